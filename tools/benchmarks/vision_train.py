"""Vision training steps: libai VisionTransformer / SwinTransformer (engine) vs HuggingFace
ViTForImageClassification / SwinForImageClassification (PyTorch).

    python tools/benchmarks/vision_train.py [--model vit|swin|both] [--steps 12 --group 4]
    python tools/benchmarks/vision_train.py --layers 1 --hidden 64 --heads 2 --batch 2 --steps 2 --warmup 1
                                                                          # tiny ViT: does it run?

ViT (defaults, flags --img --patch --layers --hidden --heads --batch): image 32, patch 4 (64
patches + the cls token), 6 layers, width 384, 6 heads, MLP 1536, batch 32.
Swin (fixed but for --batch, tiny-like stages at image 64): patch 2 (a 32x32 map), embed 96,
depths (2, 2, 6, 2), heads (3, 6, 12, 24), window 4 (maps 32, 16, 8, 4: shifted windows in the
first three stages), batch 16. (A window of 7 here would leave stages whose map is smaller than the window, which
transformers 5.23's Swin cannot run.) --swin-tiny: the configs/swin_imagenet.py recipe's size instead (image 32,
embed 32, depths (2, 2), heads (2, 4): plain and shifted windows, a patch merging), for a quick check that it runs.
Both: 10 classes, fp32, dropout and drop-path 0, random images and labels (seed 0),
cross-entropy, AdamW (lr 1e-4, weight decay 0.05). A step is zero_grad + forward + loss +
backward + optimizer step.

Both libraries hold the same weights: a randomly initialised transformers model is saved with
save_pretrained and the project's model is built from it with `from_huggingface` (exact). The
first-step losses (same batch) must agree to 1e-4 relative, else the script exits with an error.
Then the two steps run in alternating groups of `--group` consecutive steps (the first of each
group discarded) and the medians are compared: ms/step, images/s and the ratio engine/torch
(issue 12's target: at most 1.0). PyTorch runs with its default threads (the machine's cores),
the engine with its own pool; HF uses its default attention.
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
from gpt2_train import graph_step_fn, interleaved_times  # noqa: E402

LR, WD = 1e-4, 0.05


SWIN = dict(img=64, patch=2, embed=96, depths=(2, 2, 6, 2), heads=(3, 6, 12, 24), window=4, batch=16)
SWIN_TINY = dict(img=32, patch=2, embed=32, depths=(2, 2), heads=(2, 4), window=4, batch=16)
VIT_BATCH = 32


def swin_size(a):
    """The Swin sizes of the parsed arguments `a`: SWIN, or SWIN_TINY with --swin-tiny."""
    return SWIN_TINY if a.swin_tiny else SWIN


def image_and_batch(a, model):
    """(image size, images per step) of `model` under the parsed arguments `a`."""
    if model == "vit":
        return a.img, a.batch or VIT_BATCH
    size = swin_size(a)
    return size["img"], a.batch or size["batch"]


def make_batch(img, batch, classes, seed=0):
    rng = np.random.default_rng(seed)
    images = rng.standard_normal((batch, 3, img, img)).astype(np.float32)
    return images, rng.integers(0, classes, batch)


def make_hf(path, a, model):
    import torch
    from transformers import SwinConfig, SwinForImageClassification, ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    if model == "vit":
        cfg = ViTConfig(image_size=a.img, patch_size=a.patch, num_channels=3, hidden_size=a.hidden,
                        num_hidden_layers=a.layers, num_attention_heads=a.heads, intermediate_size=4 * a.hidden,
                        num_labels=a.classes, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                        attn_implementation="sdpa")
        hf = ViTForImageClassification(cfg)
    else:
        size = swin_size(a)
        cfg = SwinConfig(image_size=size["img"], patch_size=size["patch"], embed_dim=size["embed"],
                         depths=list(size["depths"]), num_heads=list(size["heads"]), window_size=size["window"],
                         num_labels=a.classes, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                         drop_path_rate=0.0)
        hf = SwinForImageClassification(cfg)
    hf.save_pretrained(path, safe_serialization=True)
    return hf


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


def compare(a, model):
    import torch

    import engine as flow
    from libai.models import SwinTransformer, VisionTransformer

    img, batch = image_and_batch(a, model)
    images, labels = make_batch(img, batch, a.classes)
    with tempfile.TemporaryDirectory() as path:
        hf = make_hf(path, a, model)
        cls = VisionTransformer if model == "vit" else SwinTransformer
        ours, ours_g = cls.from_huggingface(path), cls.from_huggingface(path)
    step_t, step_f = torch_step_fn(hf, images, labels), engine_step_fn(ours, images, labels)
    step_g = graph_step_fn(ours_g, lambda m, x, y: m(x, y)["losses"],
                           {"x": flow.tensor(images), "y": flow.tensor(labels)}, LR, WD)
    losses = [(step_t(), step_f(), step_g())]
    check_losses(*losses[0][:2])
    for _ in range(a.warmup - 1):
        losses.append((step_t(), step_f(), step_g()))
    times_t, times_f, times_g = interleaved_times([step_t, step_f, step_g], a.steps, a.group)
    t_t, t_f, t_g = statistics.median(times_t), statistics.median(times_f), statistics.median(times_g)
    if model == "vit":
        print(f"ViT training step: image {a.img}, patch {a.patch}, {a.layers} layers, width {a.hidden}, "
              f"{a.heads} heads, MLP {4 * a.hidden}, {a.classes} classes, batch {batch}, fp32, "
              f"AdamW(lr={LR}, wd={WD})")
    else:
        size = swin_size(a)
        print(f"Swin training step: image {size['img']}, patch {size['patch']}, embed {size['embed']}, depths "
              f"{size['depths']}, heads {size['heads']}, window {size['window']}, {a.classes} classes, batch {batch}, "
              f"fp32, AdamW(lr={LR}, wd={WD})")
    print(f"  torch threads {torch.get_num_threads()}, engine threads {flow.backend.parallel.get_num_threads()}")
    lt, lf, lg = losses[0]
    print(f"  first-step loss: torch {lt:.6f}  engine {lf:.6f}  graph {lg:.6f}  |diff| {abs(lt - lf):.2e}  (agree)")
    name_t = "HF ViTForImageClassification" if model == "vit" else "HF SwinForImageClassification"
    name_f = "VisionTransformer" if model == "vit" else "SwinTransformer"
    print(f"  torch ({name_t}): {t_t * 1e3:8.1f} ms/step  {batch / t_t:8.1f} images/s")
    print(f"  engine ({name_f}): {t_f * 1e3:8.1f} ms/step  {batch / t_f:8.1f} images/s")
    print(f"  engine nn.Graph: {t_g * 1e3:8.1f} ms/step  {batch / t_g:8.1f} images/s  (graph/torch {t_g / t_t:.2f}, "
          f"graph/eager {t_g / t_f:.2f})")
    print(f"  ratio engine/torch = {t_f / t_t:.2f}  (medians of {len(times_t)} steps in alternating groups of "
          f"{a.group} after {a.warmup} warm-up step(s); fastest steps {min(times_f) * 1e3:.1f} / "
          f"{min(times_t) * 1e3:.1f} ms, ratio {min(times_f) / min(times_t):.2f})")


def build_parser():
    """The command line (its defaults are the benchmark size; graph_chains.py reads them)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["vit", "swin", "both"], default="vit")
    p.add_argument("--img", type=int, default=32)
    p.add_argument("--patch", type=int, default=4)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--hidden", type=int, default=384)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--swin-tiny", action="store_true", help="Swin at the swin_imagenet.py recipe's size (a quick run)")
    p.add_argument("--batch", type=int, default=None, help="images per step (default: ViT 32, Swin 16)")
    p.add_argument("--steps", type=int, default=12, help="timed steps per library")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per library first (the first gives the "
                   "compared losses)")
    p.add_argument("--group", type=int, default=4, help="consecutive steps per group (first one discarded)")
    return p


def main():
    p = build_parser()
    a = p.parse_args()
    if a.warmup < 1 or a.group < 2 or a.steps < 1:
        p.error("need --warmup >= 1, --group >= 2, --steps >= 1")
    if a.swin_tiny and a.model == "vit":
        p.error("--swin-tiny sizes the Swin model: use it with --model swin or both")
    if a.hidden % a.heads or a.img % a.patch:
        p.error("need --hidden divisible by --heads and --img divisible by --patch")
    for model in (("vit", "swin") if a.model == "both" else (a.model,)):
        compare(a, model)


if __name__ == "__main__":
    main()
