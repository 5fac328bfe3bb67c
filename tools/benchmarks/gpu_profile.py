"""Where the engine's GPT-2 training step spends its time on a GPU (the step of gpu_gpt2.py).

    python tools/benchmarks/gpu_profile.py [--dtype fp16|fp32] [--micro-batch 8]
    ENGINE_CUPY_DOUBLE=1 PYTHONPATH=tests/cupy_double/shim:tests \\
        python tools/benchmarks/gpu_profile.py --smoke            # CPU check through the CuPy double

Three views of the same step, without any profiler the machine may lack:
  * host or device bound: the host's time to issue the step (until step() returns, nothing
    synchronised) against the step's time with a synchronisation at the end. Equal: the GPU
    waits for Python; the host much shorter: the GPU is the limit (in fp16 the loss scaler reads
    a flag inside the step, which makes them equal either way, so no verdict is given);
  * per op: every Op's forward and backward (and the optimizer and scaler calls) bracketed by
    device synchronisations, summed by name over one step: the GPU time plus the host time of
    each op, serialised (their total exceeds the step's);
  * the host's hottest Python functions over one unsynchronised step (cProfile, by own time);
  * the GPU's busy time in one step: the kernels and copies that CUPTI records (through
    torch.profiler, which sees every kernel in the process, CuPy's and cuBLAS's too), summed, and
    the costliest kernels. Busy time far below the step's: the GPU waits for the host.
"""
import argparse
import cProfile
import collections
import io
import os
import pstats
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import gpu_gpt2  # noqa: E402


def _subclasses(cls):
    out = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_subclasses(sub))
    return out


class OpTimer:
    """Wraps every Op's forward and backward (and extra callables) with synchronised timing."""

    def __init__(self, sync):
        self.sync = sync
        self.totals = collections.defaultdict(float)
        self.counts = collections.Counter()
        self.enabled = False
        self.depth = 0

    def wrap(self, label, fn):
        timer = self

        def timed(*args, **kwargs):
            if not timer.enabled or timer.depth:
                return fn(*args, **kwargs)
            timer.sync()
            t0 = time.perf_counter()
            timer.depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                timer.depth -= 1
                timer.sync()
                timer.totals[label] += time.perf_counter() - t0
                timer.counts[label] += 1

        return timed

    def install(self):
        from engine.ops.op import Op

        for op in _subclasses(Op):
            name = op.name if isinstance(getattr(op, "name", None), str) and op.name else op.__name__
            for kind in ("forward", "backward"):
                fn = op.__dict__.get(kind)
                if isinstance(fn, staticmethod):
                    setattr(op, kind, staticmethod(self.wrap(f"{name}.{kind}", fn.__func__)))


def run(a):
    gpu_gpt2.require_devices(a.smoke)
    import engine as flow

    fp16 = a.dtype == "fp16"
    vocab = gpu_gpt2.padded_vocab(a.smoke)
    model = gpu_gpt2.build_engine(a, vocab)
    ids, labels = gpu_gpt2.make_batch(a, gpu_gpt2.SMOKE_VOCAB if a.smoke else gpu_gpt2.GPT2_VOCAB)
    step, scaler = gpu_gpt2.engine_step_fn(model, ids, labels, fp16)
    sync = flow.cuda.synchronize
    for _ in range(a.warmup):
        step()
    sync()

    issue, total = [], []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step()
        issue.append(time.perf_counter() - t0)
        sync()
        total.append(time.perf_counter() - t0)
    issue_ms, total_ms = 1e3 * statistics.median(issue), 1e3 * statistics.median(total)
    print(f"engine GPT-2 step ({a.dtype}, {a.layers} layers, hidden {a.hidden}, seq {a.seq}, micro-batch "
          f"{a.micro_batch}) on {flow.cuda.get_device_name()}")
    if fp16:  # the scaler's inf/nan flag is read inside the step: the host waits for the device there
        verdict = "not told apart: the loss scaler reads a flag inside the step"
    else:
        verdict = "host-bound" if issue_ms > 0.8 * total_ms else "device-bound"
    print(f"  host issues the step in {issue_ms:.1f} ms; the step ends after {total_ms:.1f} ms ({verdict})")

    timer = OpTimer(sync)
    timer.install()
    for obj, attr in ((type(scaler), "step"), (type(scaler), "update"), (type(scaler), "unscale_")):
        setattr(obj, attr, timer.wrap(f"GradScaler.{attr}", getattr(obj, attr)))
    timer.enabled = True
    sync()
    t0 = time.perf_counter()
    step()
    sync()
    serial_ms = 1e3 * (time.perf_counter() - t0)
    timer.enabled = False
    rows = sorted(timer.totals.items(), key=lambda kv: -kv[1])
    timed = 1e3 * sum(timer.totals.values())
    print(f"  per op, synchronised around each (one step: {serial_ms:.1f} ms serialised, {timed:.1f} ms inside "
          f"the timed calls):")
    for label, s in rows[:a.top]:
        print(f"    {label:44s} {1e3 * s:8.2f} ms  {timer.counts[label]:5d} calls  {100e3 * s / serial_ms:5.1f}%")

    prof = cProfile.Profile()
    sync()
    prof.enable()
    step()
    prof.disable()
    sync()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    print(f"  host: {stats.total_calls} Python calls in one step; hottest by own time:")
    stats.sort_stats("tottime").print_stats(a.top)
    print("\n".join("    " + line for line in out.getvalue().splitlines()[-a.top - 2:] if line.strip()))
    if not a.smoke:
        device_busy(step, sync, a.top)


def device_busy(step, sync, top):
    """Sum and top entries of the GPU activity (kernels, copies, sets) in one step, from CUPTI via
    torch.profiler; a line saying why not when PyTorch or its CUDA profiler is missing."""
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except ImportError as e:
        print(f"  GPU busy time: not measured ({e})")
        return
    sync()
    t0 = time.perf_counter()
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            sync()
    except (AssertionError, RuntimeError) as e:  # a CPU-only PyTorch drops the CUDA activity
        print(f"  GPU busy time: not measured (torch.profiler: {e})")
        return
    wall = 1e3 * (time.perf_counter() - t0)
    busy = collections.defaultdict(float)
    calls = collections.Counter()
    for e in prof.events():
        if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA:
            busy[e.name] += e.time_range.elapsed_us() / 1e3
            calls[e.name] += 1
    total = sum(busy.values())
    print(f"  GPU busy in one step (CUPTI, kernels and copies summed): {total:.1f} ms of {wall:.1f} ms wall "
          f"(profiled); costliest:")
    for name, ms in sorted(busy.items(), key=lambda kv: -kv[1])[:top]:
        print(f"    {ms:8.2f} ms {calls[name]:5d}x  {name[:110]}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", default="fp16", choices=["fp16", "fp32"])
    p.add_argument("--micro-batch", type=int)
    p.add_argument("--top", type=int, default=25, help="rows of each table")
    p.add_argument("--smoke", action="store_true", help="tiny model through the CuPy double")
    a = p.parse_args(argv)
    for k, v in (gpu_gpt2.SMOKE if a.smoke else gpu_gpt2.FULL).items():
        if getattr(a, k, None) is None:
            setattr(a, k, v)
    a.steps = min(a.steps, 5)
    return a


if __name__ == "__main__":
    run(parse_args())
