"""GPT-2 124M training step on one GPU: libai GPTForPreTraining (engine, CuPy) vs Hugging Face
GPT2LMHeadModel (PyTorch eager), side by side in one process on the same GPU and the same weights.

    python tools/benchmarks/gpu_gpt2.py [--micro-batch 8] [--dtype fp16|fp32] [--json out.jsonl]
    python tools/benchmarks/gpu_gpt2.py --cuda-graph      # engine forward + backward replayed as a CUDA graph
    python tools/benchmarks/gpu_gpt2.py --attention auto      # the unfused attention core (cuBLAS + softmax)
    python tools/benchmarks/gpu_gpt2.py --attention float32   # the engine's attention upcast (the old path)
    python tools/benchmarks/gpu_gpt2.py --peak-tflops 756             # a GPU missing from the table
    ENGINE_CUPY_DOUBLE=1 PYTHONPATH=tests/cupy_double/shim:tests \\
        python tools/benchmarks/gpu_gpt2.py --smoke                    # CPU check through the CuPy double

Model: 12 layers, hidden 768, 12 heads, vocab 50257 padded to a multiple of 128 (50304, as the
GPT-2 recipe's tokenization.make_vocab_size_divisible_by pads it), sequence 1024, dropout 0,
AdamW (lr 1e-4, weight decay 0.01). A training step is zero_grad + forward + token cross-entropy
(mean over the micro-batch's tokens, labels aligned with the inputs, drawn from the 50257 real
ids) + backward + optimizer step. `--dtype fp16` (default): autocast float16 with dynamic loss
scaling (engine.amp.GradScaler / torch.amp.GradScaler), float32 master weights; `--dtype fp32`:
no autocast, no scaler. TF32 stays off on both sides (the defaults of PyTorch and CuPy).

Weights: the engine model is drawn (seed 0, on the CPU generator) with its layers placed on
'cuda' (libai.utils.distributed.set_device_type), then its logical state dict is mapped to HF's
layout (libai.models.utils.libai_to_hf_gpt2) and loaded into the PyTorch model. The first-step
losses (same batch) must agree, else the script exits: the timings would not be comparable.

Timing: `--warmup` untimed steps each (the first gives the compared losses), then `--steps`
timed steps alternating engine / torch, each step bracketed by a device synchronisation
(engine.cuda.synchronize, torch.cuda.synchronize); medians. Printed per library: ms/step,
tokens/s (micro-batch * seq / step), MFU and peak memory (engine.cuda.max_memory_allocated:
CuPy's pool; torch.cuda.max_memory_allocated: PyTorch's caching allocator; both from before the
model is built). The ratio engine/torch is that of the step times, as in the CPU benchmarks
(below 1: the engine is faster). Then `--steps` more steps each, synchronised after the forward,
the backward and the optimizer, give each library's median time per phase, and `--steps` more
the time the host takes to issue forward + backward against the time their GPU work ends.

`--cuda-graph`: after the warm-up, the engine's forward + scaled backward are captured once with
engine.cuda.graph and replayed each step (the optimizer step and the scaler update stay eager,
queued behind the replay: the scaler's inf/nan flag stays on the GPU, docs/cuda.md); the phases
are then replay and optimizer, and the graph's
private memory pool is reported beside the default pool's peak.

MFU: model FLOPs per token = 6 * N + 12 * layers * hidden * seq (PaLM's estimate, as nanoGPT's
estimate_mfu: N counts the parameters without the position embeddings, a lookup, and with the
tied word embeddings once, since the LM head is a real matmul), times tokens/s, over the GPU's
peak dense fp16/bf16 tensor FLOPS from PEAK_TFLOPS (keyed by the device name) or
--peak-tflops; the same peak for --dtype fp32, so the fp32 MFU shows what is left on the table.

`--smoke`: 2 layers, hidden 64, 4 heads, vocab 256, seq 32, micro-batch 2, 1 warm-up and 2
timed steps; the engine runs on 'cuda' (in CI the strict CuPy double, numpy underneath), PyTorch
on the CPU (its peak memory is then not reported). It checks that the script runs, not speed.

The last line printed is the JSON record of the run; `--json PATH` also appends it to PATH
(one line per run) for docs/benchmarks.md.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

GPT2_VOCAB, PAD_MULTIPLE = 50257, 128
FULL = dict(layers=12, hidden=768, heads=12, seq=1024, micro_batch=8, warmup=3, steps=10)
SMOKE = dict(layers=2, hidden=64, heads=4, seq=32, micro_batch=2, warmup=1, steps=2)
SMOKE_VOCAB = 256
LR, WD = 1e-4, 0.01
LOSS_RTOL = {"fp32": 1e-4, "fp16": 1e-2}  # fp16: two libraries round logits and sums differently
# (words that must all be in the device name, peak dense fp16/bf16 tensor TFLOPS); first match wins
PEAK_TFLOPS = [
    (("H100", "PCIe"), 756.0),
    (("H100", "NVL"), 835.0),
    (("H100",), 989.0),  # SXM (HBM3)
    (("H200",), 989.0),
    (("A100",), 312.0),
]


# ------------------------------------------------------------------ sizes and figures
def padded_vocab(smoke):
    from libai.tokenizer.base import vocab_size_with_padding

    return SMOKE_VOCAB if smoke else vocab_size_with_padding(GPT2_VOCAB, PAD_MULTIPLE)


def peak_tflops_for(name):
    """The table's peak for device `name`, or None when the GPU is not in it."""
    for words, tflops in PEAK_TFLOPS:
        if all(w.lower() in name.lower() for w in words):
            return tflops
    return None


def flops_per_token(n_params, layers, hidden, seq):
    return 6 * n_params + 12 * layers * hidden * seq


def mfu(tokens_per_s, flops_token, peak_tflops):
    return None if peak_tflops is None else tokens_per_s * flops_token / (peak_tflops * 1e12)


def make_batch(a, real_vocab, seed=0):
    """Token ids and next-token labels (the last label random), all below the unpadded vocab."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, real_vocab, size=(a.micro_batch, a.seq), dtype=np.int64)
    last = rng.integers(0, real_vocab, size=(a.micro_batch, 1), dtype=np.int64)
    return ids, np.concatenate([ids[:, 1:], last], axis=1)


def check_losses(loss_t, loss_f, dtype):
    rel = abs(loss_t - loss_f) / max(abs(loss_t), 1e-12)
    if not rel <= LOSS_RTOL[dtype]:  # also catches NaN
        raise SystemExit(f"gpu_gpt2.py: first-step losses disagree: torch {loss_t:.6f} engine {loss_f:.6f} "
                         f"(relative difference {rel:.2e} > {LOSS_RTOL[dtype]:g}); the models are not computing "
                         "the same thing, so the timings would not be comparable")
    return rel


# ------------------------------------------------------------------ the two models
def build_engine(a, vocab):
    import engine as flow
    from libai.models import GPTForPreTraining
    from libai.utils import distributed as dist

    dist.set_device_type("cuda")
    flow.manual_seed(0)
    p = getattr(a, "dropout", 0.0)
    return GPTForPreTraining(hidden_layers=a.layers, vocab_size=vocab, hidden_size=a.hidden,
                             num_attention_heads=a.heads, max_seq_length=a.seq, embedding_dropout_prob=p,
                             attention_dropout_prob=p, output_dropout_prob=p)


def host_state_dict(model):
    """{name: numpy array} of `model`'s (single-rank, CUDA) parameters and buffers, copied to the
    host (libai's logical_state_dict calls Tensor.numpy(), which refuses CUDA tensors as torch's)."""
    return {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}


def build_torch(engine_model, a, vocab, device):
    """GPT2LMHeadModel holding `engine_model`'s weights, on `device`."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from libai.models.utils import libai_to_hf_gpt2

    p = getattr(a, "dropout", 0.0)
    cfg = GPT2Config(n_layer=a.layers, n_embd=a.hidden, n_head=a.heads, vocab_size=vocab, n_positions=a.seq,
                     resid_pdrop=p, embd_pdrop=p, attn_pdrop=p, bos_token_id=0, eos_token_id=0,
                     attn_implementation=a.hf_attn)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(cfg)
    sd = libai_to_hf_gpt2(host_state_dict(engine_model.GPT_model), a.layers, a.heads)
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()}, strict=False)
    untied = [k for k in missing if k != "lm_head.weight" and not k.endswith((".attn.bias", ".attn.masked_bias"))]
    if untied or unexpected:
        raise RuntimeError(f"gpu_gpt2.py: weight copy into GPT2LMHeadModel: missing {untied}, unexpected {unexpected}")
    if model.lm_head.weight.data_ptr() != model.transformer.wte.weight.data_ptr():
        raise RuntimeError("gpu_gpt2.py: GPT2LMHeadModel's lm_head is not tied to wte")
    return model.to(device)


def timed_phases(sync, *parts):
    """Seconds of each of `parts` (callables run in order), synchronised after each."""
    marks = [time.perf_counter()]
    for part in parts:
        part()
        sync()
        marks.append(time.perf_counter())
    return [b - a for a, b in zip(marks, marks[1:])]


def _scaled_step(forward, scaler, opt):
    """The training step around `forward` (zero_grad + forward, returning the loss): backward of
    the scaled loss, scaled optimizer step, scaler update; returns the loss. `.phases(sync)` runs
    the same step synchronised after the forward, the backward and the optimizer, and returns
    their seconds. engine.amp.GradScaler and torch.amp.GradScaler share this API."""
    def backward(loss):
        scaler.scale(loss).backward()

    def update():
        scaler.step(opt)
        scaler.update()

    def step():
        loss = forward()
        backward(loss)
        update()
        return loss

    def phases(sync):
        held = []
        return timed_phases(sync, lambda: held.append(forward()), lambda: backward(held[0]), update)

    def issue(sync):
        """(seconds until forward + backward return, seconds until their GPU work is done): when
        the two are close, the host's Python is what bounds the step, not the GPU."""
        sync()
        t0 = time.perf_counter()
        loss = forward()
        backward(loss)
        t1 = time.perf_counter()
        sync()
        t2 = time.perf_counter()
        update()
        return t1 - t0, t2 - t0

    step.phases = phases
    step.phase_names = ("forward", "backward", "optimizer")
    step.issue = issue
    step.parts = forward, backward, update
    return step


def engine_step_fn(model, ids, labels, fp16):
    """zero_grad + forward (autocast float16 when `fp16`) + backward of the scaled loss + scaled
    step; returns the loss tensor unread, so the step's own host reads (the GradScaler's inf/nan
    check) are all that is timed besides the GPU work."""
    import engine as flow
    from libai.utils import distributed as dist

    model.train()
    opt = flow.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
    scaler = flow.amp.GradScaler("cuda", enabled=fp16)
    placement = dist.get_layer_placement(0)
    ids_f = flow.tensor(ids, placement=placement, sbp=flow.sbp.broadcast)
    labels_f = flow.tensor(labels, placement=placement, sbp=flow.sbp.broadcast)

    def forward():
        opt.zero_grad(set_to_none=True)
        with flow.autocast("cuda", dtype=flow.float16, enabled=fp16):
            return model(ids_f, labels_f)["lm_loss"]

    return _scaled_step(forward, scaler, opt), scaler


def torch_step_fn(model, ids, labels, fp16, device):
    import torch
    import torch.nn.functional as F

    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
    scaler = torch.amp.GradScaler(device, enabled=fp16)
    ids_t, labels_t = torch.from_numpy(ids).to(device), torch.from_numpy(labels).to(device)
    vocab = model.config.vocab_size

    def forward():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.float16, enabled=fp16):
            logits = model(ids_t).logits
            return F.cross_entropy(logits.view(-1, vocab), labels_t.view(-1))

    return _scaled_step(forward, scaler, opt), scaler


# ------------------------------------------------------------------ devices
def require_devices(smoke):
    """The torch device ('cuda', or 'cpu' under --smoke); exits with the reason when the engine
    or PyTorch cannot reach a GPU."""
    import engine as flow

    if not flow.cuda.is_available():
        if smoke:
            raise SystemExit("gpu_gpt2.py --smoke runs the engine on 'cuda': it needs CuPy with a GPU or the CuPy "
                             "double (ENGINE_CUPY_DOUBLE=1 PYTHONPATH=tests/cupy_double/shim:tests)")
        raise SystemExit("gpu_gpt2.py needs a CUDA GPU: the engine's CUDA backend (CuPy) finds none "
                         "(engine.cuda.is_available() is False). Use --smoke for a CPU check of the script.")
    if smoke:
        return "cpu"
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("gpu_gpt2.py needs a CUDA GPU for PyTorch too: torch.cuda.is_available() is False "
                         f"(torch {torch.__version__}; a CPU-only build?)")
    return "cuda"


def syncs(torch_device):
    import torch

    import engine as flow

    torch_sync = torch.cuda.synchronize if torch_device == "cuda" else (lambda: None)
    return flow.cuda.synchronize, torch_sync


def median_phases(step, sync, n):
    """{phase: median ms} over `n` steps synchronised after each phase."""
    sync()
    runs = [step.phases(sync) for _ in range(n)]
    return {name: 1e3 * statistics.median(r[i] for r in runs) for i, name in enumerate(step.phase_names)}


def engine_graph_step_fn(model, ids, labels, fp16, warmup):
    """The engine's step with forward + scaled backward captured once in a CUDA graph
    (engine.cuda.graph) after `warmup` eager steps, then replayed; the optimizer step and the
    scaler update stay eager, queued behind the replay (the scaler's inf/nan flag stays on the
    GPU, so the host does not wait for the replay). Returns (step, scaler,
    graph); step.first_loss is the loss of the first eager step."""
    import engine as flow

    eager, scaler = engine_step_fn(model, ids, labels, fp16)
    first = float(eager())
    for _ in range(warmup):
        eager()
    forward, backward, update = eager.parts
    g = flow.cuda.CUDAGraph()
    with flow.cuda.graph(g):
        loss = forward()
        backward(loss)

    def step():
        g.replay()
        update()
        return loss

    def phases(sync):
        return timed_phases(sync, g.replay, update)

    def issue(sync):
        sync()
        t0 = time.perf_counter()
        g.replay()
        t1 = time.perf_counter()
        sync()
        t2 = time.perf_counter()
        update()
        return t1 - t0, t2 - t0

    step.phases, step.phase_names, step.issue, step.first_loss = phases, ("replay", "optimizer"), issue, first
    return step, scaler, g


def median_issue(step, sync, n):
    """{host, device: median ms} of forward + backward over `n` steps (see _scaled_step.issue)."""
    runs = [step.issue(sync) for _ in range(n)]
    return {"host": 1e3 * statistics.median(r[0] for r in runs), "done": 1e3 * statistics.median(r[1] for r in runs)}


def timed_steps(steps, sync_fns, n):
    """`n` timed runs of each step function, alternating, each bracketed by its device's
    synchronisation; per-function lists of seconds."""
    times = [[] for _ in steps]
    for _ in range(n):
        for step, sync, ts in zip(steps, sync_fns, times):
            sync()
            t0 = time.perf_counter()
            step()
            sync()
            ts.append(time.perf_counter() - t0)
    return times


# ------------------------------------------------------------------ the run
def count_calls(module, name):
    """Wrap module.name to count its calls; returns the one-element counter."""
    calls, real = [0], getattr(module, name)

    def counted(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    setattr(module, name, counted)
    return calls


def run(a):
    torch_device = require_devices(a.smoke)
    import torch

    import engine as flow

    from engine.kernels import flash_attention as flash_kernels
    from engine.ops import attention

    attention.HALF_ATTENTION_ON_GPU = {"float16": True, "float32": False}.get(a.attention)
    attention.FLASH_ATTENTION_ON_GPU = a.attention in ("default", "flash")
    attention.FLASH_BACKWARD = a.flash_backward
    flash_calls = count_calls(flash_kernels, "forward_cuda")
    fp16 = a.dtype == "fp16"
    vocab = padded_vocab(a.smoke)
    real_vocab = SMOKE_VOCAB if a.smoke else GPT2_VOCAB
    name = flow.cuda.get_device_name()
    peak = a.peak_tflops if a.peak_tflops is not None else peak_tflops_for(name)

    flow.cuda.reset_peak_memory_stats()  # starts the engine's peak tracking before the model exists
    if torch_device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    fmodel = build_engine(a, vocab)
    tmodel = build_torch(fmodel, a, vocab, torch_device)
    n_params = sum(p.numel() for p in fmodel.parameters())
    n_flops = n_params - fmodel.GPT_model.embeddings.position_embeddings.weight.numel()
    ids, labels = make_batch(a, real_vocab)
    graph = None
    if a.cuda_graph:
        step_f, scaler_f, graph = engine_graph_step_fn(fmodel, ids, labels, fp16, a.warmup - 1)
        loss_f = step_f.first_loss
    else:
        step_f, scaler_f = engine_step_fn(fmodel, ids, labels, fp16)
        loss_f = float(step_f())
    if a.attention == "flash" and not flash_calls[0]:
        raise SystemExit("gpu_gpt2.py --attention flash: the flash-attention kernels did not run (they need "
                         "--dtype fp16 and a head size that is a multiple of 16 up to 128)")
    step_t, scaler_t = torch_step_fn(tmodel, ids, labels, fp16, torch_device)
    loss_t = float(step_t().detach())
    rel = None if a.dropout else check_losses(loss_t, loss_f, a.dtype)  # dropout: the two draw other masks
    for _ in range(a.warmup - 1):
        if graph is not None:
            step_f()
        step_t()
    sync_fns = syncs(torch_device)
    times_f, times_t = timed_steps([step_f, step_t], sync_fns, a.steps)
    phase_f, phase_t = (median_phases(fn, sync, a.steps) for fn, sync in zip((step_f, step_t), sync_fns))
    issue_f, issue_t = (median_issue(fn, sync, a.steps) for fn, sync in zip((step_f, step_t), sync_fns))

    tokens = a.micro_batch * a.seq
    fpt = flops_per_token(n_flops, a.layers, a.hidden, a.seq)
    figures = {}
    for lib, times, loss, scaler, phases, issue in (("engine", times_f, loss_f, scaler_f, phase_f, issue_f),
                                                    ("torch", times_t, loss_t, scaler_t, phase_t, issue_t)):
        t = statistics.median(times)
        figures[lib] = dict(ms_per_step=t * 1e3, tokens_per_s=tokens / t, mfu=mfu(tokens / t, fpt, peak),
                            first_loss=loss, loss_scale=scaler.get_scale() if fp16 else None, phases_ms=phases,
                            fwd_bwd_issue_ms=issue)
    figures["engine"]["peak_memory_bytes"] = int(flow.cuda.max_memory_allocated())
    figures["engine"]["cuda_graph_pool_bytes"] = None if graph is None else graph.pool_bytes()
    figures["engine"]["last_loss"] = float(step_f())
    figures["torch"]["peak_memory_bytes"] = int(torch.cuda.max_memory_allocated()) if torch_device == "cuda" else None
    record = dict(benchmark="gpu_gpt2", smoke=a.smoke, device=name, torch_device=torch_device, dtype=a.dtype,
                  layers=a.layers, hidden=a.hidden, heads=a.heads, vocab=vocab, seq=a.seq, micro_batch=a.micro_batch,
                  warmup=a.warmup, steps=a.steps, hf_attn=a.hf_attn, dropout=a.dropout,
                  attention=a.attention, flash_backward=a.flash_backward, flash_forward_calls=flash_calls[0], cuda_graph=a.cuda_graph,
                  params=n_params, flops_per_token=fpt,
                  peak_tflops=peak, first_loss_rel_diff=rel,
                  ratio_step_time_engine_over_torch=figures["engine"]["ms_per_step"] / figures["torch"]["ms_per_step"],
                  engine=figures["engine"], torch=figures["torch"])
    report(record)
    line = json.dumps(record)
    if a.json:
        with open(a.json, "a") as f:
            f.write(line + "\n")
    print(line)
    return record


def _mib(n):
    return "n/a (torch on the CPU)" if n is None else f"{n / 2**20:.0f} MiB"


def report(r):
    e, t = r["engine"], r["torch"]
    print(f"GPT-2 training step on {r['device']}: {r['layers']} layers, hidden {r['hidden']}, {r['heads']} heads, "
          f"vocab {r['vocab']}, seq {r['seq']}, micro-batch {r['micro_batch']}, {r['dtype']}"
          f"{' (autocast float16 + GradScaler)' if r['dtype'] == 'fp16' else ''}, AdamW(lr={LR}, wd={WD})")
    print(f"  {r['params']} parameters, {r['flops_per_token'] / 1e6:.1f} MFLOP/token, torch on {r['torch_device']}, "
          f"HF attention {r['hf_attn']}, engine attention {r.get('attention', 'auto')}")
    if r["first_loss_rel_diff"] is None:
        print(f"  first-step loss: torch {t['first_loss']:.6f}  engine {e['first_loss']:.6f}  (not compared: "
              f"dropout {r['dropout']:g} draws other masks in each library)")
    else:
        print(f"  first-step loss: torch {t['first_loss']:.6f}  engine {e['first_loss']:.6f}  "
              f"rel diff {r['first_loss_rel_diff']:.2e} (agree)")
    for lib, label, f in (("torch", "torch (HF GPT2LMHeadModel)", t), ("engine", "engine (GPTForPreTraining)", e)):
        m = "n/a (unknown GPU: pass --peak-tflops)" if f["mfu"] is None else f"{100 * f['mfu']:.1f}%"
        print(f"  {label}: {f['ms_per_step']:8.1f} ms/step  {f['tokens_per_s']:9.0f} tokens/s  MFU {m}  "
              f"peak memory {_mib(f['peak_memory_bytes'])}")
        phases = ", ".join(f"{k} {v:.1f} ms" for k, v in f["phases_ms"].items())
        print(f"      phases (synchronised after each): {phases}")
        if f.get("cuda_graph_pool_bytes"):
            print(f"      CUDA graph: forward + backward replayed; its private memory pool holds "
                  f"{_mib(f['cuda_graph_pool_bytes'])} (peak memory above: the default pool, eager warm-up included)")
        print(f"      forward + backward unsynchronised: issued in {f['fwd_bwd_issue_ms']['host']:.1f} ms, GPU done "
              f"at {f['fwd_bwd_issue_ms']['done']:.1f} ms (close: the host bounds the step)")
    ratio = r["ratio_step_time_engine_over_torch"]
    print(f"  ratio engine/torch = {ratio:.2f} (step time; tokens/s engine/torch {1 / ratio:.2f}); medians of "
          f"{r['steps']} synchronised steps after {r['warmup']} warm-up; MFU against "
          f"{'no known peak' if r['peak_tflops'] is None else str(r['peak_tflops']) + ' TFLOPS'}")
    if r["dtype"] == "fp16":
        print(f"  loss scale after the run: engine {e['loss_scale']:g}  torch {t['loss_scale']:g}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--micro-batch", type=int, help=f"sequences per step (default {FULL['micro_batch']})")
    p.add_argument("--dtype", default="fp16", choices=["fp16", "fp32"])
    p.add_argument("--warmup", type=int, help=f"untimed steps per library, >= 1 (default {FULL['warmup']})")
    p.add_argument("--steps", type=int, help=f"timed steps per library (default {FULL['steps']})")
    p.add_argument("--peak-tflops", type=float, help="the GPU's peak dense fp16/bf16 tensor TFLOPS for the MFU "
                                                     "(default: from the table by device name)")
    p.add_argument("--hf-attn", default="sdpa", choices=["sdpa", "eager"])
    p.add_argument("--cuda-graph", action="store_true",
                   help="the engine's forward + backward captured once in a CUDA graph (engine.cuda.graph) and "
                        "replayed; the optimizer step stays eager")
    p.add_argument("--attention", default="default", choices=["default", "flash", "auto", "float16", "float32"],
                   help="the engine's attention core: default = the engine's own choice (the flash-attention "
                        "kernels where they apply, FLASH_ATTENTION_ON_GPU: fp16); flash = those kernels or a "
                        "refusal; the others are the unfused core (cuBLAS products around the fused softmax), "
                        "float16 inputs computed in float16 or float32 (engine.ops.attention.HALF_ATTENTION_ON_GPU; "
                        "auto = float16 where its products go through cuBLAS)")
    p.add_argument("--flash-backward", default="split", choices=["split", "fused"],
                   help="the flash-attention backward (engine.ops.attention.FLASH_BACKWARD): split = the dq and dkdv "
                        "kernels (deterministic), fused = one pass adding dq by float32 atomics")
    p.add_argument("--dropout", type=float, default=0.0,
                   help="embedding, attention and residual dropout in both models (default 0: the first-step "
                        "losses are compared; with dropout they are not, the masks differ)")
    p.add_argument("--json", metavar="PATH", help="append the run's JSON record to PATH")
    p.add_argument("--smoke", action="store_true", help="tiny model, engine on 'cuda', torch on the CPU")
    a = p.parse_args(argv)
    for k, v in (SMOKE if a.smoke else FULL).items():
        if getattr(a, k, None) is None:
            setattr(a, k, v)
    if a.warmup < 1 or a.steps < 1 or a.micro_batch < 1:
        p.error("--warmup, --steps and --micro-batch must be >= 1")
    if a.peak_tflops is not None and not (a.peak_tflops > 0 and math.isfinite(a.peak_tflops)):
        p.error(f"--peak-tflops must be a positive number, got {a.peak_tflops}")
    if not 0.0 <= a.dropout < 1.0:
        p.error(f"--dropout must be in [0, 1), got {a.dropout}")
    return a


def main():
    run(parse_args())


if __name__ == "__main__":
    main()
