"""comm.max_over_world when the ranks' first flags differ in kind (one on the host, one on a
GPU): every rank agrees over MPI, then and later (one transport chosen together, once), and a
GPU flag is read back; a rank that chose NCCL alone would wait there for ever."""
import numpy as np

from engine import backend
from engine.distributed import comm

cp = backend.cupy()
R = comm.get_rank()
first = 0.0 if R == 0 else cp.asarray(np.float32(1.0))
got = comm.max_over_world(first)
assert isinstance(got, float) and got == 1.0, got
later = comm.max_over_world(cp.asarray(np.float32(R)))  # every rank on a GPU now: still MPI
assert isinstance(later, float) and later == comm.get_world_size() - 1, later
print(f"mixed flags OK rank {R}")
