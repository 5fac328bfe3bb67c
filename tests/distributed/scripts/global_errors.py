"""Clear errors, raised on every rank alike (so the job goes on in lockstep), on 4 ranks."""
import numpy as np

import engine as flow
from engine.distributed import sbp as S

r = flow.env.get_rank()
n = flow.env.get_world_size()
assert n == 4
P1 = flow.placement("cpu", [0, 1, 2, 3])
P2 = flow.placement("cpu", [[0, 1], [2, 3]])


def raises(exc, *words):
    class Ctx:
        def __enter__(self):
            return self

        def __exit__(self, et, ev, tb):
            assert et is not None, f"expected {exc.__name__} mentioning {words}"
            assert issubclass(et, exc), (et, ev)
            msg = str(ev)
            for w in words:
                assert w in msg, (w, msg)
            self.msg = msg
            return True

    return Ctx()


def main():
    x = flow.randn(8, 6, placement=P1, sbp=S.split(0))
    local = flow.ones(8, 6)
    # mixing local and global tensors in one op (dispatch)
    with raises(RuntimeError, "cannot mix local and global"):
        x + local
    with raises(RuntimeError, "cannot mix local and global"):
        flow.matmul(local, flow.randn(6, 3, placement=P1, sbp=S.broadcast))
    # tensors on different placements in one op
    with raises(RuntimeError, "different placements"):
        x + flow.randn(8, 6, placement=flow.placement("cpu", [0, 1]), sbp=S.broadcast)
    # split axis out of range: global -> global, creation, local -> global
    with raises(ValueError, "splits axis 2", "out of range"):
        x.to_global(sbp=S.split(2))
    with raises(ValueError, "splits axis 3", "out of range"):
        flow.zeros(4, 4, placement=P1, sbp=S.split(3))
    with raises(ValueError, "splits axis -3", "out of range"):
        flow.randn(4, 4, placement=P2, sbp=(S.broadcast, S.split(-3)))
    with raises(ValueError, "splits axis 2", "out of range"):
        local.to_global(P1, S.split(2))
    # a split extent smaller than the number of ranks it is split over
    with raises(ValueError, "extent 3", "smaller than", "4 ranks"):
        flow.randn(3, 8, placement=P1, sbp=S.split(0))
    with raises(ValueError, "extent 3", "4 ranks"):
        flow.randn(3, 8, placement=P2, sbp=(S.split(0), S.split(0)))
    with raises(ValueError, "extent 2", "smaller than"):
        flow.randn(2, 8, placement=P1, sbp=S.broadcast).to_global(sbp=S.split(0))
    with raises(ValueError, "smaller than"):  # 3 rows over 4 ranks read from local shards 1,1,1,0
        flow.ones(1 if r < 3 else 0, 2).to_global(P1, S.split(0))
    # uneven local shards that are not the balanced split (5 over 4 must be 2,1,1,1)
    rows = [1, 1, 1, 2][r]
    with raises(ValueError, "balanced split", "rank 0 has [1, 3]", "needs [2, 3]"):
        flow.ones(rows, 3).to_global(P1, S.split(0))
    with raises(ValueError, "balanced split"):  # 2-D mesh, inner axis shards disagree
        flow.ones(2, [2, 3, 3, 3][r]).to_global(P2, (S.split(0), S.split(1)))
    with raises(ValueError, "different numbers of dims"):
        flow.ones(*((2, 3) if r else (2, 3, 1))).to_global(P1, S.split(0))
    ok = flow.ones([2, 1, 1, 1][r], 3).to_global(P1, S.split(0))  # the balanced split is fine
    assert tuple(ok.shape) == (5, 3)
    # ranks disagreeing on placement / sbp / dtype: every rank raises instead of hanging
    with raises(RuntimeError, "different arguments", "sbp", "ranks [0, 1] passed (S(0),)", "ranks [2, 3] passed (B,)"):
        flow.ones(4, 4).to_global(P1, S.split(0) if r < 2 else S.broadcast)
    with raises(RuntimeError, "different arguments", "placement"):
        flow.ones(2, 4).to_global(P2 if r == 3 else flow.placement("cpu", [[0, 2], [1, 3]]), (S.broadcast, S.broadcast))
    with raises(RuntimeError, "different arguments", "dtype"):
        flow.ones(4, 4, dtype=flow.float32 if r else flow.float64).to_global(P1, S.broadcast)
    with raises(RuntimeError, "different arguments", "sbp"):
        x.to_global(sbp=S.split(1) if r == 1 else S.broadcast)
    with raises(RuntimeError, "different arguments", "placement"):
        x.to_global(placement=flow.placement("cpu", [0, 1]) if r == 2 else flow.placement("cpu", [1, 0]),
                    sbp=S.broadcast)
    # the job is still in lockstep after all of that
    assert np.allclose(x.to_global(sbp=S.broadcast).numpy(), x.numpy())
    # to_local / placement / sbp on a local tensor
    with raises(RuntimeError, "already local"):
        local.to_local()
    with raises(RuntimeError, "no placement"):
        local.placement
    with raises(RuntimeError, "no sbp"):
        local.sbp
    # bad arguments
    with raises(ValueError, "needs placement"):
        local.to_global(sbp=S.broadcast)
    with raises(ValueError, "needs sbp"):
        local.to_global(P1)
    with raises(ValueError, "2 entries", "1 axes"):
        x.to_global(sbp=(S.broadcast, S.broadcast))
    with raises(TypeError, "sbp entries"):
        x.to_global(sbp="B")
    with raises(ValueError, "sbp= needs placement="):
        flow.zeros(2, sbp=S.broadcast)
    # a rank outside the placement has no data to show
    y = flow.randn(4, placement=flow.placement("cpu", [0, 1]), sbp=S.broadcast)
    if r >= 2:
        with raises(RuntimeError, "not in the placement"):
            y.numpy()
    if r == 0:
        print(f"global errors OK on {n} ranks")


if __name__ == "__main__":
    main()
