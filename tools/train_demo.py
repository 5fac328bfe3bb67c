"""Train a small MLP classifier with the engine on generated data (the project's demo job until
tools/train_net.py lands).

    python tools/train_demo.py [--steps 300] [--device cpu|cuda]

Data: three interleaved 2-D spirals (generated, nothing is downloaded). Model: Linear-GELU-
Linear-GELU-Linear, AdamW, cosine schedule, gradient clipping. Prints the loss every 50 steps and
the final train accuracy; exits non-zero if the model did not learn.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import engine as flow  # noqa: E402
import engine.nn as nn  # noqa: E402
import engine.nn.functional as F  # noqa: E402


def spirals(n_per_class=300, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for c in range(classes):
        r = np.linspace(0.05, 1.0, n_per_class)
        theta = np.linspace(c * 4.0, (c + 1) * 4.0, n_per_class) + rng.normal(0, 0.2, n_per_class)
        xs.append(np.stack([r * np.sin(theta), r * np.cos(theta)], axis=1))
        ys.append(np.full(n_per_class, c))
    return np.concatenate(xs).astype(np.float32), np.concatenate(ys).astype(np.int64)


class MLP(nn.Module):
    def __init__(self, hidden=64, classes=3):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),
                                 nn.Linear(hidden, classes))

    def forward(self, x):
        return self.net(x)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()

    flow.manual_seed(0)
    x_np, y_np = spirals()
    x = flow.tensor(x_np, device=args.device)
    y = flow.tensor(y_np, device=args.device)
    model = MLP().to(args.device)
    opt = flow.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    sched = flow.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    for step in range(1, args.steps + 1):
        idx = flow.tensor(rng.integers(0, len(x_np), args.batch), device=args.device)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == 1:
            print(f"step {step:4d}/{args.steps}  loss {loss.item():.4f}  lr {sched.get_last_lr()[0]:.2e}")
    with flow.no_grad():
        acc = (model(x).argmax(dim=-1) == y).float().mean().item()
    print(f"train accuracy {acc:.3f}  ({time.perf_counter() - t0:.1f} s)")
    if acc < 0.9:
        sys.exit(f"demo failed to learn: accuracy {acc:.3f} < 0.9")


if __name__ == "__main__":
    main()
