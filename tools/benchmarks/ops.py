"""Hot ops of a Transformer step, engine vs PyTorch, forward+backward, in one run.

    python tools/benchmarks/ops.py [names ...]

Each op runs on the same float32 values in both libraries (shapes of the GPT-2 block benchmark),
in alternating groups of runs (about 1.5 s of each, at least 12 runs); prints medians and the engine/PyTorch ratio.
"""
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from gpt2_block import interleaved_times  # noqa: E402


def cases(flow, torch):
    causal = {flow: flow.ones(256, 256, dtype=flow.bool).tril().logical_not(),
              torch: torch.ones(256, 256, dtype=torch.bool).tril().logical_not()}
    return {
        "linear [8,256,384]x[1536,384]": ((8, 256, 384), lambda m: m.nn.Linear(384, 1536)),
        "gelu tanh [8,256,1536]": ((8, 256, 1536), lambda m: (lambda x: m.nn.functional.gelu(x, approximate="tanh"))),
        "gelu exact [8,256,1536]": ((8, 256, 1536), lambda m: (lambda x: m.nn.functional.gelu(x))),
        "softmax [8,6,256,256]": ((8, 6, 256, 256), lambda m: (lambda x: x.softmax(-1))),
        "masked_fill [8,6,256,256]": ((8, 6, 256, 256), lambda m: (lambda x: x.masked_fill(causal[m], float("-inf")))),
        "layer_norm [8,256,384]": ((8, 256, 384), lambda m: m.nn.LayerNorm(384)),
        "add [8,256,384]": ((8, 256, 384), lambda m: (lambda x: x + x)),
        "cross_entropy [2048,1000]": ((2048, 1000), lambda m: (lambda x: m.nn.functional.cross_entropy(
            x, m.arange(2048) % 1000))),
        "bias+dropout+residual [8,256,384]": ((8, 256, 384), lambda m: _bias_dropout_residual(m, flow, torch)),
        "conv2d [8,16,16,16]x[32,16,3,3]": ((8, 16, 16, 16), lambda m: m.nn.Conv2d(16, 32, 3, padding=1)),
    }


def _bias_dropout_residual(m, flow, torch, p=0.1):
    """residual + dropout(x + bias) as a transformer block's MLP output uses it: LiBai's fused op
    (bias_dropout_fusion) against PyTorch's dropout of the sum plus the residual; the bias and
    the residual take gradients too, with the same values in both libraries."""
    rng = np.random.default_rng(1)
    b, r = rng.standard_normal(384).astype(np.float32), rng.standard_normal((8, 256, 384)).astype(np.float32)
    if m is torch:
        bt, rt = (torch.from_numpy(a).requires_grad_() for a in (b, r))
        return lambda x: torch.nn.functional.dropout(x + bt, p) + rt
    from engine.ops.dropout import bias_dropout_add

    bf, rf = (flow.from_numpy(a).requires_grad_() for a in (b, r))
    return lambda x: bias_dropout_add(x, bf, rf, p)


def _iterations(*fns, budget_s=1.5, least=12, most=600):
    """Timed runs per function: enough for about `budget_s` of each, so that a sub-millisecond op
    gets hundreds of samples (its median then stands still on a noisy shared machine), a slow one
    at least `least`."""
    per_run = max(_once(fn) for fn in fns)
    return int(min(most, max(least, budget_s / max(per_run, 1e-6))))


def _once(fn):
    fn()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main():
    import torch

    import engine as flow

    only = sys.argv[1:]
    rng = np.random.default_rng(0)
    print(f"{'op (forward+backward)':36s} {'engine ms':>10s} {'torch ms':>10s} {'ratio':>6s}")
    for name, (shape, make) in cases(flow, torch).items():
        if only and not any(o in name for o in only):
            continue
        x = rng.standard_normal(shape).astype(np.float32)
        torch.manual_seed(0)
        ft, ff = make(torch), make(flow)
        if isinstance(ft, torch.nn.Module):
            ff.load_state_dict({k: flow.tensor(v.detach().numpy()) for k, v in ft.state_dict().items()})
        xt, xf = torch.from_numpy(x.copy()).requires_grad_(), flow.from_numpy(x.copy()).requires_grad_()
        out = ft(xt)
        g = rng.standard_normal(tuple(out.shape)).astype(np.float32)
        gt, gf = torch.from_numpy(g), flow.from_numpy(g)

        def run_t():
            xt.grad = None
            ft(xt).backward(gt)

        def run_f():
            xf.grad = None
            ff(xf).backward(gf)

        tt, tf = interleaved_times([run_t, run_f], _iterations(run_t, run_f))
        mt, mf = statistics.median(tt), statistics.median(tf)
        print(f"{name:36s} {mf * 1e3:10.2f} {mt * 1e3:10.2f} {mf / mt:6.2f}")


if __name__ == "__main__":
    main()
