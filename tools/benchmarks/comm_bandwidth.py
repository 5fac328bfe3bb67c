"""All-reduce and all-gather bandwidth: engine.distributed.comm vs raw mpi4py on the same buffers.

    python -m engine.distributed.launch --nproc-per-node 2 tools/benchmarks/comm_bandwidth.py [--max-mb 64]

For each message size (float32, 4 KB .. 64 MB per rank) it times, call by call after a barrier,
`comm.all_reduce(tensor)` against `COMM_WORLD.Allreduce(IN_PLACE, buf)` on the very same numpy
buffer, and `comm.all_gather(tensor)` against `Allgather(buf, out)` into a preallocated output.
The two variants alternate inside each round so that drift of the machine hits both alike; the
figure per variant is the median (or `--percentile`) over rounds of the slowest rank. Bandwidth is algorithm
bandwidth (bytes of the per-rank buffer / time, as nccl-tests' "algbw"); overhead is how much
slower the engine call is than the raw call.

all_gather is measured three ways: the default call (`all_gather(t)`: gathers the per-rank
extents with one tiny extra Allgather and allocates a fresh result, whose first touch costs
page faults on large sizes), with `sizes=` given (what boxing code that knows the global shape
does), and with `sizes=` and `out=` (the same preallocated buffer the raw call uses: the pure
wrapper overhead).
"""
import argparse
import time

import numpy as np

import engine as flow
from engine.backend import CPU
from engine.distributed import comm


def timed(fn, world):
    world.Barrier()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench(name, engine_fn, raw_fn, rounds, world, pct=50):
    for _ in range(3):  # warm up both paths (page faults, MPI internal buffers)
        engine_fn()
        raw_fn()
    te, tr = [], []
    for i in range(rounds):
        if i % 2:
            te.append(timed(engine_fn, world))
            tr.append(timed(raw_fn, world))
        else:
            tr.append(timed(raw_fn, world))
            te.append(timed(engine_fn, world))
    med = np.array([np.percentile(te, pct), np.percentile(tr, pct)])
    world.Allreduce(comm.MPI.IN_PLACE, med, op=comm.MPI.MAX)
    return med


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-mb", type=float, default=64)
    ap.add_argument("--min-kb", type=float, default=4)
    ap.add_argument("--percentile", type=float, default=50,
                    help="per-call time statistic (50 = median; lower values filter out noise "
                         "from other processes on a shared machine)")
    args = ap.parse_args()
    world = comm.init().comm
    n, rank = comm.get_world_size(), comm.get_rank()
    sizes = []
    s = int(args.min_kb * 1024)
    while s <= args.max_mb * 2**20:
        sizes.append(s)
        s *= 4
    if rank == 0:
        print(f"{n} ranks, float32; GB/s = per-rank buffer bytes / p{args.percentile:g} time of the slowest rank")
        print(f"{'op':<11}{'size':>9}{'engine us':>12}{'raw us':>12}{'engine GB/s':>13}{'raw GB/s':>10}{'overhead':>10}")
    for nbytes in sizes:
        count = nbytes // 4
        rounds = int(min(200, max(20, 4e8 / nbytes)))
        arr = np.random.default_rng(rank).standard_normal(count).astype(np.float32)
        t = flow.Tensor._make(arr, CPU)
        out = np.empty(count * n, dtype=np.float32)
        sz = [count] * n
        results = [
            ("all_reduce", bench("all_reduce", lambda: comm.all_reduce(t),
                                 lambda: world.Allreduce(comm.MPI.IN_PLACE, arr), rounds, world, args.percentile)),
            ("all_gather", bench("all_gather", lambda: comm.all_gather(t),
                                 lambda: world.Allgather(arr, out), rounds, world, args.percentile)),
            ("ag sizes", bench("ag sizes", lambda: comm.all_gather(t, sizes=sz),
                               lambda: world.Allgather(arr, out), rounds, world, args.percentile)),
            ("ag out=", bench("ag out=", lambda: comm.all_gather(t, sizes=sz, out=out),
                              lambda: world.Allgather(arr, out), rounds, world, args.percentile)),
        ]
        if rank == 0:
            label = f"{nbytes / 2**20:g} MB" if nbytes >= 2**20 else f"{nbytes / 1024:g} KB"
            for op, (te, tr) in results:
                print(f"{op:<11}{label:>9}{te * 1e6:>12.1f}{tr * 1e6:>12.1f}{nbytes / te / 1e9:>13.2f}"
                      f"{nbytes / tr / 1e9:>10.2f}{(te / tr - 1) * 100:>9.1f}%", flush=True)


if __name__ == "__main__":
    main()
