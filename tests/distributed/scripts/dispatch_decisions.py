"""The dispatch's decision cache (engine/distributed/dispatch.py): a call like an earlier one
reuses its signature choice, and anything that can change the choice (the op, an input's SBP,
shape or itemsize, an attribute, even 1 against 1.0 or True) is a new decision. The values are
checked against numpy each time, so a wrongly reused decision fails on its result."""
import numpy as np

import engine as flow
from engine.distributed import dispatch
from engine.distributed import sbp as S

r = flow.env.get_rank()
n = flow.env.get_world_size()
p = flow.placement("cpu", list(range(n)))
rng = np.random.default_rng(0)
a = rng.standard_normal((4 * n, 6)).astype(np.float32)


def check(got, want, what):
    np.testing.assert_allclose(got.to_global(sbp=S.broadcast).to_local().numpy(), want, rtol=1e-6, atol=1e-6,
                               err_msg=what)


def calls():
    """(description, op on the global tensor, the numpy reference)."""
    return [
        ("sum dim 0", lambda x: x.sum(dim=0), a.sum(0)),
        ("sum dim 1", lambda x: x.sum(dim=1), a.sum(1)),
        ("sum dim 1 keepdim", lambda x: x.sum(dim=1, keepdim=True), a.sum(1, keepdims=True)),
        ("transpose", lambda x: x.transpose(0, 1), a.T),
        ("view", lambda x: x.view(2 * n, 12), a.reshape(2 * n, 12)),
        ("view other shape", lambda x: x.view(4 * n * 6), a.reshape(-1)),
    ]


def main():
    dispatch._decisions.clear()
    for sbp in (S.split(0), S.split(1), S.broadcast):
        x = flow.tensor(a, placement=p, sbp=sbp)  # the logical tensor `a`, laid out as `sbp`
        for what, fn, want in calls():
            before = len(dispatch._decisions)
            check(fn(x), want, f"{what} on {sbp}")
            first = len(dispatch._decisions) - before
            assert first >= 1 or sbp == S.broadcast, f"{what} on {sbp}: no decision was recorded"
            check(fn(x), want, f"{what} on {sbp}, again")
            assert len(dispatch._decisions) == before + first, f"{what} on {sbp}: the same call decided anew"
    # attribute values that compare equal but are different values are different decisions
    keys = {dispatch._decision_key(object, [], [], {"v": v}) for v in (1, 1.0, True, 0.0, -0.0)}
    assert len(keys) == 5, keys
    # a value that is not plain is decided every time (no key)
    assert dispatch._decision_key(object, [], [], {"index": np.arange(3)}) is None
    assert dispatch._decision_key(object, [], [], {"generator": flow.default_generator}) is None
    assert dispatch._decision_key(object, [], [], {"s": slice(1, None, 2), "d": flow.float16}) is not None
    print(f"dispatch decisions OK on {n} ranks")


main()
