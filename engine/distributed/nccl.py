"""NCCL collectives for CuPy arrays: the CUDA transport behind engine.distributed.comm.

Bootstrapped by creating the NCCL unique id on group rank 0 and broadcasting it over the group's
MPI communicator (a one-off pickled bcast of a few bytes). Every call runs on the current CuPy
stream. Uneven all-gather / reduce-scatter pad to the largest chunk, since NCCL's collectives
take one count for all ranks.

Point-to-point: NCCL sends block until the matching receive is posted, so an isend followed by
an irecv on the same stream would deadlock in a ring. isend/irecv are therefore queued and
launched together inside one `groupStart/groupEnd` when any of their requests is waited on (or
`launch_queued()` is called, as before every collective): NCCL then matches them all at once.

Without a GPU this runs in CI through the CuPy double, whose `cupy.cuda.nccl` is NCCL's API over
MPI (tests/cupy_double/_nccl.py); CuPy is imported only when a CUDA array is first communicated.
"""
import numpy as np

from .. import backend
from ..backend import dtypes as _dtypes
from .transport import Request, offsets, stats


_queued = []  # (backend, "send" | "recv", buffer, peer): the isends / irecvs not launched yet


def launch_queued():
    """Launch every queued send and receive, in one NCCL group per GPU, on the current stream;
    also before any collective (a peer whose stream waits in a receive for one of them could
    otherwise never reach it). The host does not wait for them (as torch's Work.wait() on NCCL):
    later work on the stream runs after them, and a send buffer freed to CuPy's pool is reused
    only by later work on that stream."""
    if not _queued:
        return
    by_device = {}
    for op in _queued:
        by_device.setdefault(op[0].device_id, []).append(op)
    _queued.clear()
    for device_id, ops in by_device.items():
        first = ops[0][0]
        with first.cp.cuda.Device(device_id):
            st = first._stream()
            first.nccl.groupStart()
            try:
                for be, kind, buf, peer in ops:
                    fn = be.comm.send if kind == "send" else be.comm.recv
                    fn(buf.data.ptr, buf.size, be._raw_type(buf), peer, st)
            finally:  # never leave NCCL inside an open group (every later call would be deferred)
                first.nccl.groupEnd()


def backend_for(group, arr):
    """The NCCL backend of `group` for the device holding `arr` (created on first use:
    collective over the group)."""
    dev = arr.device.id
    if group._nccl is None:
        group._nccl = {}
    be = group._nccl.get(dev)
    if be is None:
        be = group._nccl[dev] = NcclBackend(group, dev)
    return be


def _check_distinct_devices(group, device_id):
    """NCCL refuses a communicator with two ranks on one GPU ("Duplicate GPU detected"), and some
    versions hang instead: say which ranks share which GPU, on every rank, before NCCL is asked."""
    import os
    import socket

    cp = backend.cupy()
    try:  # physical GPUs: a rank that sees only its own GPU (per-rank CUDA_VISIBLE_DEVICES) calls it cuda:0
        bus = cp.cuda.Device(device_id).pci_bus_id
    except (AttributeError, RuntimeError):
        bus = f"ordinal {device_id}"
    where = group.comm.allgather((socket.gethostname(), bus, int(device_id)))
    first = {}
    for r, (host, bus, ordinal) in enumerate(where):
        if (host, bus) in first:
            hint = (f"ENGINE_CUDA_DEVICE={os.environ['ENGINE_CUDA_DEVICE']} is set; "
                    if "ENGINE_CUDA_DEVICE" in os.environ else "")
            raise RuntimeError(
                f"NCCL needs one GPU per rank: ranks {group.ranks[first[host, bus]]} and {group.ranks[r]} of "
                f"{list(group.ranks)} both compute on cuda:{ordinal} (PCI bus {bus}) of host {host} ({hint}each "
                f"rank takes GPU LOCAL_RANK % visible GPUs unless ENGINE_CUDA_DEVICE says otherwise)")
        first[host, bus] = r


class NcclBackend:
    """NCCL collectives for CuPy arrays over one ProcessGroup on one device."""

    def __init__(self, group, device_id):
        if backend.capture_state() is not None:  # making a communicator is host work among all members
            raise RuntimeError(f"the NCCL communicator of ranks {list(group.ranks)} would first be made inside a CUDA "
                               "graph capture; run the captured code eagerly once first (a warm-up iteration), so "
                               "that every communicator it uses exists before the capture")
        self.cp = cp = backend.cupy()
        from cupy.cuda import nccl

        self.nccl = nccl
        self.group = group
        self.device_id = device_id
        _check_distinct_devices(group, device_id)
        uid = nccl.get_unique_id() if group.rank == 0 else None
        uid = group.comm.bcast(uid, root=0)
        with cp.cuda.Device(device_id):
            self.comm = nccl.NcclCommunicator(group.size, uid, group.rank)
        self._types = {
            np.dtype(np.float32): nccl.NCCL_FLOAT32, np.dtype(np.float64): nccl.NCCL_FLOAT64,
            np.dtype(np.float16): nccl.NCCL_FLOAT16, np.dtype(np.int64): nccl.NCCL_INT64,
            np.dtype(np.int32): nccl.NCCL_INT32, np.dtype(np.int8): nccl.NCCL_INT8,
            np.dtype(np.uint8): nccl.NCCL_UINT8, np.dtype(np.uint64): nccl.NCCL_UINT64,
            np.dtype(np.uint32): nccl.NCCL_UINT32,
        }
        if hasattr(nccl, "NCCL_BFLOAT16"):
            self._types[_dtypes.bfloat16.np] = nccl.NCCL_BFLOAT16
        self._ops = {"sum": nccl.NCCL_SUM, "max": nccl.NCCL_MAX, "min": nccl.NCCL_MIN, "prod": nccl.NCCL_PROD}

    # helpers
    def _stream(self):
        return self.cp.cuda.get_current_stream().ptr

    def _dtype(self, arr):
        dt = arr.dtype
        if dt == np.bool_:
            return self.nccl.NCCL_UINT8
        try:
            return self._types[dt]
        except KeyError:
            raise TypeError(f"NCCL cannot move arrays of dtype {dt}") from None

    def _raw_type(self, arr):
        """Data movement type: same-width raw type (so any dtype travels unchanged)."""
        return {1: self.nccl.NCCL_UINT8, 2: self.nccl.NCCL_FLOAT16, 4: self.nccl.NCCL_UINT32,
                8: self.nccl.NCCL_UINT64}[arr.dtype.itemsize]

    def _front(self, arr, axis):
        cp = self.cp
        return cp.ascontiguousarray(cp.moveaxis(arr, axis, 0) if axis else arr)

    def _back(self, arr, axis):
        cp = self.cp
        return arr if axis == 0 else cp.ascontiguousarray(cp.moveaxis(arr, 0, axis))

    # collectives
    @staticmethod
    def _work_dtype(dtype):
        """The dtype a reduction runs in: float32 for half precision (NCCL would sum float16 in
        float16; the MPI path upcasts too, so both transports give the same sums), uint8 for bool."""
        if dtype == np.float16:
            return np.dtype(np.float32)
        return np.dtype(np.uint8) if dtype == np.bool_ else dtype

    def all_reduce(self, arr, op):
        launch_queued()
        cp = self.cp
        with cp.cuda.Device(self.device_id):
            work = self._work_dtype(arr.dtype)
            buf = arr if arr.flags.c_contiguous and work == arr.dtype else cp.ascontiguousarray(arr, dtype=work)
            nop = self._ops["max" if arr.dtype == np.bool_ and op == "sum" else op]
            self.comm.allReduce(buf.data.ptr, buf.data.ptr, buf.size, self._dtype(buf), nop, self._stream())
            if buf is not arr:
                arr[...] = buf.astype(arr.dtype)
        n = self.group.size
        stats.record("all_reduce", 2 * (n - 1) * arr.nbytes // n)

    def all_gather(self, arr, axis, sizes):
        launch_queued()
        cp = self.cp
        n, m = self.group.size, max(sizes)
        with cp.cuda.Device(self.device_id):
            src = self._front(arr, axis)
            rest = src.shape[1:]
            if src.shape[0] != m:  # pad to the largest extent
                padded = cp.zeros((m,) + rest, dtype=src.dtype)
                padded[: src.shape[0]] = src
                src = padded
            out = cp.empty((n * m,) + rest, dtype=arr.dtype)
            self.comm.allGather(src.data.ptr, out.data.ptr, src.size, self._raw_type(src), self._stream())
            if any(s != m for s in sizes):
                out = cp.concatenate([out[i * m: i * m + s] for i, s in enumerate(sizes)])
            stats.record("all_gather", arr.nbytes * (n - 1))
            return self._back(out, axis)

    def reduce_scatter(self, arr, axis, sizes, op):
        launch_queued()
        cp = self.cp
        n, m = self.group.size, max(sizes)
        with cp.cuda.Device(self.device_id):
            src = self._front(arr, axis)
            rest = src.shape[1:]
            if any(s != m for s in sizes):  # pad every chunk to the largest
                padded = cp.zeros((n * m,) + rest, dtype=src.dtype)
                for i, (o, s) in enumerate(zip(offsets(sizes), sizes)):
                    padded[i * m: i * m + s] = src[o: o + s]
                src = padded
            work = self._work_dtype(arr.dtype)
            if work != src.dtype:
                src = src.astype(work)
            out = cp.empty((m,) + rest, dtype=work)
            self.comm.reduceScatter(src.data.ptr, out.data.ptr, out.size, self._dtype(out), self._ops[op],
                                    self._stream())
            out = out[: sizes[self.group.rank]].astype(arr.dtype, copy=False)
            stats.record("reduce_scatter", (n - 1) * arr.nbytes // n)
            return self._back(out, axis)

    def broadcast(self, arr, root):
        launch_queued()
        cp = self.cp
        with cp.cuda.Device(self.device_id):
            buf = arr if arr.flags.c_contiguous else cp.ascontiguousarray(arr)
            self.comm.broadcast(buf.data.ptr, buf.data.ptr, buf.size, self._raw_type(buf), root, self._stream())
            if buf is not arr:
                arr[...] = buf
        if self.group.rank == root:
            stats.record("broadcast", arr.nbytes)

    def all_to_all(self, arr, split_axis, concat_axis, ssizes, csizes):
        launch_queued()
        cp, nccl = self.cp, self.nccl
        me = self.group.rank
        with cp.cuda.Device(self.device_id):
            x = cp.moveaxis(arr, (concat_axis, split_axis), (0, 1))
            rest = x.shape[2:]
            chunks, off = [], 0
            for s in ssizes:
                chunks.append(cp.ascontiguousarray(x[:, off:off + s]))
                off += s
            recvs = [cp.empty((c, ssizes[me]) + rest, dtype=arr.dtype) for c in csizes]
            st = self._stream()
            nccl.groupStart()
            for peer in range(self.group.size):
                if chunks[peer].size:
                    self.comm.send(chunks[peer].data.ptr, chunks[peer].size, self._raw_type(arr), peer, st)
                if recvs[peer].size:
                    self.comm.recv(recvs[peer].data.ptr, recvs[peer].size, self._raw_type(arr), peer, st)
            nccl.groupEnd()
            out = cp.concatenate(recvs, axis=0)
            stats.record("all_to_all", sum(c.nbytes for i, c in enumerate(chunks) if i != me))
            return cp.ascontiguousarray(cp.moveaxis(out, (0, 1), (concat_axis, split_axis)))

    # Point to point, on the group's communicator (made by all its ranks together, at its first
    # use: a pipeline's handoffs use the group of their two ranks). Sends and receives are
    # queued, every communicator's in one queue, and launched together in one NCCL group when one
    # of them is waited for, a blocking send or receive included: launched alone, a receive would
    # wait on the GPU for a peer whose own receive waits behind sends this rank has not launched.
    # NCCL has no tags: two ranks' transfers are matched in the order they are made.
    def send(self, arr, peer):
        self.isend(arr, peer).wait()

    def recv(self, arr, peer):
        self.irecv(arr, peer, arr).wait()

    def isend(self, arr, peer):
        with self.cp.cuda.Device(self.device_id):
            buf = self.cp.ascontiguousarray(arr)
        _queued.append((self, "send", buf, peer))
        return Request(finish=launch_queued, buf=buf)

    def irecv(self, arr, peer, result):
        with self.cp.cuda.Device(self.device_id):
            buf = arr if arr.flags.c_contiguous else self.cp.empty(arr.shape, arr.dtype)
        _queued.append((self, "recv", buf, peer))
        return Request(finish=launch_queued, buf=buf, target=arr if buf is not arr else None, result=result)
