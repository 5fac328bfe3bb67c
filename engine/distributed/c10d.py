"""torch.distributed's module-level API (c10d) on the engine's MPI / NCCL process layer.

A training script written for `torch.distributed` runs on the engine with its imports changed
(`from engine.distributed import init_process_group, all_reduce, ...`): the same functions, the
same arguments, the same in-place results on LOCAL tensors (one tensor per rank, no placement).
Everything is built on engine.distributed.comm: `comm` moves the bytes (MPI for numpy arrays,
NCCL for CuPy arrays), this module adds torch's calling conventions on top.

How the process group comes to be, and why it differs from torch:

* The rendezvous is MPI's. mpiexec, or `python -m engine.distributed.launch` (which runs
  mpiexec), starts the processes and MPI numbers them; `init_process_group` only checks that
  what the script was told agrees with MPI. RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE
  (the torchrun variables; the engine's launcher sets them too), `world_size=` and `rank=`
  must match MPI's numbers when given, else a RuntimeError says so. MASTER_ADDR / MASTER_PORT
  and a `tcp://` or `file://` init_method have nothing to do here and are not read: MPI has
  already connected the processes. Processes started by torchrun are independent programs
  that cannot form one MPI job: each sees a world of one, which contradicts WORLD_SIZE, and
  init_process_group refuses with an error naming the launchers to use instead.
* backend 'gloo' and 'mpi' both mean MPI on the CPU; 'nccl' needs CUDA (CuPy) and refuses
  without it. Tensors choose their transport themselves: numpy arrays go over MPI, CuPy arrays
  over NCCL, whatever the backend string says (torch's "cpu:gloo,cuda:nccl" in effect).
* `get_rank()`, `get_world_size()`, `barrier()` and the collectives work before
  init_process_group (MPI starts on first use, world of one without mpiexec): the engine's own
  code relies on that. torch raises ValueError there.
* Synchronous all_reduce and broadcast return their tensor (torch returns None): the engine's
  callers chain on it, torch-style callers ignore the value.
* `timeout=` of init_process_group and new_group is accepted and not enforced: MPI collectives
  block without a deadline. A rank that fails aborts the whole job instead (comm's
  abort-on-exception), so a peer's error never turns into a silent hang. barrier(timeout=)
  and Work.wait(timeout=) do enforce theirs.

Asynchronous ops (`async_op=True`) return a `Work`: all_reduce on a contiguous CPU buffer whose
dtype MPI can reduce is a true non-blocking MPI_Iallreduce (DistributedDataParallel overlaps its
gradient buckets with backward this way), as are barrier and isend/irecv; the others complete
before returning and their Work is already done, which torch's contract allows (results are
guaranteed only after wait()).
"""
import datetime
import enum
import importlib.util
import os

import numpy as np

from ..backend import is_cuda_available
from . import comm
from .waiting import wait, wait_until

__all__ = [
    "ReduceOp", "Work", "group", "GroupMember", "init_process_group", "destroy_process_group",
    "is_initialized", "is_available", "is_mpi_available", "is_gloo_available", "is_nccl_available",
    "get_rank", "get_world_size", "get_backend", "new_group", "barrier", "all_reduce", "broadcast",
    "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "reduce", "gather", "scatter",
    "send", "recv", "isend", "irecv", "all_gather_object", "broadcast_object_list",
]


class ReduceOp(enum.Enum):
    """torch.distributed.ReduceOp. The engine's own calls pass the strings ('sum', 'max', ...):
    both are accepted everywhere a reduction is named."""

    SUM = "sum"
    AVG = "avg"
    PRODUCT = "prod"
    MIN = "min"
    MAX = "max"


_OP_NAMES = {op.value: op for op in ReduceOp}


def _reduce_op(op):
    """(comm's op name, whether to divide by the group size afterwards) for a ReduceOp or name."""
    if isinstance(op, str) and op in _OP_NAMES:
        op = _OP_NAMES[op]
    if not isinstance(op, ReduceOp):
        raise ValueError(f"unsupported reduction op {op!r}; expected a ReduceOp (SUM, AVG, PRODUCT, MIN, MAX)")
    if op is ReduceOp.AVG:
        return "sum", True
    return op.value, False


# ---------------------------------------------------------------------------- Work
class Work:
    """The handle of an `async_op=True` call (torch.distributed.Work).

    `wait()` blocks until the operation is done, then runs its finishing step (AVG's division,
    copying results into the caller's tensors) once, and returns True. `request` is anything
    with `Wait()`/`Test()` (an MPI request) or `wait()`/`is_completed()` (comm's Request); None
    for an operation that completed before the Work was made.
    """

    def __init__(self, request=None, finish=None, result=(), keep=None):
        self._request = request
        self._finish = finish
        self._result = list(result)
        self._keep = keep  # buffers that must outlive a non-blocking transfer
        self._done = request is None
        if self._done and finish is not None:
            finish()

    def _test(self):
        r = self._request
        return r.is_completed() if hasattr(r, "is_completed") else bool(r.Test())

    def _complete(self):
        self._done = True
        self._request = self._keep = None
        if self._finish is not None:
            self._finish()

    def is_completed(self):
        if not self._done and self._test():
            self._complete()
        return self._done

    def wait(self, timeout=None):
        """Block until done; with `timeout` (a timedelta or seconds) raise RuntimeError when it
        passes first."""
        if self._done:
            return True
        if timeout is not None:
            limit = _seconds(timeout)
            if not wait_until(self._test, limit):
                raise RuntimeError(f"Work.wait: the operation did not complete within {limit:g}s")
        elif hasattr(self._request, "wait"):
            self._request.wait()
        else:
            wait(self._request)  # without spinning a core (engine.distributed.waiting)
        self._complete()
        return True

    def is_success(self):
        return self.is_completed()

    def exception(self):
        return None

    def result(self):
        """The tensors the operation wrote (torch's Work.result())."""
        self.wait()
        return list(self._result)


def _seconds(timeout):
    return timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)


# ---------------------------------------------------------------------- the default group
class _Default:
    """What init_process_group set up (None fields: not initialised)."""

    backend = None
    timeout = None
    group_name = ""


_default = _Default()

_BACKENDS = ("gloo", "mpi", "nccl")
_TORCH_ONLY_BACKENDS = ("ucc", "xccl", "hccl", "fake")


def _parse_backend(backend):
    """The lower-case backend string, validated: 'gloo', 'mpi', 'nccl' or a 'cpu:gloo,cuda:nccl'
    device map. 'nccl' anywhere needs CUDA."""
    if backend is None:
        return "cpu:gloo,cuda:nccl" if is_cuda_available() else "gloo"
    if not isinstance(backend, str):
        raise TypeError(f"init_process_group: backend must be a string, got {type(backend).__name__}")
    text = backend.strip().lower()
    names = [part.split(":", 1)[-1] for part in text.split(",")] if ":" in text else [text]
    for name in names:
        if name in _TORCH_ONLY_BACKENDS:
            raise NotImplementedError(
                f"backend {name!r} is not available in the engine: use 'gloo' or 'mpi' (MPI on the CPU) "
                "or 'nccl' (CUDA)")
        if name not in _BACKENDS:
            raise AssertionError(f"Unknown backend type {name}")  # torch's exception and message
    if "nccl" in names and not is_cuda_available():
        raise RuntimeError(
            f"backend {backend!r}: NCCL needs a CUDA GPU and CuPy, and none is usable here; "
            "use backend='gloo' (or 'mpi') on the CPU")
    return text


def _env_int(name):
    value = os.environ.get(name)
    if value is None or not value.strip():
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


def _check_against_mpi(world, world_size, rank):
    """RuntimeError when the arguments or the torchrun variables contradict MPI's numbering."""
    told = [("world_size=", world_size if world_size != -1 else None, world.size),
            ("rank=", rank if rank != -1 else None, world.rank)]
    told += [(f"{v}=", _env_int(v), mine) for v, mine in (
        ("WORLD_SIZE", world.size), ("RANK", world.rank),
        ("LOCAL_WORLD_SIZE", comm.get_local_world_size()), ("LOCAL_RANK", comm.get_local_rank()))]
    bad = [f"{name}{value} (MPI: {mine})" for name, value, mine in told if value is not None and value != mine]
    if bad:
        raise RuntimeError(
            f"init_process_group: {', '.join(bad)} disagree with MPI, which started {world.size} "
            f"process(es) and numbered this one {world.rank}. The ranks come from MPI: launch with "
            "`python -m engine.distributed.launch --nproc-per-node N script.py` or `mpiexec -n N "
            "python script.py`; processes started by torchrun cannot join one MPI job.")


def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1, store=None,
                       group_name="", pg_options=None, device_id=None):
    """Set up the default process group: the MPI world, checked against what the script was told.

    See the module docstring for how each argument is read; `store` and `pg_options` (torch's
    own rendezvous store and backend options) do not exist here and raise NotImplementedError.
    `device_id` (a CUDA device) makes that device current, as torch binds the group to it.
    """
    if _default.backend is not None:
        raise ValueError("trying to initialize the default process group twice!")
    if store is not None:
        raise NotImplementedError("init_process_group: store= is not supported: the rendezvous is MPI's "
                                  "(launch with mpiexec or python -m engine.distributed.launch)")
    if pg_options is not None:
        raise NotImplementedError("init_process_group: pg_options= is not supported")
    if init_method is not None:
        scheme = str(init_method).split("://", 1)[0] + "://" if "://" in str(init_method) else str(init_method)
        if scheme not in ("env://", "tcp://", "file://"):
            raise RuntimeError(f"No rendezvous handler for {scheme}")
    name = _parse_backend(backend)
    world = comm.init()
    _check_against_mpi(world, int(world_size), int(rank))
    if device_id is not None:
        _use_device(device_id)
    _default.backend, _default.timeout, _default.group_name = name, timeout, group_name


def _use_device(device_id):
    from ..backend import as_device, cupy

    dev = as_device(device_id)
    if dev.type == "cuda":
        cupy().cuda.Device(dev.index).use()


def destroy_process_group(group=None):
    """Forget the default group (init_process_group may be called again). MPI itself stays up:
    it cannot be restarted in a process, and the engine's meshes share its communicators, which is
    also why a single sub-group cannot be destroyed (NotImplementedError)."""
    if group is not None and group is not comm.get_world_group():
        raise NotImplementedError("destroy_process_group(group): sub-groups are shared with the engine's "
                                  "meshes and live until the end of the job")
    _default.backend, _default.timeout, _default.group_name = None, None, ""


def is_initialized():
    """Whether init_process_group has been called (and destroy_process_group not since)."""
    return _default.backend is not None


def is_available():
    return is_mpi_available()


def is_mpi_available():
    return importlib.util.find_spec("mpi4py") is not None


def is_gloo_available():
    """'gloo' is served by MPI."""
    return is_mpi_available()


def is_nccl_available():
    return is_cuda_available()


def get_backend(group=None):
    """The backend string given to init_process_group ('gloo', 'mpi', 'nccl', or a device map)."""
    if _default.backend is None:
        raise ValueError("Default process group has not been initialized, please make sure to call "
                         "init_process_group.")
    _group(group)
    return _default.backend


class _GroupNamespace:
    """`group.WORLD` (torch.distributed.group) and `GroupMember.WORLD`: the world group."""

    NON_GROUP_MEMBER = None

    @property
    def WORLD(self):
        return comm.get_world_group()


group = GroupMember = _GroupNamespace()


def _group(g):
    if g is None:
        return comm.get_world_group()
    if not isinstance(g, comm.ProcessGroup):
        raise TypeError(f"group must be a ProcessGroup from new_group() (or None), got {type(g).__name__}")
    return g


def get_rank(group=None):
    """This process's rank in `group` (the world by default); -1 when it is not a member."""
    return _group(group).rank


def get_world_size(group=None):
    """The number of processes in `group`; -1 when this process is not a member (as torch)."""
    g = _group(group)
    return g.size if g.rank >= 0 else -1


def new_group(ranks=None, timeout=None, backend=None, pg_options=None, use_local_synchronization=False,
              group_desc=None, device_id=None, sort_ranks=True):
    """The group of global `ranks` (all ranks when None), sorted unless `sort_ranks=False`.

    Creation talks only to the members (comm.new_group), so it works whether or not
    non-members call it too (`use_local_synchronization` either way). Groups are cached by
    their ranks: asking twice returns the same group.
    """
    if pg_options is not None:
        raise NotImplementedError("new_group: pg_options= is not supported")
    if backend is not None:
        _parse_backend(backend)
    world = comm.get_world_group()
    ranks = list(world.ranks) if ranks is None else [int(r) for r in ranks]
    if len(ranks) > world.size:
        raise ValueError("the new group's world size should be less or equal to the world size set by "
                         "init_process_group")
    return comm.new_group(sorted(ranks) if sort_ranks else ranks)


# ------------------------------------------------------------------------- helpers
def _array(t, what="tensor"):
    """The local array of an engine Tensor (or an array as is); global tensors are refused."""
    if getattr(t, "_global", None) is not None:
        raise TypeError(f"{what}: torch.distributed collectives take local tensors; this one is global "
                        "(its placement and SBP already define its communication: use to_global / to_local)")
    data = getattr(t, "_data", None)
    if data is not None:
        return data
    if hasattr(t, "dtype") and hasattr(t, "shape") and hasattr(t, "reshape"):
        return t
    raise TypeError(f"Invalid function argument. Expected parameter `{what}` of type Tensor, "
                    f"got {type(t).__name__}")


def _written(t):
    """Note an in-place write into `t` (saved-tensor checks see it)."""
    if hasattr(t, "_bump_version"):
        t._bump_version()


def _divide(arr, n):
    """AVG's division, in place: true division for floats, truncation toward zero for integers
    (what NCCL's average does on integer types)."""
    if arr.dtype.kind in "iu":
        q = np.abs(arr) // n if arr.dtype.kind == "i" else arr // n
        arr[...] = q * np.sign(arr) if arr.dtype.kind == "i" else q
    else:
        arr /= n


def _member(g):
    """Whether this rank takes part (torch: non-members return at once)."""
    return g.rank >= 0


def _root(g, rank, group_rank, what):
    """The group rank of the root given as a global `rank` or a `group_rank`."""
    if rank is None and group_rank is None:
        raise ValueError("Must specify global_rank or group_rank")
    if rank is not None and group_rank is not None:
        raise ValueError(f"{what}: give the global rank or the group rank, not both")
    if group_rank is not None:
        if not 0 <= int(group_rank) < g.size:
            raise ValueError(f"{what}: group rank {group_rank} is not in [0, {g.size})")
        return int(group_rank)
    return g.group_rank(int(rank))


def _done(async_op, result):
    return Work(result=result) if async_op else None


def _mpi_cpu(arr):
    """Whether `arr` travels over MPI (a numpy array; CuPy arrays go through NCCL)."""
    return isinstance(arr, np.ndarray)


# --------------------------------------------------------------------- collectives
def barrier(group=None, async_op=False, device_ids=None, timeout=None):
    """Wait until every member of `group` has reached the barrier (`timeout` enforced)."""
    g = _group(group)
    if not _member(g):
        return None
    if g.size == 1:
        return _done(async_op, ())
    if not async_op and timeout is None:
        g.comm.Barrier()
        return None
    work = Work(g.comm.Ibarrier())
    if async_op:
        return work
    work.wait(timeout)
    return None


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
    """Reduce `tensor` over `group`, in place on every member. Returns `tensor` (a Work with
    async_op=True)."""
    arr = _array(tensor)
    name, average = _reduce_op(op)
    g = _group(group)
    if not _member(g):
        return _done(async_op, ()) if async_op else tensor
    finish = (lambda: (_divide(arr, g.size), _written(tensor))) if average else None
    if async_op and g.size > 1 and _mpi_cpu(arr) and arr.flags.c_contiguous:
        work_dt, mpi_t, mpi_op = comm._reduce_args(arr, name)
        if work_dt == arr.dtype:  # MPI reduces this dtype natively: a true non-blocking all-reduce
            request = g.comm.Iallreduce(comm.MPI.IN_PLACE, [arr, mpi_t], mpi_op)
            comm.stats.record("all_reduce", 2 * (g.size - 1) * arr.nbytes // g.size)
            _written(tensor)
            return Work(request, finish=finish, result=[tensor], keep=arr)
    comm.all_reduce(tensor, name, g)
    if async_op:
        return Work(finish=finish, result=[tensor])
    if finish is not None:
        finish()
    return tensor


def broadcast(tensor, src=None, group=None, async_op=False, group_src=None):
    """Copy `tensor` from rank `src` (global) or `group_src` (in the group) to every member, in place.
    Returns `tensor` (a Work with async_op=True)."""
    _array(tensor)
    g = _group(group)
    root = _root(g, src, group_src, "broadcast")
    if _member(g):
        comm.broadcast(tensor, group=g, group_src=root)
    return _done(async_op, [tensor]) if async_op else tensor


def all_gather(tensor_list, tensor, group=None, async_op=False):
    """Fill `tensor_list[i]` with group rank i's `tensor` (all of one shape and dtype)."""
    arr = _array(tensor)
    g = _group(group)
    if not _member(g):
        return _done(async_op, ())
    if len(tensor_list) != g.size:
        raise RuntimeError(f"all_gather: invalid output tensor list (expected length {g.size}, "
                           f"got {len(tensor_list)})")
    outs = [_array(t, "tensor_list") for t in tensor_list]
    for i, o in enumerate(outs):
        if o.dtype != arr.dtype:
            raise ValueError(f"Invalid usage of tensors with different dtypes: tensor_list[{i}] is {o.dtype}, "
                             f"tensor is {arr.dtype}")
        if o.shape != arr.shape:
            raise RuntimeError(f"all_gather: invalid tensor size at index {i} (expected {tuple(arr.shape)}, "
                               f"got {tuple(o.shape)})")
    parts = comm.all_gather_into_list(arr, g)
    for t, o, part in zip(tensor_list, outs, parts):
        o[...] = part
        _written(t)
    return _done(async_op, tensor_list)


def _stacked_or_concatenated(big, small, n, what):
    """How `big` holds n pieces of `small`'s shape: stacked (n, *shape) or concatenated along
    dim 0 (n * d0, *rest). RuntimeError when it is neither."""
    if big.shape == (n,) + small.shape:
        return "stacked"
    if small.ndim and big.shape == (n * small.shape[0],) + small.shape[1:]:
        return "concatenated"
    raise RuntimeError(f"{what}: a tensor of shape {tuple(big.shape)} holds neither a stack nor a concatenation "
                       f"along dim 0 of {n} tensors of shape {tuple(small.shape)}")


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    """Every member's `input_tensor` gathered into `output_tensor`, concatenated along dim 0
    (shape (n * d0, ...)) or stacked (shape (n, *input.shape))."""
    out, arr = _array(output_tensor, "output_tensor"), _array(input_tensor, "input_tensor")
    g = _group(group)
    if not _member(g):
        return _done(async_op, ())
    if out.dtype != arr.dtype:
        raise ValueError(f"Invalid usage of tensors with different dtypes: output {out.dtype}, input {arr.dtype}")
    layout = _stacked_or_concatenated(out, arr, g.size, "all_gather_into_tensor")
    if layout == "stacked":
        arr = arr.reshape((1,) + arr.shape)
    comm.all_gather(arr, g, axis=0, sizes=[arr.shape[0]] * g.size, out=out)
    _written(output_tensor)
    return _done(async_op, [output_tensor])


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op=False):
    """Reduce `input` (the concatenation or stack of one chunk per member) over the group and
    write this member's chunk into `output`."""
    out, arr = _array(output, "output"), _array(input, "input")
    name, average = _reduce_op(op)
    g = _group(group)
    if not _member(g):
        return _done(async_op, ())
    if out.dtype != arr.dtype:
        raise ValueError(f"Invalid usage of tensors with different dtypes: output {out.dtype}, input {arr.dtype}")
    _stacked_or_concatenated(arr, out, g.size, "reduce_scatter_tensor")
    rows = arr.reshape(g.size, out.size)
    chunk = comm.reduce_scatter(rows, g, axis=0, op=name)
    out[...] = chunk.reshape(out.shape)
    if average:
        _divide(out, g.size)
    _written(output)
    return _done(async_op, [output])


def reduce(tensor, dst=None, op=ReduceOp.SUM, group=None, async_op=False, group_dst=None):
    """Reduce `tensor` over the group into rank `dst`'s `tensor` (others' are left unchanged)."""
    arr = _array(tensor)
    name, average = _reduce_op(op)
    g = _group(group)
    root = _root(g, dst, group_dst, "reduce")
    if not _member(g) or g.size == 1:
        return _done(async_op, [tensor])
    if _mpi_cpu(arr):
        work_dt, mpi_t, mpi_op = comm._reduce_args(arr, name)
        src = np.ascontiguousarray(arr, dtype=work_dt)
        res = np.empty_like(src) if g.rank == root else None
        g.comm.Reduce([src, mpi_t], [res, mpi_t] if res is not None else None, mpi_op, root=root)
        comm.stats.record("reduce", src.nbytes)
    else:  # CUDA: an all-reduce of a copy (NCCL's reduce is not exposed by comm)
        res = comm.all_reduce(arr.copy(), name, g)
    if g.rank == root:
        arr[...] = res
        if average:
            _divide(arr, g.size)
        _written(tensor)
    return _done(async_op, [tensor])


def _check_list(tensors, arr, n, what, name):
    if len(tensors) != n:
        raise RuntimeError(f"{what}: Incorrect {name} size {len(tensors)}. It should be {n}, "
                           "the size of the process group.")
    arrays = [_array(t, name) for t in tensors]
    for i, a in enumerate(arrays):
        if a.shape != arr.shape or a.dtype != arr.dtype:
            raise RuntimeError(f"{what}: {name}[{i}] has shape {tuple(a.shape)} and dtype {a.dtype}, expected "
                               f"{tuple(arr.shape)} and {arr.dtype}")
    return arrays


def gather(tensor, gather_list=None, dst=None, group=None, async_op=False, group_dst=None):
    """Every member's `tensor` into `gather_list` on rank `dst` (given there only)."""
    arr = _array(tensor)
    g = _group(group)
    root = _root(g, dst, group_dst, "gather")
    if not _member(g):
        return _done(async_op, ())
    if g.rank == root:
        if not gather_list:
            raise ValueError("Argument ``gather_list`` must be specified on destination rank.")
        outs = _check_list(gather_list, arr, g.size, "gather", "gather_list")
    elif gather_list:
        raise ValueError("Argument ``gather_list`` must NOT be specified on non-destination ranks.")
    if g.size == 1:
        parts = [arr]
    elif _mpi_cpu(arr):
        src = np.ascontiguousarray(arr)
        buf = np.empty((g.size,) + arr.shape, arr.dtype) if g.rank == root else None
        g.comm.Gather(comm._mpi_raw(src), comm._mpi_raw(buf) if buf is not None else None, root=root)
        comm.stats.record("gather", src.nbytes if g.rank != root else 0)
        parts = buf
    else:  # CUDA: NCCL has no gather; every rank receives all pieces
        parts = comm.all_gather_into_list(arr, g)
    if g.rank == root:
        for t, o, part in zip(gather_list, outs, parts):
            o[...] = getattr(part, "_data", part)
            _written(t)
    return _done(async_op, list(gather_list or ()))


def scatter(tensor, scatter_list=None, src=None, group=None, async_op=False, group_src=None):
    """Member i's `tensor` receives `scatter_list[i]` of rank `src` (the list is given there only)."""
    arr = _array(tensor)
    g = _group(group)
    root = _root(g, src, group_src, "scatter")
    if not _member(g):
        return _done(async_op, ())
    if g.rank == root:
        if not scatter_list:
            raise ValueError("Argument ``scatter_list`` must be specified on source rank.")
        ins = _check_list(scatter_list, arr, g.size, "scatter", "scatter_list")
    elif scatter_list:
        raise ValueError("Argument ``scatter_list`` must NOT be specified on non-source ranks.")
    if g.size == 1:
        arr[...] = ins[0]
    elif _mpi_cpu(arr):
        send = np.stack([np.ascontiguousarray(a) for a in ins]) if g.rank == root else None
        buf = np.empty(arr.shape, arr.dtype)
        g.comm.Scatter(comm._mpi_raw(send) if send is not None else None, comm._mpi_raw(buf), root=root)
        comm.stats.record("scatter", (send.nbytes - buf.nbytes) if send is not None else 0)
        arr[...] = buf
    elif g.rank == root:  # CUDA: point to point from the root
        for r in range(g.size):
            if r != root:
                comm.send(ins[r], g.ranks[r], group=g)
        arr[...] = ins[root]
    else:
        comm.recv(arr, g.ranks[root], group=g)
    _written(tensor)
    return _done(async_op, [tensor])


# --------------------------------------------------------------------- point to point
def _peer(g, rank, group_rank, what):
    """The global rank of the peer given as a global rank or a group rank."""
    return g.ranks[_root(g, rank, group_rank, what)]


def _check_not_self(g, peer, what):
    if peer == g.ranks[g.rank]:
        raise ValueError(f"Invalid {what} rank: {what} rank should not be the same as the rank of the "
                         "current process.")


def send(tensor, dst=None, group=None, tag=0, group_dst=None):
    """Blocking send of `tensor` to rank `dst`."""
    _array(tensor)
    g = _group(group)
    peer = _peer(g, dst, group_dst, "send")
    if _member(g):
        _check_not_self(g, peer, "destination")
        comm.send(tensor, peer, tag=tag, group=g)


def recv(tensor, src=None, group=None, tag=0, group_src=None):
    """Blocking receive into `tensor` from rank `src` (any rank when both src and group_src are
    None). Returns the sender's global rank (-1 for a non-member)."""
    _array(tensor)
    g = _group(group)
    if not _member(g):
        return -1
    if src is None and group_src is None:
        status = comm.MPI.Status()
        g.comm.Probe(source=comm.MPI.ANY_SOURCE, tag=tag, status=status)
        peer = g.ranks[status.Get_source()]
    else:
        peer = _peer(g, src, group_src, "recv")
        _check_not_self(g, peer, "source")
    comm.recv(tensor, peer, tag=tag, group=g)
    return peer


def isend(tensor, dst=None, group=None, tag=0, group_dst=None):
    """Non-blocking send; returns a Work (do not modify `tensor` before wait())."""
    _array(tensor)
    g = _group(group)
    peer = _peer(g, dst, group_dst, "isend")
    if not _member(g):
        return None
    _check_not_self(g, peer, "destination")
    return Work(comm.isend(tensor, peer, tag=tag, group=g), result=[tensor])


def irecv(tensor, src=None, group=None, tag=0, group_src=None):
    """Non-blocking receive into `tensor` (from any rank when src and group_src are None)."""
    _array(tensor)
    g = _group(group)
    if not _member(g):
        return None
    peer = None if src is None and group_src is None else _peer(g, src, group_src, "irecv")
    if peer is not None:
        _check_not_self(g, peer, "source")
    return Work(comm.irecv(tensor, peer, tag=tag, group=g), result=[tensor])


# --------------------------------------------------------------------- Python objects
def all_gather_object(object_list, obj, group=None):
    """`object_list[i]` = group rank i's `obj` (picklable objects, as torch)."""
    g = _group(group)
    if not _member(g):
        return
    if len(object_list) < g.size:
        raise IndexError(f"all_gather_object: object_list has {len(object_list)} entries; it must have one per "
                         f"rank of the group ({g.size})")
    for i, o in enumerate(g.comm.allgather(obj)):
        object_list[i] = o


def broadcast_object_list(object_list, src=None, group=None, device=None, group_src=None):
    """Replace the entries of `object_list` by those of rank `src`'s list (same length everywhere)."""
    g = _group(group)
    root = _root(g, src, group_src, "broadcast_object_list")
    if not _member(g):
        return
    objs = g.comm.bcast(list(object_list) if g.rank == root else None, root=root)
    if len(objs) != len(object_list):
        raise ValueError(f"broadcast_object_list: rank {get_rank()} has a list of {len(object_list)} objects, "
                         f"the source's has {len(objs)}")
    object_list[:] = objs


def all_gather_either(tensor_list, *args, **kwargs):
    """engine.distributed.all_gather: torch's form and the engine's, told apart by the first argument.

    `all_gather(tensor_list, tensor, group=None, async_op=False)` (a list first) is torch's:
    fill the list in place. `all_gather(tensor, group=None, axis=0, sizes=None, out=None)` (a
    tensor or array first) is the engine's comm.all_gather: return the concatenation along
    `axis`, extents may differ. Both live under one name because scripts written for torch and
    the engine's own callers (libai) both call engine.distributed.all_gather.
    """
    if isinstance(tensor_list, list):
        return all_gather(tensor_list, *args, **kwargs)
    return comm.all_gather(tensor_list, *args, **kwargs)
