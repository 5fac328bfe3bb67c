"""init_process_group as a torchrun-style script calls it: `ok` must initialise and agree with the
environment; `refused` must get init_process_group's RuntimeError (the environment contradicts MPI)."""
import os
import sys

import engine as flow
import engine.distributed as dist

mode = sys.argv[1]
if mode == "ok":
    dist.init_process_group(backend="gloo", init_method="env://")
    r, n = dist.get_rank(), dist.get_world_size()
    assert (r, n) == (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])), (r, n, os.environ.get("RANK"))
    assert int(os.environ.get("LOCAL_RANK", r)) == dist.get_local_rank()
    t = flow.tensor([float(r + 1)])
    dist.all_reduce(t)
    assert float(t) == n * (n + 1) / 2, t
    dist.barrier()
    dist.destroy_process_group()
    print(f"init OK rank={r} world={n}", flush=True)
else:
    try:
        dist.init_process_group(backend="gloo")
    except RuntimeError as e:
        print(f"REFUSED rank={os.environ.get('RANK')}: {e}", flush=True)
        sys.exit(0)
    raise AssertionError("init_process_group accepted an environment that contradicts MPI")
