"""GPT-2 training step: libai GPTForPreTraining (engine) vs Hugging Face GPT2LMHeadModel (PyTorch).

    python tools/benchmarks/gpt2_train.py [--steps 12 --group 4]           # both libraries, one run
    python tools/benchmarks/gpt2_train.py --no-memory                      # skip the memory children
    python tools/benchmarks/gpt2_train.py --size tiny                      # the Python-overhead size
    python -m engine.distributed.launch --nproc-per-node 2 tools/benchmarks/gpt2_train.py --layout tp2
    python -m engine.distributed.launch --nproc-per-node 2 tools/benchmarks/gpt2_train.py --layout dp2

Model: 6 layers, hidden 384, 6 heads, vocab 8192, sequence 256, batch 8, fp32, dropout 0,
AdamW (lr 1e-4, weight decay 0.01). `--size tiny`: 6 layers, hidden 32, 4 heads, vocab 1024, sequence
8, batch 1, where the kernels cost next to nothing and the step is the libraries' Python work.

The engine runs the step twice over: eagerly, and as an nn.Graph (engine.nn.Graph: traced at its
first call, replayed after); both columns are printed, with the Python calls of one step of each
(cProfile's count, builtins included). A training step is zero_grad + forward + token
cross-entropy (mean over the batch's 2048 tokens, labels aligned with the inputs) + backward +
optimizer step.

Both models hold the same weights: a randomly initialised GPT2LMHeadModel is saved with
save_pretrained into a temporary folder and the project's model is built from it with
`GPTModel.from_huggingface`. The first-step losses (same batch) must agree. The two steps then
run in alternating groups of `--group` consecutive steps (the first step of each group is
discarded, so one library's threads still spinning do not slow the other), and the medians are
compared. PyTorch runs with its default threads (the machine's cores), the engine with its own
pool (ENGINE_NUM_THREADS, default the cores). HF uses its default attention implementation
(PyTorch's fused scaled_dot_product_attention); `--hf-attn eager` selects HF's unfused one.

Peak memory: each library runs a few steps alone in a child process (`--memory-child`) that
reports its peak resident set (VmHWM, /proc/self/status) and the growth of that peak over the
resident set after imports, so the two peaks never mix.

`--layout dp2|tp2|single` (project side only; under the launcher for dp2/tp2): the same model
(random init, same seed) on a data-parallel or tensor-parallel layout of 2 ranks; prints the
median step of the slowest rank and tokens/s. The launcher gives each of 2 ranks
cores // 2 threads (one thread each on a 2-core machine).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from gpt2_block import interleaved_times  # noqa: E402 (tools/benchmarks is the script's folder)

LAYERS, HIDDEN, HEADS, VOCAB, SEQ, BATCH = 6, 384, 6, 8192, 256, 8
SIZES = {"bench": (6, 384, 6, 8192, 256, 8), "tiny": (6, 32, 4, 1024, 8, 1)}


def set_size(name):
    global LAYERS, HIDDEN, HEADS, VOCAB, SEQ, BATCH
    LAYERS, HIDDEN, HEADS, VOCAB, SEQ, BATCH = SIZES[name]
LR, WD = 1e-4, 0.01


# ------------------------------------------------------------------ helpers
def proc_status_kb(key):
    """A kB field of /proc/self/status (VmHWM: peak resident set, VmRSS: current)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return None


def make_batch(seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, size=(BATCH, SEQ), dtype=np.int64)
    labels = np.concatenate([ids[:, 1:], rng.integers(0, VOCAB, size=(BATCH, 1))], axis=1).astype(np.int64)
    return ids, labels


def hf_config(attn="sdpa"):
    from transformers import GPT2Config

    return GPT2Config(n_layer=LAYERS, n_embd=HIDDEN, n_head=HEADS, vocab_size=VOCAB, n_positions=SEQ,
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
                      attn_implementation=attn)


def make_hf(path, attn="sdpa", seed=0):
    import torch
    from transformers import GPT2LMHeadModel

    torch.manual_seed(seed)
    model = GPT2LMHeadModel(hf_config(attn))
    model.save_pretrained(path, safe_serialization=True)
    return model


def load_hf(path, attn="sdpa"):
    from transformers import GPT2LMHeadModel

    return GPT2LMHeadModel.from_pretrained(path, attn_implementation=attn)


def torch_step_fn(model, ids, labels):
    import torch
    import torch.nn.functional as F

    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
    ids_t, labels_t = torch.from_numpy(ids), torch.from_numpy(labels)

    def step():
        opt.zero_grad(set_to_none=True)
        logits = model(ids_t).logits
        loss = F.cross_entropy(logits.view(-1, VOCAB), labels_t.view(-1))
        loss.backward()
        opt.step()
        return float(loss.detach())

    return step


def engine_step_fn(model, ids, labels, placement=None, sbp=None):
    import engine as flow

    model.train()
    opt = flow.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
    if placement is None:
        ids_f, labels_f = flow.tensor(ids), flow.tensor(labels)
    else:
        ids_f = flow.tensor(ids, placement=placement, sbp=sbp)
        labels_f = flow.tensor(labels, placement=placement, sbp=sbp)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(ids_f, labels_f)["lm_loss"]
        loss.backward()
        opt.step()
        return float(loss.detach().numpy())

    return step


def graph_step_fn(model, loss_fn, inputs, lr=LR, wd=WD):
    """`loss_fn(model, **inputs)`, its backward and an AdamW step as an nn.Graph (engine.nn.Graph:
    traced at the first call, replayed after); `step()` returns the loss. Shared by the BERT and
    vision benchmarks."""
    import engine as flow

    model.train()
    opt = flow.optim.AdamW(model.parameters(), lr=lr, weight_decay=wd)

    class TrainStep(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(opt)

        def build(self, **batch):
            loss = loss_fn(self.model, **batch)
            loss.backward()
            return loss

    graph = TrainStep()

    def step():
        return float(graph(**inputs).numpy())

    step.graph = graph
    return step


def engine_graph_step_fn(model, ids, labels):
    """The engine step as an nn.Graph (see graph_step_fn)."""
    import engine as flow

    return graph_step_fn(model, lambda m, ids, labels: m(ids, labels)["lm_loss"],
                         {"ids": flow.tensor(ids), "labels": flow.tensor(labels)})


def python_calls(step):
    """Python function calls (builtins included) of one call of `step`, counted by cProfile."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    step()
    prof.disable()
    return pstats.Stats(prof).total_calls


def load_engine(path):
    from libai.models import GPTForPreTraining, GPTModel

    model = GPTForPreTraining(hidden_layers=1, vocab_size=8, hidden_size=8, num_attention_heads=1,
                              max_seq_length=8)  # shell; replaced by the HF-loaded GPTModel
    model.GPT_model = GPTModel.from_huggingface(path, embedding_dropout_prob=0.0, attention_dropout_prob=0.0,
                                                output_dropout_prob=0.0)
    return model


# ------------------------------------------------------------------ memory children
def memory_child(lib, path, steps):
    base = proc_status_kb("VmRSS")
    ids, labels = make_batch()
    if lib == "torch":
        import torch  # noqa: F401

        base = proc_status_kb("VmRSS")
        step = torch_step_fn(load_hf(path), ids, labels)
    else:
        import engine  # noqa: F401
        import libai.models  # noqa: F401

        base = proc_status_kb("VmRSS")
        make = engine_graph_step_fn if lib == "graph" else engine_step_fn
        step = make(load_engine(path), ids, labels)
    for _ in range(steps):
        step()
    print(json.dumps({"lib": lib, "peak_kb": proc_status_kb("VmHWM"), "base_kb": base}))


def measure_memory(path, size, steps=3):
    out = {}
    for lib in ("torch", "engine", "graph"):
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--memory-child", lib, "--path", path,
                            "--steps", str(steps), "--size", size], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"memory child {lib} failed:\n{r.stderr}")
        out[lib] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


# ------------------------------------------------------------------ the comparison
def compare(args):
    import torch

    import engine as flow

    ids, labels = make_batch()
    with tempfile.TemporaryDirectory() as path:
        hf = make_hf(path, args.hf_attn)
        step_t = torch_step_fn(hf, ids, labels)
        step_f = engine_step_fn(load_engine(path), ids, labels)
        step_g = engine_graph_step_fn(load_engine(path), ids, labels)
        losses = [(step_t(), step_f(), step_g()) for _ in range(2)]  # the graph traces at its first step
        mem = None if args.no_memory else measure_memory(path, args.size)
    calls = [python_calls(s) for s in (step_t, step_f, step_g)]
    times_t, times_f, times_g = interleaved_times([step_t, step_f, step_g], args.steps, args.group)
    t_t, t_f, t_g = statistics.median(times_t), statistics.median(times_f), statistics.median(times_g)
    tokens = BATCH * SEQ
    print(f"GPT-2 training step: {LAYERS} layers, hidden {HIDDEN}, {HEADS} heads, vocab {VOCAB}, seq {SEQ}, "
          f"batch {BATCH}, fp32, AdamW(lr={LR}, wd={WD})")
    print(f"  torch threads {torch.get_num_threads()}, engine threads "
          f"{flow.backend.parallel.get_num_threads()}, HF attention {args.hf_attn}")
    for k, (lt, lf, lg) in enumerate(losses):
        print(f"  step {k + 1} loss: torch {lt:.6f}  engine {lf:.6f}  graph {lg:.6f}  |engine-torch| "
              f"{abs(lf - lt):.2e}  |graph-engine| {abs(lg - lf):.2e}")
    rows = (("torch (HF GPT2LMHeadModel)", t_t, calls[0]), ("engine eager", t_f, calls[1]),
            ("engine nn.Graph", t_g, calls[2]))
    for name, t, n in rows:
        print(f"  {name:27s}: {t * 1e3:8.2f} ms/step  {tokens / t:8.0f} tokens/s  {n:6d} Python calls/step")
    print(f"  ratio eager/torch = {t_f / t_t:.2f}, graph/torch = {t_g / t_t:.2f}, graph/eager = {t_g / t_f:.2f}  "
          f"(medians of {args.steps} steps in alternating groups of {args.group}; fastest steps "
          f"{min(times_f) * 1e3:.1f} / {min(times_g) * 1e3:.1f} / {min(times_t) * 1e3:.1f} ms)")
    tape = step_g.graph.last_tape
    print(f"  graph: {len(tape.entries)} kernel calls, planned peak of intermediates "
          f"{tape.planned_peak_bytes / 2**20:.1f} MiB")
    if mem:
        for lib in ("torch", "engine", "graph"):
            m = mem[lib]
            print(f"  peak memory {lib:6s}: VmHWM {m['peak_kb'] / 1024:7.0f} MiB  "
                  f"(+{(m['peak_kb'] - m['base_kb']) / 1024:.0f} MiB over the resident set after imports)")


# ------------------------------------------------------------------ layouts (project side only)
def layout(args):
    import engine as flow
    from engine.distributed import comm
    from libai.models import GPTForPreTraining
    from libai.utils import distributed as dist

    world = comm.get_world_size()
    dp, tp = {"dp2": (2, 1), "tp2": (1, 2), "single": (1, 1)}[args.layout]
    if dp * tp != world:
        raise SystemExit(f"--layout {args.layout} needs {dp * tp} ranks (got {world}); run it under "
                         "python -m engine.distributed.launch --nproc-per-node 2")
    dist.setup_dist_util({"data_parallel_size": dp, "tensor_parallel_size": tp})
    flow.manual_seed(0)
    model = GPTForPreTraining(hidden_layers=LAYERS, vocab_size=VOCAB, hidden_size=HIDDEN,
                              num_attention_heads=HEADS, max_seq_length=SEQ)
    ids, labels = make_batch()
    step = engine_step_fn(model, ids, labels, dist.get_layer_placement(0), dist.get_hidden_sbp())
    losses = [step() for _ in range(2)]
    times = []
    for _ in range(args.steps):
        if world > 1:
            comm.barrier()
        t0 = time.perf_counter()
        step()
        dt = time.perf_counter() - t0
        if world > 1:
            dt = float(comm.all_reduce(np.array([dt]), op="max")[0])
        times.append(dt)
    if comm.get_rank() == 0:
        t = statistics.median(times)
        print(f"layout {args.layout} (dp={dp}, tp={tp}, {world} rank(s), engine threads per rank "
              f"{flow.backend.parallel.get_num_threads()}): {t * 1e3:.1f} ms/step (median of {args.steps}, "
              f"slowest rank), {BATCH * SEQ / t:.0f} tokens/s, first losses {losses[0]:.4f} {losses[1]:.4f}")


# ------------------------------------------------------------------ profile (project side only)
class OpTimer:
    """Wall time of every engine op's local kernel (`Op.forward`, on arrays; an op's backward is
    made of other ops, so backward kernels show up under their own names), summed per op."""

    def __init__(self):
        from engine.ops.op import Op

        self.totals, self.counts, self._saved = {}, {}, []
        seen, todo = set(), [Op]
        while todo:
            c = todo.pop()
            for sub in c.__subclasses__():
                if sub not in seen:
                    seen.add(sub)
                    todo.append(sub)
        for cls in seen:
            if "forward" in cls.__dict__:
                self._wrap(cls)

    def _wrap(self, cls):
        orig = cls.__dict__["forward"]
        is_cm = isinstance(orig, classmethod)
        fn = orig.__func__ if isinstance(orig, (staticmethod, classmethod)) else orig
        totals, counts = self.totals, self.counts

        def timed(*a, **k):
            # a classmethod gets the calling class first: time under that (sub)class's name
            name = (a[0].name or a[0].__name__) if is_cm else (cls.name or cls.__name__)
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                totals[name] = totals.get(name, 0.0) + time.perf_counter() - t0
                counts[name] = counts.get(name, 0) + 1

        setattr(cls, "forward", classmethod(timed) if is_cm else staticmethod(timed))
        self._saved.append((cls, orig))

    def restore(self):
        for cls, orig in self._saved:
            setattr(cls, "forward", orig)

    def reset(self):
        self.totals.clear()
        self.counts.clear()


def profile_step(step, steps, warmup=2, top=25):
    """Time the engine step `step()`: the median step, the share of op kernels (OpTimer) and a
    cProfile of the rest (also used by bert_train.py)."""
    import cProfile
    import pstats

    for _ in range(max(1, warmup)):
        step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    t_step = statistics.median(times)
    timer = OpTimer()
    n = max(1, steps // 2)
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    t_timed = (time.perf_counter() - t0) / n
    timer.restore()
    kernel = sum(timer.totals.values()) / n
    print(f"engine step {t_step * 1e3:.1f} ms (median of {steps}); with the op timer {t_timed * 1e3:.1f} ms, "
          f"of which op kernels {kernel * 1e3:.1f} ms, {sum(timer.counts.values()) // n} op calls; the rest "
          f"(dispatch, autograd, optimizer, Python) {(t_timed - kernel) * 1e3:.1f} ms")
    print(f"{'op':28s} {'ms/step':>8s} {'calls':>6s}")
    for name, tot in sorted(timer.totals.items(), key=lambda kv: -kv[1])[:top]:
        print(f"{name:28s} {tot / n * 1e3:8.1f} {timer.counts[name] // n:6d}")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        step()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(top)


def profile(args):
    import engine as flow
    from libai.models import GPTForPreTraining

    flow.manual_seed(0)
    model = GPTForPreTraining(hidden_layers=LAYERS, vocab_size=VOCAB, hidden_size=HIDDEN,
                              num_attention_heads=HEADS, max_seq_length=SEQ)
    ids, labels = make_batch()
    profile_step(engine_step_fn(model, ids, labels), args.steps, 2, args.top)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=12, help="timed steps per library")
    p.add_argument("--group", type=int, default=4, help="consecutive steps per group (first one discarded)")
    p.add_argument("--hf-attn", default="sdpa", choices=["sdpa", "eager"])
    p.add_argument("--no-memory", action="store_true")
    p.add_argument("--profile", action="store_true", help="project side only: per-op kernel times + cProfile")
    p.add_argument("--top", type=int, default=30, help="rows of the --profile tables")
    p.add_argument("--layout", choices=["dp2", "tp2", "single"])
    p.add_argument("--size", choices=sorted(SIZES), default="bench", help="model size (tiny: Python overhead)")
    p.add_argument("--memory-child", choices=["torch", "engine", "graph"], help=argparse.SUPPRESS)
    p.add_argument("--path", help=argparse.SUPPRESS)
    args = p.parse_args()
    set_size(args.size)
    if args.memory_child:
        memory_child(args.memory_child, args.path, args.steps)
    elif args.profile:
        profile(args)
    elif args.layout:
        layout(args)
    else:
        compare(args)


if __name__ == "__main__":
    main()
