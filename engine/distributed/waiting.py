"""Waiting for MPI without spinning a core.

MPICH's blocking calls wait by polling in a loop: a rank that waits 3 s in a barrier for a
slower peer burns 3 s of CPU (0.8 s user + 2.4 s system, MPICH 5.0, ch4). Where ranks outnumber
cores (a 4-rank job on a 2-core CI machine or laptop, a pipeline whose stages take turns) the
waiting ranks take the cores from the ones computing, and the job runs at the pace of full
oversubscription. PyTorch's CPU backend (Gloo) sleeps in the kernel instead.

So the engine's MPI calls are made nonblocking and completed by `wait(request)`: it tests the
request in a loop for `SPIN_S` (a peer that is about to arrive costs no sleep), then between
`os.sched_yield()` calls until `YIELD_S` (the core goes to any rank that has work, and the wait
ends as soon as the peer arrives), then sleeps between tests, the sleeps doubling from 20 us up
to `MAX_SLEEP_S`. The yielding phase matters for training steps, which make hundreds of short
collectives: sleeping from the start (capped at 1 ms) made a dp=2 x tp=2 Swin step on 2 cores
twice as slow (20 iterations 22-24 s, against 11-13 s yielding). A wait that outlasts YIELD_S
(a pipeline bubble, a slow rank) sleeps, and ends at most MAX_SLEEP_S after its peer arrives.
`PoliteComm` wraps an mpi4py communicator so that the blocking calls the engine uses (Barrier,
Allreduce, Allgather(v), Reduce_scatter(_block), Bcast, Alltoallv, Gather, Send, Recv, Probe and
the pickled allreduce / allgather / bcast / send / recv) wait that way; anything else goes to
the communicator itself.

`ENGINE_MPI_WAIT=spin` keeps MPI's own blocking calls (the lowest latency where every rank has
a core of its own).
"""
import os
import time

__all__ = ["wait", "PoliteComm", "polite", "SPIN_S", "YIELD_S", "MAX_SLEEP_S"]

SPIN_S = 50e-6
YIELD_S = 10e-3
MIN_SLEEP_S = 20e-6
MAX_SLEEP_S = 1e-3
_yield = getattr(os, "sched_yield", lambda: time.sleep(0))


def polite():
    """Whether MPI waits sleep (the default) rather than spin (ENGINE_MPI_WAIT=spin)."""
    mode = os.environ.get("ENGINE_MPI_WAIT", "sleep").strip().lower()
    if mode not in ("sleep", "spin"):
        raise ValueError(f"ENGINE_MPI_WAIT must be 'sleep' or 'spin', got {mode!r}")
    return mode == "sleep"


def wait_until(done, timeout=None):
    """Call `done()` until it returns True: in a loop for SPIN_S, then yielding the core until
    YIELD_S, then with growing sleeps.
    Returns False if `timeout` seconds (None: no limit) pass first."""
    if done():
        return True
    start = time.perf_counter()
    while time.perf_counter() - start < SPIN_S:
        if done():
            return True
    yield_until = YIELD_S if timeout is None else min(YIELD_S, timeout)
    while time.perf_counter() - start < yield_until:
        if done():
            return True
        _yield()
    delay = MIN_SLEEP_S
    while not done():
        if timeout is not None and time.perf_counter() - start > timeout:
            return False
        time.sleep(delay)
        delay = min(2 * delay, MAX_SLEEP_S)
    return True


def wait(request, status=None):
    """`request.Wait(status)`, without spinning a core unless ENGINE_MPI_WAIT=spin."""
    if not polite():
        request.Wait(status)
    elif status is None:
        wait_until(request.Test)
    else:
        wait_until(lambda: request.Test(status))


class PoliteComm:
    """An mpi4py communicator whose blocking calls wait by `wait` (see the module doc)."""

    def __init__(self, comm):
        self._comm = comm

    def __getattr__(self, name):
        return getattr(self._comm, name)

    def __repr__(self):
        return f"PoliteComm({self._comm!r})"

    # ---- buffer (upper-case) calls
    def Barrier(self):
        wait(self._comm.Ibarrier())

    def Allreduce(self, sendbuf, recvbuf, op=None):
        wait(self._comm.Iallreduce(sendbuf, recvbuf, *(() if op is None else (op,))))

    def Allgather(self, sendbuf, recvbuf):
        wait(self._comm.Iallgather(sendbuf, recvbuf))

    def Allgatherv(self, sendbuf, recvbuf):
        wait(self._comm.Iallgatherv(sendbuf, recvbuf))

    def Reduce_scatter_block(self, sendbuf, recvbuf, op=None):
        wait(self._comm.Ireduce_scatter_block(sendbuf, recvbuf, *(() if op is None else (op,))))

    def Reduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=None):
        wait(self._comm.Ireduce_scatter(sendbuf, recvbuf, recvcounts, *(() if op is None else (op,))))

    def Bcast(self, buf, root=0):
        wait(self._comm.Ibcast(buf, root=root))

    def Alltoallv(self, sendbuf, recvbuf):
        wait(self._comm.Ialltoallv(sendbuf, recvbuf))

    def Gather(self, sendbuf, recvbuf, root=0):
        wait(self._comm.Igather(sendbuf, recvbuf, root=root))

    def Send(self, buf, dest, tag=0):
        wait(self._comm.Isend(buf, dest=dest, tag=tag))

    def Recv(self, buf, source=None, tag=None, status=None):
        source, tag = _any(source, tag)
        wait(self._comm.Irecv(buf, source=source, tag=tag), status)

    def Probe(self, source=None, tag=None, status=None):
        source, tag = _any(source, tag)
        wait_until(lambda: self._comm.Iprobe(source=source, tag=tag, status=status))
        return True

    # ---- pickled (lower-case) calls: no nonblocking form, so wait politely for everyone (or
    # for the message) first; the call itself then does not wait for a peer
    def _everyone_here(self):
        wait(self._comm.Ibarrier())

    def allreduce(self, obj, op=None):
        self._everyone_here()
        return self._comm.allreduce(obj, *(() if op is None else (op,)))

    def allgather(self, obj):
        self._everyone_here()
        return self._comm.allgather(obj)

    def bcast(self, obj, root=0):
        self._everyone_here()
        return self._comm.bcast(obj, root=root)

    def gather(self, obj, root=0):
        self._everyone_here()
        return self._comm.gather(obj, root=root)

    def send(self, obj, dest, tag=0):
        wait(self._comm.isend(obj, dest=dest, tag=tag))

    def recv(self, buf=None, source=None, tag=None, status=None):
        source, tag = _any(source, tag)
        self.Probe(source=source, tag=tag)
        return self._comm.recv(buf, source=source, tag=tag, status=status)


def _any(source, tag):
    """MPI's ANY_SOURCE / ANY_TAG for None (mpi4py's defaults)."""
    from mpi4py import MPI

    return (MPI.ANY_SOURCE if source is None else source), (MPI.ANY_TAG if tag is None else tag)
