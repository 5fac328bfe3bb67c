"""Vision training step: libai VisionTransformer (engine) vs HuggingFace ViTForImageClassification (PyTorch).

    python tools/benchmarks/vision_train.py [--steps 12 --group 4]        # ViT, both libraries, one run
    python tools/benchmarks/vision_train.py --layers 1 --hidden 64 --heads 2 --batch 2 --steps 2 --warmup 1
                                                                          # tiny: does it run?

Model (defaults, all flags): ViT, image 32, patch 4 (64 patches + the cls token), 6 layers,
width 384, 6 heads, MLP 1536, 10 classes, fp32, dropout 0, batch 32 of random images and labels
(seed 0), cross-entropy, AdamW (lr 1e-4, weight decay 0.05). A step is zero_grad + forward +
loss + backward + optimizer step. Swin joins this script with issue 12's Swin model.

Both models hold the same weights: a randomly initialised transformers ViTForImageClassification
is saved with save_pretrained and the project's model is built from it with
`VisionTransformer.from_huggingface` (exact). The first-step losses (same batch) must agree to
1e-4 relative, else the script exits with an error. Then the two steps run in alternating groups
of `--group` consecutive steps (the first of each group discarded) and the medians are compared:
ms/step, images/s and the ratio engine/torch (issue 12's target: at most 1.0). PyTorch runs with
its default threads (the machine's cores), the engine with its own pool; HF uses its default
attention (PyTorch's fused scaled_dot_product_attention).
"""
import argparse
import os
import statistics
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
for _p in (ROOT, HERE):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from bert_train import check_losses  # noqa: E402
from gpt2_train import interleaved_times  # noqa: E402

LR, WD = 1e-4, 0.05


def make_batch(a, seed=0):
    rng = np.random.default_rng(seed)
    images = rng.standard_normal((a.batch, 3, a.img, a.img)).astype(np.float32)
    return images, rng.integers(0, a.classes, a.batch)


def make_hf(path, a):
    import torch
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    cfg = ViTConfig(image_size=a.img, patch_size=a.patch, num_channels=3, hidden_size=a.hidden,
                    num_hidden_layers=a.layers, num_attention_heads=a.heads, intermediate_size=4 * a.hidden,
                    num_labels=a.classes, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                    attn_implementation="sdpa")
    model = ViTForImageClassification(cfg)
    model.save_pretrained(path, safe_serialization=True)
    return model


def torch_step_fn(model, images, labels):
    import torch

    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
    x, y = torch.from_numpy(images), torch.from_numpy(labels)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(pixel_values=x, labels=y).loss
        loss.backward()
        opt.step()
        return float(loss.detach())

    return step


def engine_step_fn(model, images, labels):
    import engine as flow

    model.train()
    opt = flow.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
    x, y = flow.tensor(images), flow.tensor(labels)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)["losses"]
        loss.backward()
        opt.step()
        return float(loss.detach().numpy())

    return step


def compare(a):
    import torch

    import engine as flow
    from libai.models import VisionTransformer

    images, labels = make_batch(a)
    with tempfile.TemporaryDirectory() as path:
        hf = make_hf(path, a)
        ours = VisionTransformer.from_huggingface(path)
    step_t, step_f = torch_step_fn(hf, images, labels), engine_step_fn(ours, images, labels)
    losses = [(step_t(), step_f())]
    check_losses(*losses[0])
    for _ in range(a.warmup - 1):
        losses.append((step_t(), step_f()))
    times_t, times_f = interleaved_times([step_t, step_f], a.steps, a.group)
    t_t, t_f = statistics.median(times_t), statistics.median(times_f)
    print(f"ViT training step: image {a.img}, patch {a.patch}, {a.layers} layers, width {a.hidden}, {a.heads} heads, "
          f"MLP {4 * a.hidden}, {a.classes} classes, batch {a.batch}, fp32, AdamW(lr={LR}, wd={WD})")
    print(f"  torch threads {torch.get_num_threads()}, engine threads {flow.backend.parallel.get_num_threads()}")
    lt, lf = losses[0]
    print(f"  first-step loss: torch {lt:.6f}  engine {lf:.6f}  |diff| {abs(lt - lf):.2e}  (agree)")
    print(f"  torch (HF ViTForImageClassification): {t_t * 1e3:8.1f} ms/step  {a.batch / t_t:8.1f} images/s")
    print(f"  engine (VisionTransformer)          : {t_f * 1e3:8.1f} ms/step  {a.batch / t_f:8.1f} images/s")
    print(f"  ratio engine/torch = {t_f / t_t:.2f}  (medians of {len(times_t)} steps in alternating groups of "
          f"{a.group} after {a.warmup} warm-up step(s); fastest steps {min(times_f) * 1e3:.1f} / "
          f"{min(times_t) * 1e3:.1f} ms, ratio {min(times_f) / min(times_t):.2f})")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--img", type=int, default=32)
    p.add_argument("--patch", type=int, default=4)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--hidden", type=int, default=384)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=12, help="timed steps per library")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per library first (the first gives the "
                   "compared losses)")
    p.add_argument("--group", type=int, default=4, help="consecutive steps per group (first one discarded)")
    a = p.parse_args()
    if a.warmup < 1 or a.group < 2 or a.steps < 1:
        p.error("need --warmup >= 1, --group >= 2, --steps >= 1")
    if a.hidden % a.heads or a.img % a.patch:
        p.error("need --hidden divisible by --heads and --img divisible by --patch")
    compare(a)


if __name__ == "__main__":
    main()
