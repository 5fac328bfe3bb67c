"""Every torch.distributed-style collective of engine.distributed against numpy, on each rank.

Rank r's data is drawn from a generator seeded with r, so every rank can compute what every
collective must produce from all ranks' data.
"""
import datetime
import os

import numpy as np

import engine as flow
import engine.distributed as dist
from engine.distributed import ReduceOp
from engine.distributed import comm


def raises(exc, fn, *args, match=None, **kwargs):
    try:
        fn(*args, **kwargs)
    except exc as e:
        assert match is None or match in str(e), (match, str(e))
        return
    raise AssertionError(f"{fn.__name__} did not raise {exc.__name__}")


def data(r, shape, dtype=np.float64):
    rng = np.random.default_rng(1000 + r)
    if np.dtype(dtype).kind in "iu":
        return rng.integers(-20, 20, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def every(shape, dtype=np.float64):
    return [data(q, shape, dtype) for q in range(n)]


def close(a, b, tol=1e-12):
    a = a.numpy() if hasattr(a, "numpy") else np.asarray(a)
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


def t_(arr):
    return flow.tensor(arr)


assert not dist.is_initialized()
dist.init_process_group(backend="gloo")
assert dist.is_initialized() and dist.get_backend() == "gloo"
r, n = dist.get_rank(), dist.get_world_size()
assert (r, n) == (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
assert dist.group.WORLD is comm.get_world_group() and dist.get_rank(dist.group.WORLD) == r
raises(ValueError, dist.init_process_group, "gloo", match="twice")

# ---------------------------------------------------------------- all_reduce
reductions = {ReduceOp.SUM: np.sum, ReduceOp.PRODUCT: np.prod, ReduceOp.MIN: np.min, ReduceOp.MAX: np.max,
              ReduceOp.AVG: np.mean}
for shape in [(3, 5), (), (0, 3), (7,)]:
    for op, fn in reductions.items():
        t = t_(data(r, shape))
        v = t._version
        assert dist.all_reduce(t, op=op) is t
        close(t, fn(np.stack(every(shape)), axis=0))
        assert t._version > v or n == 1
for op, name in [(ReduceOp.SUM, "sum"), (ReduceOp.MAX, "max")]:  # the engine's op strings still work
    a, b = t_(data(r, (4,))), t_(data(r, (4,)))
    dist.all_reduce(a, op=op)
    dist.all_reduce(b, op=name)
    close(a, b.numpy(), 0)
t = t_(data(r, (5,), np.int64))
dist.all_reduce(t, ReduceOp.SUM)
close(t, np.sum(every((5,), np.int64), axis=0), 0)
t = t_(data(r, (6,), np.int64))
dist.all_reduce(t, ReduceOp.AVG)  # integers: truncated toward zero (NCCL's average)
s = np.sum(every((6,), np.int64), axis=0)
close(t, np.trunc(s / n).astype(np.int64), 0)
for dt, tol in [(np.float32, 1e-6), (np.float16, 2e-3)]:
    for async_op in (False, True):
        t = t_(data(r, (3, 4), dt))
        w = dist.all_reduce(t, op=ReduceOp.AVG, async_op=async_op)
        if async_op:
            assert isinstance(w, dist.Work) and w.wait() is True and w.is_completed() and w.result()[0] is t
        close(t.numpy().astype(np.float64), np.mean(np.stack(every((3, 4), dt)).astype(np.float64), axis=0), tol)
t = t_(data(r, (1000,)))
w = dist.all_reduce(t, async_op=True)  # a true MPI_Iallreduce on float64
assert w.wait(timeout=datetime.timedelta(seconds=60)) and w.is_success() and w.exception() is None
close(t, np.sum(every((1000,)), axis=0))
raises(ValueError, dist.all_reduce, t_(data(r, (2,))), op="bogus", match="unsupported reduction op")
raises(TypeError, dist.all_reduce, [1.0, 2.0], match="Expected parameter `tensor`")
g = flow.ones(4, placement=flow.placement("cpu", list(range(n))), sbp=flow.sbp.broadcast)
raises(TypeError, dist.all_reduce, g, match="local tensors")

# ---------------------------------------------------------------- broadcast
t = t_(data(r, (2, 3)))
assert dist.broadcast(t, src=n - 1) is t
close(t, data(n - 1, (2, 3)), 0)
t = t_(data(r, (4,), np.float32))
dist.broadcast(t, group_src=0, async_op=True).wait()
close(t, data(0, (4,), np.float32), 0)
raises(ValueError, dist.broadcast, t_(data(r, (2,))), match="Must specify global_rank or group_rank")

# ---------------------------------------------------------------- all_gather (both forms)
for shape in [(2, 3, 1), (), (0,)]:
    mine = t_(data(r, shape))
    outs = [flow.zeros(*shape, dtype=flow.float64) for _ in range(n)]
    assert dist.all_gather(outs, mine) is None
    for q in range(n):
        close(outs[q], data(q, shape), 0)
outs = [flow.zeros(3) for _ in range(n)]
w = dist.all_gather(outs, t_(data(r, (3,), np.float32)), async_op=True)
assert w.wait() and w.result()[n - 1] is outs[n - 1]
close(outs[n - 1], data(n - 1, (3,), np.float32), 0)
raises(RuntimeError, dist.all_gather, [flow.zeros(3)] * (n + 1), t_(data(r, (3,))), match="expected length")
raises(RuntimeError, dist.all_gather, [flow.zeros(2, dtype=flow.float64)] * n, t_(data(r, (3,))),
       match="invalid tensor size")
raises(ValueError, dist.all_gather, [flow.zeros(3, dtype=flow.float32)] * n, t_(data(r, (3,))),
       match="different dtypes")
close(dist.all_gather(t_(data(r, (2, 3)))), np.concatenate(every((2, 3))), 0)  # the engine's form

# ---------------------------------------------------------------- all_gather_into_tensor
out = flow.zeros(2 * n, 3, dtype=flow.float64)
dist.all_gather_into_tensor(out, t_(data(r, (2, 3))))
close(out, np.concatenate(every((2, 3))), 0)
out = flow.zeros(n, 2, 3, dtype=flow.float64)
dist.all_gather_into_tensor(out, t_(data(r, (2, 3))), async_op=True).wait()
close(out, np.stack(every((2, 3))), 0)
out = flow.zeros(n, dtype=flow.float64)
dist.all_gather_into_tensor(out, t_(data(r, ())))
close(out, np.stack(every(())), 0)
raises(RuntimeError, dist.all_gather_into_tensor, flow.zeros(2 * n + 1, 3, dtype=flow.float64),
       t_(data(r, (2, 3))), match="neither a stack nor a concatenation")

# ---------------------------------------------------------------- reduce_scatter_tensor
for op, fn in [(ReduceOp.SUM, np.sum), (ReduceOp.AVG, np.mean), (ReduceOp.MAX, np.max)]:
    out = flow.zeros(2, 3, dtype=flow.float64)
    dist.reduce_scatter_tensor(out, t_(data(r, (2 * n, 3))), op=op)
    close(out, fn(np.stack(every((2 * n, 3))), axis=0)[2 * r:2 * r + 2])
out = flow.zeros(2, 3, dtype=flow.float64)
dist.reduce_scatter_tensor(out, t_(data(r, (n, 2, 3))))
close(out, np.sum(np.stack(every((n, 2, 3))), axis=0)[r])
raises(RuntimeError, dist.reduce_scatter_tensor, flow.zeros(3, dtype=flow.float64), t_(data(r, (2 * n,))),
       match="neither a stack nor a concatenation")

# ---------------------------------------------------------------- reduce, gather, scatter
dst = n - 1
for op, fn in [(ReduceOp.SUM, np.sum), (ReduceOp.MIN, np.min), (ReduceOp.AVG, np.mean)]:
    t = t_(data(r, (3, 2)))
    dist.reduce(t, dst=dst, op=op)
    close(t, fn(np.stack(every((3, 2))), axis=0) if r == dst else data(r, (3, 2)))
t = t_(data(r, (4,), np.float16))
dist.reduce(t, group_dst=0)
expect = np.sum(np.stack(every((4,), np.float16)).astype(np.float32), axis=0).astype(np.float16)
close(t.numpy().astype(np.float64), expect.astype(np.float64) if r == 0 else data(r, (4,), np.float16), 1e-3)

got = [flow.zeros(2, 2, dtype=flow.float64) for _ in range(n)] if r == dst else None
dist.gather(t_(data(r, (2, 2))), got, dst=dst)
if r == dst:
    for q in range(n):
        close(got[q], data(q, (2, 2)), 0)
    raises(RuntimeError, dist.gather, t_(data(r, (2, 2))), [flow.zeros(2, 2, dtype=flow.float64)] * (n + 1),
           dst=dst, match="Incorrect gather_list size")
    raises(ValueError, dist.gather, t_(data(r, (2, 2))), dst=dst, match="must be specified on destination")
else:
    raises(ValueError, dist.gather, t_(data(r, (2, 2))), [flow.zeros(2, 2)], dst=dst, match="must NOT be specified")

t = flow.zeros(3, dtype=flow.float64)
dist.scatter(t, [t_(data(q, (3,))) for q in range(n)] if r == 0 else None, src=0)
close(t, data(r, (3,)), 0)
if r == 0:
    raises(ValueError, dist.scatter, flow.zeros(3, dtype=flow.float64), src=0, match="must be specified on source")

# ---------------------------------------------------------------- point to point
if n > 1:
    nxt, prv = (r + 1) % n, (r - 1) % n
    box = flow.zeros(3, dtype=flow.float64)
    if r % 2 == 0:
        dist.send(t_(data(r, (3,))), nxt, tag=4)
        assert dist.recv(box, prv, tag=4) == prv
    else:
        assert dist.recv(box, src=prv, tag=4) == prv
        dist.send(t_(data(r, (3,))), dst=nxt, tag=4)
    close(box, data(prv, (3,)), 0)
    box = flow.zeros(2, dtype=flow.float32)
    reqs = [dist.isend(t_(data(r, (2,), np.float32)), nxt), dist.irecv(box, prv)]
    assert all(w.wait() for w in reqs)
    close(box, data(prv, (2,), np.float32), 0)
    if r == 1:  # a receive from any source reports the sender
        dist.send(t_(data(r, (2,))), 0, tag=9)
    if r == 0:
        box = flow.zeros(2, dtype=flow.float64)
        assert dist.recv(box, tag=9) == 1
        close(box, data(1, (2,)), 0)
raises(ValueError, dist.send, t_(data(r, (2,))), r, match="destination rank should not be the same")

# ---------------------------------------------------------------- Python objects
objs = [None] * n
dist.all_gather_object(objs, {"rank": r, "s": "x" * r})
assert objs == [{"rank": q, "s": "x" * q} for q in range(n)], objs
lst = [r, "mine", {"r": r}]
dist.broadcast_object_list(lst, src=n - 1)
assert lst == [n - 1, "mine", {"r": n - 1}], lst
raises(IndexError, dist.all_gather_object, [None] * (n - 1), r, match="one per rank")

# ---------------------------------------------------------------- groups and barriers
sub = dist.new_group([1, 0] if n > 1 else [0])  # sorted, as torch
assert sub.ranks == ((0, 1) if n > 1 else (0,))
t = t_(data(r, (3,)))
if r in sub.ranks:
    assert dist.get_rank(sub) == r and dist.get_world_size(sub) == len(sub.ranks)
    dist.all_reduce(t, group=sub)
    close(t, np.sum([data(q, (3,)) for q in sub.ranks], axis=0))
    dist.broadcast(t, src=sub.ranks[-1], group=sub)
else:
    assert dist.get_rank(sub) == -1 and dist.get_world_size(sub) == -1
    dist.all_reduce(t, group=sub)  # a non-member returns at once, tensor untouched
    close(t, data(r, (3,)), 0)
if n >= 4:
    odd = dist.new_group([3, 1])
    t = t_(data(r, (2,)))
    out = flow.zeros(2, 2, dtype=flow.float64)
    if r in (1, 3):
        dist.all_gather_into_tensor(out, t, group=odd)
        close(out, np.stack([data(1, (2,)), data(3, (2,))]), 0)
        dist.reduce(t, dst=3, group=odd)
        close(t, data(1, (2,)) + data(3, (2,)) if r == 3 else data(r, (2,)))
dist.barrier()
dist.barrier(timeout=datetime.timedelta(seconds=60))
assert dist.barrier(async_op=True).wait()
raises(TypeError, dist.all_reduce, t_(data(r, (2,))), group="world", match="ProcessGroup")

dist.destroy_process_group()
assert not dist.is_initialized()
raises(ValueError, dist.get_backend, match="has not been initialized")
dist.init_process_group("mpi", init_method="env://", world_size=n, rank=r)
assert dist.get_backend() == "mpi"
dist.destroy_process_group()
print(f"torch-style collectives OK on {n} ranks", flush=True)
