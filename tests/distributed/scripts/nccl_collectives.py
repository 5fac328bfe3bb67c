"""Every collective of engine.distributed.comm on CUDA arrays (the NCCL path, engine/distributed/
nccl.py) against the same call on host arrays (the MPI path, checked by collectives.py), bit for
bit, on each rank.

Bit for bit holds for the double, whose reductions go member by member in rank order; real
NCCL's ring may sum 3+ ranks' floats in another order (the last bit).

Run under mpiexec in processes whose `import cupy` is the CuPy double (tests/gpu_helper.double_env)
with one double "GPU" per rank: its `cupy.cuda.nccl` is NCCL's API over MPI
(tests/cupy_double/_nccl.py), which sums float16 in float16 and refuses buffers on another
device, duplicate devices and unmatched sends, as NCCL does.
"""
import numpy as np

import engine as flow
from engine import backend
from engine.backend import CPU
from engine.distributed import comm

cp = backend.cupy()  # selects this rank's GPU (its local rank) before any array is made
R, N = comm.get_rank(), comm.get_world_size()
GPU = backend.device_of(cp.empty(1))
DTYPES = [np.float32, np.float64, np.int64, np.int32, np.float16]


def data(rank, shape, dtype=np.float32):
    n = int(np.prod(shape))
    return ((np.arange(n) % 50) + 3 * rank).reshape(shape).astype(dtype)


def same(got, want, what):
    """`got` (a CUDA result) equals `want` (the MPI path's) in dtype, shape, device and values."""
    g, w = getattr(got, "_data", got), getattr(want, "_data", want)
    assert isinstance(g, cp.ndarray), f"{what}: the result left the GPU ({type(g).__name__})"
    assert g.device.id == GPU.index, f"{what}: on GPU {g.device.id}, not this rank's {GPU.index}"
    h = g.get()
    assert h.dtype == w.dtype and h.shape == w.shape, f"{what}: {h.dtype}{h.shape} != {w.dtype}{w.shape}"
    assert np.array_equal(h, w, equal_nan=True), f"{what}: values differ\n{h}\n{w}"


def both(fn, host, what):
    """fn on a copy of `host` on the GPU and on the host: the NCCL path against the MPI path."""
    dev = cp.asarray(host)
    same(fn(dev), fn(host.copy()), what)


def reduced(a, **kwargs):
    comm.all_reduce(a, **kwargs)
    return a


def test_all_reduce():
    for dt in DTYPES:
        for shape in [(7,), (3, 5), ()]:
            for op in ("sum", "max", "min"):
                both(lambda a, op=op: reduced(a, op=op), data(R, shape, dt), f"all_reduce {op} {dt.__name__} {shape}")
    # booleans: NCCL has none; the engine reduces them as uint8 (sum = any)
    flags = np.array([R == 0, False, True])
    both(reduced, flags, "all_reduce bool")
    # a strided view is reduced in place
    base_h = data(R, (6, 4))
    base_d = cp.asarray(base_h)
    comm.all_reduce(base_d.T)
    comm.all_reduce(base_h.T)
    same(base_d, base_h, "all_reduce strided")
    # float16 sums accumulate in float32, as on the MPI path: NCCL alone would round at each
    # addition (2048 + 1 + 1 ... stays 2048 in float16)
    h = np.array([2048.0 if R == 0 else 1.0, 1.0], np.float16)
    d = cp.asarray(h)
    comm.all_reduce(d)
    assert d.get()[0] == np.float16(2048 + (N - 1)), d.get()
    # an engine Tensor keeps its device and gets its version bumped
    t = flow.Tensor._make(cp.asarray(data(R, (2, 3))), GPU)
    v = t._version
    assert comm.all_reduce(t) is t and t._version == v + 1
    same(t, sum(data(r, (2, 3)) for r in range(N)), "all_reduce Tensor")


def test_all_gather():
    for dt in DTYPES:
        for axis in (0, 1, -1):
            both(lambda a, axis=axis: comm.all_gather(a, axis=axis), data(R, (2, 3, 4), dt),
                 f"all_gather {dt.__name__} axis {axis}")
        for axis in (0, 1):  # uneven extents, zero included, with and without sizes
            shapes = [(r % 3, 5) if axis == 0 else (4, r % 3) for r in range(N)]
            sizes = [s[axis] for s in shapes]
            both(lambda a, axis=axis: comm.all_gather(a, axis=axis), data(R, shapes[R], dt), f"all_gather uneven {axis}")
            both(lambda a, axis=axis, sizes=sizes: comm.all_gather(a, axis=axis, sizes=sizes), data(R, shapes[R], dt),
                 f"all_gather uneven sizes {axis}")
    both(lambda a: comm.all_gather(a[:, ::2]), data(R, (3, 6)), "all_gather strided")
    out = cp.zeros((2 * N, 3), np.float32)
    assert comm.all_gather(cp.asarray(data(R, (2, 3))), out=out) is out
    same(out, np.concatenate([data(r, (2, 3)) for r in range(N)]), "all_gather out=")
    lst = comm.all_gather_into_list(cp.asarray(data(R, (3, 2), np.int64)))
    assert len(lst) == N
    for r in range(N):
        same(lst[r], data(r, (3, 2), np.int64), "all_gather_into_list")
    t = comm.all_gather(flow.Tensor._make(cp.asarray(data(R, (2,))), GPU))
    assert isinstance(t, flow.Tensor) and t.device == GPU


def test_reduce_scatter():
    for dt in DTYPES:
        for shape, axis in [((N * 2, 3), 0), ((3, N * 3), 1), ((5, 3), 0), ((2, 5, 3), 1), ((7,), 0)]:
            both(lambda a, axis=axis: comm.reduce_scatter(a, axis=axis), data(R, shape, dt),
                 f"reduce_scatter {dt.__name__} {shape} axis {axis}")
    sizes = [1] * N
    sizes[0] += 2
    both(lambda a: comm.reduce_scatter(a, op="max", sizes=sizes), data(R, (sum(sizes), 2)), "reduce_scatter max sizes")
    h = np.full(N, 2048.0 if R == 0 else 1.0, np.float16)
    got = comm.reduce_scatter(cp.asarray(h)).get()
    assert got[0] == np.float16(2048 + (N - 1)), got


def test_broadcast():
    for dt in DTYPES:
        both(lambda a: comm.broadcast(a, src=N - 1), data(R, (3, 4), dt), f"broadcast {dt.__name__}")
    base_h = data(R, (4, 3))
    base_d = cp.asarray(base_h)
    comm.broadcast(base_d.T, src=0)
    comm.broadcast(base_h.T, src=0)
    same(base_d, base_h, "broadcast strided")


def chunks(n, k):
    s = comm.split_sizes(n, k)
    o = np.concatenate([[0], np.cumsum(s)]).astype(int)
    return [slice(o[i], o[i + 1]) for i in range(k)]


def test_all_to_all():
    for dt in DTYPES:
        for A, B in [(2 * N, 3 * N), (N + 1, 2 * N - 1), (3, 5)]:
            G = data(0, (A, B, 3), dt)
            local = np.ascontiguousarray(G[chunks(A, N)[R]])
            both(lambda a: comm.all_to_all(a, split_axis=1, concat_axis=0), local, f"all_to_all S0->S1 {A} {B}")
            cb = [c.stop - c.start for c in chunks(B, N)]
            back = np.ascontiguousarray(G[:, chunks(B, N)[R]])
            both(lambda a, cb=cb: comm.all_to_all(a, split_axis=0, concat_axis=1, concat_sizes=cb), back,
                 f"all_to_all S1->S0 {A} {B}")


def test_point_to_point():
    if N == 1:
        return
    nxt, prv = (R + 1) % N, (R - 1) % N
    for dt in DTYPES:  # a ring of isend / irecv: NCCL matches them in one group when waited on
        recv_buf = cp.zeros((4, 5), dt)
        rr = comm.irecv(recv_buf, prv)
        rs = comm.isend(cp.asarray(data(R, (4, 5), dt)), nxt)
        assert rr.wait() is recv_buf
        rs.wait()
        same(recv_buf, data(prv, (4, 5), dt), f"isend/irecv ring {dt.__name__}")
    # blocking send / recv between pairs, into a strided buffer
    if R % 2 == 0 and R + 1 < N:
        comm.send(cp.asarray(data(R, (3, 2))), R + 1)
    elif R % 2 == 1:
        base = cp.zeros((2, 3), np.float32)
        comm.recv(base.T, R - 1)
        same(base.T, data(R - 1, (3, 2)), "recv strided")
    try:
        comm.recv(cp.zeros(2), None)
    except ValueError as e:
        assert "any source" in str(e), e
    else:
        raise AssertionError("recv from any source on CUDA was accepted")


def test_groups():
    if N % 2 or N < 4:
        return
    mesh = np.arange(N).reshape(2, -1)
    for axis in range(mesh.ndim):
        g = comm.mesh_axis_groups(mesh, axis)  # its ranks are checked by collectives.py
        members = list(g.ranks)
        both(lambda a: reduced(a, group=g), data(R, (3,)), f"all_reduce on mesh axis {axis}")
        both(lambda a: comm.all_gather(a, group=g), data(R, (2,)), f"all_gather on mesh axis {axis}")
        both(lambda a: comm.reduce_scatter(a, group=g), data(R, (2 * g.size,)), f"reduce_scatter on mesh axis {axis}")
        both(lambda a: comm.broadcast(a, src=members[-1], group=g), data(R, (2,)), f"broadcast on mesh axis {axis}")
        nxt, prv = members[(g.rank + 1) % g.size], members[(g.rank - 1) % g.size]
        rr = comm.irecv(cp.zeros(1, np.int64), prv, group=g)
        comm.isend(cp.asarray(np.array([R])), nxt, group=g).wait()
        same(rr.wait(), np.array([prv]), f"isend/irecv on mesh axis {axis}")


def test_max_over_world():
    """The GradScaler's inf/nan flag, agreed on the GPU: a device array in, a device array out."""
    flag = cp.asarray(np.float32(1.0 if R == N - 1 else 0.0))
    out = comm.max_over_world(flag)
    assert isinstance(out, cp.ndarray) and out.shape == () and float(out.get()) == 1.0, out
    assert float(flag.get()) == (1.0 if R == N - 1 else 0.0), "max_over_world changed its input"
    assert comm.max_over_world(0.5 * R) == 0.5 * (N - 1)


def test_global_tensors_change_device_type():
    """`.cpu()` / `.cuda()` / `.to(device)` of a global tensor (OneFlow's): the same ranks and SBP
    on a placement of the other device type, the logical value kept, gradients flowing back; a
    module of global parameters moved with `.cpu()` keeps its parameters' identity."""
    from engine.distributed import sbp as S

    mesh = np.arange(N).reshape(2, -1).tolist() if N % 2 == 0 and N >= 4 else list(range(N))
    gpu_p = flow.placement("cuda", mesh)
    sbp = (S.split(1),) * gpu_p.ndim if gpu_p.ndim == 1 else (S.split(0), S.broadcast)
    value = data(0, (4, 2 * N))
    x = flow.tensor(value, placement=gpu_p, sbp=sbp, requires_grad=True)
    with comm.stats.recording() as rec:  # each rank moves its own shard: nothing travels
        host = x.cpu()
    assert rec.total_bytes == 0 and tuple(host.to_local().shape) == tuple(x.to_local().shape), rec.calls
    assert host.placement == flow.placement("cpu", mesh) and host.sbp == x.sbp, (host.placement, host.sbp)
    assert host.device.type == "cpu" and np.array_equal(host.detach().numpy(), value)
    (host * 3).sum().backward()
    assert x.grad.placement == gpu_p and x.grad.device == GPU
    assert np.array_equal(x.grad.cpu().numpy(), np.full(value.shape, 3, np.float32))
    back = host.detach().cuda()
    assert back.placement == gpu_p and back.sbp == x.sbp and back.device == GPU
    assert x.to("cuda") is x and host.to("cpu") is host
    lin = flow.nn.Linear(2 * N, 3).to_global(placement=gpu_p, sbp=(S.broadcast,) * gpu_p.ndim)
    weight = lin.weight
    lin.cpu()
    assert lin.weight is weight and weight.placement.type == "cpu" and weight.device.type == "cpu"


def test_the_double_behaves_as_nccl():
    """What makes the checks above able to fail: the double's NCCL itself sums float16 in float16
    (3+ ranks: 2048 + 1 + 1 rounds back to 2048 at each addition) and refuses a buffer that is not
    on the communicator's GPU."""
    from cupy.cuda import nccl

    from engine.distributed.nccl import backend_for

    be = backend_for(comm.get_world_group(), cp.empty(1))
    h = cp.asarray(np.array([2048.0 if R == 0 else 1.0], np.float16))
    be.comm.allReduce(h.data.ptr, h.data.ptr, 1, nccl.NCCL_FLOAT16, nccl.NCCL_SUM, be._stream())
    # summed in float16, 2048 + 1 rounds back to 2048 at each addition (with 3+ ranks this tells
    # float16 from float32 accumulation, which gives 2048 + (N - 1) rounded once; with 2 both give 2048)
    assert float(h.get()[0]) == 2048.0, h.get()
    if cp.cuda.runtime.getDeviceCount() > 1:
        with cp.cuda.Device((GPU.index + 1) % cp.cuda.runtime.getDeviceCount()):
            elsewhere = cp.ones(2, np.float32)
        try:
            be.comm.allReduce(elsewhere.data.ptr, elsewhere.data.ptr, 2, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, 0)
        except nccl.NcclError as e:
            assert "communicator on" in str(e), e
        else:
            raise AssertionError("the double's NCCL took a buffer on another GPU")


def main():
    for name, fn in sorted(globals().items()):
        if name.startswith("test_") and callable(fn):
            fn()
            comm.barrier()
    if R == 0:
        print(f"nccl collectives OK on {N} ranks")


if __name__ == "__main__":
    main()
