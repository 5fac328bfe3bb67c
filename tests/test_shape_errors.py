"""Error paths of the shape and reduction families: bad arguments fail with a message that names
the op and the shapes involved, and with the exception type PyTorch uses."""
import numpy as np
import pytest
import torch

import engine as flow


def x(*shape):
    return flow.zeros(*shape)


def test_view_and_reshape_name_both_shapes():
    with pytest.raises(RuntimeError, match=r"view: shape \[4, 4\] is invalid for input of shape \[2, 3\]"):
        x(2, 3).view(4, 4)
    with pytest.raises(RuntimeError, match=r"reshape: shape \[5, -1\] is invalid for input of shape \[2, 3\]"):
        flow.reshape(x(2, 3), (5, -1))
    with pytest.raises(RuntimeError, match="reshape"):
        x(2, 3).reshape(-1, -1)


def test_unflatten_sizes_must_multiply():
    with pytest.raises(RuntimeError, match=r"unflatten.*\[2, 2\].*\[2, 3\]"):
        x(2, 3).unflatten(1, (2, 2))


def test_cat_names_tensor_index_and_shapes():
    with pytest.raises(RuntimeError, match=r"tensor number 2.*\[2, 3\], \[2, 3\], \[3, 3\]"):
        flow.cat([x(2, 3), x(2, 3), x(3, 3)], dim=1)
    with pytest.raises(RuntimeError, match="same number of dimensions"):
        flow.cat([x(2, 3), x(2, 3, 1)])
    with pytest.raises(ValueError, match="non-empty"):  # torch: ValueError from cat, RuntimeError from stack
        flow.cat([])
    with pytest.raises(RuntimeError, match="non-empty"):
        flow.stack([])
    with pytest.raises(RuntimeError, match="zero-dimensional"):
        flow.cat([x(), x()])


def test_stack_needs_equal_shapes():
    with pytest.raises(RuntimeError, match=r"stack.*\[2\] at entry 0 and \[3\] at entry 1"):
        flow.stack([x(2), x(3)])


@pytest.mark.parametrize("call", [
    lambda t: t.transpose(0, 3),
    lambda t: t.permute(0, 1, 5),
    lambda t: t.sum(-4),
    lambda t: t.squeeze(3),
    lambda t: t.flatten(0, 3),
    lambda t: t.narrow(3, 0, 1),
    lambda t: t.cumsum(3),
    lambda t: t.max(3),
    lambda t: t.flip(-4),
    lambda t: t.split(1, 3),
    lambda t: flow.cat([t, t], 3),
])
def test_dims_out_of_range(call):
    with pytest.raises(IndexError, match=r"Dimension out of range \(expected to be in range of \[-3, 2\]"):
        call(x(2, 3, 4))


def test_unsqueeze_dim_range_includes_new_dim():
    assert tuple(x(2, 3, 4).unsqueeze(3).shape) == (2, 3, 4, 1)
    with pytest.raises(IndexError, match=r"range of \[-4, 3\], but got 4"):
        x(2, 3, 4).unsqueeze(4)


def test_permute_needs_every_dim_once():
    with pytest.raises(RuntimeError, match="does not match"):
        x(2, 3).permute(0)
    with pytest.raises(RuntimeError, match="multiple times"):
        x(2, 3).permute(1, 1)


def test_expand_incompatible_size():
    with pytest.raises(RuntimeError, match=r"expanded size of the tensor \(4\) must match the existing size \(3\)"
                                           r".*Target sizes: \[2, 4\].*Tensor sizes: \[3\]"):
        x(3).expand(2, 4)
    with pytest.raises(RuntimeError, match="number of sizes"):
        x(2, 3).expand(3)
    with pytest.raises(RuntimeError, match="leading, non-existing dimension"):
        x(3).expand(-1, 3)
    with pytest.raises(RuntimeError, match=r"expanded size of the tensor \(3\) must match the existing size \(2\)"):
        x(2, 3).expand_as(x(3, 3))


def test_repeat_bad_args():
    with pytest.raises(RuntimeError, match="repeat dims can not be smaller"):
        x(2, 3).repeat(2)
    with pytest.raises(RuntimeError, match="negative"):
        x(2).repeat(-1)


def test_split_and_chunk_bad_args():
    with pytest.raises(RuntimeError, match=r"split_with_sizes.*sum exactly to 5.*\[2, 2\]"):
        x(5).split([2, 2])
    with pytest.raises(RuntimeError, match="split_size can only be 0"):
        x(5).split(0)
    with pytest.raises(RuntimeError, match="chunk expects `chunks` to be greater than 0"):
        x(5).chunk(0)
    with pytest.raises(RuntimeError, match="at least a 1-dimensional"):
        x().chunk(2)
    with pytest.raises(RuntimeError, match=r"narrow: start \(2\) \+ length \(4\) exceeds dimension size \(5\)"):
        x(5).narrow(0, 2, 4)


def test_t_and_triangles_check_ndim():
    with pytest.raises(RuntimeError, match="t\\(\\) expects a tensor with <= 2 dimensions"):
        x(2, 3, 4).t()
    with pytest.raises(RuntimeError, match="tril: input tensor must have at least 2 dimensions"):
        x(3).tril()
    with pytest.raises(RuntimeError, match="mT"):
        x(3).mT


def test_roll_shifts_and_dims_align():
    with pytest.raises(RuntimeError, match="shifts and dimensions must align"):
        x(2, 3).roll((1, 2), 0)


def test_reductions_bad_args():
    with pytest.raises(RuntimeError, match="mean\\(\\): could not infer output dtype.*int64"):
        flow.tensor([1, 2]).mean()
    with pytest.raises(RuntimeError, match="norm\\(\\): input dtype should be either floating point"):
        flow.tensor([1, 2]).norm()
    with pytest.raises(RuntimeError, match=r"max\(\).*numel\(\) == 0"):  # torch: RuntimeError without a dim
        x(0, 3).max()
    with pytest.raises(IndexError, match="non-zero size"):
        x(0, 3).max(0)
    with pytest.raises(RuntimeError, match=r"topk: k \(4\) is out of range"):
        x(3).topk(4)
    with pytest.raises(RuntimeError, match="appears multiple times"):
        x(2, 3).sum((1, -1))


def test_view_of_a_non_viewable_layout_raises_as_torch():
    """view() never copies: where the strides allow no view it raises torch's error (it used to
    copy, so writes through the "view" were lost); reshape() copies; 3000 random layouts agree
    with torch on which views exist."""
    a = flow.arange(6.0).reshape(2, 3).t()
    with pytest.raises(RuntimeError, match=r"view size is not compatible .* Use \.reshape\(\.\.\.\) instead"):
        a.view(-1)
    np.testing.assert_array_equal(a.reshape(-1).numpy(), [0, 3, 1, 4, 2, 5])
    v = a.view(3, 1, 2)  # splitting a dim is a view: writes reach a
    v[0, 0, 0] = 7.0
    assert a[0, 0].item() == 7.0
    rng = np.random.default_rng(0)
    for _ in range(3000):
        shape = tuple(int(v) for v in rng.integers(1, 4, int(rng.integers(1, 5))))
        perm = [int(p) for p in rng.permutation(len(shape))]
        x = np.arange(int(np.prod(shape))).reshape(shape)
        t, e = torch.tensor(x).permute(*perm), flow.tensor(x).permute(*perm)
        if rng.random() < 0.5 and t.shape[0] > 1:
            t, e = t[::2], e[::2]
        total, new = t.numel(), []
        while total > 1 and len(new) < 3:
            f = int(rng.choice([f for f in range(2, total + 1) if total % f == 0]))
            new.append(f)
            total //= f
        new = tuple(new + [total])
        try:
            want = t.view(new).numpy()
        except RuntimeError:
            want = None
        if want is None:
            with pytest.raises(RuntimeError, match="view size is not compatible"):
                e.view(new)
        else:
            np.testing.assert_array_equal(e.view(new).numpy(), want)


def test_transpose_and_permute_return_views():
    a = flow.arange(24.0).reshape(2, 3, 4)
    assert np.shares_memory(a.transpose(0, 2).numpy(), a.numpy())
    assert np.shares_memory(a.permute(2, 0, 1).numpy(), a.numpy())
    assert np.shares_memory(a.narrow(1, 1, 2).numpy(), a.numpy())


def test_max_min_results_are_named_and_unpack():
    a = flow.tensor([[1.0, 5.0, 2.0], [7.0, 0.0, 3.0]])
    values, indices = a.max(1)
    r = a.min(dim=1)
    assert values.tolist() == [5.0, 7.0] and indices.tolist() == [1, 0]
    assert r.values.tolist() == [1.0, 0.0] and r.indices.tolist() == [0, 1]
    top = a.topk(2)
    assert top.indices.dtype == flow.int64 and tuple(top.values.shape) == (2, 2)


def test_squeeze_unsqueeze_inplace():
    a = x(2, 1, 3)
    assert a.squeeze_(1) is a and tuple(a.shape) == (2, 3)
    a.unsqueeze_(0)
    assert tuple(a.shape) == (1, 2, 3)


SECOND_ORDER = [
    lambda m, a: (a.sum(1) ** 2).sum(),
    lambda m, a: (a.mean(0, keepdim=True) * a).sum(),
    lambda m, a: (a.var(1) * a.sum(1)).sum(),
    lambda m, a: (a.std(0) ** 2).sum(),
    lambda m, a: (m.logsumexp(a, 1) ** 2).sum(),
    lambda m, a: a.norm(dim=1).sum() + a.norm(),
    lambda m, a: (a.max(1).values ** 2).sum(),
    lambda m, a: (a.topk(2, 0).values ** 2).sum(),
    lambda m, a: (m.cat(a.split(2, 1), 0).permute(1, 0) ** 2).sum(),
    lambda m, a: (m.stack(a.unbind(1), 0).flip(0).roll(1, 1).tril() ** 2).sum(),
    lambda m, a: (a.cumsum(1) * a).sum(),
    lambda m, a: (a.repeat(2, 1).expand(3, 6, 4) ** 2).sum(),
    lambda m, a: (a.prod(1) ** 2).sum(),
    lambda m, a: (a.cumprod(1) ** 2).sum(),
]


@pytest.mark.parametrize("k", range(len(SECOND_ORDER)))
def test_double_backward_matches_torch(k):
    """Backward formulas are engine ops, so gradients of gradients work (create_graph=True)."""
    import torch

    fn = SECOND_ORDER[k]
    base = np.random.default_rng(k).standard_normal((3, 4))
    res = []
    for m in (flow, torch):
        a = m.tensor(base, dtype=m.float64, requires_grad=True)
        g, = m.autograd.grad(fn(m, a), a, create_graph=True)
        gg, = m.autograd.grad((g * g).sum(), a)
        res.append((g.detach().numpy(), gg.numpy()))
    np.testing.assert_allclose(res[0][0], res[1][0], rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(res[0][1], res[1][1], rtol=1e-6, atol=1e-9)
