"""Fused kernels of engine/kernels: layer_norm, the attention softmax, bias + GELU and
bias + dropout + residual add.

Three layers of checks: each numpy reference against torch (forward and backward, odd sizes,
float32 and float16); each CUDA launcher through the strict CuPy double against its reference
(mask layouts, launch counts, a wrong grid caught); the engine ops on CUDA tensors against the
same ops on the CPU, and LiBai's MLP / TransformerLayer with their fusion flags.
"""
import numpy as np
import pytest
import torch

import engine as flow
import engine.nn.functional as F
from engine.kernels import _cuda, add, bias_add, cast, dropout_add, gelu, layer_norm, philox, softmax
from engine.ops.dropout import bias_dropout_add
from engine.ops.unary import bias_gelu
from nvrtc_helper import nvrtc_compiler

SHAPES = [(7, 33), (1, 33), (3, 1), (2, 3, 5)]
DTYPES = [np.float32, np.float16]
# max abs error of a reference against torch's float64 result on the same (rounded) inputs
TOL = {np.float32: 2e-5, np.float16: 4e-3, np.float64: 1e-12}


def _rand(rng, shape, dtype, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def _t(a):
    return torch.tensor(np.asarray(a, dtype=np.float64), requires_grad=True)


def _close(a, b, tol, what=""):
    err = np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))) if np.size(a) else 0.0
    assert err <= tol, f"{what}: max abs error {err} > {tol}"
    return err


def _np(t):
    """A tensor's values on the host (CUDA and global tensors too)."""
    t = t.detach()
    if t._global is not None:
        t = t.to_local()
    return t.cpu().numpy()


def _launches(cuda_double, fn, *args, **kwargs):
    stats = cuda_double._double.stats
    stats.reset()
    out = fn(*args, **kwargs)
    return out, stats.launches


# ====================================================================== numpy references vs torch
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES + [np.float64])
@pytest.mark.parametrize("affine", [(True, True), (True, False), (False, False)])
def test_layer_norm_reference_matches_torch(shape, dtype, affine):
    rng = np.random.default_rng(1)
    d = shape[-1]
    x2 = _rand(rng, shape, dtype, 3.0).reshape(-1, d) + dtype(1.5)
    w = _rand(rng, d, dtype) if affine[0] else None
    b = _rand(rng, d, dtype) if affine[1] else None
    g2 = _rand(rng, x2.shape, dtype)
    y, mean, rstd = layer_norm.forward_reference(x2, w, b, 1e-5)
    assert y.dtype == dtype and mean.dtype == (np.float64 if dtype == np.float64 else np.float32)
    tx, tw, tb = _t(x2), (_t(w) if w is not None else None), (_t(b) if b is not None else None)
    ty = torch.nn.functional.layer_norm(tx, (d,), tw, tb, 1e-5)
    ty.backward(torch.tensor(g2.astype(np.float64)))
    tol = TOL[dtype] * (4 if d > 1 else 1)
    _close(y, ty.detach(), tol, "y")
    _close(mean, tx.detach().mean(-1), TOL[dtype], "mean")
    dx, dw, db = layer_norm.backward_reference(g2, x2, mean, rstd, w, b is not None)
    scale = 1 / np.sqrt(x2.astype(np.float64).var(-1).min() + 1e-5)  # dx grows with rstd
    _close(dx, tx.grad, TOL[dtype] * 20 * scale, "dx")
    if w is not None:
        _close(dw, tw.grad, TOL[dtype] * 20, "dw")
    else:
        assert dw is None
    if b is not None:
        _close(db, tb.grad, TOL[dtype] * 20, "db")
    else:
        assert db is None


def _torch_scores(x, mask, scale, fill, causal):
    """torch's masked scores: x * scale, fill where masked (bool / causal), + an additive mask."""
    tx = _t(x)
    z = tx * scale
    if mask is not None and mask.dtype == np.bool_:
        z = z.masked_fill(torch.tensor(mask), fill)
    elif mask is not None:
        z = z + torch.tensor(mask.astype(np.float64))
    if causal:  # query i sees keys j <= i + (k - q)
        q, k = x.shape[-2:]
        z = z.masked_fill(torch.ones(q, k, dtype=torch.bool).triu(k - q + 1), fill)
    return tx, z


def _masks(rng, shape):
    b, h, q, k = shape
    return {
        "none": None,
        "padding": rng.random((b, 1, 1, k)) < 0.3,
        "square": rng.random((1, 1, q, k)) < 0.3,
        "full": rng.random((b, h, q, k)) < 0.3,
        "additive": (rng.standard_normal((q, k)) * 2).astype(np.float32),
        "keys": rng.random(k) < 0.3,
    }


@pytest.mark.parametrize("shape", [(2, 3, 5, 9), (1, 1, 1, 33), (2, 1, 7, 7)])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kind", ["none", "padding", "square", "full", "additive", "keys"])
def test_softmax_reference_matches_torch(shape, dtype, causal, kind):
    rng = np.random.default_rng(2)
    x = _rand(rng, shape, dtype, 3.0)
    mask = _masks(rng, shape)[kind]
    g = _rand(rng, shape, dtype)
    y = softmax.forward_reference(x, mask, 0.7, -10000.0, causal)
    assert y.dtype == dtype
    tx, z = _torch_scores(x, mask, 0.7, -10000.0, causal)
    ty = torch.softmax(z, -1)
    ty.backward(torch.tensor(g.astype(np.float64)))
    _close(y, ty.detach(), TOL[dtype], "y")
    dx = softmax.backward_reference(g, y, mask, 0.7, causal)
    _close(dx, tx.grad, TOL[dtype] * 4, "dx")
    masked = np.zeros(shape, bool)
    if mask is not None and mask.dtype == np.bool_:
        masked |= np.broadcast_to(mask, shape)
    if causal:
        masked |= softmax.causal_mask(*shape[-2:])
    assert np.all(dx[masked] == 0)  # masked scores are constants: exactly no gradient


def test_causal_softmax_with_more_queries_than_keys_is_uniform_on_hidden_rows():
    """q > k: the first q - k queries see no key; their scores are all `fill`, a uniform row."""
    x = np.random.default_rng(3).standard_normal((4, 3)).astype(np.float32)
    y = softmax.forward_reference(x, None, 1.0, -10000.0, True)
    assert np.allclose(y[0], 1 / 3) and y[1, 0] == 1.0


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gelu_reference_matches_torch(shape, dtype, approximate, with_bias):
    rng = np.random.default_rng(4)
    x = _rand(rng, shape, dtype, 3.0)
    b = _rand(rng, shape[-1], dtype) if with_bias else None
    g = _rand(rng, shape, dtype)
    y = gelu.gelu_reference(x, b, approximate)
    dx = gelu.gelu_grad_reference(g, x, b, approximate)
    assert y.dtype == dx.dtype == dtype
    tx = _t(x)
    tb = _t(b) if with_bias else None
    ty = torch.nn.functional.gelu(tx + tb if with_bias else tx, approximate=approximate)
    ty.backward(torch.tensor(g.astype(np.float64)))
    tol = TOL[dtype] * 8
    _close(y, ty.detach(), tol, "y")
    _close(dx, tx.grad, tol, "dx")


@pytest.mark.parametrize("dtype", DTYPES + [np.float64])
@pytest.mark.parametrize("p", [0.0, 0.3, 1.0])
def test_dropout_add_reference_matches_torch_given_its_mask(dtype, p):
    """The reference is residual + (x + b) * keep / (1 - p) with keep = u >= p, u the generator
    stream's uniforms at (seed, offset); the gradient of x is g * keep / (1 - p)."""
    rng = np.random.default_rng(5)
    x, r, g = (_rand(rng, (7, 33), dtype) for _ in range(3))
    b = _rand(rng, 33, dtype)
    seed, offset = 1234567, 40
    kind = dropout_add.uniform_kind(dtype)
    u = philox.reference(kind, x.size, seed, offset).reshape(x.shape)
    keep = u >= u.dtype.type(p)
    tx, tb, tr = _t(x), _t(b), _t(r)
    scale = 0.0 if p == 1 else 1 / (1 - p)
    ty = (tx + tb) * torch.tensor(keep * scale) + tr
    ty.backward(torch.tensor(g.astype(np.float64)))
    y = dropout_add.bias_dropout_add_reference(x, b, r, p, seed, offset)
    _close(y, ty.detach(), TOL[dtype] * 8, "y")
    _close(dropout_add.dropout_grad_reference(g, p, seed, offset), tx.grad, TOL[dtype] * 4, "dx")
    assert dropout_add.groups(dtype, x.size) == philox.groups(kind, x.size)


def test_dropout_add_keeps_a_fraction_one_minus_p():
    mask = dropout_add.scaled_mask((200, 500), np.float32, 0.3, 99, 0) > 0
    assert abs(mask.mean() - 0.7) < 0.005
    other = dropout_add.scaled_mask((200, 500), np.float32, 0.3, 99, 25000) > 0  # the next draw
    assert 0.45 < (mask == other).mean() < 0.63  # independent: 0.7^2 + 0.3^2 = 0.58


def test_dropout_add_reference_refuses_mismatched_operands():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match="bias"):
        dropout_add.bias_dropout_add_reference(x, np.zeros(2, np.float32), None, 0.1, 0, 0)
    with pytest.raises(ValueError, match="residual"):
        dropout_add.bias_dropout_add_reference(x, None, np.zeros((2, 3), np.float16), 0.1, 0, 0)
    with pytest.raises(ValueError, match="probability"):
        dropout_add.bias_dropout_add_reference(x, None, None, 1.5, 0, 0)


# ====================================================================== CUDA launchers (through the cuda_double)
def _dev(cuda_double, a):
    return None if a is None else cuda_double.asarray(a)


def _host(a):
    return None if a is None else a.get()


@pytest.mark.parametrize("shape", [(7, 33), (1, 33), (600, 5), (2, 1100)])
@pytest.mark.parametrize("dtype", DTYPES + [np.float64])
@pytest.mark.parametrize("affine", [(True, True), (False, True), (False, False)])
def test_layer_norm_launchers_match_the_reference(cuda_double, shape, dtype, affine):
    rng = np.random.default_rng(6)
    x2, g2 = _rand(rng, shape, dtype), _rand(rng, shape, dtype)
    d = shape[1]
    w = _rand(rng, d, dtype) if affine[0] else None
    b = _rand(rng, d, dtype) if affine[1] else None
    dev = [_dev(cuda_double, a) for a in (x2, w, b)]
    (y, mean, rstd), n = _launches(cuda_double, layer_norm.layer_norm_forward, *dev, 1e-5)
    assert n == 1
    ref = layer_norm.forward_reference(x2, w, b, 1e-5)
    for got, want in zip((y, mean, rstd), ref):
        assert got.dtype == want.dtype and np.array_equal(got.get(), want)
    out, n = _launches(cuda_double, layer_norm.layer_norm_backward, _dev(cuda_double, g2), dev[0], mean, rstd,
                       dev[1], b is not None)
    assert n == (2 if affine != (False, False) else 1)
    ref = layer_norm.backward_reference(g2, x2, ref[1], ref[2], w, b is not None)
    _close(out[0].get(), ref[0], 0, "dx")
    for got, want, what in zip(out[1:], ref[1:], ("dw", "db")):
        assert (got is None) == (want is None), what
        if got is not None:  # the partial sums add in another order than the reference's
            _close(got.get(), want, TOL[dtype] * 2 * max(1, shape[0] / 50), what)


def test_layer_norm_launchers_take_strided_weights(cuda_double):
    rng = np.random.default_rng(22)
    x2, g2, w2 = _rand(rng, (3, 8), np.float32), _rand(rng, (3, 8), np.float32), _rand(rng, 16, np.float32)
    w = cuda_double.asarray(w2)[::2]
    y, mean, rstd = layer_norm.layer_norm_forward(cuda_double.asarray(x2), w, w, 1e-5)
    assert np.array_equal(y.get(), layer_norm.forward_reference(x2, w2[::2], w2[::2], 1e-5)[0])
    dx, dw, _ = layer_norm.layer_norm_backward(cuda_double.asarray(g2), cuda_double.asarray(x2), mean, rstd, w, False)
    want = layer_norm.backward_reference(g2, x2, mean.get(), rstd.get(), w2[::2], False)
    assert np.array_equal(dx.get(), want[0])
    _close(dw.get(), want[1], 1e-6)


def test_layer_norm_launcher_refuses_mixed_dtypes(cuda_double):
    x = cuda_double.asarray(np.zeros((2, 3), np.float16))
    with pytest.raises(TypeError, match="weight"):
        layer_norm.layer_norm_forward(x, cuda_double.asarray(np.zeros(3, np.float32)), None, 1e-5)


MASK_SHAPES = {"padding": (2, 1, 1, 9), "square": (1, 1, 5, 9), "batch": (2, 1, 5, 9), "full": (2, 3, 5, 9),
               "keys": (9,), "rows": (2, 3, 5, 1), "heads": (1, 3, 1, 9), "2d": (5, 9)}


@pytest.mark.parametrize("layout", sorted(MASK_SHAPES))
@pytest.mark.parametrize("kind", ["bool", "additive"])
@pytest.mark.parametrize("causal", [False, True])
def test_softmax_launchers_read_broadcast_masks_in_place(cuda_double, layout, kind, causal):
    rng = np.random.default_rng(7)
    shape = (2, 3, 5, 9)
    x, g = _rand(rng, shape, np.float32, 2.0), _rand(rng, shape, np.float32)
    mask = rng.random(MASK_SHAPES[layout]) < 0.3 if kind == "bool" else _rand(rng, MASK_SHAPES[layout], np.float32)
    dmask = _dev(cuda_double, mask)
    y, n = _launches(cuda_double, softmax.softmax_forward, _dev(cuda_double, x), dmask, 0.5, -10000.0, causal)
    assert n == 1
    assert np.array_equal(y.get(), softmax.forward_reference(x, mask, 0.5, -10000.0, causal))
    dx, n = _launches(cuda_double, softmax.softmax_backward, _dev(cuda_double, g), y, dmask, 0.5, causal)
    assert n == 1
    assert np.array_equal(dx.get(), softmax.backward_reference(g, y.get(), mask, 0.5, causal))


@pytest.mark.parametrize("dtype", DTYPES + [np.float64])
def test_softmax_launchers_odd_shapes_and_dtypes(cuda_double, dtype):
    rng = np.random.default_rng(8)
    for shape in [(7, 33), (1, 1), (3, 1, 1100)]:
        x, g = _rand(rng, shape, dtype), _rand(rng, shape, dtype)
        y = softmax.softmax_forward(_dev(cuda_double, x))
        assert y.dtype == dtype and np.array_equal(y.get(), softmax.forward_reference(x))
        dx = softmax.softmax_backward(_dev(cuda_double, g), y)
        assert np.array_equal(dx.get(), softmax.backward_reference(g, y.get()))


def test_softmax_mask_the_strides_cannot_express_is_written_out(cuda_double):
    """x [2, 3, 4, 5, 6] with a mask [2, 1, 4, 1, 6]: four leading dims that do not fold into
    three; the launcher broadcasts the mask (one more launch) and the result is the same."""
    rng = np.random.default_rng(9)
    x = _rand(rng, (2, 3, 4, 5, 6), np.float32)
    mask = rng.random((2, 1, 4, 1, 6)) < 0.4
    y, n = _launches(cuda_double, softmax.softmax_forward, _dev(cuda_double, x), _dev(cuda_double, mask), 1.0, -10000.0)
    assert n == 2
    assert np.array_equal(y.get(), softmax.forward_reference(x, mask, 1.0, -10000.0))


def test_softmax_mask_layout_folds_attention_masks_into_strides():
    # (l1, l2, t0, t1, t2, tl): [b, 1, 1, k] is b rows of stride k, each 15 times
    assert softmax.mask_layout(np, np.zeros((2, 1, 1, 9), bool), (2, 3, 5, 9))[1:] == (2, 15, 0, 9, 0, 1)
    assert softmax.mask_layout(np, np.zeros((1, 1, 5, 9), bool), (2, 3, 5, 9))[1:] == (6, 5, 0, 0, 9, 1)
    assert softmax.mask_layout(np, np.zeros((2, 3, 5, 9), bool), (2, 3, 5, 9))[1:] == (1, 30, 0, 0, 9, 1)
    assert softmax.mask_layout(np, np.zeros((2, 3, 5, 1), bool), (2, 3, 5, 9))[1:] == (1, 30, 0, 0, 1, 0)


@pytest.mark.parametrize("dtype", DTYPES + [np.float64])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gelu_launchers_match_the_reference(cuda_double, dtype, approximate, with_bias):
    rng = np.random.default_rng(10)
    x, g = _rand(rng, (7, 33), dtype, 2.0), _rand(rng, (7, 33), dtype)
    b = _rand(rng, 33, dtype) if with_bias else None
    y, n = _launches(cuda_double, gelu.gelu, _dev(cuda_double, x), _dev(cuda_double, b), approximate)
    assert n == 1 and y.dtype == dtype
    assert np.array_equal(y.get(), gelu.gelu_reference(x, b, approximate))
    dg, dx_, db = (_dev(cuda_double, a) for a in (g, x, b))
    dx, n = _launches(cuda_double, gelu.gelu_grad, dg, dx_, db, approximate)
    assert n == 1
    assert np.array_equal(dx.get(), gelu.gelu_grad_reference(g, x, b, approximate))


@pytest.mark.parametrize("dtype", DTYPES + [np.float64])
@pytest.mark.parametrize("operands", [(True, True), (True, False), (False, True), (False, False)])
def test_dropout_add_launchers_match_the_reference(cuda_double, dtype, operands):
    rng = np.random.default_rng(11)
    x, r, g = (_rand(rng, (7, 33), dtype) for _ in range(3))
    b = _rand(rng, 33, dtype) if operands[0] else None
    r = r if operands[1] else None
    seed, offset = (1 << 63) + 5, 17
    dx, db, dr = (_dev(cuda_double, a) for a in (x, b, r))
    y, n = _launches(cuda_double, dropout_add.bias_dropout_add, dx, db, dr, 0.25, seed, offset)
    assert n == 1
    assert np.array_equal(y.get(), dropout_add.bias_dropout_add_reference(x, b, r, 0.25, seed, offset))
    dx, n = _launches(cuda_double, dropout_add.dropout_grad, _dev(cuda_double, g), 0.25, seed, offset)
    assert n == 1
    assert np.array_equal(dx.get(), dropout_add.dropout_grad_reference(g, 0.25, seed, offset))


def test_emulators_catch_a_wrong_launch(cuda_double):
    """A raw kernel launched with too few blocks, a block that is not whole warps, or a Python
    int where the kernel takes a 32-bit int fails as it would misbehave on a GPU."""
    x = cuda_double.asarray(np.ones((7, 33), np.float32))
    y, stat = cuda_double.empty((7, 33), np.float32), cuda_double.empty(7, np.float32)
    kernel = _cuda.raw_kernel(layer_norm.SOURCE, _cuda.kernel_name("engine_layer_norm_fwd", np.float32))
    args = (x, x, x, y, stat, stat, _cuda.i32(7), _cuda.i32(33), _cuda.f64(1e-5), _cuda.i32(0), _cuda.i32(0))
    kernel((7,), (64,), args)  # the right launch
    with pytest.raises(ValueError, match="one block per row"):
        kernel((6,), (64,), args)
    with pytest.raises(ValueError, match="block"):
        kernel((7,), (48,), args)
    with pytest.raises(TypeError, match="int32"):
        kernel((7,), (64,), args[:6] + (np.int64(7),) + args[7:])
    with pytest.raises(ValueError, match="elements"):
        kernel((8,), (64,), args[:6] + (_cuda.i32(8),) + args[7:])  # rows past the arrays
    wb = _cuda.raw_kernel(layer_norm.SOURCE, _cuda.kernel_name("engine_layer_norm_bwd_wb", np.float32))
    part = cuda_double.zeros((2, 300), np.float32)
    out = cuda_double.empty(300, np.float32)
    with pytest.raises(ValueError, match="columns"):
        wb((1,), (256,), (part, part, out, out, _cuda.i32(2), _cuda.i32(300), _cuda.i32(1), _cuda.i32(1)))
    sm = _cuda.raw_kernel(softmax.SOURCE, _cuda.kernel_name("engine_softmax_fwd", np.float16))
    with pytest.raises(TypeError, match="float16"):  # float32 memory read as __half
        sm((7,), (64,), (x, x, x, y, _cuda.i32(7), _cuda.i32(33), _cuda.i32(1), _cuda.f64(1), _cuda.f64(0),
                         _cuda.i32(0), _cuda.i32(0), _cuda.i32(1), _cuda.i32(1), _cuda.i64(0), _cuda.i64(0),
                         _cuda.i64(0), _cuda.i64(0)))


# ====================================================================== engine ops: CUDA (cuda_double) vs CPU
def _both(cuda_double, arrays, requires_grad=True):
    """The same arrays as CPU and as CUDA tensors."""
    cpu = [None if a is None else flow.tensor(a, requires_grad=requires_grad) for a in arrays]
    cuda = [None if a is None else flow.tensor(a, device="cuda", requires_grad=requires_grad) for a in arrays]
    return cpu, cuda


def _grads(ts):
    return [None if t is None or t.grad is None else _np(t.grad) for t in ts]


def _compare_runs(cuda_double, fn, arrays, tol, grad=None):
    """fn on CPU and CUDA tensors: outputs and input gradients (of sum(out * grad)) agree."""
    cpu, cuda = _both(cuda_double, arrays)
    outs = []
    for ts in (cpu, cuda):
        y = fn(*ts)
        g = flow.tensor(grad if grad is not None else np.ones(y.shape, np.float32), dtype=y.dtype,
                        device=y.device)
        (y * g).sum().backward()
        outs.append((_np(y), _grads(ts)))
    _close(outs[0][0], outs[1][0], tol, "forward")
    for a, b in zip(outs[0][1], outs[1][1]):
        if a is not None:
            _close(a, b, tol * 10, "gradient")
    return outs


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_op_on_cuda_matches_cpu(cuda_double, dtype, affine):
    rng = np.random.default_rng(12)
    x = _rand(rng, (3, 7, 33), dtype)
    w, b = (_rand(rng, 33, dtype), _rand(rng, 33, dtype)) if affine else (None, None)
    grad = _rand(rng, x.shape, np.float32)
    _compare_runs(cuda_double, lambda x, w, b: F.layer_norm(x, (33,), w, b), [x, w, b], TOL[dtype] * 4, grad)
    # two trailing normalised dims, and the launch counts of the op itself
    x4 = flow.tensor(_rand(rng, (2, 3, 4, 5), dtype), device="cuda", requires_grad=True)
    w4 = flow.tensor(_rand(rng, (4, 5), dtype), device="cuda", requires_grad=True)
    y, n = _launches(cuda_double, F.layer_norm, x4, (4, 5), w4, w4)
    assert n == 1
    _, n = _launches(cuda_double, y.sum().backward)
    cpu = F.layer_norm(flow.tensor(_np(x4)), (4, 5), flow.tensor(_np(w4)),
                       flow.tensor(_np(w4)))
    _close(_np(y), _np(cpu), TOL[dtype] * 4)


def test_layer_norm_op_launches(cuda_double):
    x = flow.tensor(np.ones((4, 8), np.float32), device="cuda", requires_grad=True)
    w = flow.tensor(np.ones(8, np.float32), device="cuda", requires_grad=True)
    b = flow.tensor(np.zeros(8, np.float32), device="cuda", requires_grad=True)
    y, n = _launches(cuda_double, F.layer_norm, x, (8,), w, b)
    assert n == 1
    g = flow.tensor(np.ones((4, 8), np.float32), device="cuda")
    grads, n = _launches(cuda_double, flow.autograd.grad, [y], [x, w, b], [g])
    assert n == 2


def _ln_then_matmul(norm, x, w, b, weight, grad, device, low):
    """(out, x.grad, w.grad, b.grad) of norm(x) @ weight under autocast(device, low): the norm's
    output read by a product, as in a pre-LN block."""
    x, w, b, weight = (flow.tensor(a, device=device, requires_grad=True) for a in (x, w, b, weight))
    with flow.autocast(device, dtype=low):
        out = flow.matmul(norm(x, (x.shape[-1],), w, b), weight)
    out.backward(flow.tensor(grad, device=device).to(out.dtype))
    return [_np(t) for t in (out, x.grad, w.grad, b.grad)]


@pytest.mark.parametrize("device,low", [("cuda", flow.float16), ("cpu", flow.bfloat16), ("cpu", flow.float16)])
def test_layer_norm_into_autocast_is_layer_norm_then_the_cast(cuda_double, device, low):
    """F.layer_norm_into_autocast before a product under autocast: the values and gradients of
    F.layer_norm there, bit for bit (the product would cast its input to the same dtype). On CUDA
    in float16 the cast is in the kernels: two launches fewer forward + backward."""
    rng = np.random.default_rng(5)
    x, grad = _rand(rng, (3, 5, 64), np.float32, 3.0), _rand(rng, (3, 5, 16), np.float32)
    w, b, weight = _rand(rng, 64, np.float32), _rand(rng, 64, np.float32), _rand(rng, (64, 16), np.float32)
    stats = cuda_double._double.stats
    stats.reset()
    want = _ln_then_matmul(F.layer_norm, x, w, b, weight, grad, device, low)
    plain = stats.launches
    stats.reset()
    got = _ln_then_matmul(F.layer_norm_into_autocast, x, w, b, weight, grad, device, low)
    for what, a, e in zip(("out", "x.grad", "w.grad", "b.grad"), got, want):
        assert a.dtype == e.dtype and np.array_equal(a, e), what
    if device == "cuda":
        assert stats.launches == plain - 2, (stats.launches, plain)


@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_into_autocast_under_create_graph(cuda_double, affine):
    """A double backward (create_graph=True) through the float16 output: the gradients of
    layer_norm followed by the cast, dtypes included (the composite backward gets the gradient
    in float32, as after the cast's backward)."""
    rng = np.random.default_rng(8)
    x = _rand(rng, (4, 32), np.float32, 2.0)
    w, b = (_rand(rng, 32, np.float32), _rand(rng, 32, np.float32)) if affine else (None, None)
    results = []
    for norm in (lambda t, w, b: F.layer_norm(t, (32,), w, b), lambda t, w, b: F.layer_norm_into_autocast(t, (32,), w, b)):
        ts = [None if a is None else flow.tensor(a, device="cuda", requires_grad=True) for a in (x, w, b)]
        with flow.autocast("cuda", dtype=flow.float16):
            y = norm(*ts)
            y = y.to(flow.float16)  # the product's cast (a no-op after layer_norm_into_autocast)
        grads = flow.autograd.grad((y.float() ** 2).sum(), [t for t in ts if t is not None], create_graph=True)
        second = flow.autograd.grad(sum(g.float().sum() for g in grads), ts[0])[0]
        results.append([(_np(g), g.dtype) for g in grads] + [(_np(second), second.dtype)])
    for (got, got_dtype), (want, want_dtype) in zip(results[1], results[0]):
        assert got_dtype == want_dtype and np.array_equal(got, want)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_layer_norm_grad_of_a_float16_gradient_is_float32(cuda_double, device):
    """A float16 gradient for a float32 layer_norm output gives float32 dx and db on both
    devices, as in torch (its engine casts the gradient to the output's dtype first)."""
    rng = np.random.default_rng(4)
    x, b = (flow.tensor(_rand(rng, s, np.float32), device=device, requires_grad=True) for s in ((3, 8), 8))
    y = F.layer_norm(x, (8,), None, b)
    g = _rand(rng, (3, 8), np.float16)
    dx, db = flow.autograd.grad(y, (x, b), flow.tensor(g, device=device))
    tx, tb = (torch.tensor(_np(t), requires_grad=True) for t in (x, b))
    want = torch.autograd.grad(torch.nn.functional.layer_norm(tx, (8,), None, tb), (tx, tb), torch.tensor(g))
    assert (dx.dtype, db.dtype) == (flow.float32, flow.float32) and all(w.dtype == torch.float32 for w in want)
    for got, w in zip((dx, db), want):
        np.testing.assert_allclose(_np(got), w.numpy(), rtol=1e-5, atol=1e-5)


def test_layer_norm_into_autocast_outside_autocast_and_its_errors(cuda_double):
    x = flow.tensor(np.arange(12, dtype=np.float32).reshape(3, 4), device="cuda")
    y = F.layer_norm_into_autocast(x, 4)
    assert y.dtype == flow.float32 and np.array_equal(_np(y), _np(F.layer_norm(x, 4)))
    with flow.autocast("cpu", dtype=flow.bfloat16):  # another device's autocast: layer_norm's result
        assert F.layer_norm_into_autocast(x, 4).dtype == flow.float32
    with pytest.raises(RuntimeError, match=r"layer_norm_into_autocast: given normalized_shape=\[5\]"):
        F.layer_norm_into_autocast(x, 5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_op_on_cuda_matches_cpu(cuda_double, dtype):
    rng = np.random.default_rng(13)
    x = _rand(rng, (2, 5, 33), dtype, 3.0)
    grad = _rand(rng, x.shape, np.float32)
    _compare_runs(cuda_double, lambda x: F.softmax(x, dim=-1), [x], TOL[dtype], grad)
    _compare_runs(cuda_double, lambda x: F.softmax(x, dim=1), [x], TOL[dtype], grad)  # not the last dim: CuPy ops
    t = flow.tensor(x, device="cuda", requires_grad=True)
    y, n = _launches(cuda_double, F.softmax, t, -1)
    assert n == 1
    _, n = _launches(cuda_double, flow.autograd.grad, [y], [t], [flow.tensor(grad, dtype=y.dtype, device="cuda")])
    assert n == 1


@pytest.mark.parametrize("kind", ["none", "padding", "square", "additive", "keys"])
@pytest.mark.parametrize("causal", [False, True])
def test_scale_mask_softmax_op_on_cuda_matches_cpu_and_torch(cuda_double, kind, causal):
    rng = np.random.default_rng(14)
    shape = (2, 3, 5, 9)
    x = _rand(rng, shape, np.float32, 3.0)
    mask = _masks(rng, shape)[kind]
    grad = _rand(rng, shape, np.float32)
    outs = _compare_runs(cuda_double, lambda x: F.scale_mask_softmax(
        x, None if mask is None else flow.tensor(mask, device=x.device), scale=0.5, causal=causal),
        [x], 1e-6, grad)
    tx, z = _torch_scores(x, mask, 0.5, -10000.0, causal)
    ty = torch.softmax(z, -1)
    ty.backward(torch.tensor(grad.astype(np.float64)))
    _close(outs[0][0], ty.detach(), 2e-6, "cpu forward vs torch")
    _close(outs[0][1][0], tx.grad, 2e-6, "cpu backward vs torch")
    masked = np.zeros(shape, bool)
    if kind not in ("none", "additive"):
        masked |= np.broadcast_to(mask, shape)
    if causal:
        masked |= softmax.causal_mask(*shape[-2:])
    for _, (dx,) in outs:  # masked scores are constants: exactly no gradient, on both devices
        assert np.all(dx[masked] == 0)


def test_scale_mask_softmax_causal_equals_the_mask_tensor_it_replaces(cuda_double):
    """A KV cache: 3 new queries over 7 keys; causal=True gives what LiBai's explicit mask gives."""
    rng = np.random.default_rng(15)
    x = flow.tensor(_rand(rng, (2, 4, 3, 7), np.float32), device="cuda")
    explicit = flow.tensor(softmax.causal_mask(3, 7)[None, None], device="cuda")
    y, n = _launches(cuda_double, F.scale_mask_softmax, x, None, 0.3, -10000.0, True)
    assert n == 1
    assert np.array_equal(_np(y), _np(F.scale_mask_softmax(x, explicit, scale=0.3)))
    with pytest.raises(ValueError, match="causal"):
        F.scale_mask_softmax(flow.zeros(5), causal=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_ops_on_cuda_match_cpu(cuda_double, dtype, approximate):
    rng = np.random.default_rng(16)
    x, b = _rand(rng, (7, 33), dtype, 2.0), _rand(rng, 33, dtype)
    grad = _rand(rng, x.shape, np.float32)
    tol = TOL[dtype] * 2
    _compare_runs(cuda_double, lambda x: F.gelu(x, approximate=approximate), [x], tol, grad)
    _compare_runs(cuda_double, lambda x, b: bias_gelu(x, b, approximate), [x, b], tol, grad)
    t, tb = flow.tensor(x, device="cuda", requires_grad=True), flow.tensor(b, device="cuda", requires_grad=True)
    y, n = _launches(cuda_double, bias_gelu, t, tb, approximate)
    assert n == 1
    _, n = _launches(cuda_double, flow.autograd.grad, [y], [t, tb], [flow.ones_like(y)])
    assert n == 2  # the fused kernel and the bias's column sum


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_bias_gelu_matches_torch_to_second_order(approximate):
    rng = np.random.default_rng(17)
    x, b = _rand(rng, (5, 7), np.float64), _rand(rng, 7, np.float64)
    t, tb = flow.tensor(x, requires_grad=True), flow.tensor(b, requires_grad=True)
    y = bias_gelu(t, tb, approximate)
    gx, gb = flow.autograd.grad(y.sum(), [t, tb], create_graph=True)
    ggx, ggb = flow.autograd.grad((gx * gx).sum() + gb.sum(), [t, tb])
    rx, rb = _t(x), _t(b)
    ry = torch.nn.functional.gelu(rx + rb, approximate=approximate)
    rgx, rgb = torch.autograd.grad(ry.sum(), [rx, rb], create_graph=True)
    rggx, rggb = torch.autograd.grad((rgx * rgx).sum() + rgb.sum(), [rx, rb])
    for a, r in ((y, ry), (gx, rgx), (gb, rgb), (ggx, rggx), (ggb, rggb)):
        _close(_np(a), r.detach(), 1e-10)


def test_bias_gelu_refuses_a_bias_that_is_not_the_last_dim():
    with pytest.raises(ValueError, match="bias"):
        bias_gelu(flow.zeros(2, 3), flow.zeros(2))
    with pytest.raises(ValueError, match="approximate"):
        bias_gelu(flow.zeros(2, 3), flow.zeros(3), "fast")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_bias_dropout_add_drops_what_dropout_drops(cuda_double, device, dtype):
    """From the same generator state the fused op drops the elements F.dropout drops (on CUDA
    both draw the device Philox stream; on the CPU numpy's), and reproduces under manual_seed."""
    rng = np.random.default_rng(18)
    x, r, g = (_rand(rng, (7, 33), dtype) for _ in range(3))
    b = _rand(rng, 33, dtype)
    tx, tb, tr = (flow.tensor(a, device=device, requires_grad=True) for a in (x, b, r))
    flow.manual_seed(3)
    y = bias_dropout_add(tx, tb, tr, 0.3)
    flow.manual_seed(3)
    ref = F.dropout(tx + tb, 0.3) + tr
    # the separate ops round x + b, the product and the sum to float16; the kernel rounds once
    tol = {np.float32: 1e-6, np.float16: 1e-2, np.float64: 1e-12}[dtype]
    _close(_np(y), _np(ref), tol, "forward")
    assert np.array_equal(_np(y) == _np(tr), _np(ref) == _np(tr))
    gy = flow.tensor(g, device=device)
    grads = flow.autograd.grad([y], [tx, tb, tr], [gy])
    want = flow.autograd.grad([ref], [tx, tb, tr], [gy])
    for a, w in zip(grads, want):
        _close(_np(a), _np(w), tol * 30, "gradient")
    flow.manual_seed(3)
    assert np.array_equal(_np(bias_dropout_add(tx, tb, tr, 0.3)), _np(y))


def test_bias_dropout_add_launches_and_replays_the_mask(cuda_double):
    x = flow.tensor(np.ones((64, 9), np.float32), device="cuda", requires_grad=True)
    b = flow.tensor(np.zeros(9, np.float32), device="cuda")
    y, n = _launches(cuda_double, bias_dropout_add, x, b, None, 0.5)
    assert n == 1
    (gx,), n = _launches(cuda_double, flow.autograd.grad, [y], [x], [flow.ones_like(y)])
    assert n == 1
    assert np.array_equal(_np(gx), _np(y))  # x = 1: y and dy/dx are both the scaled mask
    z = bias_dropout_add(x, b, None, 0.5)
    assert not np.array_equal(_np(z), _np(y))  # the stream moved on


def test_bias_dropout_add_without_dropout_and_its_errors():
    x, b, r = flow.ones(2, 3), flow.full((3,), 2.0), flow.full((2, 3), 3.0)
    assert np.array_equal(_np(bias_dropout_add(x, b, r, 0.5, training=False)), np.full((2, 3), 6.0))
    assert np.array_equal(_np(bias_dropout_add(x, b, r, 0.0)), np.full((2, 3), 6.0))
    with pytest.raises(ValueError, match="residual"):
        bias_dropout_add(x, b, flow.ones(3, 2), 0.5)
    with pytest.raises(ValueError, match="bias"):
        bias_dropout_add(x, flow.ones(2), None, 0.5)
    with pytest.raises(ValueError, match="probability"):
        bias_dropout_add(x, b, r, -0.1)


# ====================================================================== LiBai layers with the fusion flags
def _layer_pair(cls, *args, **kwargs):
    """The same layer with and without the fusion flags, with equal weights."""
    fused = cls(*args, bias_gelu_fusion=True, bias_dropout_fusion=True, **kwargs)
    plain = cls(*args, **kwargs)
    plain.load_state_dict(fused.state_dict())
    return fused, plain


def test_mlp_fusion_flags_take_the_fused_kernels_on_cuda(cuda_layers):
    from libai.layers import MLP

    fused, plain = _layer_pair(MLP, 8, 32, output_dropout_prob=0.2)
    assert fused.bias_gelu_fusion and fused.bias_dropout_fusion
    x = flow.tensor(np.random.default_rng(19).standard_normal((2, 5, 8)).astype(np.float32), device="cuda")
    x = x.to_global(placement=fused.dense_h_to_4h.weight.placement, sbp=flow.sbp.broadcast)
    res = x * 2
    fused.eval(), plain.eval()
    _close(_np(fused(x)), _np(plain(x)), 1e-6, "eval")
    _close(_np(fused(x, residual=res)), _np(res + plain(x)), 1e-6, "eval with residual")
    fused.train()
    y = fused(x, residual=res)
    y.sum().backward()
    kept = _np(y - res) != 0
    assert 0.5 < kept.mean() < 0.95
    assert fused.dense_h_to_4h.bias.grad is not None and fused.dense_4h_to_h.bias.grad is not None


def test_mlp_fused_dropout_drops_what_the_separate_ops_drop(cuda_layers):
    from libai.layers import MLP

    fused, plain = _layer_pair(MLP, 8, 32, output_dropout_prob=0.3)
    x = flow.tensor(np.random.default_rng(21).standard_normal((2, 5, 8)).astype(np.float32), device="cuda")
    x = x.to_global(placement=fused.dense_h_to_4h.weight.placement, sbp=flow.sbp.broadcast)
    flow.manual_seed(5)
    a = _np(fused(x))
    flow.manual_seed(5)
    b = _np(plain(x))
    assert np.array_equal(a == 0, b == 0)
    _close(a, b, 1e-6)


def test_mlp_fusion_flags_change_nothing_on_the_cpu():
    from libai.layers import MLP

    mlp = MLP(8, 32, bias_gelu_fusion=True, bias_dropout_fusion=True)
    assert not mlp.bias_gelu_fusion and not mlp.bias_dropout_fusion
    assert not mlp.dense_h_to_4h.skip_bias_add


def test_transformer_layer_with_fusion_flags_matches_without(cuda_layers):
    from libai.layers import TransformerLayer

    for position in ("pre", "post"):
        fused, plain = _layer_pair(TransformerLayer, 8, 32, 2, layernorm_position=position)
        fused.eval(), plain.eval()
        x = flow.tensor(np.random.default_rng(20).standard_normal((2, 5, 8)).astype(np.float32), device="cuda")
        x = x.to_global(placement=fused.mlp.dense_h_to_4h.weight.placement, sbp=flow.sbp.broadcast)
        _close(_np(fused(x)), _np(plain(x)), 2e-6, position)


# ====================================================================== the CUDA sources compile
@pytest.mark.parametrize("source", [layer_norm.SOURCE, softmax.SOURCE, dropout_add.SOURCE, bias_add.SOURCE,
                                    cast.SOURCE, gelu.RAW_SOURCE, add.SOURCE],
                         ids=["layer_norm", "softmax", "dropout_add", "bias_add", "cast", "gelu", "add"])
def test_raw_kernel_sources_compile_with_nvrtc(source):
    log = nvrtc_compiler()(source)
    assert "warning" not in log.lower(), log


_C_TYPES = {"uint64": "unsigned long long", "uint32": "unsigned int", "float64": "double"}


def _elementwise_as_raw(spec, preamble, c_type):
    """An ElementwiseKernel's operation inside a raw kernel with CuPy's names (T, i, the params),
    so NVRTC checks what CuPy would compile around it."""
    name, ins, out, operation = spec
    params, binds = [], []
    for p in [q.strip() for q in ins.split(",")] + [out]:
        ty, var = p.split()
        ct = c_type if ty == "T" else _C_TYPES[ty]
        params.append(f"{ct}* {var}_")
        binds.append(f"{ct}& {var} = {var}_[i];")
    return (f"#include <cuda_fp16.h>\n{preamble}\ntypedef {c_type} T;\n"
            f'extern "C" __global__ void {name}({", ".join(params)}) {{\n'
            f"  const ptrdiff_t i = blockIdx.x * blockDim.x + threadIdx.x;\n  {' '.join(binds)}\n  {operation}\n}}\n")


def test_elementwise_kernel_operations_compile_with_nvrtc():
    compile_ = nvrtc_compiler()
    specs = [gelu.kernel_spec(a, bwd, bias) for a in gelu.APPROXIMATIONS for bwd in (False, True)
             for bias in (False, True)]
    for spec in specs:
        for c_type in ("__half", "float", "double"):
            compile_(_elementwise_as_raw(spec, gelu.PREAMBLE, c_type))


def test_layer_norm_with_a_bias_of_another_dtype_on_cuda(cuda_double):
    """float64 input and weight with a float32 bias: the forward runs the float32 kernel, and the
    backward must too (found in review: it launched the double kernel on float32 statistics)."""
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((5, 7)), rng.standard_normal(7)
    b = rng.standard_normal(7).astype(np.float32)
    outs = []
    for device in ("cpu", "cuda"):
        xt = flow.tensor(x, device=device, requires_grad=True)
        wt = flow.tensor(w, device=device, requires_grad=True)
        bt = flow.tensor(b, device=device, requires_grad=True)
        y = flow.nn.functional.layer_norm(xt, (7,), wt, bt)
        y.backward(flow.ones_like(y))
        outs.append([t.detach().cpu().numpy() for t in (y, xt.grad, wt.grad, bt.grad)])
    for got, want in zip(outs[1], outs[0]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_softmax_kernels_write_in_place(cuda_double):
    """out= the input: the attention core's scores become probabilities (and the probabilities'
    gradient the scores' gradient) in the same buffer, without a copy."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 3, 5, 9)).astype(np.float32)
    g = rng.standard_normal(x.shape).astype(np.float32)
    mask = rng.random((2, 1, 1, 9)) < 0.3
    want = softmax.forward_reference(x, mask, 0.7, -10000.0, False)
    xd = cuda_double.asarray(x)
    assert softmax.softmax_forward(xd, cuda_double.asarray(mask), 0.7, out=xd) is xd
    np.testing.assert_array_equal(xd.get(), want)
    gd = cuda_double.asarray(g)
    assert softmax.softmax_backward(gd, xd, cuda_double.asarray(mask), 0.7, out=gd) is gd
    np.testing.assert_array_equal(gd.get(), softmax.backward_reference(g, want, mask, 0.7))
    strided = cuda_double.empty((2, 3, 5, 18), np.float32)[..., ::2]  # not writable by the kernel: copied into
    softmax.softmax_forward(cuda_double.asarray(x), None, 0.7, out=strided)
    np.testing.assert_array_equal(strided.get(), softmax.forward_reference(x, None, 0.7))


@pytest.mark.parametrize("half", [True, False])
def test_float16_attention_on_cuda_in_float16_or_float32(cuda_double, monkeypatch, half):
    """With HALF_ATTENTION_ON_GPU the attention core on CUDA computes float16 inputs in float16
    (float32 accumulation in the softmax) and stores float16 probabilities, as PyTorch's autocast
    does; without it (the default), and on the CPU, in float32. All agree to float16 rounding,
    forward and backward."""
    from engine.ops import attention
    from engine.ops.attention import PackedQKVAttention
    monkeypatch.setattr(attention, "HALF_ATTENTION_ON_GPU", half)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 7, 3 * 2 * 8)).astype(np.float16)
    g = rng.standard_normal((2, 7, 2 * 8)).astype(np.float16)
    mask = np.triu(np.ones((7, 7), bool), 1)[None, None]
    outs = []
    for device in ("cpu", "cuda"):
        qkv = flow.tensor(x, device=device, requires_grad=True)
        m = flow.tensor(mask, device=device)
        out, probs, _ = PackedQKVAttention.apply(qkv, m, None, heads=2, scale=0.35, fill=-10000.0, dropout_p=0.0,
                                                 generator=flow.default_generator)
        assert out.dtype == flow.float16
        assert probs.dtype == (flow.float16 if device == "cuda" and half else flow.float32)
        out.backward(flow.tensor(g, device=device))
        outs.append((out.detach().cpu().numpy().astype(np.float64), qkv.grad.cpu().numpy().astype(np.float64)))
    for got, want in zip(outs[1], outs[0]):
        np.testing.assert_allclose(got, want, atol=4e-3, rtol=4e-3)


def test_softmax_mask_broadcast_is_not_copied_out(cuda_double):
    """A mask passed as a broadcast view (the attention core's causal mask under [b, G, heads])
    reaches the kernel as its own small array with stride-0 dims, not written out to the scores'
    size (measured: 100 MB copied twice per GPT-2 124M layer on an H100)."""
    from engine.kernels.softmax import mask_layout
    shape = (8, 1, 12, 64, 64)
    causal = cuda_double.asarray(np.triu(np.ones((64, 64), bool), 1))
    view = cuda_double.broadcast_to(causal.reshape(1, 1, 1, 64, 64), shape)
    mask, *_ = mask_layout(cuda_double, view, shape)
    assert mask.size == 64 * 64
    np.testing.assert_array_equal(cuda_double.asnumpy(cuda_double.broadcast_to(mask, shape)), cuda_double.asnumpy(view))


# ====================================================================== a + b of one shape
@pytest.mark.parametrize("dtypes", [(np.float16, np.float16), (np.float32, np.float32), (np.float64, np.float64),
                                    (np.float32, np.float16), (np.float16, np.float32)],
                         ids=["half", "float", "double", "float+half", "half+float"])
def test_add_op_on_cuda_uses_the_add_kernel(cuda_double, dtypes):
    """flow.add / + on CUDA of operands of one shape (a residual add, a gradient sum): one launch
    of engine/kernels/add.py, no cast before it when float32 meets float16 (a residual add under
    float16 autocast: the float16 operand read as it is, either order), the CPU's promoted values
    bit for bit; each input's gradient in its own dtype, as through the cast. A broadcast keeps
    CuPy's add."""
    rng = np.random.default_rng(3)
    x_h, y_h = [rng.standard_normal((6, 40)).astype(dt) for dt in dtypes]
    out_dtype = np.result_type(*dtypes)
    g_h = rng.standard_normal((6, 40)).astype(out_dtype)
    kernel = add.NAMES[out_dtype, min(np.dtype(dt) for dt in dtypes)]  # (float32, float16) when mixed
    stats = cuda_double._double.stats
    results = {}
    for device in ("cpu", "cuda"):
        x = flow.tensor(x_h, device=device, requires_grad=True)
        y = flow.tensor(y_h, device=device, requires_grad=True)
        stats.reset()
        z = x + y
        if device == "cuda":
            assert {k: n for k, n in stats.by_name.items() if n} == {kernel: 1}
            stats.reset()
            flow.add(x, x[0])  # a broadcast: CuPy's add
            assert stats.by_name["add"] == 1
        assert z.dtype == getattr(flow, out_dtype.name)
        z.backward(flow.tensor(g_h, device=device))
        assert (x.grad.dtype, y.grad.dtype) == (x.dtype, y.dtype)
        results[device] = [t.detach().cpu().numpy() for t in (z, x.grad, y.grad)]
    for got, want in zip(results["cuda"], results["cpu"]):
        np.testing.assert_array_equal(got, want)
