"""Rank 0 computes (sleeps) for a while before each call; the other ranks wait in it. Prints each
rank's CPU time spent waiting, and checks every call's result."""
import resource
import sys
import time

import numpy as np

from engine.distributed import comm

DELAY = float(sys.argv[1]) if len(sys.argv) > 1 else 0.5


def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main():
    g = comm.init()
    c = g.comm
    calls = {
        "Barrier": lambda: c.Barrier(),
        "Allreduce": lambda: allreduce(c, g),
        "Bcast": lambda: bcast(c, g),
        "Send/Recv": lambda: send_recv(c, g),
        "bcast (pickled)": lambda: c.bcast({"from": 0} if g.rank == 0 else None, root=0) == {"from": 0} or fail(),
        "allgather (pickled)": lambda: c.allgather(g.rank) == list(range(g.size)) or fail(),
        "recv (pickled)": lambda: pickled_send_recv(c, g),
    }
    waited = {}
    for name, call in calls.items():
        c.Barrier()
        if g.rank == 0:
            time.sleep(DELAY)  # the others wait in `call` meanwhile
        before = cpu()
        call()
        waited[name] = cpu() - before
    worst = max(waited.values())
    print(f"rank {g.rank}: most CPU time in one wait {worst:.3f} s of {DELAY} s "
          + " ".join(f"{k}={v:.3f}" for k, v in waited.items()), flush=True)


def fail():
    raise AssertionError(f"wrong result on rank {comm.get_rank()}")


def allreduce(c, g):
    x = np.full(4, g.rank + 1.0)
    c.Allreduce(comm.MPI.IN_PLACE, [x, comm.MPI.DOUBLE], comm.MPI.SUM)
    assert (x == g.size * (g.size + 1) / 2).all(), x


def bcast(c, g):
    x = np.arange(5.0) if g.rank == 0 else np.zeros(5)
    c.Bcast([x, comm.MPI.DOUBLE], root=0)
    assert (x == np.arange(5.0)).all(), x


def send_recv(c, g):
    if g.rank == 0:
        for r in range(1, g.size):
            c.Send([np.full(3, float(r)), comm.MPI.DOUBLE], dest=r, tag=7)
    else:
        x = np.zeros(3)
        c.Recv([x, comm.MPI.DOUBLE], source=0, tag=7)
        assert (x == g.rank).all(), x


def pickled_send_recv(c, g):
    if g.rank == 0:
        for r in range(1, g.size):
            c.send(("hello", r), dest=r, tag=8)
    else:
        assert c.recv(source=0, tag=8) == ("hello", g.rank)


if __name__ == "__main__":
    main()
