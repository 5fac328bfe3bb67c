"""engine.nn.utils.clip_grad_norm_ / clip_grad_value_ against torch.nn.utils."""
import math
import os

import numpy as np
import pytest
import torch

import engine as flow
from engine.nn.utils import clip_grad_norm_, clip_grad_value_

DEVICE = os.environ.get("ENGINE_TEST_DEVICE", "cpu")
SHAPES = [(4, 3), (7,), (2, 2, 3)]


def _pair(scale=1.0, seed=0, with_none=False):
    rng = np.random.default_rng(seed)
    ours, theirs = [], []
    for i, s in enumerate(SHAPES):
        w = rng.standard_normal(s).astype(np.float32)
        g = (rng.standard_normal(s) * scale).astype(np.float32)
        p, q = flow.tensor(w, device=DEVICE, requires_grad=True), torch.tensor(w, requires_grad=True)
        if not (with_none and i == 1):
            p.grad, q.grad = flow.tensor(g, device=DEVICE), torch.tensor(g)
        ours.append(p)
        theirs.append(q)
    return ours, theirs


@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf, 3.0, "inf"])
@pytest.mark.parametrize("max_norm", [0.5, 1e4])  # clipping, and a no-op scale
def test_clip_grad_norm_matches_torch(norm_type, max_norm):
    ours, theirs = _pair(with_none=True)
    total_o = clip_grad_norm_(ours, max_norm, norm_type=norm_type)
    total_t = torch.nn.utils.clip_grad_norm_(theirs, max_norm, norm_type=float(norm_type))
    assert isinstance(total_o, flow.Tensor) and total_o.dtype == flow.float32 and total_o.shape == ()
    np.testing.assert_allclose(float(total_o), float(total_t), rtol=1e-6)
    for p, q in zip(ours, theirs):
        if q.grad is None:
            assert p.grad is None
        else:
            np.testing.assert_allclose(np.asarray(p.grad), q.grad.numpy(), rtol=1e-6, atol=1e-7)


def test_clip_grad_norm_single_tensor_and_generator():
    ours, theirs = _pair(scale=10.0)
    total_o = clip_grad_norm_(ours[0], 1.0)
    total_t = torch.nn.utils.clip_grad_norm_(theirs[0], 1.0)
    np.testing.assert_allclose(float(total_o), float(total_t), rtol=1e-6)
    total_o = clip_grad_norm_((p for p in ours), 2.0)
    total_t = torch.nn.utils.clip_grad_norm_((q for q in theirs), 2.0)
    np.testing.assert_allclose(float(total_o), float(total_t), rtol=1e-6)
    for p, q in zip(ours, theirs):
        np.testing.assert_allclose(np.asarray(p.grad), q.grad.numpy(), rtol=1e-6, atol=1e-7)


def test_clip_grad_norm_is_in_place_and_float32_for_half_grads():
    p = flow.zeros(5, dtype=flow.float16, device=DEVICE, requires_grad=True)
    p.grad = flow.full((5,), 100.0, dtype=flow.float16, device=DEVICE)
    storage = p.grad._data
    total = clip_grad_norm_([p], 1.0)
    assert total.dtype == flow.float32
    np.testing.assert_allclose(float(total), math.sqrt(5) * 100, rtol=1e-6)
    assert p.grad._data is storage and p.grad.dtype == flow.float16
    np.testing.assert_allclose(np.asarray(p.grad).astype(np.float32), 1 / math.sqrt(5), rtol=1e-3)


def test_clip_grad_norm_without_grads_returns_zero():
    p = flow.zeros(3, requires_grad=True)
    total = clip_grad_norm_([p], 1.0)
    assert float(total) == 0.0


def test_clip_grad_norm_nonfinite():
    ours, theirs = _pair()
    ours[0].grad._data[0, 0] = np.inf if DEVICE == "cpu" else float("inf")
    with pytest.raises(RuntimeError, match="non-finite"):
        clip_grad_norm_(ours, 1.0, error_if_nonfinite=True)
    total = clip_grad_norm_(ours, 1.0)  # allowed: torch scales by the non-finite norm
    assert math.isinf(float(total))


@pytest.mark.parametrize("clip", [0.1, 1.0])
def test_clip_grad_value_matches_torch(clip):
    ours, theirs = _pair(scale=2.0, with_none=True)
    assert clip_grad_value_(ours, clip) is None
    torch.nn.utils.clip_grad_value_(theirs, clip)
    for p, q in zip(ours, theirs):
        if q.grad is not None:
            np.testing.assert_array_equal(np.asarray(p.grad), q.grad.numpy())
