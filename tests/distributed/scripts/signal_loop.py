"""A stand-in for the trainer's signal handling: `signal_loop.py OUTDIR MODE`.

Every rank writes `pids.<rank>` (its pid, its parent's -- the hydra proxy -- and its
grandparent's -- mpiexec) and then loops over a barrier and an all-reduce, as training steps do.

MODE:
  graceful  SIGINT/SIGTERM set a flag; the ranks agree through an all-reduce to stop at the same
            step, write `stopped.<rank>` (the signal number), and exit with 128+signum.
  stubborn  the handler writes `got.<rank>` and the loop goes on: only SIGKILL ends the job.
  plain     no handler: SIGINT raises KeyboardInterrupt wherever the rank is.
  lone      rank 0 stops on its own (exit 143) while rank 1 waits in a barrier that never
            completes: the job must be aborted, not hang.

The loop ends by itself after a minute, so that a broken launcher leaks nothing for long.
"""
import os
import signal
import sys
import time

from engine.distributed import comm
from engine.distributed.launch import parent_pid

outdir, mode = sys.argv[1], sys.argv[2]
rank = comm.get_rank()
world = comm.MPI.COMM_WORLD
received = 0


def write(name, text):
    tmp = os.path.join(outdir, f".{name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, os.path.join(outdir, name))


def on_signal(signum, frame):
    global received
    received = received or signum
    if mode == "stubborn":
        write(f"got.{rank}", str(signum))


if mode != "plain":
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

ppid = os.getppid()
write(f"pids.{rank}", f"{os.getpid()} {ppid} {parent_pid(ppid)}")

if mode == "lone":
    world.Barrier()
    if rank == 0:
        sys.exit(128 + signal.SIGTERM)
    world.Barrier()

deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    world.Barrier()
    stop = world.allreduce(received, op=comm.MPI.MAX)
    if stop and mode == "graceful":
        write(f"stopped.{rank}", str(stop))
        world.Barrier()
        sys.exit(128 + stop)
    time.sleep(0.05)
sys.exit(1)
