"""cupy.cuda.nccl in the double: NCCL's communicator API over MPI, on the double's device memory.

Each process of an `mpiexec` job is one "GPU" rank. A communicator is made as NCCL makes one:
rank 0 of the group calls `get_unique_id()`, the id travels to the others by the caller's own
means (the engine broadcasts it over MPI), and every member calls `NcclCommunicator(n, id, r)`;
the members then find each other through MPI_COMM_WORLD and compute on an MPI communicator of
their own. Calls take raw device addresses (`arr.data.ptr`), element counts and NCCL datatype
codes, as CuPy's wrapper does, and the double enforces what NCCL enforces or does:

  * one distinct GPU per rank on a host: a communicator whose members share a device is refused
    (NCCL's "Duplicate GPU detected", ncclInvalidUsage);
  * every buffer lies on the communicator's device, inside a live allocation large enough for
    `count` items of the datatype (else ncclInvalidArgument);
  * reductions are computed in the datatype, member by member in rank order: float16 sums are
    rounded to float16 at every addition, as NCCL's ring does (the engine upcasts before it
    calls; the double makes that visible);
  * outside a group a send does not complete before its receive is posted (MPI's synchronous
    send), so an unmatched ring of sends hangs as it would on GPUs; inside
    `groupStart()`/`groupEnd()` sends and receives are posted together at `groupEnd`;
  * a destroyed or aborted communicator refuses further calls.
Every call counts one kernel launch in the double's stats (by name, "nccl.<call>"), and inside a
CUDA-graph capture it is recorded so that the graph's replay runs it again (NCCL's collectives
can be captured).
"""
import os
import socket
import types

import numpy as np

from . import _double

NCCL_INT8 = NCCL_CHAR = 0
NCCL_UINT8 = 1
NCCL_INT32 = NCCL_INT = 2
NCCL_UINT32 = 3
NCCL_INT64 = 4
NCCL_UINT64 = 5
NCCL_FLOAT16 = NCCL_HALF = 6
NCCL_FLOAT32 = NCCL_FLOAT = 7
NCCL_FLOAT64 = NCCL_DOUBLE = 8
NCCL_BFLOAT16 = 9
NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN, NCCL_AVG = 0, 1, 2, 3, 4

_NP_TYPES = {NCCL_INT8: np.int8, NCCL_UINT8: np.uint8, NCCL_INT32: np.int32, NCCL_UINT32: np.uint32,
             NCCL_INT64: np.int64, NCCL_UINT64: np.uint64, NCCL_FLOAT16: np.float16, NCCL_FLOAT32: np.float32,
             NCCL_FLOAT64: np.float64}
_REDUCE = {NCCL_SUM: np.add, NCCL_PROD: np.multiply, NCCL_MAX: np.maximum, NCCL_MIN: np.minimum,
           NCCL_AVG: np.add}

_SUCCESS, _INVALID_ARGUMENT, _INVALID_USAGE = 0, 4, 5
_ERROR_NAMES = {1: "NCCL_ERROR_UNHANDLED_CUDA_ERROR", 2: "NCCL_ERROR_SYSTEM_ERROR", 3: "NCCL_ERROR_INTERNAL_ERROR",
                4: "NCCL_ERROR_INVALID_ARGUMENT", 5: "NCCL_ERROR_INVALID_USAGE"}
_ERROR_TEXT = {1: "unhandled cuda error", 2: "unhandled system error", 3: "internal error",
               4: "invalid argument", 5: "invalid usage"}

_JOIN_TAG, _MEMBERS_TAG = 30_001, 30_002  # MPI_COMM_WORLD tags of the communicators' rendezvous


class NcclError(RuntimeError):
    """cupy_backends.cuda.libs.nccl.NcclError: `status` is NCCL's result code."""

    def __init__(self, status, detail=""):
        self.status = status
        msg = f"{_ERROR_NAMES.get(status, status)}: {_ERROR_TEXT.get(status, 'error')}"
        super().__init__(msg + (f" ({detail})" if detail else ""))


def get_version():
    return 22703


get_build_version = get_version


def _polite(comm):
    """`comm` waiting as the engine's MPI calls wait (without spinning a core: 4 ranks share 2)."""
    from engine.distributed.waiting import PoliteComm, polite
    return PoliteComm(comm) if polite() else comm


def _world():
    from mpi4py import MPI
    return _polite(MPI.COMM_WORLD)


def _wait(requests, receives=()):
    """Wait for `requests`; `receives` are (index in requests, buffer, peer) of receives, each of
    which must have got exactly its buffer's bytes: NCCL matches a pair's transfers in the order
    they are made (it has no tags), and a receive matched with a send of another size is an
    error (on GPUs a hang or garbage), not the silent partial fill MPI allows."""
    from engine.distributed.waiting import wait_until
    from mpi4py import MPI
    statuses = [MPI.Status() for _ in requests]
    wait_until(lambda: MPI.Request.Testall(requests, statuses))
    for i, buf, peer in receives:
        got = statuses[i].Get_count(MPI.BYTE)
        if got != buf.nbytes:
            raise NcclError(_INVALID_USAGE, f"a receive of {buf.nbytes} bytes from rank {peer} was matched with a "
                                            f"send of {got} bytes: the two ranks make their transfers in different "
                                            "orders")


def _any_source():
    from mpi4py import MPI
    return MPI.ANY_SOURCE


_ids_made = [0]


def get_unique_id():
    """A 128-byte id as CuPy returns it (a tuple of ints); it names its creator's MPI rank, so the
    members of the communicator can find one another."""
    _ids_made[0] += 1
    head = [_world().Get_rank(), _ids_made[0], os.getpid() & 0x7FFF]
    noise = np.random.default_rng().integers(-128, 128, size=128 - len(head)).tolist()
    return tuple(head + noise)


# ------------------------------------------------------------------ groups
_group = {"depth": 0, "ops": []}


def groupStart():
    _group["depth"] += 1


def groupEnd():
    if _group["depth"] == 0:
        raise NcclError(_INVALID_USAGE, "groupEnd without groupStart")
    _group["depth"] -= 1
    if _group["depth"] == 0:
        ops, _group["ops"] = _group["ops"], []
        _post_together(ops)
        _double.record(lambda: _post_together(ops))


def _post_together(ops):
    """A group's sends and receives, posted at once (NCCL matches them all together). A send
    completes only once its receive is posted (MPI's synchronous mode, not an eager buffered
    send), as NCCL's does: a group whose send nobody receives yet holds the rank there."""
    requests, receives = [], []
    for comm, kind, buf, peer in ops:
        if kind == "send":
            requests.append(comm._mpi.Issend(buf, dest=peer, tag=0))
        else:
            receives.append((len(requests), buf, peer))
            requests.append(comm._mpi.Irecv(buf, source=peer, tag=0))  # a larger send: MPI's truncation error
    _wait(requests, receives)


# ------------------------------------------------------------------ the communicator
_stash = {"join": [], "members": []}  # rendezvous messages that arrived for another communicator


def _receive(source, tag, kind, key):
    """The next rendezvous message of `kind` for communicator `key` (others are kept for later)."""
    world = _world()
    for i, msg in enumerate(_stash[kind]):
        if msg[0] == key:
            return _stash[kind].pop(i)
    while True:
        msg = world.recv(source=source, tag=tag)
        if msg[0] == key:
            return msg
        _stash[kind].append(msg)


class NcclCommunicator:
    """cupy.cuda.nccl.NcclCommunicator(ndev, commId, rank) for one member of an `ndev`-rank group."""

    def __init__(self, ndev, commId, rank):
        if not 0 <= rank < ndev:
            raise NcclError(_INVALID_ARGUMENT, f"rank {rank} of a communicator of {ndev}")
        commId = tuple(commId)
        if len(commId) != 128:
            raise NcclError(_INVALID_ARGUMENT, "a unique id is 128 bytes")
        world = _world()
        creator, key = int(commId[0]), commId
        me = (key, rank, world.Get_rank(), socket.gethostname(), _double.Device().pci_bus_id, ndev)
        if rank == 0:
            if creator != world.Get_rank():
                raise NcclError(_INVALID_USAGE, "rank 0 of a communicator is the process that made its id")
            members = {0: me}
            while len(members) < ndev:
                msg = _receive(_any_source(), _JOIN_TAG, "join", key)
                if msg[1] in members or msg[5] != ndev:
                    raise NcclError(_INVALID_USAGE, f"rank {msg[1]} joined twice or with another size ({msg[5]})")
                members[msg[1]] = msg
            table = [members[r][2:5] for r in range(ndev)]
            for r in range(1, ndev):
                world.send((key, table), dest=members[r][2], tag=_MEMBERS_TAG)
        else:
            world.send(me, dest=creator, tag=_JOIN_TAG)
            table = _receive(creator, _MEMBERS_TAG, "members", key)[1]
        seen = {}
        for r, (_, host, dev) in enumerate(table):  # NCCL tells GPUs apart by their bus id
            if (host, dev) in seen:
                raise NcclError(_INVALID_USAGE, f"Duplicate GPU detected : rank {r} and rank {seen[host, dev]} "
                                                f"both on CUDA device with busId {dev} of {host}")
            seen[host, dev] = r
        ranks = [w for w, _, _ in table]
        self._mpi = _polite(world.Create_group(world.Get_group().Incl(ranks), tag=int(commId[1]) % 16_384 + 1))
        self._rank, self._size, self._device = rank, ndev, _double.current_device()
        self._alive = True

    # ---------------------------------------------------------- queries
    def rank_id(self):
        return self._rank

    def size(self):
        return self._size

    def device_id(self):
        return self._device

    def check_async_error(self):
        pass

    def destroy(self):
        if self._alive:
            self._alive = False
            self._mpi.Free()

    def abort(self):
        self.destroy()

    # ---------------------------------------------------------- helpers
    def _buffer(self, ptr, count, datatype, what):
        if not self._alive:
            raise NcclError(_INVALID_USAGE, "the communicator was destroyed")
        if datatype not in _NP_TYPES:
            raise NcclError(_INVALID_ARGUMENT, f"datatype {datatype} is not emulated")
        try:
            buf = _double.view(ptr, _NP_TYPES[datatype], int(count))
        except (ValueError, IndexError) as e:
            raise NcclError(_INVALID_ARGUMENT, f"{what}: {e}") from None
        dev = _double.device_at(ptr)
        if dev is not None and dev != self._device:
            raise NcclError(_INVALID_ARGUMENT, f"{what} is on CUDA device {dev}, the communicator on {self._device}")
        return buf

    @staticmethod
    def _stream(stream):
        if not isinstance(stream, (int, np.integer)):
            raise TypeError(f"stream must be a stream pointer (int), got {type(stream).__name__}")

    def _run(self, name, work):
        """Do `work` now (and again at each replay when a CUDA graph is being captured)."""
        if _group["depth"]:
            raise NotImplementedError(f"the CuPy double does not emulate a collective ({name}) inside an NCCL group")
        _double.stats.names.add(f"cupy.cuda.nccl.NcclCommunicator.{name}")
        _double.stats.launches += 1
        _double.stats.by_name[f"nccl.{name}"] += 1
        work()
        _double.record(work)

    def _reduce(self, src, op):
        """All members' `src` reduced in rank order, in src's dtype (NCCL's arithmetic)."""
        if op not in _REDUCE:
            raise NcclError(_INVALID_ARGUMENT, f"reduction op {op}")
        parts = np.empty((self._size,) + src.shape, src.dtype)
        self._mpi.Allgather(np.ascontiguousarray(src), parts)
        acc = parts[0].copy()
        for p in parts[1:]:
            _REDUCE[op](acc, p, out=acc)
        if op == NCCL_AVG:
            acc = (acc / self._size).astype(src.dtype)
        return acc

    # ---------------------------------------------------------- collectives
    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):
        self._stream(stream)
        src, dst = (self._buffer(sendbuf, count, datatype, "sendbuf"), self._buffer(recvbuf, count, datatype, "recvbuf"))
        self._run("allReduce", lambda: np.copyto(dst, self._reduce(src, op)))

    def reduce(self, sendbuf, recvbuf, count, datatype, op, root, stream):
        self._stream(stream)
        src = self._buffer(sendbuf, count, datatype, "sendbuf")
        dst = self._buffer(recvbuf, count, datatype, "recvbuf") if self._rank == root else None

        def work():
            acc = self._reduce(src, op)
            if dst is not None:
                np.copyto(dst, acc)
        self._run("reduce", work)

    def broadcast(self, sendbuff, recvbuff, count, datatype, root, stream):
        self._stream(stream)
        src = self._buffer(sendbuff, count, datatype, "sendbuff") if self._rank == root else None
        dst = self._buffer(recvbuff, count, datatype, "recvbuff")

        def work():
            buf = src.copy() if src is not None else np.empty_like(dst)
            self._mpi.Bcast(buf, root=root)
            np.copyto(dst, buf)
        self._run("broadcast", work)

    def bcast(self, buff, count, datatype, root, stream):
        self.broadcast(buff, buff, count, datatype, root, stream)

    def allGather(self, sendbuf, recvbuf, count, datatype, stream):
        self._stream(stream)
        src = self._buffer(sendbuf, count, datatype, "sendbuf")
        dst = self._buffer(recvbuf, count * self._size, datatype, "recvbuf")
        self._run("allGather", lambda: self._mpi.Allgather(src.copy(), dst))

    def reduceScatter(self, sendbuf, recvbuf, recvcount, datatype, op, stream):
        self._stream(stream)
        src = self._buffer(sendbuf, recvcount * self._size, datatype, "sendbuf")
        dst = self._buffer(recvbuf, recvcount, datatype, "recvbuf")
        n = int(recvcount)
        self._run("reduceScatter", lambda: np.copyto(dst, self._reduce(src, op)[self._rank * n:(self._rank + 1) * n]))

    # ---------------------------------------------------------- point to point
    def _check_peer(self, peer):
        if not 0 <= peer < self._size:
            raise NcclError(_INVALID_ARGUMENT, f"peer {peer} of a communicator of {self._size}")

    def send(self, sendbuf, count, datatype, peer, stream):
        self._stream(stream)
        self._check_peer(peer)
        buf = self._buffer(sendbuf, count, datatype, "sendbuf")
        self._p2p("send", buf, peer)

    def recv(self, recvbuf, count, datatype, peer, stream):
        self._stream(stream)
        self._check_peer(peer)
        buf = self._buffer(recvbuf, count, datatype, "recvbuf")
        self._p2p("recv", buf, peer)

    def _p2p(self, kind, buf, peer):
        _double.stats.launches += 1
        _double.stats.by_name[f"nccl.{kind}"] += 1
        if _group["depth"]:
            _group["ops"].append((self, kind, buf, peer))
            return
        work = (lambda: _wait([self._mpi.Issend(buf, dest=peer, tag=0)])) if kind == "send" else (
            lambda: _wait([self._mpi.Irecv(buf, source=peer, tag=0)], [(0, buf, peer)]))
        work()
        _double.record(work)


def module():
    """The `cupy.cuda.nccl` module of the double."""
    mod = types.ModuleType("cupy.cuda.nccl")
    for name, value in globals().items():
        if name.startswith("NCCL_") or name in ("NcclCommunicator", "NcclError", "get_unique_id", "get_version",
                                                 "get_build_version", "groupStart", "groupEnd"):
            setattr(mod, name, value)
    mod.available = True
    return mod
