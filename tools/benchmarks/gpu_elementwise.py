"""The memory-bound kernels of a GPT-2 124M fp16 step on a GPU, against the device's copy bandwidth.

    python tools/benchmarks/gpu_elementwise.py

The profile of the step (tools/benchmarks/gpu_profile.py on an H200) put 10 ms of its 39 ms of
GPU work in casts and adds that move little data: 48 bias adds (`out += bias` after each
linear's cuBLAS product) 3.3 ms, 100 float16 <-> float32 casts 6.9 ms, 50 float32 adds 1.7 ms.
This times each of those CuPy calls at GPT-2's shapes beside a plain device copy of the same
bytes and beside the engine's own kernel where it has one (the bias add, the add), so that the gap is a number: GB/s moved
(bytes read once + written once over the median time of CUDA events around each call, buffers
rotated over more than the L2 cache).
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

ROWS = 8 * 1024  # micro-batch 8 x seq 1024 tokens
ROTATE = 6       # buffer sets cycled through: > the 60 MB L2 of an H100/H200 at every shape here


def timed(cp, fn, sets, reps):
    """Median milliseconds of fn(*set) over `reps` calls, rotating through `sets`."""
    for s in sets:
        fn(*s)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for r in range(reps):
        s = sets[r % len(sets)]
        start.record()
        fn(*s)
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
    return statistics.median(times)


def row(label, ms, nbytes):
    print(f"  {label:58s} {1e3 * ms:8.1f} us  {nbytes / ms / 1e6:7.0f} GB/s")


def run(a):
    import cupy as cp

    from engine.kernels import add, bias_add

    rng = cp.random.default_rng(0)
    print(f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}: medians of {a.reps} calls, "
          f"{ROTATE} buffer sets rotated")

    def normal(shape, dtype):
        return rng.standard_normal(shape, dtype=cp.float32).astype(dtype)

    # the device's copy bandwidth on the largest tensor of the step's casts, as the reference
    big = [(normal((ROWS, 3072), cp.float16), cp.empty((ROWS, 3072), cp.float16)) for _ in range(ROTATE)]
    row("copy float16 [8192, 3072] (reference)", timed(cp, lambda x, y: cp.copyto(y, x), big, a.reps),
        2 * big[0][0].nbytes)

    for width in (768, 2304, 3072):
        sets = [(normal((ROWS, width), cp.float16), normal((width,), cp.float16)) for _ in range(ROTATE)]
        moved = 2 * sets[0][0].nbytes
        row(f"bias add, CuPy out += bias      [8192, {width}] fp16",
            timed(cp, lambda y, b: y.__iadd__(b), sets, a.reps), moved)
        row(f"bias add, engine kernel         [8192, {width}] fp16",
            timed(cp, bias_add.bias_add_cuda_, sets, a.reps), moved)
        y, b = sets[0]
        want = bias_add.bias_add_reference(cp.asnumpy(y), cp.asnumpy(b))
        bias_add.bias_add_cuda_(y, b)
        print(f"    engine kernel: {int((cp.asnumpy(y) != want).sum())} elements differ from the reference")

    for width in (768, 3072):
        f32 = [(normal((ROWS, width), cp.float32),) for _ in range(ROTATE)]
        f16 = [(normal((ROWS, width), cp.float16),) for _ in range(ROTATE)]
        n = ROWS * width
        row(f"cast float32 -> float16 (astype) [8192, {width}]",
            timed(cp, lambda x: x.astype(cp.float16), f32, a.reps), 6 * n)
        row(f"cast float16 -> float32 (astype) [8192, {width}]",
            timed(cp, lambda x: x.astype(cp.float32), f16, a.reps), 6 * n)
    pairs = [(normal((ROWS, 768), cp.float32), normal((ROWS, 768), cp.float32)) for _ in range(ROTATE)]
    row("add float32 + float32 [8192, 768]", timed(cp, lambda x, y: x + y, pairs, a.reps), 12 * ROWS * 768)
    row("add, engine kernel float32 [8192, 768]", timed(cp, add.add_cuda, pairs, a.reps), 12 * ROWS * 768)
    x, y = pairs[0]
    differ = int((cp.asnumpy(add.add_cuda(x, y)) != add.add_reference(cp.asnumpy(x), cp.asnumpy(y))).sum())
    print(f"    engine kernel: {differ} elements differ from the reference")
    mixed = [(normal((ROWS, 768), cp.float32), normal((ROWS, 768), cp.float16)) for _ in range(ROTATE)]
    row("add float32 + float16 -> float32 [8192, 768] (no cast)", timed(cp, lambda x, y: x + y, mixed, a.reps),
        10 * ROWS * 768)
    row("add, engine kernel float32 + float16 [8192, 768]", timed(cp, add.add_cuda, mixed, a.reps),
        10 * ROWS * 768)
    logits = [(normal((ROWS, 50304), cp.float16),) for _ in range(2)]
    row("cast float16 -> float32 (astype) logits [8192, 50304]",
        timed(cp, lambda x: x.astype(cp.float32), logits, max(5, a.reps // 5)), 6 * ROWS * 50304)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=50)
    run(p.parse_args(argv))


if __name__ == "__main__":
    main()
