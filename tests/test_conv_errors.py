"""Error paths of engine/ops/conv.py: each bad call names the op and the offending shapes/arguments."""
import numpy as np
import pytest

import engine as flow
import engine.nn.functional as F


def r(*shape, dtype=None):
    return flow.tensor(np.random.default_rng(0).standard_normal(shape).astype(np.float32), dtype=dtype)


@pytest.mark.parametrize("call, match", [
    (lambda: F.conv2d(r(2, 4, 8, 8), r(6, 3, 3, 3)), r"groups=1.*\[6, 3, 3, 3\].*input\[2, 4, 8, 8\].*3 channels"),
    (lambda: F.conv2d(r(2, 4, 8, 8), r(6, 3, 3, 3), groups=2), r"groups=2.*6 channels, but got 4"),
    (lambda: F.conv2d(r(2, 4, 8, 8), r(5, 2, 3, 3), groups=2), r"divisible by 2.*\[5, 2, 3, 3\]"),
    (lambda: F.conv2d(r(2, 3, 2, 2), r(4, 3, 3, 3)), r"Kernel size can't be greater"),
    (lambda: F.conv2d(r(3, 8), r(4, 3, 3, 3)), r"conv2d: expected a 3-D.*\[3, 8\]"),
    (lambda: F.conv2d(r(2, 3, 8, 8), r(4, 3, 3)), r"4-D weight.*\[4, 3, 3\]"),
    (lambda: F.conv2d(r(2, 3, 8, 8), r(4, 3, 3, 3), stride=0), r"non-positive stride"),
    (lambda: F.conv2d(r(2, 3, 8, 8), r(4, 3, 3, 3), r(5)), r"bias of shape \[4\].*\[5\]"),
    (lambda: F.conv2d(r(2, 3, 8, 8), r(4, 3, 3, 3, dtype=flow.float64)), r"input type \(float32\), weight type \(float64\)"),
    (lambda: F.conv1d(r(2, 3, 8), r(4, 2, 3)), r"3 channels"),
    (lambda: F.avg_pool2d(r(1, 1, 4, 4), 2, padding=2), r"pad should be at most half"),
    (lambda: F.max_pool2d(r(4, 4), 2), r"max_pool2d: expected a 3-D or 4-D input"),
    (lambda: F.adaptive_avg_pool2d(r(1, 1, 2, 3, 4), 2), r"adaptive_avg_pool2d: expected a 3-D or 4-D"),
    (lambda: F.pad(r(2, 3), (1, 2, 3)), r"divisible by 2"),
    (lambda: F.pad(r(2, 3), (1, 1, 1, 1, 1, 1)), r"too large"),
    (lambda: F.pad(r(2, 3), (-2, -2)), r"negative output size"),
    (lambda: F.pad(r(1, 2, 3), (3, 0), mode="reflect"), r"less than the corresponding input dimension"),
])
def test_runtime_errors(call, match):
    with pytest.raises(RuntimeError, match=match):
        call()


@pytest.mark.parametrize("call, exc, match", [
    (lambda: F.conv2d(r(1, 3, 8, 8), r(4, 3, 3, 3), padding="same", stride=2), ValueError, r"not supported for strided"),
    (lambda: F.conv2d(r(1, 3, 8, 8), r(4, 3, 3, 3), padding="full"), ValueError, r"invalid padding string"),
    (lambda: F.interpolate(r(1, 1, 4, 4), size=3, scale_factor=2), ValueError, r"exactly one of size or scale_factor"),
    (lambda: F.interpolate(r(1, 1, 4, 4), size=3, align_corners=True), ValueError, r"align_corners option"),
    (lambda: F.interpolate(r(1, 1, 4, 4), size=3, mode="lanczos"), NotImplementedError, r"lanczos"),
    (lambda: F.adaptive_avg_pool2d(r(4), 2), ValueError, r"Input dimension should be at least 3"),
    (lambda: F.interpolate(r(1, 4, 4), size=3, mode="bilinear"), NotImplementedError, r"bilinear mode needs 4D"),
    (lambda: F.interpolate(r(1, 1, 4), size=3, mode="linear", antialias=True), ValueError, r"Anti-alias"),
    (lambda: F.pad(r(2, 3), (1, 1), mode="wrap"), NotImplementedError, r"unknown padding mode"),
])
def test_argument_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_conv2d_grad_of_grad_matches_finite_differences():
    """create_graph through the fused grad ops: d/dx of sum(dL/dw) vs a finite difference."""
    rng = np.random.default_rng(1)
    x0 = rng.standard_normal((1, 2, 5, 5))
    w = flow.tensor(rng.standard_normal((3, 2, 3, 3)), requires_grad=True)

    def inner(xa):
        x = flow.tensor(xa, requires_grad=True)
        y = F.conv2d(x, w, stride=2, padding=1)
        (gw,) = flow.autograd.grad((y * y).sum(), [w], create_graph=True)
        return x, (gw * gw).sum()

    x, s = inner(x0)
    (gx,) = flow.autograd.grad(s, [x])
    eps = 1e-6
    for idx in [(0, 0, 0, 0), (0, 1, 2, 3), (0, 1, 4, 4)]:
        xp, xm = x0.copy(), x0.copy()
        xp[idx] += eps
        xm[idx] -= eps
        num = (inner(xp)[1].item() - inner(xm)[1].item()) / (2 * eps)
        assert abs(gx.numpy()[idx] - num) < 1e-4 * max(1, abs(num))


def test_max_pool2d_indices_match_positions():
    x = r(1, 1, 4, 4)
    out, idx = F.max_pool2d(x, 2, return_indices=True)
    flat = x.numpy().reshape(-1)
    np.testing.assert_array_equal(flat[idx.numpy().reshape(-1)], out.numpy().reshape(-1))
    assert idx.dtype is flow.int64
