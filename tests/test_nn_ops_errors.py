"""Error paths of engine/ops/{softmax,normalization,dropout,loss}.py (clear messages naming op, shapes and bad values), and the
cases the parity harness cannot express (0-d targets, double backward of softmax)."""
import numpy as np
import pytest
import torch

import engine as flow
import engine.nn.functional as F


def test_cross_entropy_float_target_of_index_shape():
    with pytest.raises(RuntimeError, match=r"cross_entropy: expected target of class indices .*float32.*\[3\]"):
        F.cross_entropy(flow.randn(3, 4), flow.zeros(3))


def test_cross_entropy_target_out_of_range():
    with pytest.raises(IndexError, match=r"cross_entropy: target 7 is out of bounds for 4 classes.*\[3, 4\]"):
        F.cross_entropy(flow.randn(3, 4), flow.tensor([0, 7, 1]))
    with pytest.raises(IndexError, match=r"target -1 is out of bounds"):
        F.nll_loss(flow.randn(3, 4), flow.tensor([0, -1, 1]))


def test_cross_entropy_target_shape():
    with pytest.raises(ValueError, match=r"cross_entropy: expected target of shape \[2, 5\].*\[2, 3, 5\]"):
        F.cross_entropy(flow.randn(2, 3, 5), flow.tensor([0, 1]))


def test_cross_entropy_weight_and_reduction():
    with pytest.raises(RuntimeError, match="weight tensor should be defined either for all 4 classes"):
        F.cross_entropy(flow.randn(3, 4), flow.tensor([0, 1, 2]), weight=flow.ones(3))
    with pytest.raises(ValueError, match="reduction must be one of"):
        F.cross_entropy(flow.randn(3, 4), flow.tensor([0, 1, 2]), reduction="avg")
    with pytest.raises(ValueError, match="label_smoothing"):
        F.cross_entropy(flow.randn(3, 4), flow.tensor([0, 1, 2]), label_smoothing=1.5)


def test_integer_inputs_rejected():
    with pytest.raises(RuntimeError, match="softmax: expected a floating point input"):
        flow.softmax(flow.tensor([1, 2]), 0)
    with pytest.raises(RuntimeError, match="layer_norm: expected a floating point input"):
        F.layer_norm(flow.tensor([[1, 2]]), (2,))


def test_softmax_bad_dim():
    with pytest.raises(IndexError, match="Dimension out of range"):
        flow.softmax(flow.randn(2, 3), 2)


def test_layer_norm_shape_errors():
    with pytest.raises(RuntimeError, match=r"layer_norm: given normalized_shape=\[4\].*\[\*, 4\].*\[2, 3\]"):
        F.layer_norm(flow.randn(2, 3), (4,))
    with pytest.raises(RuntimeError, match=r"layer_norm: expected weight of shape \[3\], got \[4\]"):
        F.layer_norm(flow.randn(2, 3), (3,), flow.ones(4))


def test_pointwise_loss_errors():
    with pytest.raises(ValueError, match=r"binary_cross_entropy_with_logits: target size \(\[3\]\) must be the same"):
        F.binary_cross_entropy_with_logits(flow.randn(2, 3), flow.rand(3))
    with pytest.raises(RuntimeError, match="binary_cross_entropy: all elements of input should be between 0 and 1"):
        F.binary_cross_entropy(flow.tensor([0.5, 1.5]), flow.tensor([0.0, 1.0]))
    with pytest.raises(RuntimeError, match="The size of tensor a"):
        F.mse_loss(flow.randn(2, 3), flow.randn(4))
    with pytest.raises(RuntimeError, match="smooth_l1_loss does not support negative values for beta"):
        F.smooth_l1_loss(flow.randn(2), flow.randn(2), beta=-1.0)


def test_scale_mask_softmax_mask_errors():
    with pytest.raises(RuntimeError, match="scale_mask_softmax"):
        F.scale_mask_softmax(flow.randn(2, 3, 3), flow.ones(4, 4, dtype=flow.bool))


@pytest.mark.parametrize("fn", ["cross_entropy", "nll_loss"])
def test_unbatched_target(fn):
    x = np.random.default_rng(0).standard_normal(5).astype(np.float32)
    xf, xt = flow.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    yf = getattr(F, fn)(xf, flow.tensor(3))
    yt = getattr(torch.nn.functional, fn)(xt, torch.tensor(3))
    np.testing.assert_allclose(yf.item(), yt.item(), rtol=1e-5)
    yf.backward()
    yt.backward()
    np.testing.assert_allclose(xf.grad.numpy(), xt.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_cross_entropy_all_ignored_mean_is_nan():
    with np.errstate(all="ignore"):
        y = F.cross_entropy(flow.randn(2, 3), flow.tensor([-100, -100]))
    assert np.isnan(y.item())


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_double_backward_through_the_upstream_gradient(op):
    # L = sum(op(x) * w); dL/dx = OpGrad(w, y) is differentiable in w (saved outputs are detached
    # by the engine core, so the path through y itself is not recorded)
    rng = np.random.default_rng(1)
    x, w, v = (rng.standard_normal((3, 4)) for _ in range(3))
    xf, wf = flow.tensor(x, requires_grad=True), flow.tensor(w, requires_grad=True)
    xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    gf, = flow.autograd.grad((getattr(flow, op)(xf, 1) * wf).sum(), [xf], create_graph=True)
    gt, = torch.autograd.grad((getattr(torch, op)(xt, 1) * wt).sum(), [xt], create_graph=True)
    np.testing.assert_allclose(gf.detach().numpy(), gt.detach().numpy(), rtol=1e-6, atol=1e-8)
    dwf, = flow.autograd.grad((gf * flow.tensor(v)).sum(), [wf])
    dwt, = torch.autograd.grad((gt * torch.tensor(v)).sum(), [wt])
    np.testing.assert_allclose(dwf.numpy(), dwt.numpy(), rtol=1e-6, atol=1e-8)


def test_bce_double_backward_is_a_clear_error():
    """layer_norm differentiates twice now (tests/test_autograd.py); bce's fused grad does not."""
    x = flow.rand(2, 3, requires_grad=True)
    g, = flow.autograd.grad(F.binary_cross_entropy(x * 0.5 + 0.25, flow.rand(2, 3)), [x], create_graph=True)
    with pytest.raises(RuntimeError, match="double backward .* bce"):
        g.sum().backward()


def test_gpt_attention_shape_matches_torch_composition():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 2, 16, 16)).astype(np.float32)
    mask = np.triu(np.ones((16, 16), bool), 1)
    xf, xt = flow.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    yf = F.scale_mask_softmax(xf, flow.tensor(mask), 0.125)
    yt = torch.softmax((xt * 0.125).masked_fill(torch.tensor(mask), -10000.0), -1)
    np.testing.assert_allclose(yf.detach().numpy(), yt.detach().numpy(), rtol=1e-5, atol=1e-7)
    g = rng.standard_normal(x.shape).astype(np.float32)
    yf.backward(flow.tensor(g))
    yt.backward(torch.tensor(g))
    np.testing.assert_allclose(xf.grad.numpy(), xt.grad.numpy(), rtol=1e-4, atol=1e-6)
