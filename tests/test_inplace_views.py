"""Recorded in-place ops on views, against PyTorch (engine/ops/inplace.py, "In-place operations"
in docs/engine.md): the write reaches the root base (PyTorch's CopySlices), every live view of
the base is taken again from the new value (views held elsewhere, views of views, a row taken
before the base itself was written), and values and gradients equal torch's."""
import numpy as np
import pytest
import torch

import engine as flow


def _run(lib, fn):
    x = lib.tensor(np.arange(1.0, 13.0).reshape(3, 4), requires_grad=True)
    w = lib.tensor(np.array([0.5, -2.0, 3.0, 1.5]), requires_grad=True)
    out = fn(lib, x, w)
    weights = lib.tensor(np.linspace(-1, 1, int(np.prod(tuple(out.shape)))).reshape(tuple(out.shape)))
    (out * weights).sum().backward()
    return [out.detach().numpy()] + [None if t.grad is None else t.grad.numpy() for t in (x, w)]


def _middle_view(lib, x, w):
    b = x * 1
    a = b.t()
    a[0].mul_(5)  # a row of a view of b: a and b both see it
    return b + a.t()


def _held_view_repeated(lib, x, w):
    buf = lib.zeros(3, 4) * w
    v = buf.view(3, 2, 2)
    for _ in range(3):
        v[0].add_(w.view(2, 2))
    return buf + v.reshape(3, 4)


def _view_then_base(lib, x, w):
    a = x * 1
    v = a[0]
    a.mul_(2)  # the base rebound: v shows it
    v.add_(w)
    return a + v


def _view_and_subview(lib, x, w):
    a = x * 1
    r = a[1]
    r[1:3].mul_(w[:2])
    r.add_(1)
    a[:, 0].mul_(w[:3])
    return a * r


def _non_contiguous_base(lib, x, w):
    a = (x * 1).t()  # a transposed root view
    a[1:3, 0].mul_(w[2])
    return a.t() * 2


def _masked_and_copy(lib, x, w):
    a = x * 1
    a[:, 1:].masked_fill_(a[:, 1:] > 6, 0.0)
    a[2].copy_(w)
    a.t()[3].clamp_(max=5)
    return a


@pytest.mark.parametrize("fn", [_middle_view, _held_view_repeated, _view_then_base, _view_and_subview,
                                _non_contiguous_base, _masked_and_copy],
                         ids=lambda f: f.__name__.strip("_"))
def test_views_see_writes_as_in_torch(fn):
    for got, want in zip(_run(flow, fn), _run(torch, fn)):
        assert (got is None) == (want is None)
        if want is not None:
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_a_piece_of_a_one_piece_split_is_written_through():
    """torch refuses in-place writes to split/chunk/unbind outputs under autograd; the engine
    writes them through (a one-piece split crashed with an internal error)."""
    x = flow.tensor(np.ones((2, 3)), requires_grad=True)
    a = x * 1
    a.split(10)[0][0].mul_(flow.tensor([1.0, 2.0, 3.0]))
    a.chunk(1)[0][1].add_(1.0)
    a.unbind(0)[1].mul_(2.0)
    np.testing.assert_array_equal(a.detach().numpy(), [[1, 2, 3], [4, 4, 4]])
    a.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[1, 2, 3], [2, 2, 2]])


def test_view_raises_only_where_torch_would():
    """view() of a transposed view raises as torch's; the engine's kernels may lay results out
    otherwise than torch's (a sum of a permuted input, fancy indexing, stack): those views work,
    as in torch (by a copy where the engine's strides allow no view)."""
    x = np.arange(24.0).reshape(2, 3, 4)
    idx = np.array([2, 0])
    for fn in (lambda m, t: t.transpose(0, 2).sum(1).view(-1), lambda m, t: t[:, idx].view(-1),
               lambda m, t: m.stack([t.transpose(0, 2), t.transpose(0, 2)], 1).view(-1),
               lambda m, t: t.permute(2, 0, 1).cumsum(1).view(-1)):
        np.testing.assert_array_equal(fn(flow, flow.tensor(x)).numpy(), fn(torch, torch.tensor(x)).numpy())
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        flow.tensor(x).transpose(0, 2).view(-1)
