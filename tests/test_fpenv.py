"""engine.backend.fpenv: denormals flushed to zero inside a block, on the calling thread only,
and the softmax / attention kernels that rely on it (no denormal probabilities, same bits for any
thread count)."""
import threading

import numpy as np
import pytest

import engine as flow
import engine.nn.functional as F
from engine.backend import fpenv, parallel

needs_fpenv = pytest.mark.skipif(not fpenv.available(), reason="no MXCSR control here (x86-64 glibc only)")

TINY = np.finfo(np.float32).tiny  # smallest normal float32


def _is_denormal(a):
    return (a != 0) & (np.abs(a) < TINY)


def _halve(x):
    return np.multiply(x, np.float32(0.5))


@needs_fpenv
def test_flush_inside_the_block_and_ieee_again_after_it():
    x = np.array([TINY, 1.5 * TINY], np.float32)
    before = fpenv.mxcsr()
    assert _is_denormal(_halve(x)).all()  # IEEE: halving the smallest normals gives denormals
    with fpenv.flush_denormals():
        assert fpenv.mxcsr() & 0x8040 == 0x8040
        assert (_halve(x) == 0).all()  # FTZ: denormal results are 0
        d = np.array([1e-40], np.float32)
        assert (d * np.float32(1e30) == 0).all()  # DAZ: a denormal input reads as 0
    assert fpenv.mxcsr() == before
    assert _is_denormal(_halve(x)).all()


@needs_fpenv
def test_state_comes_back_after_an_error_and_when_nested():
    before = fpenv.mxcsr()
    with pytest.raises(KeyError):
        with fpenv.flush_denormals():
            raise KeyError("boom")
    assert fpenv.mxcsr() == before
    with fpenv.flush_denormals():
        inner_before = fpenv.mxcsr()
        with fpenv.flush_denormals():
            pass
        assert fpenv.mxcsr() == inner_before  # the outer block still flushes
    assert fpenv.mxcsr() == before


@needs_fpenv
def test_other_threads_keep_ieee_denormals():
    x = np.array([TINY], np.float32)
    seen = {}
    started, finish = threading.Event(), threading.Event()

    def other():
        started.wait()
        seen["other"] = _halve(x)
        finish.set()

    t = threading.Thread(target=other)
    t.start()
    with fpenv.flush_denormals():
        started.set()
        finish.wait(10)
        seen["here"] = _halve(x)
    t.join()
    assert _is_denormal(seen["other"]).all() and (seen["here"] == 0).all()


def test_unavailable_is_a_no_op(monkeypatch):
    monkeypatch.setattr(fpenv, "_libm", None)
    assert not fpenv.available() and fpenv.mxcsr() is None
    with fpenv.flush_denormals():
        assert _is_denormal(_halve(np.array([TINY], np.float32))).all()


def test_softmax_of_masked_scores_has_no_denormals():
    """A score 100 below its row's maximum (Swin's shift mask) gives exp(-100) ~ 4e-44: with the
    flush it is 0, the rows still sum to 1, and the caller's thread is left as it was."""
    scores = np.zeros((64, 16), np.float32)
    scores[:, 8:] = -100.0
    before = fpenv.mxcsr()
    probs = F.softmax(flow.tensor(scores), dim=-1).numpy()
    assert fpenv.mxcsr() == before
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(probs[:, :8], 1 / 8, rtol=1e-6)
    if fpenv.available():
        assert (probs[:, 8:] == 0).all()
    else:
        assert (probs[:, 8:] < 1e-40).all()


@pytest.mark.parametrize("fill", [-100.0, -1e4])
def test_attention_with_a_shift_mask_bias_flushes_on_every_thread(fill):
    """Swin's case: a [windows, heads, s, s] bias holding the shift mask. The probabilities have
    no denormals whichever thread computed a block, and outputs and gradients have the same bits
    for 1 and 2 threads."""
    from engine.ops.attention import PackedQKVAttention

    rng = np.random.default_rng(0)
    images, windows, heads, s, d = 32, 8, 3, 16, 8  # 196,608 scores: two blocks, one per thread
    x = rng.standard_normal((images, windows, s, heads * 3 * d)).astype(np.float32)
    bias = np.where(rng.random((windows, 1, s, s)) < 0.4, fill, 0.0).astype(np.float32)
    bias = np.broadcast_to(bias, (windows, heads, s, s)).copy()
    bias[..., 0] = 0.0  # no fully masked row
    g = rng.standard_normal((images, windows, s, heads * d)).astype(np.float32)
    before = parallel.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            parallel.set_num_threads(threads)
            qkv, b = flow.tensor(x, requires_grad=True), flow.tensor(bias, requires_grad=True)
            ctx, probs, _ = PackedQKVAttention.apply(qkv, None, b, heads=heads, scale=0.35, fill=-1e4,
                                                     dropout_p=0.0, generator=flow.default_generator)
            ctx.backward(flow.tensor(g))
            results.append((ctx.detach().numpy(), probs.detach().numpy(), qkv.grad.numpy(), b.grad.numpy()))
    finally:
        parallel.set_num_threads(before)
    probs = results[0][1]
    assert not _is_denormal(probs).any()
    masked = np.broadcast_to(bias == fill, (images,) + bias.shape).reshape(probs.shape)
    if fpenv.available():
        assert (probs[masked] == 0).all()
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)
