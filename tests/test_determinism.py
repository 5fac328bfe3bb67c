"""Bitwise reproducibility on the CPU: a kernel or a training run repeated gives the same bits.

The engine's threaded kernels (engine.backend.parallel) split work by shape and thread count
only and combine partial results in a fixed order. These tests hold them to it: the threaded
reduction itself (blocked, LayerNormGrad's dw/db), the kernels of a GPT-2 block on inputs that
start at every float offset in a cache line, and two identical runs of the GPT-2 recipe (one
process, and 2-process data parallel under the launcher) compared on every logged loss and
every weight.
"""
import json
import os
import sys
import threading
import time

import numpy as np
import pytest
from distributed.mpi_helper import ROOT, mpi_env, run_command

import engine as flow
import engine.nn.functional as F
from engine.backend import parallel
from engine.ops._kernels import blocked, row_blocks
from engine.ops.normalization import LayerNorm, LayerNormGrad


@pytest.fixture
def threads():
    """Set the engine's thread count for one test; restored afterwards."""
    before = parallel.get_num_threads()
    yield parallel.set_num_threads
    parallel.set_num_threads(before)


def bits(*arrays):
    return b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)


class _Ctx:
    pass


# ------------------------------------------------------------------ the threaded reductions
def test_blocked_returns_block_results_in_block_order(threads):
    """Later blocks finishing first (the first ones sleep) still come back in block order."""
    threads(4)
    shape = (64, 8192)  # 8 blocks of 64 Ki elements, 2 per thread
    blocks = row_blocks(shape)
    assert len(blocks) == 8
    finished = []

    def fn(sel):
        i = blocks.index(sel)
        time.sleep(0.02 * (len(blocks) - i))
        finished.append(i)
        return i, threading.get_ident()

    got = blocked(fn, shape)
    assert [i for i, _ in got] == list(range(len(blocks)))
    assert finished != sorted(finished)  # the threads did finish out of order
    assert len({t for _, t in got}) > 1  # and several threads took part


def test_layer_norm_grad_same_bits_every_time_and_any_thread_count(threads):
    """dw and db sum one partial per row block. Added up in the order the threads finished,
    they changed in the last bits from call to call (the cause of two identical GPT-2 runs
    logging different losses); in block order they are the same bits for any thread count."""
    rng = np.random.default_rng(0)
    m, d = 16 * 256, 384  # batch 16, seq 256, hidden 384: above one block (normalization.MIN_PARALLEL)
    g = rng.standard_normal((m, d)).astype(np.float32)
    x = rng.standard_normal((m, d)).astype(np.float32)
    mean = (rng.standard_normal((m, 1)) * 0.1).astype(np.float32)
    rstd = (rng.random((m, 1)) + 0.5).astype(np.float32)
    w = rng.standard_normal(d).astype(np.float32)
    from engine.ops import normalization

    compiled = normalization._layer_norm_grad_rows_jit is not None
    blocks = row_blocks((m, d), normalization._block_elements(m * d, compiled))
    assert len(blocks) >= 3  # a sum of two partials would be order-free

    threads(1)
    ref = bits(*LayerNormGrad.forward(_Ctx(), g, x, mean, rstd, w, 1, True))
    for n in (2, 3, 4, 8):
        threads(n)
        for _ in range(25):
            assert bits(*LayerNormGrad.forward(_Ctx(), g, x, mean, rstd, w, 1, True)) == ref, n


# ------------------------------------------------------------------ buffer alignment
def _at_offset(a, offset):
    """A copy of `a` whose data starts `offset` bytes past a 64-byte boundary."""
    buf = np.empty(a.nbytes + 128, np.uint8)
    start = (-buf.ctypes.data) % 64 + offset
    out = buf[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def _block_step(x, w, ln_w, ln_b, target):
    """layer_norm -> linear -> gelu -> attention-style softmax -> cross_entropy, and backward:
    the loss and every gradient, as numpy arrays."""
    x, w, ln_w, ln_b = (flow.from_numpy(a).requires_grad_() for a in (x, w, ln_w, ln_b))
    h = F.gelu(F.linear(F.layer_norm(x, (x.shape[-1],), ln_w, ln_b), w))
    p = F.softmax(h @ h.transpose(-1, -2) * 0.1, dim=-1) @ h
    loss = F.cross_entropy(p.reshape(-1, p.shape[-1]), flow.from_numpy(target))
    loss.backward()
    return [loss.detach().numpy()] + [t.grad.numpy() for t in (x, w, ln_w, ln_b)]


def test_block_step_does_not_depend_on_buffer_alignment(threads):
    """numpy's SIMD loops may treat the first elements of an unaligned buffer apart; the
    kernels of a GPT-2 block give the same bits wherever their inputs start."""
    threads(2)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 128, 384)).astype(np.float32)
    w = (rng.standard_normal((512, 384)) * 0.05).astype(np.float32)
    ln_w = rng.standard_normal(384).astype(np.float32)
    ln_b = rng.standard_normal(384).astype(np.float32)
    target = rng.integers(0, 512, 4 * 128)
    ref = bits(*_block_step(x, w, ln_w, ln_b, target))
    for offset in range(4, 64, 4):
        got = _block_step(*(_at_offset(a, offset) for a in (x, w, ln_w, ln_b)), target)
        assert bits(*got) == ref, offset


def test_layer_norm_forward_same_bits_any_thread_count(threads):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((16, 256, 384)).astype(np.float32)  # several row blocks
    w, b = rng.standard_normal((2, 384)).astype(np.float32)
    threads(1)
    ref = bits(*LayerNorm.forward(_Ctx(), x, w, b, 1, 1e-5))
    for n in (2, 4):
        threads(n)
        assert bits(*LayerNorm.forward(_Ctx(), x, w, b, 1, 1e-5)) == ref, n


# ------------------------------------------------------------------ whole training runs
CONFIG = os.path.join(ROOT, "configs", "gpt2_pretrain.py")
TRAIN_NET = os.path.join(ROOT, "tools", "train_net.py")
# small enough to train 4 iterations in a few seconds, with 4 engine threads (the kernels'
# blocked sums are checked at sizes where they have several blocks above); dropout stays on
# (its random stream must repeat too)
RUN = ["model.cfg.hidden_layers=2", "model.cfg.hidden_size=256", "model.cfg.ffn_hidden_size=1024",
       "model.cfg.num_attention_heads=4", "model.cfg.max_seq_length=128", "train.train_iter=4",
       "train.log_period=1", "train.train_micro_batch_size=8", "train.evaluation.enabled=False",
       "train.checkpointer.period=100"]


def _train(out, nprocs):
    """tools/train_net.py with 4 engine threads per process (more than this machine's cores,
    so the threads' timing varies from run to run); under the launcher when nprocs > 1."""
    args = ["--config-file", CONFIG, *RUN, f"train.output_dir={out}",
            f"train.dist.data_parallel_size={nprocs}"]
    if nprocs == 1:
        cmd = [sys.executable, TRAIN_NET, *args]
    else:
        cmd = [sys.executable, "-m", "engine.distributed.launch", "--nproc-per-node", str(nprocs),
               "--threads-per-proc", "4", TRAIN_NET, *args]
    run_command(cmd, timeout=300, env=mpi_env(PYTHONHASHSEED="0", ENGINE_NUM_THREADS="4"))
    with open(os.path.join(out, "metrics.json")) as f:
        losses = [r["total_loss"] for r in map(json.loads, f) if "total_loss" in r]
    weights = flow.load(os.path.join(out, "model_final", "model.safetensors"))
    return losses, {k: v.numpy() for k, v in weights.items()}


@pytest.mark.parametrize("nprocs", [1, 2])
def test_gpt2_recipe_twice_same_losses_and_weights(tmp_path, nprocs):
    losses_a, weights_a = _train(str(tmp_path / "a"), nprocs)
    losses_b, weights_b = _train(str(tmp_path / "b"), nprocs)
    assert len(losses_a) == 4
    assert losses_a == losses_b  # float equality of every logged loss: the same bits
    assert sorted(weights_a) == sorted(weights_b) and len(weights_a) > 20
    for k in weights_a:
        assert weights_a[k].dtype == weights_b[k].dtype and bits(weights_a[k]) == bits(weights_b[k]), k
