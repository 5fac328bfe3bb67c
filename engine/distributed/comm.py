"""Processes and collectives on local tensors: MPI (mpi4py) on the CPU, NCCL (CuPy) on CUDA.

This is the only module of `engine.distributed` that talks to other processes. Everything above
it (placements, SBP, boxing, global tensors) expresses data movement with the handful of
collectives defined here, so the transport can be reasoned about, measured and tested in one
place.

Design choices, and why:

* MPI is initialised lazily, on the first call that needs it. Importing `engine.distributed`
  therefore costs nothing for single-process users, and a plain `python script.py` (no mpiexec)
  still works: MPI starts as a singleton, world size 1, and every collective is an identity or
  a copy.
* Only mpi4py's upper-case (buffer) methods are used on the hot path: numpy arrays go straight
  to MPI without pickling. Data *movement* sends every dtype as same-width unsigned integers
  (bfloat16 becomes raw uint16), so dtypes MPI has no name for travel unchanged; *reductions*
  use the real MPI type, upcasting float16/bfloat16 to float32 for the arithmetic (MPI has no
  half-precision sum, and summing in float32 is what one wants anyway).
* Collectives along an axis move that axis to the front and make the array contiguous, so each
  rank's chunk is one contiguous slab and a single Allgatherv / Reduce_scatter / Alltoallv does
  the whole job. Uneven extents use the balanced split of `split_sizes` (5 over 4 -> 2,1,1,1).
* Groups are MPI sub-communicators made with `Comm.Create_group`, which is collective over the
  *members* only: non-members do no communication, so a rank outside a mesh never blocks on it.
  Every rank must still create groups in the same order (as in torch.distributed).
* Ranks given to collectives (`src`, `dst`) are global ranks, as in torch.distributed.
* `stats` counts the bytes this rank sends, with the textbook amounts of the algorithms (ring
  all-reduce sends 2(n-1)/n of the buffer), so tests and benchmarks can check communication
  volume of a parallel layout independently of how MPI implements it.
* A rank that raises must bring the whole job down, never leave its peers waiting in a
  collective forever: `install_abort_on_exception` turns an uncaught exception into a printed,
  rank-tagged traceback and `MPI_Abort`.

CUDA arrays (cupy) go through nccl.py's `NcclBackend`; the CPU path never imports CuPy.
These functions do not record autograd history: they move data. Differentiable redistribution
is built on top of them (engine.distributed.boxing).
"""
import contextlib
import math
import os
import sys
import threading
import traceback

import numpy as np

from .. import backend
from ..backend import dtypes as _dtypes
from . import nccl
from .sbp import balanced_sizes
from .transport import CommStats, Request, offsets as _offsets, stats
from .waiting import PoliteComm, polite

__all__ = [
    "init", "is_initialized", "get_rank", "get_world_size", "get_local_rank", "get_local_world_size",
    "barrier", "ProcessGroup", "new_group", "get_world_group", "mesh_axis_groups", "split_sizes",
    "all_reduce", "all_gather", "all_gather_into_list", "reduce_scatter", "broadcast", "all_to_all",
    "send", "recv", "isend", "irecv", "Request", "CommStats", "stats", "install_abort_on_exception",
]

MPI = None          # the mpi4py.MPI module, once initialised
_world = None       # ProcessGroup over COMM_WORLD
_local = (0, 1)     # (local rank, local world size)
_init_lock = threading.Lock()


# ----------------------------------------------------------------------------------- setup
def init():
    """Initialise MPI (idempotent). Called implicitly by everything that needs the world.

    Importing mpi4py calls MPI_Init (with MPI_THREAD_MULTIPLE). Without mpiexec MPICH starts a
    singleton: world size 1. With more than one process the abort-on-exception hook is
    installed, so that an error on one rank ends the job instead of hanging the others.
    """
    global MPI, _world, _local
    if _world is not None:
        return _world
    with _init_lock:
        if _world is not None:
            return _world
        from mpi4py import MPI as _MPI

        MPI = _MPI
        _mpi_tables()
        cw = MPI.COMM_WORLD
        node = cw.Split_type(MPI.COMM_TYPE_SHARED)
        _local = (node.Get_rank(), node.Get_size())
        node.Free()
        _world = ProcessGroup(list(range(cw.Get_size())), cw)
        if cw.Get_size() > 1:
            install_abort_on_exception()
    return _world


def is_initialized():
    """Whether MPI has been started by this module (it starts on first use)."""
    return _world is not None


def get_world_group():
    return init()


def get_rank():
    return init().rank


def get_world_size():
    return init().size


def get_local_rank():
    """Rank among the processes on this host (shared-memory node), e.g. the GPU to use."""
    init()
    return _local[0]


def get_local_world_size():
    init()
    return _local[1]


def _group(group):
    return init() if group is None else group


def barrier(group=None):
    g = _group(group)
    if g.size > 1 and g.comm is not None:
        g.comm.Barrier()


# ---------------------------------------------------------------------- failure handling
_hook_installed = False


def _abort_with_traceback(exc_type, exc, tb, where=""):
    """Print the traceback with every line tagged by the rank, flush, and abort all ranks."""
    rank = MPI.COMM_WORLD.Get_rank() if MPI is not None else 0
    lines = "".join(traceback.format_exception(exc_type, exc, tb)).rstrip("\n").split("\n")
    prefix = f"[rank {rank}] "
    msg = "\n".join(prefix + line for line in lines)
    if where:
        msg = f"{prefix}uncaught exception in {where}\n" + msg
    try:
        sys.stdout.flush()
    except Exception:
        pass
    try:
        sys.stderr.write(msg + "\n")
        sys.stderr.flush()
    except Exception:
        pass
    if MPI is not None:
        wait_for_output_forwarded()
        MPI.COMM_WORLD.Abort(1)
    os._exit(1)


def wait_for_output_forwarded(fds=(1, 2), timeout=3.0):
    """Wait until the launcher has read what this rank wrote to its stdout/stderr pipes.

    mpiexec's proxy reads a rank's output asynchronously and handles an MPI_Abort as soon as it
    arrives: under load it tore the job down with the failing rank's traceback still unread in
    the pipe (measured: 10 tracebacks lost in 75 aborts with 4 jobs running at once). A fixed
    sleep only makes that rarer; asking the pipe how many bytes are still unread (FIONREAD)
    waits exactly as long as needed. Output to a file or terminal needs no waiting.
    """
    import fcntl
    import stat
    import struct
    import termios
    import time

    pipes = []
    for fd in fds:
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                pipes.append(fd)
        except OSError:
            pass
    deadline = time.monotonic() + timeout
    buf = bytearray(struct.calcsize("i"))
    while pipes and time.monotonic() < deadline:
        try:
            pipes = [fd for fd in pipes if fcntl.ioctl(fd, termios.FIONREAD, buf) == 0
                     and struct.unpack("i", buf)[0] > 0]
        except OSError:
            return
        if pipes:
            time.sleep(0.005)


def install_abort_on_exception():
    """Make any uncaught exception (main thread or other threads) abort the whole MPI job.

    Without it a rank that dies leaves the others blocked in their next collective forever.
    With it mpiexec tears every rank down within about a second and exits non-zero, and the
    failing rank's traceback is on stderr, each line prefixed with `[rank R]`.
    """
    global _hook_installed
    if _hook_installed:
        return
    _hook_installed = True

    def excepthook(exc_type, exc, tb):
        _abort_with_traceback(exc_type, exc, tb)

    def thread_hook(args):
        if args.exc_type is SystemExit:
            return
        _abort_with_traceback(args.exc_type, args.exc_value, args.exc_traceback,
                              where=f"thread {args.thread.name if args.thread else '?'}")

    sys.excepthook = excepthook
    threading.excepthook = thread_hook


# ---------------------------------------------------------------------------- groups
_metadata = threading.local()


@contextlib.contextmanager
def metadata_exchange():
    """MPI calls made inside only agree on host metadata (shapes, placements, SBP), which stays
    the same at every replay of a CUDA graph: they are allowed inside a capture (NoMPIInCapture)."""
    before = getattr(_metadata, "on", False)
    _metadata.on = True
    try:
        yield
    finally:
        _metadata.on = before


class NoMPIInCapture:
    """An MPI communicator that refuses to communicate while this process captures a CUDA graph.

    A replay re-runs the captured kernels, NCCL's collectives among them, and never host code: an
    MPI call made during the capture would happen once, at capture, and be missing from every
    replay (stale data, or a peer waiting forever). Local queries (`Get_rank`, `Get_size`, ...)
    and metadata agreement (`metadata_exchange`) stay allowed."""

    __slots__ = ("_comm",)

    def __init__(self, comm):
        self._comm = comm

    def __getattr__(self, name):
        if (backend.capture_state() is not None and not name.startswith("Get_")
                and not getattr(_metadata, "on", False)):
            raise RuntimeError(f"MPI {name} inside a CUDA graph capture: a replay re-runs the captured GPU "
                               "kernels (NCCL collectives included), never host code, so this transfer would be "
                               "missing from every replay; keep MPI communication outside the captured region")
        return getattr(self._comm, name)

    def __repr__(self):
        return f"NoMPIInCapture({self._comm!r})"


class ProcessGroup:
    """An ordered list of global ranks and the MPI communicator connecting them.

    `rank` is this process's index in the group (-1 if it is not a member, in which case
    `comm` is None and collectives on the group must not be called).
    """

    def __init__(self, ranks, comm):
        self.ranks = tuple(int(r) for r in ranks)
        # waits sleep instead of spinning a core (engine.distributed.waiting); no MPI while a CUDA
        # graph is captured
        self.comm = None if comm is None else NoMPIInCapture(PoliteComm(comm) if polite() else comm)
        self.size = len(self.ranks)
        self.rank = comm.Get_rank() if comm is not None else -1
        self._nccl = None  # per-device NCCL communicators, made on first CUDA collective

    def contains(self, rank):
        return rank in self.ranks

    def group_rank(self, global_rank):
        """Index of a global rank inside this group."""
        try:
            return self.ranks.index(global_rank)
        except ValueError:
            raise ValueError(f"rank {global_rank} is not in group {list(self.ranks)}") from None

    def __repr__(self):
        return f"ProcessGroup(ranks={list(self.ranks)}, rank={self.rank})"


_groups = {}
_mesh_groups = {}


def new_group(ranks):
    """The group of `ranks` (global ranks, in this order), cached by the tuple of ranks.

    Creation is collective over the members (`Comm.Create_group`); non-members get a group with
    `rank == -1` without communicating. All ranks must create groups in the same order.
    """
    world = init()
    key = tuple(int(r) for r in ranks)
    if len(set(key)) != len(key) or any(r < 0 or r >= world.size for r in key):
        raise ValueError(f"new_group: ranks must be distinct and in [0, {world.size}), got {list(key)}")
    g = _groups.get(key)
    if g is not None:
        return g
    if key == world.ranks:
        g = world
    elif world.rank in key:
        cw = MPI.COMM_WORLD
        mpi_group = cw.Get_group().Incl(list(key))
        comm = cw.Create_group(mpi_group, tag=_group_tag(key))
        mpi_group.Free()
        g = ProcessGroup(key, comm)
    else:
        g = ProcessGroup(key, None)
    _groups[key] = g
    return g


def _group_tag(key):
    # Distinct tags keep concurrent creations of different groups apart.
    return hash(key) & 0x7FFF


def mesh_axis_groups(mesh, axis):
    """The group of ranks sharing every mesh coordinate with this rank except along `axis`.

    `mesh` is an array of global ranks (e.g. `np.arange(4).reshape(2, 2)`). All the groups of
    that axis are created in C order of the other coordinates, so every rank issues the same
    sequence of creations. Returns None if this rank is not in the mesh. Cached by mesh + axis.
    """
    mesh = np.asarray(mesh, dtype=np.int64)
    axis = axis % mesh.ndim
    key = (mesh.shape, mesh.tobytes(), axis)
    if key in _mesh_groups:
        return _mesh_groups[key]
    mine = None
    lines = np.moveaxis(mesh, axis, -1).reshape(-1, mesh.shape[axis])
    for line in lines:
        g = new_group(line.tolist())
        if g.rank >= 0:
            mine = g
    _mesh_groups[key] = mine
    return mine


# ------------------------------------------------------------------------- array helpers
def _unwrap(x):
    """(array, tensor-or-None): collectives accept engine Tensors or raw arrays."""
    data = getattr(x, "_data", None)
    if data is not None:
        return data, x
    return x, None


def _wrap(arr, like):
    """Return `arr` as the same kind of object as `like` (Tensor or array)."""
    if like is None:
        return arr
    from ..tensor import Tensor

    return Tensor._make(arr, like._device)


def _mark_modified(tensor):
    if tensor is not None and hasattr(tensor, "_bump_version"):
        tensor._bump_version()


def _is_cupy(arr):
    return not isinstance(arr, np.ndarray) and type(arr).__module__.startswith("cupy")


_RAW = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _raw(arr):
    """Same-width unsigned view of a contiguous array, for pure data movement (any dtype)."""
    return arr.view(_RAW[arr.dtype.itemsize])


def host_contiguous(arr):
    """A C-contiguous numpy array with `arr`'s values (a CuPy array is copied to the host): what
    the MPI transfers of host memory (boxing across placements, pipeline handoffs) send."""
    return np.ascontiguousarray(arr if isinstance(arr, np.ndarray) else arr.get())


def _mpi_raw(arr):
    """[buffer, MPI type] for moving a contiguous array: its own MPI type when MPI has one
    (no view to make), else same-width unsigned integers (bfloat16, float16)."""
    mt = _MPI_MOVE.get(arr.dtype)
    if mt is not None:
        return [arr, mt]
    return [_raw(arr), _MPI_RAW[arr.dtype.itemsize]]


_MPI_RAW = {}
_MPI_MOVE = {}
_MPI_REDUCE = {}
_MPI_OPS = {}


def _mpi_tables():
    if _MPI_OPS:
        return
    _MPI_RAW.update({1: MPI.UINT8_T, 2: MPI.UINT16_T, 4: MPI.UINT32_T, 8: MPI.UINT64_T})
    _MPI_REDUCE.update({
        np.dtype(np.float32): MPI.FLOAT, np.dtype(np.float64): MPI.DOUBLE,
        np.dtype(np.int8): MPI.INT8_T, np.dtype(np.int16): MPI.INT16_T,
        np.dtype(np.int32): MPI.INT32_T, np.dtype(np.int64): MPI.INT64_T,
        np.dtype(np.uint8): MPI.UINT8_T, np.dtype(np.uint16): MPI.UINT16_T,
        np.dtype(np.uint32): MPI.UINT32_T, np.dtype(np.uint64): MPI.UINT64_T,
        np.dtype(np.bool_): MPI.C_BOOL,
    })
    _MPI_MOVE.update((dt, t) for dt, t in _MPI_REDUCE.items() if dt != np.bool_)
    _MPI_OPS.update({"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "prod": MPI.PROD})


_UPCAST = (np.dtype(np.float16), _dtypes.bfloat16.np)
_BOOL_OPS = {"sum": "lor", "max": "lor", "min": "land", "prod": "land"}


def _reduce_args(arr, op):
    """(working dtype, MPI datatype, MPI op) for reducing `arr` with `op`."""
    if op not in ("sum", "max", "min", "prod"):
        raise ValueError(f"unsupported reduction op {op!r}; expected 'sum', 'max', 'min' or 'prod'")
    _mpi_tables()
    dt = arr.dtype
    if dt in _UPCAST:
        return np.dtype(np.float32), MPI.FLOAT, _MPI_OPS[op]
    if dt == np.bool_:
        return dt, MPI.C_BOOL, MPI.LOR if _BOOL_OPS[op] == "lor" else MPI.LAND
    try:
        return dt, _MPI_REDUCE[dt], _MPI_OPS[op]
    except KeyError:
        raise TypeError(f"cannot reduce arrays of dtype {dt}") from None


def split_sizes(n, k):
    """Balanced split of n items over k parts: the first n % k parts get one more (5, 4 -> 2,1,1,1)."""
    return balanced_sizes(int(n), int(k))


def _front(arr, axis):
    """`arr` with `axis` moved to the front, C-contiguous (a view when already so)."""
    if axis != 0:
        arr = np.moveaxis(arr, axis, 0)
    return np.ascontiguousarray(arr)


def _back(arr, axis):
    """Inverse of `_front`: the front axis goes back to `axis`, result C-contiguous."""
    if axis == 0:
        return arr
    return np.ascontiguousarray(np.moveaxis(arr, 0, axis))


def _norm_axis(axis, ndim):
    if not -ndim <= axis < max(ndim, 1):
        raise IndexError(f"axis {axis} out of range for a {ndim}-d tensor")
    return axis % ndim if ndim else 0


def _gather_extents(g, n):
    """Every rank's extent `n` (one small Allgather), used when the caller did not give sizes."""
    out = np.empty(g.size, dtype=np.int64)
    g.comm.Allgather([np.array([n], dtype=np.int64), MPI.INT64_T], [out, MPI.INT64_T])
    return out.tolist()


def _check_member(g, what):
    if g.rank < 0:
        raise RuntimeError(f"{what}: rank {get_rank()} is not a member of {g}")


# ------------------------------------------------------------------------- collectives
_flags_on_gpu = None  # whether max_over_world agrees flags with NCCL (decided once per job)


def max_over_world(value):
    """The largest of every rank's `value`: a float, or a 0-d device array (the GradScaler's
    inf/nan flag). In one process `value` itself, as given (MPI is not started for it).

    Flags are agreed on the GPUs (an NCCL max; the result stays a 0-d float32 device array, so
    nothing is read back) when every rank's first flag was a device array, else over MPI on the
    host (a device flag is then read back). That choice is made once, on the first flag, by all
    ranks together: ranks that chose differently would wait in different transports for ever."""
    global _flags_on_gpu
    if _world is None and int(os.environ.get("WORLD_SIZE", os.environ.get("PMI_SIZE", "1"))) == 1:
        return value
    world = init()
    if world.size == 1:
        return value
    if _flags_on_gpu is None:
        _flags_on_gpu = bool(world.comm.allreduce(int(_is_cupy(value)), op=MPI.MIN))
    if not _flags_on_gpu:
        return float(world.comm.allreduce(float(value), op=MPI.MAX))
    if _is_cupy(value):
        flag = value.astype(np.float32).reshape(1)  # a copy: the caller's flag is left as it was
    else:
        from .. import backend
        flag = backend.cupy().full(1, value, dtype=np.float32)
    nccl.backend_for(world, flag).all_reduce(flag, "max")
    return flag.reshape(())


def all_reduce(tensor, op="sum", group=None):
    """Reduce `tensor` over the group, in place on every rank; returns `tensor`."""
    g = _group(group)
    arr, t = _unwrap(tensor)
    if g.size == 1:
        return tensor
    _check_member(g, "all_reduce")
    if _is_cupy(arr):
        nccl.backend_for(g, arr).all_reduce(arr, op)
        _mark_modified(t)
        return tensor
    work_dt, mpi_t, mpi_op = _reduce_args(arr, op)
    if work_dt == arr.dtype and arr.flags.c_contiguous:
        g.comm.Allreduce(MPI.IN_PLACE, [arr, mpi_t], mpi_op)
    else:
        buf = np.ascontiguousarray(arr, dtype=work_dt)  # a copy: arr is strided or needs upcasting
        g.comm.Allreduce(MPI.IN_PLACE, [buf, mpi_t], mpi_op)
        np.copyto(arr, buf, casting="unsafe")
    n = g.size
    stats.record("all_reduce", 2 * (n - 1) * arr.nbytes // n)
    _mark_modified(t)
    return tensor


def all_gather(tensor, group=None, axis=0, sizes=None, out=None):
    """Concatenate every rank's tensor along `axis` (extents along `axis` may differ).

    `sizes` are the per-rank extents along `axis`; when None they are gathered first (one tiny
    extra Allgather, so callers that know the global shape should pass them). `out` (tensor or
    array of the result's shape and dtype) is filled and returned instead of allocating: large
    fresh outputs cost page faults comparable to the transfer itself, so hot loops reuse one.
    Every other dimension must agree across ranks.
    """
    g = _group(group)
    arr, t = _unwrap(tensor)
    if g.size == 1:
        if out is not None:
            _unwrap(out)[0][...] = arr
            return out
        return _wrap(arr.copy(), t)
    _check_member(g, "all_gather")
    axis = _norm_axis(axis, arr.ndim)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if sizes is None:
        sizes = _gather_extents(g, arr.shape[axis])
    sizes = [int(s) for s in sizes]
    if sizes[g.rank] != arr.shape[axis]:
        raise ValueError(f"all_gather: sizes[{g.rank}]={sizes[g.rank]} but the local extent is {arr.shape[axis]}")
    if _is_cupy(arr):
        res = nccl.backend_for(g, arr).all_gather(arr, axis, sizes)
        if out is not None:
            _unwrap(out)[0][...] = res
            return out
        return _wrap(res, t)
    src = _front(arr, axis)
    rest = src.shape[1:]
    inner = math.prod(rest)
    shape = (sum(sizes),) + rest
    out_arr = _unwrap(out)[0] if out is not None else None
    if out_arr is not None and axis == 0 and out_arr.flags.c_contiguous:
        if out_arr.shape != shape or out_arr.dtype != arr.dtype:
            raise ValueError(f"all_gather: out has shape {out_arr.shape} {out_arr.dtype}, expected {shape} {arr.dtype}")
        buf = out_arr
    else:
        buf = np.empty(shape, dtype=arr.dtype)
    if all(s == sizes[0] for s in sizes):
        g.comm.Allgather(_mpi_raw(src), _mpi_raw(buf))
    else:
        counts = [s * inner for s in sizes]
        rbuf, rtype = _mpi_raw(buf)
        g.comm.Allgatherv(_mpi_raw(src), [rbuf, (counts, _offsets(counts)), rtype])
    stats.record("all_gather", src.nbytes * (g.size - 1))
    if out is None:
        return _wrap(_back(buf, axis), t)
    if buf is not out_arr:
        out_arr[...] = np.moveaxis(buf, 0, axis)
    _mark_modified(out)
    return out


def all_gather_into_list(tensor, group=None):
    """Every rank's tensor (all of the same shape), as a list indexed by group rank."""
    g = _group(group)
    arr, t = _unwrap(tensor)
    if g.size == 1:
        return [_wrap(arr.copy(), t)]
    _check_member(g, "all_gather_into_list")
    if _is_cupy(arr):
        out = nccl.backend_for(g, arr).all_gather(arr.reshape((1,) + arr.shape), 0, [1] * g.size)
    else:
        src = np.ascontiguousarray(arr)
        out = np.empty((g.size,) + arr.shape, dtype=arr.dtype)
        g.comm.Allgather(_mpi_raw(src), _mpi_raw(out))
        stats.record("all_gather", src.nbytes * (g.size - 1))
    return [_wrap(out[i], t) for i in range(g.size)]


def reduce_scatter(tensor, group=None, axis=0, op="sum", sizes=None):
    """Reduce over the group, then keep this rank's chunk along `axis`.

    Chunks follow `sizes` (default: the balanced split, first n % k chunks one larger).
    Returns a new tensor; the input is unchanged.
    """
    g = _group(group)
    arr, t = _unwrap(tensor)
    if g.size == 1:
        return _wrap(arr.copy(), t)
    _check_member(g, "reduce_scatter")
    axis = _norm_axis(axis, arr.ndim)
    sizes = split_sizes(arr.shape[axis], g.size) if sizes is None else [int(s) for s in sizes]
    if sum(sizes) != arr.shape[axis] or len(sizes) != g.size:
        raise ValueError(f"reduce_scatter: sizes {sizes} do not split extent {arr.shape[axis]} over {g.size} ranks")
    if _is_cupy(arr):
        return _wrap(nccl.backend_for(g, arr).reduce_scatter(arr, axis, sizes, op), t)
    work_dt, mpi_t, mpi_op = _reduce_args(arr, op)
    src = _front(arr, axis)
    if src.dtype != work_dt:
        src = src.astype(work_dt)
    rest = src.shape[1:]
    inner = math.prod(rest)
    out = np.empty((sizes[g.rank],) + rest, dtype=work_dt)
    counts = [s * inner for s in sizes]
    if all(c == counts[0] for c in counts):
        g.comm.Reduce_scatter_block([src, mpi_t], [out, mpi_t], mpi_op)
    else:
        g.comm.Reduce_scatter([src, mpi_t], [out, mpi_t], counts, mpi_op)
    stats.record("reduce_scatter", (g.size - 1) * arr.nbytes // g.size)
    if out.dtype != arr.dtype:
        out = out.astype(arr.dtype)
    return _wrap(_back(out, axis), t)


def broadcast(tensor, src=0, group=None, group_src=None):
    """Copy `tensor` from global rank `src` (or group rank `group_src`) to every rank, in place."""
    g = _group(group)
    arr, t = _unwrap(tensor)
    if g.size == 1:
        return tensor
    _check_member(g, "broadcast")
    root = g.group_rank(src) if group_src is None else int(group_src)
    if _is_cupy(arr):
        nccl.backend_for(g, arr).broadcast(arr, root)
    else:
        buf = arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)
        g.comm.Bcast(_mpi_raw(buf), root=root)
        if buf is not arr:
            arr[...] = buf
        if g.rank == root:
            stats.record("broadcast", arr.nbytes)
    if g.rank != root:
        _mark_modified(t)
    return tensor


def all_to_all(tensor, group=None, split_axis=0, concat_axis=0, split_sizes_=None, concat_sizes=None):
    """The S(concat_axis) -> S(split_axis) primitive.

    Each rank splits its local tensor along `split_axis` into group.size chunks (`split_sizes_`,
    default balanced), sends chunk j to group rank j, and concatenates the chunks it receives
    along `concat_axis` in rank order. `concat_sizes` are the senders' extents along
    `concat_axis` (gathered with one small Allgather when None). The two axes must differ.

    Layout: each outgoing chunk is packed with `concat_axis` first, so the receive buffer is
    already the concatenation along the front axis; one Alltoallv moves everything.
    """
    g = _group(group)
    arr, t = _unwrap(tensor)
    nd = arr.ndim
    split_axis, concat_axis = _norm_axis(split_axis, nd), _norm_axis(concat_axis, nd)
    if split_axis == concat_axis:
        raise ValueError("all_to_all: split_axis and concat_axis must differ")
    if g.size == 1:
        return _wrap(arr.copy(), t)
    _check_member(g, "all_to_all")
    n, me = g.size, g.rank
    ssizes = split_sizes(arr.shape[split_axis], n) if split_sizes_ is None else [int(s) for s in split_sizes_]
    if sum(ssizes) != arr.shape[split_axis] or len(ssizes) != n:
        raise ValueError(f"all_to_all: split sizes {ssizes} do not split extent {arr.shape[split_axis]} over {n} ranks")
    if concat_sizes is None:
        concat_sizes = _gather_extents(g, arr.shape[concat_axis])
    csizes = [int(s) for s in concat_sizes]
    if _is_cupy(arr):
        return _wrap(nccl.backend_for(g, arr).all_to_all(arr, split_axis, concat_axis, ssizes, csizes), t)
    # x: (concat, split, rest...) view of the local tensor
    x = np.moveaxis(arr, (concat_axis, split_axis), (0, 1))
    rest = x.shape[2:]
    inner = math.prod(rest)
    c_me = x.shape[0]
    send_counts = [c_me * s * inner for s in ssizes]
    send_displ = _offsets(send_counts)
    sendbuf = np.empty(sum(send_counts), dtype=arr.dtype)
    off = 0
    for k, s in enumerate(ssizes):
        np.copyto(sendbuf[send_displ[k]:send_displ[k] + send_counts[k]].reshape((c_me, s) + rest), x[:, off:off + s])
        off += s
    out = np.empty((sum(csizes), ssizes[me]) + rest, dtype=arr.dtype)
    recv_counts = [c * ssizes[me] * inner for c in csizes]
    (sbuf, mt), (rbuf, _) = _mpi_raw(sendbuf), _mpi_raw(out)
    g.comm.Alltoallv([sbuf, (send_counts, send_displ), mt], [rbuf, (recv_counts, _offsets(recv_counts)), mt])
    stats.record("all_to_all", (sum(send_counts) - send_counts[me]) * arr.dtype.itemsize)
    res = np.ascontiguousarray(np.moveaxis(out, (0, 1), (concat_axis, split_axis)))
    return _wrap(res, t)


# ------------------------------------------------------------------------- point to point
def _p2p_peer(g, rank, what):
    _check_member(g, what)
    return g.group_rank(rank)


def _recv_target(tensor_or_spec):
    """(array to receive into, object to return) from a tensor/array or a (shape, dtype) pair."""
    if isinstance(tensor_or_spec, tuple) and len(tensor_or_spec) == 2 and not hasattr(tensor_or_spec, "shape"):
        shape, dt = tensor_or_spec
        np_dt = dt.np if isinstance(dt, _dtypes.dtype) else np.dtype(dt)
        arr = np.empty(tuple(shape), dtype=np_dt)
        from ..tensor import Tensor
        from ..backend import CPU

        return arr, Tensor._make(arr, CPU)
    arr, t = _unwrap(tensor_or_spec)
    return arr, tensor_or_spec


def send(tensor, dst, tag=0, group=None):
    """Blocking send to global rank `dst`."""
    g = _group(group)
    arr, _ = _unwrap(tensor)
    peer = _p2p_peer(g, dst, "send")
    if _is_cupy(arr):
        nccl.backend_for(g, arr).send(arr, peer)
    else:
        g.comm.Send(_mpi_raw(np.ascontiguousarray(arr)), dest=peer, tag=tag)
    stats.record("send", arr.nbytes)


def recv(tensor, src=None, tag=0, group=None):
    """Blocking receive from global rank `src` (None: any) into `tensor`, or into a new tensor
    when given `(shape, dtype)`. Returns the filled tensor."""
    g = _group(group)
    arr, result = _recv_target(tensor)
    _check_member(g, "recv")
    if _is_cupy(arr):
        if src is None:
            raise ValueError("recv from any source is not supported on CUDA (NCCL)")
        nccl.backend_for(g, arr).recv(arr, g.group_rank(src))
    else:
        peer = MPI.ANY_SOURCE if src is None else g.group_rank(src)
        buf = arr if arr.flags.c_contiguous else np.empty(arr.shape, arr.dtype)
        g.comm.Recv(_mpi_raw(buf), source=peer, tag=tag)
        if buf is not arr:
            arr[...] = buf
    if hasattr(result, "_bump_version"):
        result._bump_version()
    return result


def isend(tensor, dst, tag=0, group=None):
    """Non-blocking send; returns a Request. Do not modify `tensor` before `wait()`."""
    g = _group(group)
    arr, _ = _unwrap(tensor)
    peer = _p2p_peer(g, dst, "isend")
    stats.record("send", arr.nbytes)
    if _is_cupy(arr):
        return nccl.backend_for(g, arr).isend(arr, peer)
    buf = np.ascontiguousarray(arr)
    return Request(g.comm.Isend(_mpi_raw(buf), dest=peer, tag=tag), buf=buf)


def irecv(tensor, src=None, tag=0, group=None):
    """Non-blocking receive into `tensor` (or a new tensor for `(shape, dtype)`);
    `Request.wait()` returns the filled tensor."""
    g = _group(group)
    arr, result = _recv_target(tensor)
    _check_member(g, "irecv")
    if _is_cupy(arr):
        if src is None:
            raise ValueError("irecv from any source is not supported on CUDA (NCCL)")
        return nccl.backend_for(g, arr).irecv(arr, g.group_rank(src), result)
    peer = MPI.ANY_SOURCE if src is None else g.group_rank(src)
    if arr.flags.c_contiguous:
        return Request(g.comm.Irecv(_mpi_raw(arr), source=peer, tag=tag), buf=arr, result=result)
    buf = np.empty(arr.shape, arr.dtype)
    return Request(g.comm.Irecv(_mpi_raw(buf), source=peer, tag=tag), buf=buf, target=arr, result=result)
