"""Rank 1 raises (or exits, or is SIGKILLed) while every other rank waits in a barrier: the job
must abort, not hang."""
import sys
import time

from engine.distributed import comm

mode = sys.argv[1] if len(sys.argv) > 1 else "raise"
if comm.get_rank() == 1:
    time.sleep(0.3)
    if mode == "raise":
        raise ValueError("deliberate failure on rank one")
    if mode == "exit":
        sys.exit(3)
    if mode == "sigkill":  # no Python code runs: the launcher names the rank from its pid
        import os
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "thread":
        import threading

        th = threading.Thread(target=lambda: (_ for _ in ()).throw(RuntimeError("deliberate thread failure")))
        th.start()
        th.join()
        time.sleep(30)
comm.barrier()
print(f"rank {comm.get_rank()} passed the barrier: the failure did not abort the job", flush=True)
