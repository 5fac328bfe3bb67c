"""`x[key]`, `x[key] = v`, fill_/zero_/copy_ (Tensor methods, so their parity cases live here
rather than in tests/ops/cases_indexing.py), in-place semantics, and the error messages of the
indexing and linalg families."""
import numpy as np
import pytest
import torch

import engine as flow
from harness import Input as I, OpCase, gradcheck, run_parity


def Idx(value):
    return I(dtype="int64", value=np.array(value, dtype=np.int64))


X = I((4, 3))
X3 = I((3, 4, 5))
GETITEM = [
    OpCase("getitem", lambda m, x: x[1], [X], name="int"),
    OpCase("getitem", lambda m, x: x[-1, 2], [X], name="int-int"),
    OpCase("getitem", lambda m, x: x[1:3], [X], name="slice"),
    OpCase("getitem", lambda m, x: x[::2, 1:], [X], name="step"),
    OpCase("getitem", lambda m, x: x[:, None, 1], [X], name="none"),
    OpCase("getitem", lambda m, x: x[..., 0], [X3], name="ellipsis"),
    OpCase("getitem", lambda m, x: x[None, ..., None], [X], name="none-ellipsis"),
    OpCase("getitem", lambda m, x: x[1:, 2:2], [X], name="empty-slice", gradcheck=False),
    OpCase("getitem", lambda m, x: x[[0, 2, 0]], [X], name="list-dup"),
    OpCase("getitem", lambda m, x, i: x[i], [X, Idx([[3, 0], [3, 3]])], name="tensor-2d-dup"),
    OpCase("getitem", lambda m, x, i: x[i], [X, Idx(2)], name="tensor-0d"),
    OpCase("getitem", lambda m, x: x[[0, 1, 1], [2, 0, 2]], [X], name="pairs"),
    OpCase("getitem", lambda m, x: x[[-1, 3, 0, -4]], [X], name="negative-alias"),
    OpCase("getitem", lambda m, x: x[:, [2, 0, 2]], [X], name="slice-list"),
    OpCase("getitem", lambda m, x: x[1:, [0, 0], 2:], [X3], name="mixed"),
    OpCase("getitem", lambda m, x: x[[0, 2], :, [1, 1]], [X3], name="separated-adv"),
    OpCase("getitem", lambda m, x: x[..., [1, -1]], [X3], name="ellipsis-list"),
    OpCase("getitem", lambda m, x, k: x[k], [X, I((4, 3), "bool", "bool")], name="mask-full"),
    OpCase("getitem", lambda m, x, k: x[k], [X3, I((3,), "bool", "bool")], name="mask-rows"),
    OpCase("getitem", lambda m, x, k: x[1:, k], [X3, I((4, 5), "bool", "bool")], name="slice-mask"),
    OpCase("getitem", lambda m, x: x[[True, False, True, True]], [X], name="bool-list"),
    OpCase("getitem", lambda m, x: x[:, np.array([True, False, True])], [X], name="numpy-mask"),
    OpCase("getitem", lambda m, x: x[np.array([2, 2, 0])], [X], name="numpy-index"),
    OpCase("getitem", lambda m, x: x[:, 1:][[2, 0]], [I((4, 3), noncontig=True)], name="noncontig"),
]


def _set(key):
    def fn(m, x, v):
        y = x.clone()
        y[key] = v
        return y
    return fn


def _set_scalar(key, value):
    def fn(m, x):
        y = x.clone()
        y[key] = value
        return y
    return fn


SETITEM = [
    OpCase("setitem", _set_scalar(1, 2.5), [X], name="int-scalar"),
    OpCase("setitem", _set_scalar((slice(1, 3), 0), -1), [X], name="slice-scalar"),
    OpCase("setitem", _set(slice(1, 3)), [X, I((3,))], name="slice-bcast"),
    OpCase("setitem", _set((Ellipsis, 1)), [X3, I((3, 1))], name="ellipsis-bcast"),
    OpCase("setitem", _set([0, 3]), [X, I((2, 3))], name="adv"),
    OpCase("setitem", _set((slice(None), [2, 0])), [X, I((1, 2))], name="adv-bcast"),
    OpCase("setitem", _set(None), [X, I((1, 4, 3))], name="none-key"),
    OpCase("setitem", _set(1), [X, I((1, 3))], name="leading-one"),
    OpCase("setitem", _set(0), [I((2, 3), "float64"), I((3,))], name="cast-value"),
]


def _mask_set(m, x, k, v):
    y = x.clone()
    y[k] = v
    return y


SETITEM += [
    OpCase("setitem", _mask_set, [X, I((4, 3), "bool", "bool"), I(())], name="mask-0d"),
    OpCase("setitem", lambda m, x, k: _mask_set(m, x, k, 0.0), [X, I((4,), "bool", "bool")], name="mask-rows"),
]


def _fill(m, x, v):
    y = x * 1
    y.fill_(v.reshape(()))
    return y * x


def _copy(m, x, s):
    y = x * 1
    y.copy_(s)
    return y * x


FILLS = [
    OpCase("fill_", lambda m, x: (x * 1).fill_(2.0) * x, [X], name="scalar"),
    OpCase("fill_", _fill, [X, I((1,))], name="tensor"),
    OpCase("zero_", lambda m, x: (x * 1).zero_() + x, [X]),
    OpCase("copy_", _copy, [X, I((3,))], name="bcast"),
    OpCase("copy_", _copy, [X, I((4, 3), "float64", noncontig=True)], name="cast-noncontig"),
    OpCase("copy_", lambda m, x, s: (x * 1).copy_(s), [X, I((4, 3), "int64", "int", -5, 5)], name="from-int"),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in GETITEM + SETITEM + FILLS])
def test_parity(case):
    run_parity(case, seed=0)
    run_parity(case, seed=1)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in GETITEM + SETITEM + FILLS if c.gradcheck])
def test_gradcheck(case):
    gradcheck(case)


# ------------------------------------------------------------------ semantics
def test_basic_indexing_is_a_view():
    x = flow.arange(12.0).reshape(3, 4)
    for y in (x[1], x[1:, ::2], x[None, ..., 2], x[2, 3]):
        assert np.shares_memory(y._data, x._data)
    assert not np.shares_memory(x[[0, 1]]._data, x._data)


def test_unrecorded_setitem_writes_storage():
    x = flow.zeros(3, 4)
    row = x[1]
    x[1, 2] = 5.0
    assert row.tolist()[2] == 5.0
    x[x > 4] = 7.0
    assert row.tolist()[2] == 7.0
    v0 = x._version
    x[0] = flow.ones(4)
    assert x._version == v0 + 1
    assert x.tolist()[0] == [1.0] * 4


def test_setitem_duplicate_advanced_index_last_write_is_one_of_the_values():
    x = flow.zeros(3)
    x[[0, 0]] = flow.tensor([1.0, 2.0])
    assert x.tolist()[0] in (1.0, 2.0)


def test_setitem_on_leaf_requiring_grad_raises():
    x = flow.zeros(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        x[0] = 1.0
    with flow.no_grad():
        x[0] = 1.0
    assert x.tolist()[0] == 1.0


def test_recorded_setitem_gradients():
    x = flow.randn(4, 3, requires_grad=True)
    v = flow.randn(3, requires_grad=True)
    y = x * 2
    y[[1, 2]] = v
    y.backward(flow.ones(4, 3))
    np.testing.assert_allclose(x.grad.numpy(), [[2] * 3, [0] * 3, [0] * 3, [2] * 3])
    np.testing.assert_allclose(v.grad.numpy(), [2.0] * 3)


def test_copy_grad_flows_to_src_and_not_to_overwritten():
    x = flow.randn(2, 3, requires_grad=True)
    s = flow.randn(3, dtype=flow.float64, requires_grad=True)
    y = x * 1
    y.copy_(s)
    assert y.dtype == flow.float32
    y.backward(flow.ones(2, 3))
    assert s.grad.dtype == flow.float64
    np.testing.assert_allclose(s.grad.numpy(), [2.0] * 3)
    np.testing.assert_allclose(x.grad.numpy(), np.zeros((2, 3)))


def test_inplace_fill_and_scatter_write_storage():
    x = flow.ones(2, 3)
    view = x[0]
    x.zero_()
    assert view.tolist() == [0.0] * 3
    x.fill_(2)
    assert view.tolist() == [2.0] * 3
    x.scatter_(1, flow.tensor([[2], [0]]), flow.full((2, 1), 5.0))
    assert x.tolist() == [[2.0, 2.0, 5.0], [5.0, 2.0, 2.0]]
    x.scatter_add_(0, flow.tensor([[0, 0, 0], [0, 0, 0]]), flow.ones(2, 3))
    assert x.tolist()[0] == [4.0, 4.0, 7.0]
    x.masked_fill_(flow.tensor([True, False, True]), -1.0)
    assert x.tolist() == [[-1.0, 4.0, -1.0], [-1.0, 2.0, -1.0]]
    x.copy_(flow.tensor([1, 2, 3]))
    assert x.tolist() == [[1.0, 2.0, 3.0]] * 2


def test_embedding_backward_accumulates_repeated_ids_large_vocab():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50, (8, 64))
    w = flow.tensor(rng.standard_normal((50, 16)).astype(np.float32), requires_grad=True)
    g = rng.standard_normal((8, 64, 16)).astype(np.float32)
    flow.nn.functional.embedding(flow.tensor(ids), w).backward(flow.tensor(g))
    ref = np.zeros((50, 16), np.float32)
    np.add.at(ref, ids.reshape(-1), g.reshape(-1, 16))
    np.testing.assert_allclose(w.grad.numpy(), ref, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ errors
def _raises(exc, match, fn):
    with pytest.raises(exc, match=match):
        fn()


def test_indexing_errors():
    x = flow.randn(3, 4)
    _raises(ValueError, "step must be greater than zero", lambda: x[::-1])
    _raises(IndexError, "index 5 is out of bounds for dimension 0 with size 3", lambda: x[5])
    _raises(IndexError, "index 7 is out of bounds for dimension 1 with size 4", lambda: x[:, [0, 7]])
    _raises(IndexError, "too many indices", lambda: x[0, 0, 0])
    _raises(IndexError, "long, int, byte or bool", lambda: x[flow.tensor([0.0])])
    _raises(IndexError, "shape of the mask", lambda: x[flow.tensor([True, False])])
    _raises(RuntimeError, "cannot be broadcast", lambda: x.__setitem__(0, flow.ones(3)))


def test_gather_scatter_errors():
    x = flow.randn(3, 4)
    _raises(RuntimeError, "gather.*int32/int64", lambda: x.gather(0, flow.tensor([[0.0]])))
    _raises(RuntimeError, "gather.*out of bounds", lambda: x.gather(1, flow.tensor([[4]])))
    _raises(RuntimeError, "same number of dimensions", lambda: x.gather(1, flow.tensor([0])))
    _raises(IndexError, "Dimension out of range", lambda: x.gather(2, flow.tensor([[0]])))
    _raises(RuntimeError, "scatter.*dtype", lambda: x.scatter(0, flow.tensor([[0]]), flow.ones(1, 1, dtype=flow.float64)))
    _raises(IndexError, "index_select.*vector", lambda: x.index_select(0, flow.tensor([[0]])))
    _raises(IndexError, "index_select.*out of range", lambda: x.index_select(0, flow.tensor([3])))
    _raises(RuntimeError, "masked_fill.*bool", lambda: x.masked_fill(flow.tensor([1, 0, 1, 0]), 0.0))
    _raises(RuntimeError, "0-dimensional", lambda: x.masked_fill(x > 0, flow.ones(2)))


def test_embedding_and_one_hot_errors():
    w = flow.randn(10, 4)
    _raises(RuntimeError, "embedding.*float32", lambda: flow.nn.functional.embedding(flow.tensor([1.0]), w))
    _raises(IndexError, r"embedding: index 12 .*size 10", lambda: flow.nn.functional.embedding(flow.tensor([3, 12]), w))
    _raises(IndexError, r"embedding: index -1 ", lambda: flow.nn.functional.embedding(flow.tensor([-1]), w))
    _raises(RuntimeError, "one_hot.*int64", lambda: flow.nn.functional.one_hot(flow.tensor([1.0])))
    _raises(RuntimeError, "smaller than num_classes", lambda: flow.nn.functional.one_hot(flow.tensor([3]), 2))


def test_linalg_errors():
    a, b = flow.randn(2, 3), flow.randn(4, 5)
    _raises(RuntimeError, r"matmul: shapes \[2, 3\] and \[4, 5\] cannot be multiplied \(3 != 4\)", lambda: a @ b)
    _raises(RuntimeError, r"matmul: shapes \[3\] and \[4\] cannot be multiplied", lambda: flow.matmul(flow.randn(3), flow.randn(4)))
    _raises(RuntimeError, "batch dimensions", lambda: flow.matmul(flow.randn(2, 2, 3), flow.randn(3, 3, 1)))
    _raises(RuntimeError, "at least 1 dimension", lambda: flow.matmul(flow.tensor(1.0), a))
    _raises(RuntimeError, "same dtype.*float32 != float64", lambda: flow.matmul(a, flow.randn(3, 2, dtype=flow.float64)))
    _raises(RuntimeError, "bmm: batch1 must be a 3D tensor", lambda: flow.bmm(a, a))
    _raises(RuntimeError, "bmm: batch sizes", lambda: flow.bmm(flow.randn(2, 2, 3), flow.randn(3, 3, 2)))
    _raises(RuntimeError, "mm: self must be a matrix", lambda: flow.mm(flow.randn(3), a))
    _raises(RuntimeError, r"mm: shapes \[2, 3\] and \[4, 5\]", lambda: flow.mm(a, b))
    _raises(RuntimeError, "dot: 1D tensors expected, but got 2D and 1D", lambda: flow.dot(a, flow.randn(3)))
    _raises(RuntimeError, r"linear: shapes \[2, 3\] and \[4, 5\]\^T", lambda: flow.nn.functional.linear(a, b))
    _raises(RuntimeError, "einsum.*2 subscripts", lambda: flow.einsum("ij,jk->ik", a))
    _raises(RuntimeError, "einsum.*labels", lambda: flow.einsum("ijk->i", a))


def test_linear_matches_torch_on_gpt_shapes():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 16, 24)).astype(np.float32)
    w = rng.standard_normal((72, 24)).astype(np.float32) * 0.1
    b = rng.standard_normal(72).astype(np.float32)
    g = rng.standard_normal((2, 16, 72)).astype(np.float32)
    fx, fw, fb = (flow.tensor(a, requires_grad=True) for a in (x, w, b))
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    y = flow.nn.functional.linear(fx, fw, fb)
    y.backward(flow.tensor(g))
    torch.nn.functional.linear(tx, tw, tb).backward(torch.tensor(g))
    assert y.dtype == flow.float32 and fw.grad.dtype == flow.float32
    for f, t in ((fx, tx), (fw, tw), (fb, tb)):
        np.testing.assert_allclose(f.grad.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("ids", [
    np.arange(10), [3, 3, 1, 3, 0], [-1, 9, 2, -1], [5] * 100, list(range(5)) * 40,
], ids=["distinct", "repeats", "negative-alias", "one-id-100x", "40-rounds"])
def test_add_rows_matches_add_at(ids):
    from engine.ops.indexing import add_rows

    rng = np.random.default_rng(0)
    idx = np.asarray(ids, dtype=np.int64)
    rows = rng.standard_normal((idx.size, 4)).astype(np.float32)
    out = rng.standard_normal((10, 4)).astype(np.float32)
    ref = out.copy()
    np.add.at(ref, idx, rows)
    add_rows(out, idx, rows)
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-5)
