"""BERT pretraining step: libai BertForPreTraining (engine) vs Hugging Face BertForPreTraining (PyTorch).

    python tools/benchmarks/bert_train.py [--steps 12 --group 4]           # both libraries, one run
    python tools/benchmarks/bert_train.py --no-memory                      # skip the memory children
    python tools/benchmarks/bert_train.py --vocab 30522                    # BERT-base's vocabulary
    python tools/benchmarks/bert_train.py --layers 1 --hidden 64 --heads 2 --seq 16 --batch 2 \\
        --steps 2 --warmup 1 --no-memory                                   # tiny: does it run?
    python tools/benchmarks/bert_train.py --profile                        # project side: where the time goes

Model (defaults, all flags): 6 layers, hidden 384, 6 heads, intermediate 1536, vocab 8192,
sequence 128, batch 16, fp32, dropout 0, post-LN (HF's layout), masked-LM head tied to the word
embeddings + next-sentence head, AdamW (lr 1e-4, weight decay 0.01). A training step is
zero_grad + forward + loss (masked-LM cross-entropy, mean over the masked tokens, + next-sentence
cross-entropy) + backward + optimizer step.

Batch (fixed, seed 0): random token ids in [2, vocab) (0 is HF's [PAD], whose embedding row
gets no gradient in HF, so it is kept out to keep the two trainings identical after step 1),
token types 0 on the first half and 1 on the second, a full attention mask, ~15% of the
positions masked (input replaced by token 1, the label the original token; at least one per
row), random next-sentence labels. Ours gets `lm_labels` (-1 where not predicted) + `loss_mask`
+ `ns_labels` and backpropagates `total_loss`; HF gets `labels` (-100 where not predicted) +
`next_sentence_label` and backpropagates `loss`.

Both models hold the same weights: a randomly initialised transformers BertForPreTraining is saved
with save_pretrained into a temporary folder and the project's model is built from it with
`BertForPreTraining.from_huggingface` (exact). The first-step losses (same batch) must agree to
1e-4 relative, else the script exits with an error. After `--warmup` untimed steps each (the
first gives the compared losses), the two steps run in alternating groups of `--group`
consecutive steps (the first step of each group is discarded, so one library's threads still
spinning do not slow the other), and the medians are compared: ms/step, tokens/s
(batch * seq / step) and the ratio engine/torch (the target is at most 1.0). PyTorch runs with
its default threads (the machine's cores), the engine with its own pool (ENGINE_NUM_THREADS,
default the cores). HF uses its default attention implementation (PyTorch's fused
scaled_dot_product_attention); `--hf-attn eager` selects HF's unfused one.

Peak memory: each library runs a few steps alone in a child process (`--memory-child`) that
reports its peak resident set (VmHWM, /proc/self/status) and the growth of that peak over the
resident set after imports, so the two peaks never mix.

Helpers shared with gpt2_train.py (interleaved timing, /proc/self/status, the op timer) are
imported from it.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
for _p in (ROOT, HERE):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from gpt2_train import graph_step_fn, interleaved_times, proc_status_kb, profile_step  # noqa: E402

LR, WD = 1e-4, 0.01
MASK_ID, MASK_FRACTION = 1, 0.15
SIZE_FLAGS = ("layers", "hidden", "heads", "intermediate", "vocab", "seq", "batch")
LOSS_RTOL = 1e-4


# ------------------------------------------------------------------ helpers
def make_batch(a, seed=0):
    """Engine-side and HF-side arrays of one fixed pretraining batch (see the module docstring)."""
    rng = np.random.default_rng(seed)
    orig = rng.integers(2, a.vocab, size=(a.batch, a.seq), dtype=np.int64)
    masked = rng.random((a.batch, a.seq)) < MASK_FRACTION
    masked[:, 1] = True  # at least one predicted token per row
    ids = np.where(masked, MASK_ID, orig).astype(np.int64)
    types = np.broadcast_to((np.arange(a.seq) >= a.seq // 2).astype(np.int64), (a.batch, a.seq)).copy()
    attention = np.ones((a.batch, a.seq), np.int64)
    ns = rng.integers(0, 2, size=(a.batch,), dtype=np.int64)
    ours = dict(ids=ids, attention=attention, types=types, ns=ns, lm_labels=np.where(masked, orig, -1),
                loss_mask=masked.astype(np.int64))
    hf = dict(input_ids=ids, attention_mask=attention, token_type_ids=types, labels=np.where(masked, orig, -100),
              next_sentence_label=ns)
    return ours, hf


def hf_config(a):
    from transformers import BertConfig

    return BertConfig(vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=a.layers,
                      num_attention_heads=a.heads, intermediate_size=a.intermediate, max_position_embeddings=a.seq,
                      type_vocab_size=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                      attn_implementation=a.hf_attn)


def make_hf(path, a, seed=0):
    import torch
    from transformers import BertForPreTraining

    torch.manual_seed(seed)
    model = BertForPreTraining(hf_config(a))
    model.save_pretrained(path, safe_serialization=True)
    return model


def load_hf(path, a):
    from transformers import BertForPreTraining

    return BertForPreTraining.from_pretrained(path, attn_implementation=a.hf_attn)


def load_engine(path):
    from libai.models import BertForPreTraining

    # the HF folder's config gives vocab_size, hidden_size, hidden_layers, num_attention_heads,
    # intermediate_size, max_position_embeddings, dropout 0 and add_binary_head=True
    return BertForPreTraining.from_huggingface(path)


def build_engine(a):
    """A randomly initialised model of the same size (for --profile; no HF needed)."""
    from libai.models import BertForPreTraining

    return BertForPreTraining(vocab_size=a.vocab, hidden_size=a.hidden, hidden_layers=a.layers,
                              num_attention_heads=a.heads, intermediate_size=a.intermediate,
                              max_position_embeddings=a.seq, hidden_dropout_prob=0.0,
                              attention_probs_dropout_prob=0.0, add_binary_head=True)


def torch_step_fn(model, batch):
    import torch

    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
    inputs = {k: torch.from_numpy(v) for k, v in batch.items()}

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(**inputs).loss
        loss.backward()
        opt.step()
        return float(loss.detach())

    return step


def engine_step_fn(model, batch):
    import engine as flow

    model.train()
    opt = flow.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
    b = {k: flow.tensor(v) for k, v in batch.items()}

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(b["ids"], b["attention"], b["types"], ns_labels=b["ns"], lm_labels=b["lm_labels"],
                     loss_mask=b["loss_mask"])["total_loss"]
        loss.backward()
        opt.step()
        return float(loss.detach().numpy())

    return step


def _bert_loss(model, ids, attention, types, ns, lm_labels, loss_mask):
    return model(ids, attention, types, ns_labels=ns, lm_labels=lm_labels, loss_mask=loss_mask)["total_loss"]


def check_losses(loss_t, loss_f, what="first-step"):
    rel = abs(loss_t - loss_f) / max(abs(loss_t), 1e-12)
    if not rel <= LOSS_RTOL:  # also catches NaN
        raise SystemExit(f"bert_train.py: {what} losses disagree: torch {loss_t:.6f} engine {loss_f:.6f} "
                         f"(relative difference {rel:.2e} > {LOSS_RTOL:g}); the models are not computing the "
                         "same thing, so the timings would not be comparable")
    return rel


def describe(a):
    return (f"{a.layers} layers, hidden {a.hidden}, {a.heads} heads, intermediate {a.intermediate}, "
            f"vocab {a.vocab}, seq {a.seq}, batch {a.batch}, fp32, AdamW(lr={LR}, wd={WD})")


# ------------------------------------------------------------------ memory children
def memory_child(a):
    ours, hf_batch = make_batch(a)
    if a.memory_child == "torch":
        import torch  # noqa: F401
        import transformers  # noqa: F401

        base = proc_status_kb("VmRSS")
        step = torch_step_fn(load_hf(a.path, a), hf_batch)
    else:
        import engine  # noqa: F401
        import libai.models  # noqa: F401

        base = proc_status_kb("VmRSS")
        step = engine_step_fn(load_engine(a.path), ours)
    for _ in range(a.steps):
        step()
    print(json.dumps({"lib": a.memory_child, "peak_kb": proc_status_kb("VmHWM"), "base_kb": base}))


def measure_memory(path, a, steps=3):
    sizes = [x for k in SIZE_FLAGS for x in (f"--{k}", str(getattr(a, k)))]
    out = {}
    for lib in ("torch", "engine"):
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--memory-child", lib, "--path", path,
                            "--steps", str(steps), "--hf-attn", a.hf_attn, *sizes], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"memory child {lib} failed:\n{r.stderr}")
        out[lib] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


# ------------------------------------------------------------------ the comparison
def compare(a):
    import torch

    import engine as flow

    ours, hf_batch = make_batch(a)
    with tempfile.TemporaryDirectory() as path:
        hf = make_hf(path, a)
        fmodel = load_engine(path)
        step_t = torch_step_fn(hf, hf_batch)
        step_f = engine_step_fn(fmodel, ours)
        step_g = graph_step_fn(load_engine(path), _bert_loss, {k: flow.tensor(v) for k, v in ours.items()}, LR, WD)
        losses = [(step_t(), step_f(), step_g())]
        check_losses(*losses[0][:2])
        mem = None if a.no_memory else measure_memory(path, a)
    for _ in range(a.warmup - 1):
        losses.append((step_t(), step_f(), step_g()))
    times_t, times_f, times_g = interleaved_times([step_t, step_f, step_g], a.steps, a.group)
    t_t, t_f, t_g = statistics.median(times_t), statistics.median(times_f), statistics.median(times_g)
    tokens = a.batch * a.seq
    masked = int(ours["loss_mask"].sum())
    print(f"BERT pretraining step: {describe(a)}")
    print(f"  vocab {a.vocab} (--vocab), {masked} masked tokens of {tokens}, token types 0|1 halves, full attention "
          "mask, masked-LM + next-sentence loss")
    print(f"  torch threads {torch.get_num_threads()}, engine threads "
          f"{flow.backend.parallel.get_num_threads()}, HF attention {a.hf_attn}")
    for i, (lt, lf, lg) in enumerate(losses):
        name = "first-step" if i == 0 else ("second-step" if i == 1 else f"step-{i + 1}")
        print(f"  {name} loss: torch {lt:.6f}  engine {lf:.6f}  graph {lg:.6f}  |diff| {abs(lt - lf):.2e}  "
              f"rel {abs(lt - lf) / max(abs(lt), 1e-12):.2e}" + ("  (agree)" if i == 0 else ""))
    print(f"  torch (HF BertForPreTraining)  : {t_t * 1e3:8.1f} ms/step  {tokens / t_t:8.0f} tokens/s")
    print(f"  engine (BertForPreTraining)    : {t_f * 1e3:8.1f} ms/step  {tokens / t_f:8.0f} tokens/s")
    print(f"  engine nn.Graph                : {t_g * 1e3:8.1f} ms/step  {tokens / t_g:8.0f} tokens/s  "
          f"(graph/torch {t_g / t_t:.2f}, graph/eager {t_g / t_f:.2f}; graph mode scores every position in "
          "the masked-LM head)")
    print(f"  ratio engine/torch = {t_f / t_t:.2f}  (medians of {len(times_t)} steps in alternating groups of "
          f"{a.group} after {a.warmup} warm-up step(s); fastest steps {min(times_f) * 1e3:.1f} / "
          f"{min(times_t) * 1e3:.1f} ms, ratio {min(times_f) / min(times_t):.2f})")
    if mem:
        for lib in ("torch", "engine"):
            m = mem[lib]
            print(f"  peak memory {lib:6s}: VmHWM {m['peak_kb'] / 1024:7.0f} MiB  "
                  f"(+{(m['peak_kb'] - m['base_kb']) / 1024:.0f} MiB over the resident set after imports)")


# ------------------------------------------------------------------ profile (project side only)
def profile(a):
    import engine as flow

    flow.manual_seed(0)
    ours, _ = make_batch(a)
    print(f"BERT pretraining step (engine only): {describe(a)}")
    profile_step(engine_step_fn(build_engine(a), ours), a.steps, a.warmup, a.top)


def build_parser():
    """The command line (its defaults are the benchmark size; graph_chains.py reads them)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--hidden", type=int, default=384)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--intermediate", type=int, default=None, help="default 4 * hidden (1536)")
    p.add_argument("--vocab", type=int, default=8192, help="vocabulary size (BERT-base: 30522)")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=12, help="timed steps per library")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per library first (the first gives the "
                   "compared losses)")
    p.add_argument("--group", type=int, default=4, help="consecutive steps per group (first one discarded)")
    p.add_argument("--hf-attn", default="sdpa", choices=["sdpa", "eager"])
    p.add_argument("--no-memory", action="store_true")
    p.add_argument("--profile", action="store_true", help="project side only: per-op kernel times + cProfile")
    p.add_argument("--top", type=int, default=30, help="rows of the --profile tables")
    p.add_argument("--memory-child", choices=["torch", "engine"], help=argparse.SUPPRESS)
    p.add_argument("--path", help=argparse.SUPPRESS)
    return p


def main():
    p = build_parser()
    a = p.parse_args()
    if a.intermediate is None:
        a.intermediate = 4 * a.hidden
    if a.warmup < 1:
        p.error("--warmup must be at least 1 (the first step gives the compared losses)")
    if a.group < 2:
        p.error("--group must be at least 2 (the first step of each group is discarded)")
    if a.steps < 1 or a.hidden % a.heads or a.vocab < 3 or a.seq < 2:
        p.error("need --steps >= 1, --hidden divisible by --heads, --vocab >= 3, --seq >= 2")
    if a.memory_child:
        memory_child(a)
    elif a.profile:
        profile(a)
    else:
        compare(a)


if __name__ == "__main__":
    main()
