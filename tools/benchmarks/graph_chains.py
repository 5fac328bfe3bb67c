"""Where a replayed nn.Graph step spends its time, and what fusing its elementwise chains could save.

    python tools/benchmarks/graph_chains.py [--model gpt2|bert|vit|swin|all] [--steps 5] [--tiny]

Issue 16 asks for elementwise chains that the graph sees end to end to be fused into one pass
"where a measurement shows it pays". This is that measurement. Each model's training step
(forward, backward, AdamW; the benchmark sizes, random weights) is traced once as an nn.Graph,
then replayed with a timer around every recorded kernel call. A *chain* is a run of entries of
elementwise ops (Add, Mul, Div, Exp, ...) where each one's output is read by the next one only,
so a fused kernel would never write the intermediate out. Fusing a chain of k such passes into
one saves at most the time of all but its slowest pass; that upper bound is printed per model,
next to the replay's total, the share of elementwise ops and the ten costliest kernels.
"""
import argparse
import collections
import os
import statistics
import sys
import time

import numpy as np

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)), os.path.join(os.path.dirname(__file__), "..", "..")]

from gpt2_train import graph_step_fn  # noqa: E402

# one pass over memory per element each: what a fused elementwise kernel would replace (the
# engine's Op names; GELU, softmax, layer_norm and dropout are fused kernels of their own)
ELEMENTWISE = frozenset((
    "Add", "Sub", "Mul", "Div", "Neg", "Pow", "Exp", "Log", "Sqrt", "Rsqrt", "Abs", "Tanh", "Sigmoid",
    "Relu", "ReluGrad", "TanhGrad", "SigmoidGrad", "ExpGrad", "Clamp", "Where", "MaskedFill", "Sign", "Erf",
    "Silu", "SiluGrad",
))


def build_step(model_name):
    """(graph step function, description) for the model at its benchmark size."""
    import engine as flow

    rng = np.random.default_rng(0)
    flow.manual_seed(0)
    if model_name == "gpt2":
        import gpt2_train as g
        from libai.models import GPTForPreTraining

        model = GPTForPreTraining(hidden_layers=g.LAYERS, vocab_size=g.VOCAB, hidden_size=g.HIDDEN,
                                  num_attention_heads=g.HEADS, max_seq_length=g.SEQ)
        ids, labels = g.make_batch()
        return g.engine_graph_step_fn(model, ids, labels), "GPT-2 (gpt2_train.py size)"
    if model_name == "bert":
        import bert_train as b

        a = b.build_parser().parse_args([])
        a.intermediate = 4 * a.hidden
        model = b.build_engine(a)
        ours = b.make_batch(a)[0]
        return (graph_step_fn(model, b._bert_loss, {k: flow.tensor(v) for k, v in ours.items()}, b.LR, b.WD),
                "BERT (bert_train.py defaults)")
    import vision_train as v
    from libai.models import SwinTransformer, VisionTransformer

    a = v.build_parser().parse_args([])
    if model_name == "vit":
        model = VisionTransformer(img_size=a.img, patch_size=a.patch, in_chans=3, embed_dim=a.hidden,
                                  depth=a.layers, num_heads=a.heads, mlp_ratio=4.0, num_classes=a.classes)
    else:
        s = v.swin_size(a)
        model = SwinTransformer(img_size=s["img"], patch_size=s["patch"], in_chans=3, num_classes=a.classes,
                                embed_dim=s["embed"], depths=list(s["depths"]), num_heads=list(s["heads"]),
                                window_size=s["window"], drop_path_rate=0.0)
    img, batch = v.image_and_batch(a, model_name)
    images = rng.standard_normal((batch, 3, img, img)).astype(np.float32)
    labels = rng.integers(0, a.classes, batch)
    step = graph_step_fn(model, lambda m, x, y: m(x, y)["losses"],
                         {"x": flow.tensor(images), "y": flow.tensor(labels)}, v.LR, v.WD)
    return step, f"{model_name} (vision_train.py size)"


class EntryTimer:
    """Wraps every entry of a tape with a timer (seconds summed per entry index)."""

    def __init__(self, tape):
        self.tape = tape
        self.times = [0.0] * len(tape.entries)
        self._saved = []
        for i, e in enumerate(tape.entries):
            if e.fn is None:
                continue
            self._saved.append((e, e.fn))
            e.fn = self._timed(e.fn, i)

    def _timed(self, fn, i):
        times = self.times

        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                times[i] += time.perf_counter() - t0

        return timed

    def restore(self):
        for e, fn in self._saved:
            e.fn = fn


def readers(tape):
    """slot -> indices of the entries that read it."""
    from engine.autograd.trace import _SLOT, _leaves

    out = collections.defaultdict(list)
    for i, e in enumerate(tape.entries):
        for _, code, v in e.arg_patch + e.kw_patch:
            for c, x in _leaves(code, v):
                if c == _SLOT:
                    out[x].append(i)
    return out


def chains(tape):
    """Maximal runs [i0, i1, ...] of elementwise entries, each output read only by the next."""
    read = readers(tape)
    entries = tape.entries
    is_ew = [e.kind == "op" and e.label in ELEMENTWISE for e in entries]
    nxt = {}
    for i, e in enumerate(entries):
        if not is_ew[i] or len(e.outs) != 1 or e.outs[0] is None:
            continue
        r = read.get(e.outs[0], [])
        if len(r) == 1 and is_ew[r[0]]:
            nxt[i] = r[0]
    heads = set(nxt) - set(nxt.values())
    result = []
    for h in sorted(heads):
        run = [h]
        while run[-1] in nxt:
            run.append(nxt[run[-1]])
        result.append(run)
    return result


def analyse(model_name, steps):
    step, what = build_step(model_name)
    for _ in range(3):  # trace, then warm replays
        step()
    tape = step.graph.last_tape
    timer = EntryTimer(tape)
    walls = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        walls.append(time.perf_counter() - t0)
    timer.restore()
    per = [t / steps for t in timer.times]
    wall = statistics.median(walls)
    labels = collections.Counter()
    for e, t in zip(tape.entries, per):
        labels[e.label] += t
    ew = sum(t for e, t in zip(tape.entries, per) if e.kind == "op" and e.label in ELEMENTWISE)
    runs = chains(tape)
    in_chains = sum(per[i] for run in runs for i in run)
    saving = sum(sum(per[i] for i in run) - max(per[i] for i in run) for run in runs)
    print(f"\n== {what}: {len(tape.entries)} replayed entries, step {wall * 1e3:.1f} ms (median of {steps}, "
          f"timed), kernels {sum(per) * 1e3:.1f} ms")
    print(f"elementwise ops: {ew * 1e3:.1f} ms ({ew / wall:.1%} of the step); in {len(runs)} chains of 2+: "
          f"{in_chains * 1e3:.2f} ms; fusing every chain saves at most {saving * 1e3:.2f} ms ({saving / wall:.2%})")
    for run in sorted(runs, key=lambda r: -sum(per[i] for i in r))[:5]:
        names = " -> ".join(tape.entries[i].label for i in run)
        print(f"  {sum(per[i] for i in run) * 1e3:6.2f} ms  {names}  {tape.entries[run[0]].info}")
    print("costliest kernels (ms per step):")
    for name, t in labels.most_common(10):
        print(f"  {name:28s} {t * 1e3:8.2f}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["gpt2", "bert", "vit", "swin", "all"], default="all")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--tiny", action="store_true", help="GPT-2 at gpt2_train.py's tiny size (a smoke run)")
    args = p.parse_args()
    if args.tiny:
        import gpt2_train

        gpt2_train.set_size("tiny")
    for name in (["gpt2", "bert", "vit", "swin"] if args.model == "all" else [args.model]):
        analyse(name, args.steps)


if __name__ == "__main__":
    main()
