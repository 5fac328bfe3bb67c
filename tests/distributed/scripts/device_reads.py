"""LiBai's trainer on several GPUs (CuPy doubles, NCCL over MPI), built in process as
tools/train_net.py builds it: counts each rank's host synchronisations per iteration.

    python -m engine.distributed.launch --nproc-per-node N device_reads.py OUT_DIR KEY=VALUE ...

Asserts on every rank, for each iteration but the last (which also writes model_final): one
read of the device on a rank of the last pipeline stage (the logged loss), none elsewhere, and
no wait for an event recorded in the iteration itself (in float16 the GradScaler's host copy of
the previous iteration's inf/nan flag is the one event waited for).
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "gpt2"))

from engine import backend  # noqa: E402

backend.cupy()  # this rank's GPU first

import cupy_double  # noqa: E402
from gpt2_helpers import train_counting_device_reads  # noqa: E402
from libai.utils import distributed as dist  # noqa: E402

ITERS = 4


def main():
    out, layout = sys.argv[1], sys.argv[2:]
    seen = train_counting_device_reads(cupy_double._double.stats, out, *layout, iters=ITERS)
    topo = dist.get_dist_util()
    last_stage = dist.get_rank() in topo.ranks[-1].reshape(-1).tolist()
    for i, (syncs, sites, earlier) in enumerate(seen[:-1]):
        assert syncs == int(last_stage), f"rank {dist.get_rank()} iteration {i}: {syncs} reads: {sites}"
        assert all(earlier), f"rank {dist.get_rank()} iteration {i} waited for its own events"
    print(f"device reads OK rank {dist.get_rank()}: {[s for s, _, _ in seen[:-1]]}", flush=True)


if __name__ == "__main__":
    main()
