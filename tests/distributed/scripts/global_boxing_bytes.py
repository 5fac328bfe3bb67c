"""Each conversion uses its textbook collective and moves the textbook amount (comm.stats),
on 4 ranks: 1-D, then the 2-D mesh; also the cost of to_global's argument check."""
import itertools
import time

import numpy as np

import engine as flow
from engine.distributed import comm
from engine.distributed import sbp as S

r = flow.env.get_rank()
n = flow.env.get_world_size()
assert n == 4, "run on 4 ranks"
P1 = flow.placement("cpu", [0, 1, 2, 3])
S0, S1, B, PS = S.split(0), S.split(1), S.broadcast, S.partial_sum


def calls_of(x, sbp):
    with comm.stats.recording() as st:
        y = x.to_global(sbp=sbp)
    return y, st


def only(st, name):
    names = {c for c, _ in st.calls}
    assert names <= {name}, (name, st.calls)


def one_d():
    for shape in [(8, 12), (5, 7)]:
        A = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
        T = A.nbytes
        x = {s: flow.tensor(A, placement=P1, sbp=B).to_global(sbp=s) for s in (S0, S1, B, PS)}
        local = {s: x[s].to_local().numpy().nbytes for s in x}

        _, st = calls_of(x[PS], B)  # P -> B: all_reduce, 2(n-1)/n T
        only(st, "all_reduce")
        assert st.bytes_of("all_reduce") == 2 * (n - 1) * T // n, (st.calls, T)
        for s in (S0, S1):
            _, st = calls_of(x[s], B)  # S -> B: all_gather, own chunk * (n-1)
            only(st, "all_gather")
            assert st.bytes_of("all_gather") == local[s] * (n - 1), (s, st.calls)
            _, st = calls_of(x[PS], s)  # P -> S: reduce_scatter, (n-1)/n of the input
            only(st, "reduce_scatter")
            assert st.bytes_of("reduce_scatter") == (n - 1) * T // n, (s, st.calls)
            _, st = calls_of(x[B], s)  # B -> S: local slice
            assert st.total_bytes == 0 and not st.calls, st.calls
            _, st = calls_of(x[s], PS)  # S -> P: local
            assert st.total_bytes == 0 and not st.calls, st.calls
        _, st = calls_of(x[B], PS)  # B -> P: local
        assert st.total_bytes == 0 and not st.calls, st.calls
        for a, b in ((S0, S1), (S1, S0)):  # S(i) -> S(j): all_to_all of the bytes for the others
            y, st = calls_of(x[a], b)
            only(st, "all_to_all")
            la, lb = x[a].to_local().shape, y.to_local().shape
            own = np.prod([lb[d] if d == b.axis else la[d] for d in range(2)]) * 4  # block kept by this rank
            assert st.bytes_of("all_to_all") == local[a] - own, (a, b, st.calls, local[a], own)
            if shape == (8, 12):
                assert st.bytes_of("all_to_all") == local[a] * (n - 1) // n


def two_d():
    p = flow.placement("cpu", [[0, 1], [2, 3]])
    A = np.ones((8, 12), np.float32)
    sbps = list(itertools.product([S0, S1, B, PS], repeat=2))
    gathers = []
    for src in sbps:
        x = flow.tensor(A, placement=p, sbp=(B, B)).to_global(sbp=src)
        for dst in sbps:
            with comm.stats.recording() as st:
                x.to_global(sbp=dst, check_meta=False)
            names = {c for c, _ in st.calls}
            if all(a == b for a, b in zip(src, dst)):
                assert not st.calls
            # no gather where every mesh axis goes P -> S, S -> S or B -> anything, unless an outer
            # axis must re-split a dim that an inner axis splits before and after (a cycle)
            plain = all(a == b or a.is_broadcast or (b.is_split and not a.is_broadcast) for a, b in zip(src, dst))
            touched = {s.axis for s in (src[0], dst[0]) if s.is_split} if src[0] != dst[0] else set()
            cyclic = src[1].is_split and dst[1].is_split and src[1].axis in touched and dst[1].axis in touched
            if plain and "all_gather" in names:
                assert cyclic, (src, dst, st.calls)
                gathers.append((src, dst))
            if all(a.is_broadcast for a in src):
                assert st.total_bytes == 0, (src, dst, st.calls)
            if all(a.is_partial for a in src) and all(b.is_split for b in dst):
                assert names == {"reduce_scatter"}, (src, dst, st.calls)
    return gathers


def check_cost():
    """The argument check of to_global is one small Allgather: report what it adds."""
    x = flow.randn(64, 64, placement=P1, sbp=S0)

    def bench(**kw):
        comm.barrier()
        t = time.perf_counter()
        for _ in range(50):
            x.to_global(sbp=S1, **kw)
        comm.barrier()
        return (time.perf_counter() - t) / 50 * 1e6

    bench()
    return bench(check_meta=False), bench(check_meta=True)


def main():
    one_d()
    gathers = two_d()
    off, on = check_cost()
    if r == 0:
        print(f"2-D conversions that gather an inner axis (cycles): {len(gathers)}")
        print(f"S(0)->S(1) 64x64: {off:.0f} us without the check, {on:.0f} us with it")
        print(f"global boxing bytes OK on {n} ranks")


if __name__ == "__main__":
    main()
