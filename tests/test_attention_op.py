"""engine.nn.functional.packed_qkv_attention against the same computation written with the
engine's separate ops (permuted views, matmul, scale_mask_softmax, dropout): the fused core does
the same arithmetic, so it gives the same values, forward and backward, dropout included (it
draws its mask as F.dropout on the probabilities would)."""
import numpy as np
import pytest

import engine as flow
import engine.nn.functional as F
from engine.backend import parallel


def _separate_ops(qkv, heads, mask, scale, fill, p):
    b, s = qkv.shape[:2]
    d = qkv.shape[2] // (3 * heads)
    q, k, v = (t.permute(0, 2, 1, 3) for t in qkv.view(b, s, heads, 3 * d).chunk(3, dim=-1))
    probs = F.scale_mask_softmax(flow.matmul(q, k.transpose(-1, -2)), mask, scale=scale, fill=fill)
    if p > 0:
        probs = F.dropout(probs, p, training=True)
    return flow.matmul(probs, v).permute(0, 2, 1, 3).reshape(b, s, heads * d)


def _run(fn, x, g, seed):
    flow.manual_seed(seed)
    qkv = flow.tensor(x, requires_grad=True)
    out = fn(qkv)
    out.backward(flow.tensor(g))
    return out.detach().numpy(), qkv.grad.numpy()


MASKS = {
    "none": None,
    "causal": np.triu(np.ones((1, 1, 9, 9), bool), 1),
    "padding": (np.arange(9)[None, None, None, :] >= np.array([9, 6, 3, 1])[:, None, None, None]),
    "fully-masked-rows": np.zeros((4, 1, 9, 9), bool) | (np.arange(9)[None, None, :, None] == 4),
}


@pytest.mark.parametrize("mask_name", sorted(MASKS))
@pytest.mark.parametrize("p", [0.0, 0.3])
@pytest.mark.parametrize("threads", [1, 2])
def test_fused_core_equals_the_separate_ops(mask_name, p, threads):
    rng = np.random.default_rng(0)
    heads, d = 3, 8
    x = rng.standard_normal((4, 9, heads * 3 * d)).astype(np.float32)
    g = rng.standard_normal((4, 9, heads * d)).astype(np.float32)
    mask_np = MASKS[mask_name]
    mask = flow.tensor(mask_np) if mask_np is not None else None
    scale = 1 / np.sqrt(d)
    before = parallel.get_num_threads()
    parallel.set_num_threads(threads)
    try:
        fused = _run(lambda t: F.packed_qkv_attention(t, heads, mask, dropout_p=p), x, g, seed=7)
        ref = _run(lambda t: _separate_ops(t, heads, mask, scale, -10000.0, p), x, g, seed=7)
    finally:
        parallel.set_num_threads(before)
    for a, b, what in zip(fused, ref, ("output", "qkv gradient")):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7, err_msg=what)
    assert np.isfinite(fused[1]).all()
    if mask_name == "fully-masked-rows" and p == 0:
        # with a finite fill the fully masked query row attends uniformly: the mean of the values
        v = x.reshape(4, 9, heads, 3 * d)[..., 2 * d:]
        np.testing.assert_allclose(fused[0][:, 4], v.mean(axis=1).reshape(4, heads * d), rtol=1e-5, atol=1e-6)


def test_dropout_draws_from_the_generator_and_only_in_training():
    x = np.random.default_rng(1).standard_normal((2, 6, 12)).astype(np.float32)
    qkv = flow.tensor(x)
    flow.manual_seed(3)
    a = F.packed_qkv_attention(qkv, 2, dropout_p=0.5).numpy()
    flow.manual_seed(3)
    b = F.packed_qkv_attention(qkv, 2, dropout_p=0.5).numpy()
    c = F.packed_qkv_attention(qkv, 2, dropout_p=0.5).numpy()
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    evald = F.packed_qkv_attention(qkv, 2, dropout_p=0.5, training=False).numpy()
    np.testing.assert_array_equal(evald, F.packed_qkv_attention(qkv, 2).numpy())


def test_bad_inputs_are_clear_errors():
    qkv = flow.zeros(2, 5, 12)
    with pytest.raises(RuntimeError, match=r"heads \* 3 \* head_size.*heads=5.*\[2, 5, 12\]"):
        F.packed_qkv_attention(qkv, 5)
    with pytest.raises(RuntimeError, match=r"mask must be bool and broadcastable to \[2, 2, 5, 5\]"):
        F.packed_qkv_attention(qkv, 2, flow.zeros(2, 1, 5, 4, dtype=flow.bool))
    with pytest.raises(RuntimeError, match="mask must be bool"):
        F.packed_qkv_attention(qkv, 2, flow.zeros(1, 1, 5, 5))
    with pytest.raises(ValueError, match="dropout probability"):
        F.packed_qkv_attention(qkv, 2, dropout_p=1.5)
    with pytest.raises(RuntimeError, match="double backward"):
        x = flow.randn(2, 5, 12, requires_grad=True)
        (gx,) = flow.autograd.grad(F.packed_qkv_attention(x, 2).sum(), [x], create_graph=True)
        gx.sum().backward()


def _separate_ops_nd(qkv, heads, mask, bias, scale, fill):
    """The core on any number of batch axes, with an additive bias, as separate ops."""
    lead, s = tuple(qkv.shape[:-2]), qkv.shape[-2]
    d = qkv.shape[-1] // (3 * heads)
    q, k, v = (t.transpose(-3, -2) for t in qkv.view(*lead, s, heads, 3 * d).chunk(3, dim=-1))
    scores = flow.matmul(q, k.transpose(-1, -2)) * scale
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = scores.masked_fill(mask, fill)
    return flow.matmul(F.softmax(scores, dim=-1), v).transpose(-3, -2).reshape(*lead, s, heads * d)


# (qkv batch axes, bias shape, mask shape or None): Swin's [images, windows] batch with a
# per-window bias, a bias shared by all rows, per-row biases, broadcast inner axes, a mask beside
BIAS_CASES = {
    "swin-windows": ((3, 4), (4, 2, 6, 6), None),
    "shared": ((5,), (2, 6, 6), None),
    "per-row": ((5,), (5, 2, 6, 6), None),
    "per-row-per-query": ((5,), (5, 1, 6, 1), None),
    "three-axes": ((2, 3, 2), (3, 1, 2, 6, 6), (2, 1, 1, 1, 1, 6)),
    "with-padding-mask": ((4,), (2, 6, 6), (4, 1, 1, 6)),
    "one-row": ((1, 4), (4, 2, 6, 6), None),
}


@pytest.mark.parametrize("case", sorted(BIAS_CASES))
@pytest.mark.parametrize("threads", [1, 2])
def test_bias_and_batch_axes_equal_the_separate_ops(case, threads, monkeypatch):
    from engine.ops import attention

    lead, bias_shape, mask_shape = BIAS_CASES[case]
    heads, s, d = 2, 6, 5
    rng = np.random.default_rng(3)
    x = rng.standard_normal(lead + (s, heads * 3 * d)).astype(np.float32)
    g = rng.standard_normal(lead + (s, heads * d)).astype(np.float32)
    b0 = rng.standard_normal(bias_shape).astype(np.float32)
    mask = None
    if mask_shape is not None:
        m = rng.random(mask_shape) < 0.3
        m[..., 0] = False  # no fully masked rows: the separate ops would give their bias a gradient
        mask = flow.tensor(m)
    # small blocks, so that several of them (and both threads) share the bias's gradient
    monkeypatch.setattr(attention, "ROW_BLOCK_ELEMENTS", heads * s * s)
    before = parallel.get_num_threads()
    parallel.set_num_threads(threads)
    results = []
    try:
        for fn in (lambda t, bb: F.packed_qkv_attention(t, heads, mask, bias=bb, scale=0.4),
                   lambda t, bb: _separate_ops_nd(t, heads, mask, bb, 0.4, -10000.0)):
            qkv, bias = flow.tensor(x, requires_grad=True), flow.tensor(b0, requires_grad=True)
            out = fn(qkv, bias)
            out.backward(flow.tensor(g))
            results.append((out.detach().numpy(), qkv.grad.numpy(), bias.grad.numpy()))
    finally:
        parallel.set_num_threads(before)
    for a, b, what in zip(*results, ("output", "qkv gradient", "bias gradient")):
        assert a.shape == b.shape, what
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=what)


def test_bias_gradient_does_not_depend_on_the_thread_count(monkeypatch):
    from engine.ops import attention

    rng = np.random.default_rng(4)
    x = rng.standard_normal((6, 4, 8, 36)).astype(np.float32)
    b0 = rng.standard_normal((4, 3, 8, 8)).astype(np.float32)
    monkeypatch.setattr(attention, "ROW_BLOCK_ELEMENTS", 4 * 3 * 64)
    before = parallel.get_num_threads()
    grads = []
    try:
        for threads in (1, 2, 3):
            parallel.set_num_threads(threads)
            bias = flow.tensor(b0, requires_grad=True)
            F.packed_qkv_attention(flow.tensor(x), 3, bias=bias).square().sum().backward()
            grads.append(bias.grad.numpy())
    finally:
        parallel.set_num_threads(before)
    np.testing.assert_array_equal(grads[0], grads[1])
    np.testing.assert_array_equal(grads[0], grads[2])


def test_bias_without_gradient_and_bad_bias_are_handled():
    rng = np.random.default_rng(5)
    qkv = flow.tensor(rng.standard_normal((2, 5, 12)).astype(np.float32), requires_grad=True)
    bias = flow.tensor(rng.standard_normal((2, 5, 5)).astype(np.float32))
    F.packed_qkv_attention(qkv, 2, bias=bias).sum().backward()
    assert bias.grad is None and qkv.grad is not None
    with pytest.raises(RuntimeError, match=r"bias must be float32.*broadcastable to \[2, 2, 5, 5\].*\[3, 5, 5\]"):
        F.packed_qkv_attention(qkv, 2, bias=flow.zeros(3, 5, 5))
    with pytest.raises(RuntimeError, match=r"bias must be float32.*float64"):
        F.packed_qkv_attention(qkv, 2, bias=flow.zeros(2, 5, 5, dtype=flow.float64))
