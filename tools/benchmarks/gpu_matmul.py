"""Batched and plain matrix products on a GPU: CuPy's matmul (what the engine calls) against
PyTorch's on the same GPU, in TFLOP/s, for the shapes of GPT-2 124M's step (seq 1024, batch 8).

    python tools/benchmarks/gpu_matmul.py [--tiny]
Why: the attention core's batched float16 product q k^T measured 13 TFLOP/s through CuPy
(tools/benchmarks/gpu_attention.py), below its float32 rate. Medians of 20 synchronised runs after
one warm-up; fresh random inputs.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_attention import timed as timed_ms  # noqa: E402

REPS = 20


def timed(fn, sync):
    """Seconds: the median of REPS synchronised runs after a warm-up."""
    return timed_ms(fn, sync, REPS) / 1e3


def main():
    tiny = "--tiny" in sys.argv  # every size divided by 64: a quick check of the script itself
    import cupy as cp
    try:
        import torch
        has_torch = torch.cuda.is_available()
    except ImportError:
        has_torch = False
    sync_cp = cp.cuda.runtime.deviceSynchronize
    rng = np.random.default_rng(0)
    cases = [  # (label, batch shape, m, k, n, b transposed)
        ("q k^T: 96 x (1024 x 64 x 1024), k^T a view", (96,), 1024, 64, 1024, True),
        ("q k^T: 96 x (1024 x 64 x 1024), k^T contiguous", (96,), 1024, 64, 1024, False),
        ("p v:   96 x (1024 x 1024 x 64)", (96,), 1024, 1024, 64, False),
        ("qkv projection: 8192 x 768 x 2304", (), 8192, 768, 2304, False),
        ("LM head: 8192 x 768 x 50304, weight^T a view", (), 8192, 768, 50304, True),
    ]
    print(f"{'product':52s} {'dtype':8s} {'cupy TFLOP/s':>13s} {'torch TFLOP/s':>14s}")
    for label, batch, m, k, n, bt in cases:
        if tiny:
            batch, m, k, n = tuple(max(1, x // 64) for x in batch), max(1, m // 64), max(1, k // 64), max(1, n // 64)
        for dt in (np.float16, np.float32):
            a = rng.standard_normal(batch + (m, k)).astype(dt)
            b = rng.standard_normal(batch + ((n, k) if bt else (k, n))).astype(dt)
            flops = 2 * int(np.prod(batch)) * m * k * n
            ad, bd = cp.asarray(a), cp.asarray(b)
            bdv = bd.swapaxes(-1, -2) if bt else bd
            t_cp = timed(lambda: cp.matmul(ad, bdv), sync_cp)
            t_th = None
            if has_torch:
                at, bt_ = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
                btv = bt_.transpose(-1, -2) if bt else bt_
                t_th = timed(lambda: torch.matmul(at, btv), torch.cuda.synchronize)
            th = "n/a" if t_th is None else f"{flops / t_th / 1e12:14.1f}"
            print(f"{label:52s} {np.dtype(dt).name:8s} {flops / t_cp / 1e12:13.1f} {th:>14s}")


if __name__ == "__main__":
    main()
