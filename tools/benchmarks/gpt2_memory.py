"""A GPT-2 training step's peak memory and time under activation checkpointing and mixed precision.

    python tools/benchmarks/gpt2_memory.py [--layers 6 --hidden 384 --seq 256 --batch 8]

Settings: plain float32; activation checkpointing (every TransformerLayer recomputes its
forward, with the same dropout masks, in backward instead of keeping its activations);
autocast bfloat16; autocast float16 with a GradScaler. Each runs in its own child process (a
few steps of GPTForPreTraining + AdamW, dropout 0.1) that reports the growth of its peak
resident set (VmHWM) over the resident set before the first step, the median step time and the
losses. Checkpointing must give exactly the plain losses (the script fails otherwise); the
mixed-precision losses are shown with their largest relative difference from float32.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def vm_kib(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{key} not in /proc/self/status")


def child(args):
    import numpy as np

    import engine as flow
    from libai.layers.utils import set_activation_checkpointing
    from libai.models import GPTForPreTraining

    flow.manual_seed(0)
    model = GPTForPreTraining(hidden_layers=args.layers, vocab_size=args.vocab, hidden_size=args.hidden,
                              num_attention_heads=args.heads, max_seq_length=args.seq, embedding_dropout_prob=0.1,
                              attention_dropout_prob=0.1, output_dropout_prob=0.1)
    if args.setting == "checkpointing":
        set_activation_checkpointing(model)
    opt = flow.optim.AdamW(model.parameters(), lr=1e-4)
    low = {"bfloat16": flow.bfloat16, "float16": flow.float16}.get(args.setting)
    scaler = flow.amp.GradScaler(enabled=args.setting == "float16")
    ids = np.random.default_rng(0).integers(0, args.vocab, (args.batch, args.seq + 1))
    batch = {"input_ids": flow.tensor(ids[:, :-1]), "labels": flow.tensor(ids[:, 1:])}
    base = vm_kib("VmRSS")
    times, losses = [], []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        with flow.autocast("cpu", dtype=low or flow.bfloat16, enabled=low is not None):
            loss = model(**batch)["lm_loss"]
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        times.append(time.perf_counter() - t0)
        losses.append(float(loss.item()))
    print(json.dumps({"peak_growth_mib": (vm_kib("VmHWM") - base) / 1024,
                      "step_ms": 1000 * statistics.median(times[1:]), "losses": losses}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--settings", default="plain,checkpointing,bfloat16,float16")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--setting", default="plain", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    results = {}
    for setting in ["plain"] + [s for s in args.settings.split(",") if s != "plain"]:
        cmd = [sys.executable, os.path.abspath(__file__), "--child", *sys.argv[1:], "--setting", setting]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
        if proc.returncode != 0:
            sys.exit(proc.stdout + proc.stderr)
        results[setting] = json.loads(proc.stdout.strip().splitlines()[-1])
    plain = results["plain"]
    if "checkpointing" in results and results["checkpointing"]["losses"] != plain["losses"]:
        sys.exit(f"losses differ with activation checkpointing: {plain['losses']} vs "
                 f"{results['checkpointing']['losses']}")
    print(f"GPT-2 step ({args.layers} layers, hidden {args.hidden}, seq {args.seq}, batch {args.batch}, dropout 0.1), "
          f"{args.steps} steps, plain losses {plain['losses']}")
    for name, r in results.items():
        diff = max(abs(a - b) / abs(b) for a, b in zip(r["losses"], plain["losses"]))
        mem, ms = r["peak_growth_mib"], r["step_ms"]
        print(f"{name:14s}: peak memory growth {mem:7.1f} MiB ({mem / plain['peak_growth_mib']:.2f}x)   "
              f"{ms:7.1f} ms/step ({ms / plain['step_ms']:.2f}x)   loss vs plain {diff:.1e}")


if __name__ == "__main__":
    main()
