"""Every collective of engine.distributed.comm, checked on each rank (run under mpiexec).

Each rank builds its data from its rank number, so the expected result of every collective is
known everywhere without communication. Any failed assert aborts the whole job.
"""
import numpy as np
import ml_dtypes

import engine as flow
from engine.backend import CPU
from engine.distributed import comm

R, N = comm.get_rank(), comm.get_world_size()
DTYPES = [np.float32, np.float64, np.int64, ml_dtypes.bfloat16]


def T(arr):
    """An engine tensor wrapping `arr` as is (keeps strides, for non-contiguous cases)."""
    return flow.Tensor._make(arr, CPU)


def data(rank, shape, dtype=np.float32):
    """Deterministic per-rank data; small integers so bfloat16 holds them exactly."""
    n = int(np.prod(shape))
    return ((np.arange(n) % 50) + 3 * rank).reshape(shape).astype(dtype)


def eq(a, b, what):
    a = a.numpy() if hasattr(a, "numpy") else np.asarray(a)
    assert a.dtype == np.asarray(b).dtype, f"{what}: dtype {a.dtype} != {np.asarray(b).dtype}"
    assert a.shape == np.asarray(b).shape, f"{what}: shape {a.shape} != {np.asarray(b).shape}"
    assert np.array_equal(a.astype(np.float64), np.asarray(b).astype(np.float64)), f"{what}: values differ"


def chunks(n, k):
    s = comm.split_sizes(n, k)
    o = np.concatenate([[0], np.cumsum(s)]).astype(int)
    return [slice(o[i], o[i + 1]) for i in range(k)]


def test_all_reduce():
    for dt in DTYPES + [np.float16, np.int32]:
        for shape in [(7,), (3, 5), (2, 3, 4), ()]:
            t = T(data(R, shape, dt))
            out = comm.all_reduce(t)
            assert out is t
            eq(t, sum(data(r, shape, np.float64) for r in range(N)).astype(dt), f"all_reduce sum {dt} {shape}")
        t = T(data(R, (4, 6), dt))
        comm.all_reduce(t, op="max")
        eq(t, data(N - 1, (4, 6), dt), f"all_reduce max {dt}")
        t = T(data(R, (4, 6), dt))
        comm.all_reduce(t, op="min")
        eq(t, data(0, (4, 6), dt), f"all_reduce min {dt}")
    # non-contiguous tensor, reduced in place
    base = data(R, (6, 4))
    t = T(base.T)
    comm.all_reduce(t)
    eq(base.T, sum(data(r, (6, 4)) for r in range(N)).T, "all_reduce strided")
    # version counter bumped (in-place)
    t = flow.ones(3)
    v = t._version
    comm.all_reduce(t)
    assert t._version == v + (1 if N > 1 else 0)
    # raw numpy arrays are accepted too
    a = np.full(5, R, dtype=np.float64)
    comm.all_reduce(a)
    assert np.all(a == sum(range(N)))


def test_all_gather():
    for dt in DTYPES:
        # even, along axis 0 and 1
        for axis in (0, 1, -1):
            shape = (2, 3, 4)
            out = comm.all_gather(T(data(R, shape, dt)), axis=axis)
            eq(out, np.concatenate([data(r, shape, dt) for r in range(N)], axis=axis), f"all_gather even {dt} {axis}")
        # uneven: rank r has extent r % 3 along the axis (zero allowed), sizes gathered or given
        for axis in (0, 1):
            shapes = [(r % 3, 5) if axis == 0 else (4, r % 3) for r in range(N)]
            exp = np.concatenate([data(r, shapes[r], dt) for r in range(N)], axis=axis)
            out = comm.all_gather(T(data(R, shapes[R], dt)), axis=axis)
            eq(out, exp, f"all_gather uneven {dt} {axis}")
            sizes = [s[axis] for s in shapes]
            out = comm.all_gather(T(data(R, shapes[R], dt)), axis=axis, sizes=sizes)
            eq(out, exp, f"all_gather uneven sizes {dt} {axis}")
    # into a preallocated output (axis 0 direct, axis 1 through a temporary)
    for axis in (0, 1):
        shape = (3, 2)
        exp = np.concatenate([data(r, shape) for r in range(N)], axis=axis)
        out = flow.zeros(*exp.shape)
        res = comm.all_gather(T(data(R, shape)), axis=axis, sizes=[shape[axis]] * N, out=out)
        assert res is out
        eq(out, exp, f"all_gather out= axis {axis}")
    # result is a Tensor on the same device
    out = comm.all_gather(flow.ones(2, 2))
    assert isinstance(out, flow.Tensor) and tuple(out.shape) == (2 * N, 2)
    lst = comm.all_gather_into_list(T(data(R, (3, 2), np.int64)))
    assert len(lst) == N
    for r in range(N):
        eq(lst[r], data(r, (3, 2), np.int64), "all_gather_into_list")


def test_reduce_scatter():
    for dt in [np.float32, np.float64, np.int64, ml_dtypes.bfloat16]:
        for shape, axis in [((N * 2, 3), 0), ((3, N * 3), 1), ((5, 3), 0), ((2, 5, 3), 1), ((7,), 0)]:
            full = sum(data(r, shape, np.float64) for r in range(N))
            idx = [slice(None)] * len(shape)
            idx[axis] = chunks(shape[axis], N)[R]
            out = comm.reduce_scatter(T(data(R, shape, dt)), axis=axis)
            eq(out, full[tuple(idx)].astype(dt), f"reduce_scatter {dt} {shape} {axis}")
    # explicit sizes and op=max
    sizes = [1] * N
    sizes[0] += 2
    shape = (sum(sizes), 2)
    out = comm.reduce_scatter(T(data(R, shape)), op="max", sizes=sizes)
    o = sum(sizes[:R])
    eq(out, data(N - 1, shape)[o:o + sizes[R]], "reduce_scatter max sizes")
    assert comm.split_sizes(5, 4) == [2, 1, 1, 1]


def test_broadcast():
    src = N - 1
    for dt in DTYPES:
        t = T(data(R, (3, 4), dt))
        comm.broadcast(t, src=src)
        eq(t, data(src, (3, 4), dt), f"broadcast {dt}")
    base = data(R, (4, 3))
    comm.broadcast(T(base.T), src=0)
    eq(base, data(0, (4, 3)), "broadcast strided")


def test_all_to_all():
    for dt in DTYPES:
        # S(0) -> S(1) of a global (A, B, C) tensor, uneven A and B
        for A, B in [(2 * N, 3 * N), (N + 1, 2 * N - 1), (3, 5)]:
            G = data(0, (A, B, 3), dt)
            ca, cb = chunks(A, N), chunks(B, N)
            out = comm.all_to_all(T(np.ascontiguousarray(G[ca[R]])), split_axis=1, concat_axis=0)
            eq(out, G[:, cb[R]], f"all_to_all S0->S1 {dt} {A} {B}")
            # and back S(1) -> S(0), with sizes given
            back = comm.all_to_all(out, split_axis=0, concat_axis=1,
                                   concat_sizes=[c.stop - c.start for c in cb])
            eq(back, G[ca[R]], f"all_to_all S1->S0 {dt} {A} {B}")
        # S(2) -> S(0) on a 3-d tensor
        G = data(1, (N + 2, 4, 2 * N + 1), dt)
        c0, c2 = chunks(G.shape[0], N), chunks(G.shape[2], N)
        out = comm.all_to_all(T(np.ascontiguousarray(G[:, :, c2[R]])), split_axis=0, concat_axis=2)
        eq(out, G[c0[R]], f"all_to_all S2->S0 {dt}")


def test_point_to_point():
    if N == 1:
        return
    nxt, prv = (R + 1) % N, (R - 1) % N
    for dt in DTYPES:
        send_buf = T(data(R, (4, 5), dt))
        recv_buf = T(np.zeros((4, 5), dtype=dt))
        rs = comm.isend(send_buf, nxt, tag=7)
        rr = comm.irecv(recv_buf, prv, tag=7)
        got = rr.wait()
        rs.wait()
        assert got is recv_buf and rr.is_completed() and rs.is_completed()
        eq(recv_buf, data(prv, (4, 5), dt), f"isend/irecv ring {dt}")
    # irecv into a fresh tensor from (shape, dtype); blocking send/recv between pairs
    req = comm.irecv(((3,), flow.float64), prv, tag=3)
    comm.send(T(np.full(3, R, dtype=np.float64)), nxt, tag=3) if R % 2 == 0 else None
    if R % 2 == 1:
        comm.send(T(np.full(3, R, dtype=np.float64)), nxt, tag=3)
    got = req.wait()
    assert isinstance(got, flow.Tensor) and got.numpy().tolist() == [prv] * 3
    # blocking recv into a strided tensor
    if R % 2 == 0 and R + 1 < N:
        comm.send(T(data(R, (3, 2))), R + 1)
    elif R % 2 == 1:
        base = np.zeros((2, 3), dtype=np.float32)
        comm.recv(T(base.T), R - 1)
        eq(base.T, data(R - 1, (3, 2)), "recv strided")


def test_groups():
    assert comm.get_local_world_size() == N and 0 <= comm.get_local_rank() < N
    sub = comm.new_group([0, N - 1]) if N > 1 else comm.new_group([0])
    assert (sub.rank >= 0) == (R in (0, N - 1))
    if sub.rank >= 0:
        t = T(np.array([R + 1.0]))
        comm.all_reduce(t, group=sub)
        assert t.numpy()[0] == (1 + N if N > 1 else 1)
    assert comm.new_group([0, N - 1] if N > 1 else [0]) is sub  # cached
    if N % 2 == 0 and N >= 4:
        meshes = [np.arange(N).reshape(2, -1)]
        if N == 8:
            meshes.append(np.arange(8).reshape(2, 2, 2))
        for mesh in meshes:
            coord = np.argwhere(mesh == R)[0]
            for axis in range(mesh.ndim):
                g = comm.mesh_axis_groups(mesh, axis)
                idx = list(coord)
                idx[axis] = slice(None)
                expect = mesh[tuple(idx)].tolist()
                assert list(g.ranks) == expect, (mesh.shape, axis, g.ranks, expect)
                assert g.rank == coord[axis] and g.contains(R)
                assert comm.mesh_axis_groups(mesh, axis) is g
                # collectives on the axis group
                t = T(np.array([float(R)]))
                comm.all_reduce(t, group=g)
                assert t.numpy()[0] == sum(expect)
                out = comm.all_gather(T(np.array([R])), group=g)
                assert out.numpy().tolist() == expect
                rs = comm.reduce_scatter(T(np.arange(g.size * 2, dtype=np.float32) + R), group=g)
                full = sum(np.arange(g.size * 2, dtype=np.float32) + r for r in expect)
                eq(rs, full[2 * g.rank: 2 * g.rank + 2], "reduce_scatter on group")
                b = T(np.array([R]))
                comm.broadcast(b, src=expect[-1], group=g)
                assert b.numpy()[0] == expect[-1]
                a2a = comm.all_to_all(T(np.full((1, g.size), R)), group=g, split_axis=1, concat_axis=0)
                assert a2a.numpy().ravel().tolist() == expect
                # point-to-point inside the group uses global ranks
                nxt, prv = expect[(g.rank + 1) % g.size], expect[(g.rank - 1) % g.size]
                rr = comm.irecv(((1,), np.int64), prv, group=g)
                comm.isend(T(np.array([R])), nxt, group=g).wait()
                assert rr.wait().numpy()[0] == prv
                comm.barrier(g)
    comm.barrier()


def test_byte_counts():
    n = N
    x = T(np.ones((8 * n, 6), dtype=np.float32))
    nbytes = x._data.nbytes
    with comm.stats.recording() as rec:
        comm.all_reduce(x)
    assert rec.calls == ([("all_reduce", 2 * (n - 1) * nbytes // n)] if n > 1 else []), rec.calls
    with comm.stats.recording() as rec:
        comm.all_gather(x, sizes=[8 * n] * n)
    assert rec.total_bytes == nbytes * (n - 1), rec.calls
    with comm.stats.recording() as rec:
        comm.reduce_scatter(x)
    assert rec.total_bytes == (n - 1) * nbytes // n, rec.calls
    with comm.stats.recording() as rec:
        comm.all_to_all(x, split_axis=0, concat_axis=1, concat_sizes=[6] * n)
    assert rec.total_bytes == (n - 1) * nbytes // n, rec.calls
    with comm.stats.recording() as rec:
        comm.broadcast(x, src=0)
    assert rec.total_bytes == (nbytes if R == 0 and n > 1 else 0), rec.calls
    before = comm.stats.total_bytes
    with comm.stats.recording() as outer:
        comm.all_reduce(x)
        with comm.stats.recording() as inner:
            comm.all_reduce(x)
    assert outer.total_bytes == 2 * inner.total_bytes
    assert comm.stats.total_bytes - before == outer.total_bytes


def main():
    for name, fn in sorted(globals().items()):
        if name.startswith("test_") and callable(fn):
            fn()
            comm.barrier()
    comm.barrier()
    if R == 0:
        print(f"collectives OK on {N} ranks")


if __name__ == "__main__":
    main()
