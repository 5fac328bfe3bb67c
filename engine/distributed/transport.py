"""What the two transports (MPI in comm.py, NCCL in nccl.py) share: byte accounting (`stats`),
pending point-to-point transfers (`Request`), and the offsets of uneven chunks."""
from contextlib import contextmanager

from .waiting import wait

__all__ = ["CommStats", "stats", "Request", "offsets"]


class CommStats:
    """Bytes this rank sends, per call, with each algorithm's textbook amount.

    `calls` lists (name, bytes); `total_bytes` is their sum. `recording()` yields a fresh
    CommStats that sees only the calls made inside the `with` block (nesting is fine), which
    is how tests measure one operation without resetting the global counters.
    """

    max_calls = 1_000_000  # keep a long training run from growing the list without bound

    def __init__(self):
        self.calls = []
        self.total_bytes = 0
        self._children = []

    def reset(self):
        self.calls = []
        self.total_bytes = 0

    def record(self, name, nbytes):
        nbytes = int(nbytes)
        self.calls.append((name, nbytes))
        self.total_bytes += nbytes
        if len(self.calls) > self.max_calls:
            del self.calls[: len(self.calls) // 2]
        for child in self._children:
            child.record(name, nbytes)

    def bytes_of(self, name):
        return sum(b for n, b in self.calls if n == name)

    @contextmanager
    def recording(self):
        rec = CommStats()
        self._children.append(rec)
        try:
            yield rec
        finally:
            self._children.remove(rec)

    def __repr__(self):
        return f"CommStats(calls={len(self.calls)}, total_bytes={self.total_bytes})"


stats = CommStats()


class Request:
    """A pending isend/irecv. Buffers stay referenced here until `wait()` returns."""

    def __init__(self, mpi_request=None, buf=None, target=None, result=None, finish=None):
        self._req = mpi_request
        self._buf = buf          # keeps the transfer buffer alive
        self._target = target    # array to copy into after completion (non-contiguous recv)
        self._result = result    # what wait() returns (the received tensor for irecv)
        self._finish = finish    # callable run once on completion (CUDA backend)
        self._done = False

    def _complete(self):
        if self._done:
            return
        self._done = True
        if self._finish is not None:
            self._finish()
        if self._target is not None:
            self._target[...] = self._buf
        self._buf = self._target = None

    def wait(self):
        if not self._done:
            if self._req is not None:
                wait(self._req)  # without spinning a core (engine.distributed.waiting)
            self._complete()
        return self._result

    def is_completed(self):
        if self._done:
            return True
        if self._req is None or self._req.Test():
            self._complete()
            return True
        return False


def offsets(sizes):
    """Start of each chunk when chunks of `sizes` lie back to back."""
    out, acc = [], 0
    for s in sizes:
        out.append(acc)
        acc += s
    return out
