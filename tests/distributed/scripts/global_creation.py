"""Creation with placement= and sbp=: for a seed, the logical tensor is the one a plain single
process makes (`flow.manual_seed(s); flow.randn(shape)`), whatever the placement and SBP; the
generator stays in lockstep. Runs on 2 and 4 ranks (and the 2-D mesh on 4)."""
import itertools

import numpy as np

import engine as flow
from engine.distributed import sbp as S

r = flow.env.get_rank()
n = flow.env.get_world_size()

FACTORIES = {
    "randn": lambda **kw: flow.randn(5, 8, **kw),
    "rand": lambda **kw: flow.rand(8, 5, **kw),
    "randint": lambda **kw: flow.randint(0, 100, (6, 4), **kw),
    "normal": lambda **kw: flow.normal(1.5, 2.0, (4, 6), **kw),
    "tensor": lambda **kw: flow.tensor(np.arange(20, dtype=np.float32).reshape(4, 5), **kw),
    "zeros": lambda **kw: flow.zeros(4, 6, **kw),
    "ones": lambda **kw: flow.ones(6, 4, **kw),
    "full": lambda **kw: flow.full((5, 4), 2.5, **kw),
    "arange": lambda **kw: flow.arange(4, **kw),
}


def layouts():
    base = [S.broadcast, S.split(0), S.split(1), S.partial_sum]
    out = [(flow.placement("cpu", list(range(n))), (s,)) for s in base]
    out.append((flow.placement("cpu", [1]), (S.broadcast,)))
    out.append((flow.placement("cpu", list(reversed(range(n)))), (S.split(0),)))
    if n == 4:
        p2 = flow.placement("cpu", [[0, 1], [2, 3]])
        out += [(p2, nd) for nd in itertools.product(base, repeat=2)]
    return out


def main():
    count = 0
    for name, make in FACTORIES.items():
        for seed in (0, 7):
            flow.manual_seed(seed)
            ref = make()
            after_ref = flow.randn(3).numpy()
            for p, sbp in layouts():
                if ref.ndim < 2 and any(s == S.split(1) for s in sbp):
                    continue
                flow.manual_seed(seed)
                t = make(placement=p, sbp=sbp)
                after = flow.randn(3).numpy()
                assert np.array_equal(after, after_ref), (name, "generator out of lockstep")
                assert t.placement == p and t.sbp == sbp and tuple(t.shape) == tuple(ref.shape), (name, t.sbp)
                assert t.dtype == ref.dtype, (name, t.dtype, ref.dtype)
                if p.has_rank(r):
                    v = t.numpy()
                    assert np.array_equal(v, ref.numpy()), (name, seed, p, sbp)
                count += 1
    # requires_grad on a global factory
    p = flow.placement("cpu", list(range(n)))
    w = flow.randn(4, 3, placement=p, sbp=S.split(0), requires_grad=True)
    assert w.requires_grad and w.is_leaf
    if r == 0:
        print(f"global creation OK on {n} ranks: {count} tensors")


if __name__ == "__main__":
    main()
