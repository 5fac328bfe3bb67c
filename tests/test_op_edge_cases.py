"""Edge cases a probe found against torch 2.13 on the CPU: 0-dim bool masks, empty inputs of
unique(dim=)/searchsorted, einsum's sublist format, integer powers, the legacy and metadata
Tensor methods (new, get_device, data_ptr, nbytes, itemsize, is_complex), integer convolutions
and average pools. Op parity cases live in tests/ops/cases_*.py; this file holds the Tensor
methods and indexing keys (not names in a family's __all__) and the errors."""
import numpy as np
import pytest
import torch

import engine as flow
from harness import Input as I, OpCase, gradcheck, run_parity

X = I((2, 3))
T, FALSE = I(dtype="bool", value=np.array(True)), I(dtype="bool", value=np.array(False))
# (the harness hands 0-dim values over as shape (1,): the cases make them 0-dim themselves)


def _0d(t):
    return t.reshape(())


MASKS_0D = [
    OpCase("getitem", lambda m, x, k: _0d(x)[_0d(k)], [I(()), T], name="0d-true"),
    OpCase("getitem", lambda m, x, k: _0d(x)[_0d(k)], [I(()), FALSE], name="0d-false", gradcheck=False),
    OpCase("getitem", lambda m, x, k: _0d(x)[_0d(k), None], [I(()), T], name="0d-true-none"),
    OpCase("getitem", lambda m, x, k: _0d(x)[..., _0d(k)], [I(()), T], name="0d-ellipsis"),
    OpCase("getitem", lambda m, x, k: _0d(x)[_0d(k), _0d(k)], [I(()), T], name="0d-two"),
    OpCase("getitem", lambda m, x, k: x[_0d(k)], [X, T], name="2d-true"),
    OpCase("getitem", lambda m, x, k: x[_0d(k)], [X, FALSE], name="2d-false", gradcheck=False),
    OpCase("getitem", lambda m, x, k: x[..., _0d(k)], [X, T], name="2d-ellipsis-true"),
    OpCase("getitem", lambda m, x, k: x[..., _0d(k)], [X, FALSE], name="2d-ellipsis-false", gradcheck=False),
    OpCase("getitem", lambda m, x, k: x[1, _0d(k), 2], [X, T], name="between-ints"),
    OpCase("getitem", lambda m, x, k: x[_0d(k), ..., _0d(k), 1], [I((2, 3, 4)), T], name="two-with-ellipsis"),
    OpCase("getitem", lambda m, x, k, i: x[:, _0d(k), i], [X, T, I(dtype="int64", value=np.array([2, 0, 2]))], name="with-index"),
    OpCase("getitem", lambda m, x, k: x[..., k], [X, I((3,), "bool", "bool")], name="1d-mask-after-ellipsis"),
    OpCase("getitem", lambda m, x, k: x[..., k, :], [I((2, 3, 4)), I((3,), "bool", "bool")], name="1d-mask-ellipsis-slice"),
    OpCase("setitem", lambda m, x, k: _set(_0d(x), _0d(k), 5.0), [I(()), T], name="0d-true"),
    OpCase("setitem", lambda m, x, k: _set(_0d(x), _0d(k), 5.0), [I(()), FALSE], name="0d-false"),
    OpCase("setitem", lambda m, x, k: _set(x, (Ellipsis, _0d(k)), -1.0), [X, T], name="ellipsis-true"),
]


def _set(x, key, value):
    y = x * 1
    y[key] = value
    return y * x


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in MASKS_0D])
def test_0d_bool_masks_match_torch(case):
    run_parity(case, seed=0)
    if case.gradcheck:
        gradcheck(case)


def test_mask_index_errors_match_torch():
    for m in (torch, flow):
        with pytest.raises(IndexError, match="too many indices for tensor of dimension 0"):
            m.tensor(1.0)[m.tensor([True])]
        with pytest.raises(IndexError, match="shape of the mask"):
            m.ones(2, 3)[..., m.tensor([True, False])]
        with pytest.raises(IndexError, match="too many indices"):
            m.ones(2, 3)[1, 1, 1]


# ------------------------------------------------------------------ unique(dim=) errors on empty inputs
@pytest.mark.parametrize("shape, dim, error, message", [
    ((3, 0), 0, RuntimeError, "There are 0 sized dimensions, and they aren't selected"),
    ((0, 3), 1, RuntimeError, "There are 0 sized dimensions, and they aren't selected"),
    ((0, 0), 1, RuntimeError, "Number of zero sized dimensions is more than one"),
    ((2, 0, 0), 1, RuntimeError, "Number of zero sized dimensions is more than one"),
    ((2, 0, 0), 0, RuntimeError, "There are 0 sized dimensions, and they aren't selected"),
    ((0, 2, 0), 0, RuntimeError, "Number of zero sized dimensions is more than one"),
    ((), 0, IndexError, "Dimension specified as 0 but tensor has no dimensions"),
    ((), -1, IndexError, "Dimension specified as -1 but tensor has no dimensions"),
])
def test_unique_dim_errors_match_torch(shape, dim, error, message):
    for m in (torch, flow):
        with pytest.raises(error, match=message):
            m.unique(m.zeros(shape), dim=dim)


# ------------------------------------------------------------------ einsum
def test_einsum_sublist_errors_match_torch():
    for m in (torch, flow):
        with pytest.raises(ValueError, match=r"not within the valid range \[0, 52\)"):
            m.einsum(m.ones(2, 3), [0, 52])
        with pytest.raises(ValueError, match=r"not within the valid range \[0, 52\)"):
            m.einsum(m.ones(2, 3), [Ellipsis, -1])
        with pytest.raises(ValueError, match="must specify the equation string and at least one operand"):
            m.einsum(m.ones(2))
        with pytest.raises(ValueError, match="must specify the equation string and at least one operand"):
            m.einsum("i")
        with pytest.raises(RuntimeError, match="subscript A is repeated for operand 0 but the sizes don't match, 3 != 2"):
            m.einsum(m.ones(2, 3), [0, 0])
        with pytest.raises(RuntimeError, match="subscript i is repeated for operand 0 but the sizes don't match, 4 != 2"):
            m.einsum("iji", m.ones(2, 3, 4))


# ------------------------------------------------------------------ pow
def test_int_pow_by_scalar_negative_exponent_raises_as_torch():
    for m in (torch, flow):
        for fn in (lambda: m.pow(m.tensor([1, 2, -1]), -1), lambda: m.tensor(2) ** -2,
                   lambda: m.tensor([1, 2], dtype=m.int32).pow_(-1)):
            with pytest.raises(RuntimeError, match="^Integers to negative integer powers are not allowed."):
                fn()
        assert m.pow(m.tensor([1, 2]), -1.0).dtype == m.float32  # a float exponent: a float result


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64", "uint8"])
def test_int_pow_by_tensor_negative_exponents_matches_torch(dtype):
    base = np.array([[1], [2], [-1], [0], [-2], [5]]) % (256 if dtype == "uint8" else 1 << 40)
    exp = np.array([-1, -2, -3, 0, 2, 3])
    got = flow.pow(flow.tensor(base).to(getattr(flow, dtype)), flow.tensor(exp).to(flow.int8))
    want = torch.pow(torch.tensor(base).to(getattr(torch, dtype)), torch.tensor(exp).to(torch.int8))
    assert got.dtype.name == str(want.dtype).split(".")[-1]
    np.testing.assert_array_equal(got.numpy(), want.numpy())


# ------------------------------------------------------------------ Tensor.new and metadata
def _same(f, t):
    """The same value: a tensor of the same shape, dtype and elements, or equal Python values."""
    if isinstance(t, torch.Tensor):
        assert isinstance(f, flow.Tensor), f
        assert tuple(f.shape) == tuple(t.shape) and f.dtype.name == str(t.dtype).split(".")[-1], (f, t)
        assert f.tolist() == t.tolist()
    elif isinstance(t, torch.Size):
        assert isinstance(f, flow.Size) and tuple(f) == tuple(t), (f, t)
    else:
        assert type(f) is type(t) and f == t, (f, t)


@pytest.mark.parametrize("call", [
    lambda m, x: x.new(2, 3).shape, lambda m, x: x.new(2, 3).dtype.is_floating_point,
    lambda m, x: x.new(m.Size([2, 0])).shape, lambda m, x: x.new(size=(4,)).shape, lambda m, x: x.new(np.int64(2)).shape,
    lambda m, x: x.new(), lambda m, x: x.new([]), lambda m, x: x.new([[1, 2], [3, 4]]), lambda m, x: x.new((2, 3)),
    lambda m, x: x.new([True, False]), lambda m, x: x.new(np.array(2.5)), lambda m, x: x.new([1, 2], device="cpu"),
    lambda m, x: x.long().new([1.5, -2.7]), lambda m, x: x.bool().new([1, 0, 2]), lambda m, x: x.int().new(3).dtype.itemsize,
    lambda m, x: x.new(m.ones(2, requires_grad=True)).requires_grad,
    lambda m, x: x.requires_grad_().new(2).requires_grad,
    lambda m, x: x.get_device(), lambda m, x: x.is_complex(), lambda m, x: m.is_complex(x.long()),
    lambda m, x: (x.nbytes, x.itemsize, x.element_size()), lambda m, x: (x.double().nbytes, x.half().itemsize),
    lambda m, x: (x.bfloat16().nbytes, x.bool().itemsize, x.char().nbytes, x[:, :0].nbytes),
    lambda m, x: x[:, 1].data_ptr() - x.data_ptr(), lambda m, x: x[1:].data_ptr() - x.data_ptr(),
    lambda m, x: (m.zeros(0).data_ptr(), x[:, 3:].data_ptr()),
])
def test_new_and_metadata_match_torch(call):
    _same(call(flow, flow.ones(2, 3)), call(torch, torch.ones(2, 3)))


def test_new_aliases_a_tensor_of_its_dtype_and_data_ptr_is_the_address():
    x, t = flow.ones(2, 3), flow.zeros(4)
    y = x.new(t)
    assert y.data_ptr() == t.data_ptr() and y is not t
    assert x.data_ptr() == x.numpy().__array_interface__["data"][0]
    assert x.new(2, 3).device == x.device


@pytest.mark.parametrize("call, error", [
    (lambda m, x: x.new(m.ones(2, dtype=m.int64)), TypeError), (lambda m, x: x.new(2.5), TypeError),
    (lambda m, x: x.new(True), TypeError), (lambda m, x: x.new(None), TypeError), (lambda m, x: x.new("ab"), TypeError),
    (lambda m, x: x.new(2, (3,)), TypeError), (lambda m, x: x.new(-1), RuntimeError), (lambda m, x: x.new(2, -3), RuntimeError),
    (lambda m, x: m.is_complex(2.0), TypeError),
    (lambda m, x: x.long().clamp_min_(2.5), RuntimeError), (lambda m, x: x.requires_grad_().clamp_max_(0.0), RuntimeError),
    (lambda m, x: x.select(1, 3), IndexError), (lambda m, x: x.select(2, 0), IndexError),
    (lambda m, x: m.tensor(1.0).select(0, 0), IndexError),
    (lambda m, x: x.index_fill(1, m.tensor([0, 3]), 1.0), IndexError),
    (lambda m, x: x.index_fill(1, m.tensor([-4]), 1.0), IndexError),
    (lambda m, x: x.index_fill(1, m.tensor([0], dtype=m.int32), 1.0), IndexError),
    (lambda m, x: x.index_fill(1, m.tensor([[0]]), 1.0), RuntimeError),
    (lambda m, x: x.index_fill(1, m.tensor([0]), m.ones(1)), RuntimeError),
    (lambda m, x: x.index_fill(2, m.tensor([0]), 1.0), IndexError),
    (lambda m, x: x.requires_grad_().index_fill_(1, m.tensor([0]), 1.0), RuntimeError),
])
def test_method_errors_match_torch(call, error):
    for m in (torch, flow):
        with pytest.raises(error):
            call(m, m.ones(2, 3))


def test_select_and_index_fill_messages():
    x = flow.ones(2, 3)
    with pytest.raises(IndexError, match=r"select\(\): index 3 out of range for tensor of size \[2, 3\] at dimension 1"):
        x.select(1, 3)
    with pytest.raises(IndexError, match="index -4 is out of bounds for dimension 1 with size 3"):
        x.index_fill(1, flow.tensor([-4]), 1.0)
    with pytest.raises(IndexError, match=r"index_fill_\(\): Expected dtype int64 for index."):
        x.index_fill(0, flow.tensor([0], dtype=flow.int32), 1.0)


# ------------------------------------------------------------------ integer convolutions and average pools
def _ints(m, shape, dtype):
    a = (np.arange(int(np.prod(shape))) % 5 - 2).reshape(shape)
    return m.tensor(a).to(getattr(m, dtype))


INT_CALLS = {
    "conv1d": lambda m, F, d: F.conv1d(_ints(m, (1, 1, 6), d), _ints(m, (1, 1, 3), d), _ints(m, (1,), d)),
    "conv2d-groups": lambda m, F, d: F.conv2d(_ints(m, (2, 4, 5, 5), d), _ints(m, (4, 2, 2, 2), d), stride=2, padding=1,
                                              groups=2),
    "conv2d-dilated": lambda m, F, d: F.conv2d(_ints(m, (1, 2, 5, 5), d), _ints(m, (2, 1, 2, 2), d), dilation=2, groups=2),
    "conv1d-dilated": lambda m, F, d: F.conv1d(_ints(m, (1, 1, 6), d), _ints(m, (1, 1, 2), d), dilation=2),
    "conv2d-empty-batch": lambda m, F, d: F.conv2d(_ints(m, (0, 1, 4, 4), d), _ints(m, (1, 1, 3, 3), d)),
    "conv_transpose1d": lambda m, F, d: F.conv_transpose1d(_ints(m, (1, 1, 4), d), _ints(m, (1, 1, 3), d)),
    "conv_transpose2d": lambda m, F, d: F.conv_transpose2d(_ints(m, (1, 2, 3, 3), d), _ints(m, (2, 3, 2, 2), d), stride=2,
                                                           padding=1, output_padding=1, groups=2),
    "conv_transpose2d-empty-batch": lambda m, F, d: F.conv_transpose2d(_ints(m, (0, 1, 4, 4), d), _ints(m, (1, 1, 3, 3), d)),
    "avg_pool1d": lambda m, F, d: F.avg_pool1d(_ints(m, (1, 2, 7), d) * 3, 3, 1, 1),
    "avg_pool2d": lambda m, F, d: F.avg_pool2d(_ints(m, (1, 2, 5, 5), d) * 7, 2, divisor_override=3),
    "avg_pool2d-empty-batch": lambda m, F, d: F.avg_pool2d(_ints(m, (0, 1, 4, 4), d), 2),
}


@pytest.mark.parametrize("dtype", ["int64", "int32", "int16", "int8", "uint8", "bool"])
@pytest.mark.parametrize("name", list(INT_CALLS))
def test_integer_conv_and_avg_pool_match_torch(name, dtype):
    """torch's CPU kernels: int64 everywhere, the other integer types only in the plain convolution
    (NotImplementedError from the dilated and transposed ones and from avg_pool), bool nowhere."""
    results = []
    for m in (torch, flow):
        try:
            r = INT_CALLS[name](m, m.nn.functional, dtype)
            results.append((str(r.dtype).split(".")[-1], tuple(r.shape), np.asarray(r.tolist()).tolist()))
        except NotImplementedError as e:
            results.append(("NotImplementedError", str(e)))
    assert results[1] == results[0]


def test_integer_conv_wraps_as_torch():
    for dtype, a, w in (("int8", 100, 50), ("uint8", 200, 3), ("int64", 2 ** 62, 3)):
        got = flow.nn.functional.conv1d(flow.full((1, 1, 4), a, dtype=getattr(flow, dtype)),
                                        flow.full((1, 1, 3), w, dtype=getattr(flow, dtype)))
        want = torch.nn.functional.conv1d(torch.full((1, 1, 4), a, dtype=getattr(torch, dtype)),
                                          torch.full((1, 1, 3), w, dtype=getattr(torch, dtype)))
        np.testing.assert_array_equal(got.numpy(), want.numpy())
