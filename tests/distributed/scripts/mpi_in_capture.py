"""MPI inside a CUDA graph capture on 2 GPU ranks: a transfer of data over MPI is refused by name
(a replay would not repeat it), metadata agreement (to_global's check of every rank's placement,
sbp and shape) is allowed, an NCCL communicator first needed inside the capture is refused, and
NCCL collectives on a communicator made before the capture are replayed with the new data."""
import numpy as np

import engine as flow
from engine import backend
from engine.distributed import comm

cp = backend.cupy()
R = comm.get_rank()
world = comm.new_group([0, 1])
pair = comm.new_group([1, 0])  # the same ranks in another order: its own, not yet used, group


def refused(fn, words):
    try:
        with flow.cuda.graph(flow.cuda.CUDAGraph()):
            fn()
    except RuntimeError as e:
        assert all(w in str(e) for w in words), str(e)
    else:
        raise AssertionError(f"not refused: {words}")


refused(lambda: comm.all_reduce(np.ones(3, np.float32), group=world), ["MPI Allreduce inside a CUDA graph capture"])
x = cp.full(4, float(R + 1), np.float32)
refused(lambda: comm.all_reduce(x, group=pair), ["NCCL communicator of ranks", "warm-up iteration"])

comm.all_reduce(x, group=world)  # makes the communicator eagerly: 1 + 2 = 3 on both
assert float(x[0]) == 3.0
placement = flow.placement("cuda", [0, 1])
g = flow.cuda.CUDAGraph()
with flow.cuda.graph(g):
    comm.all_reduce(x, group=world)  # captured
    y = flow.ones(2, 3, device="cuda").to_global(placement=placement, sbp=flow.sbp.split(0))  # metadata: allowed
assert tuple(y.shape) == (4, 3)
for step in range(3):
    x[...] = R + 10 * step  # new data in the captured buffer
    g.replay()
    assert float(x[0]) == 1 + 20 * step, (step, float(x[0]))
print(f"mpi in capture OK rank {R}")
