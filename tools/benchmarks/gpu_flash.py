"""Flash attention's kernels (engine/kernels/flash_attention.py) on a GPU, side by side with
PyTorch's scaled_dot_product_attention (its own flash kernels on float16) and with the engine's
unfused attention core (cuBLAS products + the fused softmax), at GPT-2 124M's attention shape.

    python tools/benchmarks/gpu_flash.py [--batch 8] [--seq 1024] [--heads 12] [--head-size 64]
    python tools/benchmarks/gpu_flash.py --no-causal --dropout 0.1
    python tools/benchmarks/gpu_flash.py --baseline OLD.py [--baseline OLDER.py]   # other versions too
    ENGINE_CUPY_DOUBLE=1 PYTHONPATH=tests/cupy_double/shim:tests \\
        python tools/benchmarks/gpu_flash.py --smoke                  # CPU check through the CuPy double

Inputs: qkv [b, s, heads, 3d] and the output gradient [b, s, heads, d] in float16, drawn once
(standard normal); scale d^-0.5; causal unless --no-causal. Times: each version's forward
(flash_forward: one kernel; up to head size 64 also with the forward's other block shape, one
query m-tile of 16 rows per warp instead of two) and backward (flash_backward: the dq and dkdv
kernels; up to head size 80 also the fused backward, one pass that adds dq by float32 atomics)
as the median of --reps timings, each of --inner calls between two device synchronisations,
after a warm-up.
TFLOP/s count FlashAttention's convention: forward 4 b heads s^2 d (half of it when causal),
backward 2.5 times that (its five products; the engine's split backward does seven, recomputing
the scores and dP in each of its two kernels, and is still credited five).

Correctness, before any timing: the engine's flash output and gradients against PyTorch's on the
same inputs, as ||engine - torch|| / ||torch|| (float16 outputs: about 1e-3 expected); the script
exits if any is above 1e-2, or if an output is not finite (the memory pool is filled with NaN first).
--dropout p > 0 times the kernels with dropout (no comparison with PyTorch: its masks differ).
The last line printed is a JSON record (also appended to --json PATH).
"""
import argparse
import functools
import importlib.util
import json
import os
import statistics
import sys
import time
import types

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

MAX_REL_ERROR = 1e-2


def load_module(path, n):
    """Another version of engine/kernels/flash_attention.py, imported as a sibling of it (its
    relative imports resolve in engine.kernels)."""
    spec = importlib.util.spec_from_file_location(f"engine.kernels._flash_baseline{n}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def timed_ms(fn, sync, reps, inner):
    """Median ms per call of `fn` over `reps` timings of `inner` back-to-back calls."""
    fn()
    sync()
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        sync()
        times.append((time.perf_counter() - t0) / inner)
    return 1e3 * statistics.median(times)


def poison(cp, nbytes):
    """Fill free memory of CuPy's pool with NaN: outputs allocated next start as NaN."""
    junk = cp.full(2 * nbytes // 4, np.nan, np.float32)
    del junk


def rel(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--head-size", type=int, default=64)
    ap.add_argument("--no-causal", action="store_true")
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--inner", type=int, default=10)
    ap.add_argument("--baseline", action="append", default=[],
                    help="another version of engine/kernels/flash_attention.py to time beside it (repeatable)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, 1 rep: a CPU check through the CuPy double")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.smoke:
        a.batch, a.seq, a.heads, a.head_size, a.reps, a.inner = 1, 80, 2, 32, 1, 1

    import torch

    import engine as flow
    from engine import backend
    from engine.kernels import flash_attention as fa
    from engine.ops import attention as A

    cp = backend.cupy()
    sync = flow.cuda.synchronize
    b, s, h, d, causal = a.batch, a.seq, a.heads, a.head_size, not a.no_causal
    scale, fill = d ** -0.5, -10000.0
    rng = np.random.default_rng(0)
    qkv = rng.standard_normal((b, s, h, 3 * d)).astype(np.float16)
    g = rng.standard_normal((b, s, h, d)).astype(np.float16)
    qkv_dev, g_dev = cp.asarray(qkv), cp.asarray(g)
    dropout = (a.dropout, 1234, 0) if a.dropout else None

    tdev = "cuda" if torch.cuda.is_available() else "cpu"
    tsync = torch.cuda.synchronize if tdev == "cuda" else (lambda: None)
    tq, tk, tv = (torch.tensor(qkv[..., i * d:(i + 1) * d], device=tdev).transpose(1, 2).contiguous()
                  .requires_grad_() for i in range(3))  # [b, heads, s, d]
    tg = torch.tensor(g, device=tdev).transpose(1, 2)

    def torch_fwd():
        return torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal, scale=scale)

    versions = [("engine flash", fa)]
    if fa.forward_m_tiles(d) != 1:  # the forward's other block shape: 64 queries, one m-tile per warp
        versions.append(("engine flash, fwd 1 m-tile/warp",
                         types.SimpleNamespace(flash_forward=functools.partial(fa.flash_forward, m_tiles=1),
                                               flash_backward=fa.flash_backward)))
    if d <= fa.FUSED_MAX_HEAD_SIZE:  # the fused backward: one pass over the key tiles, dq by float32 atomics
        versions.append(("engine flash, fused bwd",
                         types.SimpleNamespace(flash_forward=fa.flash_forward,
                                               flash_backward=functools.partial(fa.flash_backward, fused=True))))
    versions += [(f"flash of {os.path.basename(path)}", load_module(path, n)) for n, path in enumerate(a.baseline)]
    record = dict(benchmark="gpu_flash", device=flow.cuda.get_device_name(), batch=b, seq=s, heads=h, head_size=d,
                  causal=causal, dropout=a.dropout, smoke=a.smoke)

    # ---- correctness against PyTorch (no dropout)
    t_out = torch_fwd()
    t_dq, t_dk, t_dv = torch.autograd.grad(t_out, (tq, tk, tv), tg)
    want = {"out": t_out, "dq": t_dq, "dk": t_dk, "dv": t_dv}
    want = {k: v.detach().float().cpu().numpy() for k, v in want.items()}
    errors = {}
    for label, mod in versions:
        poison(cp, qkv.nbytes + g.nbytes)
        out, lse = mod.flash_forward(qkv_dev, None, scale, fill, causal)
        dqkv, _ = mod.flash_backward(g_dev, qkv_dev, out, lse, None, scale, fill, causal)
        out4 = cp.asnumpy(out).transpose(0, 2, 1, 3)
        d4 = cp.asnumpy(dqkv).transpose(0, 2, 1, 3)
        if not (np.isfinite(out4).all() and np.isfinite(d4).all()):
            sys.exit(f"{label}: NaN or inf in the output or gradients (unwritten elements?)")
        got = {"out": out4, "dq": d4[..., :d], "dk": d4[..., d:2 * d], "dv": d4[..., 2 * d:]}
        errors[label] = {k: rel(got[k], want[k]) for k in want}
        bad = {k: e for k, e in errors[label].items() if not e <= MAX_REL_ERROR}
        if bad:
            sys.exit(f"{label}: differs from PyTorch's attention: {bad} (limit {MAX_REL_ERROR})")

    # ---- timings
    fwd_flops = 4 * b * h * s * s * d * (0.5 if causal else 1.0)
    rows = []

    def add(label, fwd_ms, bwd_ms):
        rows.append((label, fwd_ms, bwd_ms))

    for label, mod in versions:
        out, lse = mod.flash_forward(qkv_dev, None, scale, fill, causal, dropout)
        add(label, timed_ms(lambda: mod.flash_forward(qkv_dev, None, scale, fill, causal, dropout), sync, a.reps,
                            a.inner),
            timed_ms(lambda: mod.flash_backward(g_dev, qkv_dev, out, lse, None, scale, fill, causal, dropout), sync,
                     a.reps, a.inner))

    # the engine's op without flash: cuBLAS products + fused softmax (forward), and its backward
    saved = A.FLASH_ATTENTION_ON_GPU
    A.FLASH_ATTENTION_ON_GPU = False
    try:
        x = flow.tensor(qkv.reshape(b, s, -1), device="cuda", requires_grad=True)
        go = flow.tensor(g.reshape(b, s, -1), device="cuda")
        mask = None if not causal else flow.tensor(np.triu(np.ones((s, s), bool), 1)[None, None], device="cuda")

        def unfused():
            return A.PackedQKVAttention.apply(x, mask, None, heads=h, scale=scale, fill=fill, dropout_p=a.dropout,
                                              generator=flow.default_generator)[0]

        def unfused_step():
            x.grad = None
            unfused().backward(go)

        f_ms = timed_ms(unfused, sync, a.reps, a.inner)
        add("engine unfused (cuBLAS + softmax)", f_ms, timed_ms(unfused_step, sync, a.reps, a.inner) - f_ms)
    finally:
        A.FLASH_ATTENTION_ON_GPU = saved

    if a.dropout == 0.0:
        def torch_step():
            tq.grad = tk.grad = tv.grad = None
            torch_fwd().backward(tg)

        f_ms = timed_ms(torch_fwd, tsync, a.reps, a.inner)
        add(f"torch scaled_dot_product_attention ({tdev})", f_ms, timed_ms(torch_step, tsync, a.reps, a.inner) - f_ms)

    print(f"attention on {record['device']}: batch {b}, heads {h}, seq {s}, head {d}, "
          f"{'causal' if causal else 'no mask'}, dropout {a.dropout}; float16; medians of {a.reps} x {a.inner} calls")
    for label, errs in errors.items():
        print(f"  {label} vs torch (rel. error): " + ", ".join(f"{k} {e:.2e}" for k, e in errs.items()))
    print(f"  {'':40s} {'fwd ms':>9s} {'TFLOP/s':>8s} {'bwd ms':>9s} {'TFLOP/s':>8s}")
    for label, f_ms, b_ms in rows:
        print(f"  {label:40s} {f_ms:9.3f} {fwd_flops / f_ms / 1e9:8.1f} {b_ms:9.3f} {2.5 * fwd_flops / b_ms / 1e9:8.1f}")
    record["errors_vs_torch"] = errors
    record["ms"] = {label: {"fwd": f_ms, "bwd": b_ms} for label, f_ms, b_ms in rows}
    line = json.dumps(record)
    print(line)
    if a.json:
        with open(a.json, "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
