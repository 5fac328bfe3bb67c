"""Checks the environment the launcher and engine.distributed.run give every rank."""
import os
import sys

from engine.distributed import comm

rank, world = comm.get_rank(), comm.get_world_size()
assert os.environ["RANK"] == str(rank), os.environ["RANK"]
assert os.environ["WORLD_SIZE"] == str(world)
assert os.environ["LOCAL_RANK"] == str(comm.get_local_rank())
assert os.environ["LOCAL_WORLD_SIZE"] == str(comm.get_local_world_size())
assert os.environ["OPENBLAS_NUM_THREADS"] == "1"
threads = int(os.environ["ENGINE_NUM_THREADS"])
assert threads == max(1, len(os.sched_getaffinity(0)) // world) or "EXPECT_THREADS" in os.environ, threads
if "EXPECT_THREADS" in os.environ:
    assert threads == int(os.environ["EXPECT_THREADS"])
assert os.environ["OMP_NUM_THREADS"] == str(threads)
assert sys.argv[1:] == ["--flag", "value"], sys.argv
assert __name__ == "__main__"
print(f"env OK rank={rank} world={world} threads={threads}", flush=True)
