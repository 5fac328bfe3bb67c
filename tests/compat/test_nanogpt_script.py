"""nanoGPT's train.py / sample.py / model.py, written for torch, run on the engine after only their
import lines were changed (tests/compat/script_runner.port_imports).

The scripts (tests/compat/nanogpt_scripts/) follow Karpathy's nanoGPT closely: the GPT model with
F.scaled_dot_product_attention and tied embeddings, configure_optimizers choosing `fused` by
inspecting AdamW's signature, autocast, GradScaler, gradient accumulation, clip_grad_norm_,
np.memmap data, estimate_loss, checkpoints with resume, torch.compile, and the DDP branch driven
by RANK / LOCAL_RANK / WORLD_SIZE. The data is a few hundred characters written by the fixture.

What is checked, and why it is an honest comparison with torch:

* engine runs on their own: from scratch (compile=True) in float32 and under bfloat16 autocast,
  the first evaluation is near ln(vocab) (a fresh GPT predicts almost uniformly) and the losses
  fall far below it; resuming continues from the saved weights and optimizer state; sample.py
  prints text made of the training text's character pairs; DDP on 2 MPI processes keeps both
  replicas bit-identical although each rank draws different batches.
* against torch: the same seed does not give the same initial weights or batches in the two
  libraries (different generators), so comparing two from-scratch runs could only say "both
  fall". Instead torch's train.py writes its initial checkpoint (eval_only=True), and both
  libraries resume from that one file (the engine reads torch's checkpoint format), on a dataset
  of exactly block_size+1 tokens per split, where `torch.randint(len(data) - block_size, ...)`
  can only return 0: both see the same batches without sharing a generator. With dropout 0 the
  two runs then compute the same function, and float32 losses must agree to the printed 4
  decimals (tolerance 2e-4) and the final weights to 5e-4 (Adam's step is about sign(grad) * lr,
  so float32 rounding grows to ~1e-4 in 10 steps; a wrong gradient or update moves weights by
  ~lr = 1e-2). Under bfloat16 / float16 autocast the two libraries round at different places,
  so there the losses must agree to 1e-2 / 5e-3 (observed: 3e-3 / 5e-4; the losses fall by
  ~0.2 per step). Greedy sampling from a torch-written checkpoint whose keys carry
  torch.compile's '_orig_mod.' prefix gives the same text in both libraries.
* the DDP run is checked on the engine only (torch's would need torchrun and its own RNG
  streams, so nothing could be compared step by step); the DDP wrapper (DDP_REPORT) runs
  train.py unchanged and only reads its globals afterwards.
"""
import hashlib
import math
import os
import pickle
import re
import shutil
import sys

import numpy as np
import pytest

import engine
from script_runner import copy_scripts, mpiexec, port_imports, python, run

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nanogpt_scripts")
TEXT = "the quick brown fox jumps over the lazy dog. " * 8
BLOCK_SIZE = 16  # train.py's default
CHARS = sorted(set(TEXT))
VOCAB = len(CHARS)
LN_VOCAB = math.log(VOCAB)
STEP = re.compile(r"^step (\d+): train loss (\d+\.\d+), val loss (\d+\.\d+)$", re.M)
ITER = re.compile(r"^iter (\d+): loss (\d+\.\d+),", re.M)


def evals(out):
    """[(step, train loss, val loss)] from train.py's output."""
    return [(int(s), float(t), float(v)) for s, t, v in STEP.findall(out)]


def iters(out):
    """[(iter, loss)] from train.py's output."""
    return [(int(i), float(v)) for i, v in ITER.findall(out)]


def write_data(root):
    """data/tiny: the text split 80/20; data/same: block_size+1 tokens per split (see the module doc)."""
    stoi = {c: i for i, c in enumerate(CHARS)}
    meta = {"vocab_size": VOCAB, "itos": {i: c for c, i in stoi.items()}, "stoi": stoi}
    ids = np.array([stoi[c] for c in TEXT], dtype=np.uint16)
    n = int(0.8 * len(ids))
    splits = {"tiny": (ids[:n], ids[n:]),
              "same": (ids[:BLOCK_SIZE + 1], ids[20:20 + BLOCK_SIZE + 1])}
    for name, (train, val) in splits.items():
        d = os.path.join(root, "data", name)
        os.makedirs(d)
        train.tofile(os.path.join(d, "train.bin"))
        val.tofile(os.path.join(d, "val.bin"))
        with open(os.path.join(d, "meta.pkl"), "wb") as f:
            pickle.dump(meta, f)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """Two working directories with the same data: the ported scripts, and the original ones."""
    base = tmp_path_factory.mktemp("nanogpt")
    out = {}
    for lib, port in (("engine", True), ("torch", False)):
        d = str(base / lib)
        copy_scripts(SCRIPTS, d, port=port)
        write_data(d)
        out[lib] = d
    return out


@pytest.fixture(scope="module")
def scratch_fp32(dirs):
    """The engine's float32 run from scratch (compile=True, 20 iterations) into out/."""
    return python("train.py", "--compile=True", cwd=dirs["engine"])


def load_ckpt(d, out_dir):
    path = os.path.join(d, out_dir, "ckpt.pt")
    assert os.path.isfile(path), f"no checkpoint at {path}"
    return engine.load(path)


def assert_learns(out, drop=1.0):
    """First evaluation near ln(vocab); last evaluation and last iterations well below it."""
    ev = evals(out)
    assert len(ev) >= 3, out
    _, train0, val0 = ev[0]
    assert abs(train0 - LN_VOCAB) < 0.1 and abs(val0 - LN_VOCAB) < 0.1, (ev[0], LN_VOCAB)
    assert ev[-1][1] < train0 - drop and ev[-1][2] < val0 - drop, ev
    it = [loss for _, loss in iters(out)]
    assert np.mean(it[-3:]) < np.mean(it[:3]) - drop, it


def bigram_rate(text):
    """Share of the character pairs of `text` that occur in the training text."""
    pairs = [text[i:i + 2] for i in range(len(text) - 1)]
    return sum(p in TEXT for p in pairs) / len(pairs)


def samples(out):
    """The texts sample.py printed, one per sample."""
    body = out.split("Loading meta from", 1)[1].split("\n", 1)[1]
    parts = body.split("---------------\n")
    assert parts[-1] == "", out
    return [p[:-1] for p in parts[:-1]]  # each sample is followed by print()'s newline


# ----------------------------------------------------------------------------- porting
def test_port_changes_only_import_lines():
    expected = {"model.py": 3, "train.py": 3, "sample.py": 1}
    for name, n_imports in expected.items():
        with open(os.path.join(SCRIPTS, name), encoding="utf-8") as f:
            original = f.read()
        ported = port_imports(original)
        a, b = original.splitlines(), ported.splitlines()
        assert len(a) == len(b)
        changed = [(x, y) for x, y in zip(a, b) if x != y]
        assert len(changed) == n_imports, changed
        for x, y in changed:
            assert re.match(r"(import|from) torch\b", x), x
            assert "engine" in y and "torch" not in y.replace(" as torch", ""), y
    assert port_imports("from torch.nn.parallel import DistributedDataParallel as DDP\n") == \
        "from engine.nn.parallel import DistributedDataParallel as DDP\n"
    with pytest.raises(ValueError, match="cannot port"):
        port_imports("import torch.nn\n")  # would bind the name torch to engine's parent package


# ----------------------------------------------------------------------------- engine runs
def test_train_float32_compiled(dirs, scratch_fp32):
    out = scratch_fp32
    assert "compiling the model" in out and "using fused AdamW: False" in out
    assert [s for s, _, _ in evals(out)] == [0, 5, 10, 15, 20]
    assert [i for i, _ in iters(out)] == list(range(21))
    assert_learns(out)
    ckpt = load_ckpt(dirs["engine"], "out")
    assert ckpt["iter_num"] == 20 and ckpt["config"]["compile"] is True
    assert ckpt["model_args"]["vocab_size"] == VOCAB and ckpt["model_args"]["bias"] is False
    assert float(ckpt["best_val_loss"]) == pytest.approx(evals(out)[-1][2], abs=1e-4)
    assert all(int(s["step"]) == 20 for s in ckpt["optimizer"]["state"].values())
    # a compiled model's state_dict keys carry torch's "_orig_mod." prefix (sample.py strips it)
    assert all(k.startswith("_orig_mod.") for k in ckpt["model"])
    model = {k[len("_orig_mod."):]: v for k, v in ckpt["model"].items()}
    assert np.array_equal(model["lm_head.weight"].numpy(), model["transformer.wte.weight"].numpy())  # tied


def test_train_bfloat16_autocast(dirs, scratch_fp32):
    out = python("train.py", "--compile=True", "--dtype=bfloat16", "--out_dir=out_bf16", cwd=dirs["engine"])
    assert_learns(out)
    # same seeds, so the same batches as the float32 run: the losses stay close, and differ
    # somewhere (autocast really computed in bfloat16)
    ev16, ev32 = evals(out), evals(scratch_fp32)
    assert len(ev16) == len(ev32)
    diffs = [abs(a - b) for e16, e32 in zip(ev16, ev32) for a, b in zip(e16[1:], e32[1:])]
    assert max(diffs) < 0.05 and max(diffs) > 0, (ev16, ev32)
    ckpt = load_ckpt(dirs["engine"], "out_bf16")
    assert all(t.dtype == engine.float32 for t in ckpt["model"].values())  # master weights stay float32


def test_resume(dirs, scratch_fp32):
    d = dirs["engine"]
    shutil.copytree(os.path.join(d, "out"), os.path.join(d, "out_resume"))
    out = python("train.py", "--init_from=resume", "--out_dir=out_resume", "--max_iters=30", "--lr_decay_iters=30",
                 "--compile=True", cwd=d)
    ev = evals(out)
    assert [s for s, _, _ in ev] == [20, 25, 30]
    assert [i for i, _ in iters(out)] == list(range(20, 31))
    # the trained weights were loaded: the first evaluation is where the first run ended
    # (other batches: the generator restarts from the seed), far from a fresh model's ln(vocab)
    assert abs(ev[0][1] - evals(scratch_fp32)[-1][1]) < 0.2 and ev[0][1] < LN_VOCAB - 1.0, ev
    assert ev[-1][1] < ev[0][1] and ev[-1][2] < ev[0][2], ev
    ckpt = load_ckpt(d, "out_resume")
    assert ckpt["iter_num"] == 30
    # the optimizer state was loaded too: 20 steps before the resume, 10 after
    assert all(int(s["step"]) == 30 for s in ckpt["optimizer"]["state"].values())


def test_sample(dirs, scratch_fp32):
    d = dirs["engine"]
    greedy = samples(python("sample.py", "--start=the ", "--top_k=1", "--max_new_tokens=40", cwd=d))
    assert len(greedy) == 2 and greedy[0] == greedy[1], greedy
    assert len(greedy[0]) == 44 and greedy[0].startswith("the ")
    assert bigram_rate(greedy[0]) > 0.9, greedy  # a fresh model would give ~5% (30 of 784 pairs)
    sampled = samples(python("sample.py", "--start=the ", "--max_new_tokens=40", cwd=d))
    assert len(sampled) == 2 and sampled[0] != sampled[1], sampled
    for s in sampled:
        assert len(s) == 44 and s.startswith("the ") and set(s) <= set(CHARS), s


# ----------------------------------------------------------------------------- DDP
# Runs train.py unchanged as __main__ on each rank, its stdout going to ddp_rank<R>.log (the
# ranks' streams reach mpiexec interleaved, not always at line boundaries), then reports what
# only the ranks can see: hashes of the replica's parameters and of the rank's last batch.
DDP_REPORT = r"""
import contextlib, hashlib, os, runpy, sys
sys.argv = ['train.py'] + sys.argv[1:]
with open(f"ddp_rank{os.environ['RANK']}.log", 'w') as log, contextlib.redirect_stdout(log):
    g = runpy.run_path('train.py', run_name='__main__')
    h = lambda arrays: hashlib.sha256(b''.join(a.tobytes() for a in arrays)).hexdigest()[:16]
    params = h(p.detach().numpy() for p in g['raw_model'].parameters())
    print(f"report ddp={g['ddp']} world={g['ddp_world_size']} accum={g['gradient_accumulation_steps']} "
          f"params={params} batch={h([g['X'].numpy()])}")
"""
REPORT = re.compile(r"^report ddp=(\w+) world=(\d+) accum=(\d+) params=(\w+) batch=(\w+)$", re.M)


def test_ddp_two_processes(dirs):
    d = dirs["engine"]
    cmd = [mpiexec(), "-n", "2", sys.executable, "-m", "engine.distributed.run", "-c", DDP_REPORT,
           "--gradient_accumulation_steps=4", "--out_dir=out_ddp", "--compile=True", "--max_iters=10"]
    run(cmd, d, timeout=120)
    logs = []
    for rank in range(2):
        with open(os.path.join(d, f"ddp_rank{rank}.log")) as f:
            logs.append(f.read())
    reports = [REPORT.findall(log) for log in logs]
    assert [[r[:3] for r in rep] for rep in reports] == [[("True", "2", "2")]] * 2, logs
    (_, _, _, params0, batch0), (_, _, _, params1, batch1) = reports[0][0], reports[1][0]
    # the ranks drew different batches (seed 1337 + rank), yet the replicas are identical:
    # rank 0's initial weights were broadcast and every step used the averaged gradients
    assert batch0 != batch1 and params0 == params1, reports
    assert [s for s, _, _ in evals(logs[0])] == [0, 5, 10] and not evals(logs[1])  # only the master logs
    assert_learns(logs[0], drop=0.8)
    ckpt = load_ckpt(d, "out_ddp")
    assert ckpt["iter_num"] == 10 and not any(k.startswith("module.") for k in ckpt["model"])


# ----------------------------------------------------------------------------- against torch
@pytest.fixture(scope="module")
def same_init(dirs):
    """Both libraries resume from torch's initial checkpoint on the 'same' dataset (module doc)."""
    t, e = dirs["torch"], dirs["engine"]
    python("train.py", "--dataset=same", "--eval_only=True", "--out_dir=init", cwd=t)
    runs = {}
    for dtype in ("float32", "bfloat16", "float16"):
        for lib, d, extra in (("torch", t, []), ("engine", e, ["--compile=True"])):
            out_dir = f"same_{dtype}"
            shutil.copytree(os.path.join(t, "init"), os.path.join(d, out_dir))
            runs[lib, dtype] = python("train.py", "--dataset=same", "--init_from=resume", f"--out_dir={out_dir}",
                                      "--max_iters=10", f"--dtype={dtype}", *extra, cwd=d)
    return runs


def losses(out):
    return [x for _, t, v in evals(out) for x in (t, v)] + [loss for _, loss in iters(out)]


def test_float32_matches_torch(dirs, same_init):
    import torch
    t_out, e_out = same_init["torch", "float32"], same_init["engine", "float32"]
    assert [s for s, _, _ in evals(e_out)] == [s for s, _, _ in evals(t_out)] == [0, 5, 10]
    assert abs(evals(t_out)[0][1] - LN_VOCAB) < 0.1
    np.testing.assert_allclose(losses(e_out), losses(t_out), rtol=0, atol=2e-4)
    assert losses(t_out)[-1] < losses(t_out)[0] - 1.0
    init = torch.load(os.path.join(dirs["torch"], "init", "ckpt.pt"))["model"]
    t_final = torch.load(os.path.join(dirs["torch"], "same_float32", "ckpt.pt"))["model"]
    # the engine's run compiled the model: torch.compile's "_orig_mod." key prefix, stripped as
    # nanoGPT's own loaders strip it (the torch run does not compile: inductor needs a compiler)
    e_final = {k.removeprefix("_orig_mod."): v
               for k, v in load_ckpt(dirs["engine"], "same_float32")["model"].items()}
    assert set(e_final) == set(t_final)
    moved = 0.0
    for k, w in t_final.items():
        np.testing.assert_allclose(e_final[k].numpy(), w.numpy(), rtol=0, atol=5e-4, err_msg=k)
        moved = max(moved, float((w - init[k]).abs().max()))
    assert moved > 0.05  # training moved the weights far more than the tolerance


@pytest.mark.parametrize("dtype, atol", [("bfloat16", 1e-2), ("float16", 5e-3)])
def test_autocast_matches_torch(same_init, dtype, atol):
    """float16 also runs the GradScaler (enabled only for float16): scale, unscale_, step, update."""
    t_out, e_out = same_init["torch", dtype], same_init["engine", dtype]
    assert len(losses(e_out)) == len(losses(t_out)) == 6 + 11
    np.testing.assert_allclose(losses(e_out), losses(t_out), rtol=0, atol=atol)
    assert losses(e_out)[-1] < losses(e_out)[0] - 1.0


def test_sample_torch_compiled_checkpoint(dirs, same_init):
    """torch.compile'd models save keys with an '_orig_mod.' prefix, which sample.py strips."""
    import torch
    ckpt = torch.load(os.path.join(dirs["torch"], "same_float32", "ckpt.pt"))
    ckpt["model"] = {"_orig_mod." + k: v for k, v in ckpt["model"].items()}
    texts = {}
    for lib, d in dirs.items():
        os.makedirs(os.path.join(d, "compiled"))
        torch.save(ckpt, os.path.join(d, "compiled", "ckpt.pt"))
        out = python("sample.py", "--out_dir=compiled", "--start=the ", "--top_k=1", "--num_samples=1",
                     "--max_new_tokens=30", cwd=d)
        texts[lib] = samples(out)
    assert len(texts["engine"]) == 1 and len(texts["engine"][0]) == 34
    assert texts["engine"] == texts["torch"], texts


def _digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_scripts_left_unmodified_for_torch(dirs):
    """The torch directory holds the original scripts byte for byte (the comparison runs them)."""
    for name in ("model.py", "train.py", "sample.py"):
        assert _digest(os.path.join(dirs["torch"], name)) == _digest(os.path.join(SCRIPTS, name))
