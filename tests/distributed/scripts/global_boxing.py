"""Boxing matrix on every rank count it runs on (2 or 4): every (from, to) pair of nd-SBP over
{S(0), S(1), B, P} on even (8, 12) and uneven (5, 7) shapes keeps the logical value, and the
gradient through the two conversions is the gradient of the identity. On 2 ranks also the
meshes [[0], [1]] and [[0, 1]] (an axis of one rank), on 4 ranks the 2-D mesh [[0, 1], [2, 3]]
and conversions between placements (ranks outside a placement run the very same code: to_global
is collective over the union of the ranks). An argument "cuda" runs it all on CUDA placements
(one GPU per rank: under the CuPy double, its NCCL over MPI)."""
import itertools
import sys

import numpy as np

import engine as flow
from engine.distributed import sbp as S

r = flow.env.get_rank()
n = flow.env.get_world_size()
DEV = sys.argv[1] if len(sys.argv) > 1 else "cpu"
BASE = [S.split(0), S.split(1), S.broadcast, S.partial_sum]
SHAPES = [(8, 12), (5, 7)]


def host(t):
    """The logical value of global tensor `t` as a numpy array, from either device type."""
    return t.detach().cpu().numpy()


def bcast(p):
    return (S.broadcast,) * p.ndim


def matrix(p, check_meta):
    count = 0
    rng = np.random.default_rng(1)
    sbps = list(itertools.product(BASE, repeat=p.ndim))
    for shape in SHAPES:
        A = rng.standard_normal(shape).astype(np.float32)
        G = rng.standard_normal(shape).astype(np.float32)
        g = flow.tensor(G, placement=p, sbp=bcast(p))
        for src in sbps:
            for dst in sbps:
                leaf = flow.tensor(A, placement=p, sbp=bcast(p), requires_grad=True)
                y = leaf.to_global(sbp=src, check_meta=check_meta).to_global(sbp=dst, check_meta=check_meta)
                assert y.sbp == dst and tuple(y.shape) == shape and y.placement == p, (src, dst, y.sbp, y.shape)
                v = host(y)
                assert np.allclose(v, A, atol=1e-5), (p, shape, src, dst, "value", np.abs(v - A).max())
                (y * g).sum().backward()
                assert leaf.grad.sbp == bcast(p), (src, dst, leaf.grad.sbp)
                assert np.allclose(host(leaf.grad), G, atol=1e-5), (p, shape, src, dst, "grad")
                count += 1
    return count


def across(ps, pd, sbps_src, sbps_dst):
    count = 0
    rng = np.random.default_rng(2)
    for shape in SHAPES:
        A = rng.standard_normal(shape).astype(np.float32)
        G = rng.standard_normal(shape).astype(np.float32)
        g = flow.tensor(G, placement=pd, sbp=bcast(pd))
        for src in sbps_src:
            for dst in sbps_dst:
                leaf = flow.tensor(A, placement=ps, sbp=bcast(ps), requires_grad=True)
                y = leaf.to_global(sbp=src).to_global(placement=pd, sbp=dst)
                assert y.placement == pd and y.sbp == dst, (y.placement, y.sbp)
                assert tuple(y.shape) == shape, (ps, pd, y.shape)  # known outside pd too
                if pd.has_rank(r):
                    assert np.allclose(host(y), A, atol=1e-5), (ps, pd, shape, src, dst, "value")
                else:
                    assert y.to_local().numel() == 0
                # y.backward(g) rather than (y * g).sum(): ops on ranks outside a placement record
                # no graph (dispatch), but the conversion's own backward is collective over both
                y.backward(g)
                if ps.has_rank(r):
                    assert np.allclose(host(leaf.grad), G, atol=1e-5), (ps, pd, shape, src, dst, "grad")
                count += 1
    return count


def main():
    P = lambda ranks: flow.placement(DEV, ranks)  # noqa: E731
    total = matrix(P(list(range(n))), check_meta=True)
    if n == 2:  # meshes with an axis of one rank: every conversion along it is the identity
        total += matrix(P([[0], [1]]), check_meta=False)
        total += matrix(P([[0, 1]]), check_meta=False)
    if n == 4:
        total += matrix(P([[0, 1], [2, 3]]), check_meta=False)
        one = [(s,) for s in BASE]
        two = [(S.split(0), S.split(1)), (S.partial_sum, S.split(0)), (S.broadcast, S.partial_sum),
               (S.split(1), S.split(1)), (S.broadcast, S.broadcast)]
        total += across(P([0, 1]), P([2, 3]), one, one)
        total += across(P([0, 1, 2, 3]), P([1, 2]), one, one)
        total += across(P([[0, 1], [2, 3]]), P([0, 3]), two, one)
        total += across(P([0, 3]), P([[0, 1], [2, 3]]), one, two)
        total += across(P([0, 1]), P([1, 0]), one, one)
    if r == 0:
        print(f"global boxing OK on {n} ranks ({DEV}): {total} conversions")


if __name__ == "__main__":
    main()
