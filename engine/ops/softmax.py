"""softmax, log_softmax and the fused attention softmax (scale, mask, softmax in one kernel).

Hot ops of a Transformer step: each is one fused kernel on backend arrays with one fused
gradient op. Kernels work in place on temporaries they own (`x - max` is allocated once, then
`exp` and the normalisation are applied with `out=`), so a softmax makes one output array; on the
CPU, row blocks run on the engine's threads. The grad ops are themselves differentiable (their
backward is written in engine ops). float16/bfloat16 inputs are computed in float32.
"""
import contextlib

import numpy as np

from ..backend import dtypes, jit, xp_of
from ..backend.fpenv import flush_denormals
from ..backend.parallel import same_view
from ..tensor import _check_dim, tensor_method
from ._core import broadcast_shapes, cast, check_float, shape_str
from ._kernels import BLOCK_ELEMENTS, blocked, empty, fill_where, row_dot, row_max, row_sum, rows_of, select_bits, work_array
from .op import Op
from ..kernels import softmax as softmax_kernels

__all__ = ["softmax", "log_softmax", "scale_mask_softmax"]


# ------------------------------------------------------------------ softmax / log_softmax
def _softmax_array(x, axis, log):
    """Numerically stable (log-)softmax: one output array, every step in place on it. On the CPU
    with a last-axis softmax, row blocks run on all threads."""
    xp = xp_of(x)
    if xp is not np and not log and axis == x.ndim - 1 and x.size:
        return softmax_kernels.softmax_forward(x)  # one fused launch
    out_dtype = x.dtype
    x = work_array(x)
    if x.size == 0:
        return xp.empty(x.shape, dtype=out_dtype)
    if xp is np and axis == x.ndim - 1 and x.ndim > 1:
        out = empty(np, x.shape, x.dtype)
        blocked(lambda sel: _softmax_rows(x[sel], out[sel], -1, log), x.shape, _row_block(x, log))
    else:
        out = xp.empty(x.shape, dtype=x.dtype)
        _softmax_rows(x, out, axis, log)
    return out.astype(out_dtype, copy=False)


_SOFTMAX_JIT, _SOFTMAX_INPLACE_JIT, _SOFTMAX_GRAD_JIT, _SOFTMAX_GRAD_INPLACE_JIT = (
    jit.kernel(f"engine.ops._jit_activations:{name}") for name in (
        "softmax_rows_loop", "softmax_rows_inplace_loop", "softmax_grad_rows_loop", "softmax_grad_rows_inplace_loop"))


# Blocks of rows for the compiled row kernels: each row is one pass in cache whatever the block,
# so blocks are large (each costs ~15 us of Python: the 64 Ki-element blocks of the numpy path
# made [8, 6, 256, 256]'s backward 4.8 ms against 1.4 ms for the kernel alone on one thread)
COMPILED_ROW_BLOCK = 1 << 20


def _row_block(x, log):
    """Elements per block of rows: large where the compiled kernels take the rows (see above)."""
    compiled = not log and softmax_compiled() and x.dtype == np.float32 and x.flags.c_contiguous
    return COMPILED_ROW_BLOCK if compiled else BLOCK_ELEMENTS


def _compiled_rows(*arrays):
    """The [rows, d] views the compiled row kernels take, or None: numpy float32, C-contiguous,
    not empty (a reshape of such arrays is a view, so results land in place)."""
    a = arrays[0]
    if not (isinstance(a, np.ndarray) and a.size and a.ndim >= 1):
        return None
    if all(isinstance(b, np.ndarray) and b.dtype == np.float32 and b.flags.c_contiguous and b.shape == a.shape
           for b in arrays):
        return [b.reshape(-1, a.shape[-1]) for b in arrays]
    return None


def softmax_compiled():
    """Whether float32 softmax rows run as the compiled loop (numba available and on)."""
    return _SOFTMAX_JIT is not None


def _softmax_rows(x, z, axis, log):
    """z = (log_)softmax(x) along `axis`, written into z. float32 rows go through one compiled
    loop where numba is installed (engine/ops/_jit_activations.py: 2.8x faster on ViT's rows of
    65). Otherwise on the CPU with denormals flushed to zero: a masked score (-100, -10000)
    would leave exp() denormals that slow every later product ~100x (engine.backend.fpenv); the
    compiled exp returns 0 below 2^-125 and never makes one."""
    xp = xp_of(x)
    axis %= x.ndim
    rows = _compiled_rows(x, z) if not log and _SOFTMAX_JIT is not None and axis == x.ndim - 1 else None
    if rows is not None:
        if same_view(x, z):
            _SOFTMAX_INPLACE_JIT(rows[1])
        else:
            _SOFTMAX_JIT(*rows)
        return z
    with flush_denormals() if xp is np else contextlib.nullcontext():
        xp.subtract(x, row_max(x) if axis == x.ndim - 1 else x.max(axis=axis, keepdims=True), out=z)
        if log:
            e = xp.exp(z)
            z -= xp.log(row_sum(e, axis))
        else:
            xp.exp(z, out=z)  # numpy's, not MKL's: that one is ~100x slower on every underflow
            z *= 1 / row_sum(z, axis)
    return z


def _softmax_grad_rows(g, y, dx, axis, scale, zero_mask):
    xp = xp_of(g)
    axis %= g.ndim
    rows = _compiled_rows(g, y, dx) if _SOFTMAX_GRAD_JIT is not None and axis == g.ndim - 1 else None
    if rows is not None:
        if same_view(g, dx):
            _SOFTMAX_GRAD_INPLACE_JIT(rows[0], rows[1], np.float32(scale))
        else:
            _SOFTMAX_GRAD_JIT(*rows, np.float32(scale))
    else:
        xp.subtract(g, row_dot(g, y, axis), out=dx)
        dx *= y
        if scale != 1.0:
            dx *= dx.dtype.type(scale)
    if zero_mask is not None:
        xp.copyto(dx, 0, where=zero_mask)


class SoftmaxGrad(Op):
    """dx = y * (g - sum(g * y)); also the input gradient of scale_mask_softmax (times scale), zero
    where the bool `zero_mask` or (last-axis scores [..., q, k]) the `causal` flag masks."""

    name = "SoftmaxGrad"
    save_inputs = (0, 1)

    @staticmethod
    def forward(ctx, g, y, axis, scale=1.0, zero_mask=None, causal=False):
        ctx.axis, ctx.scale = axis, scale
        xp = xp_of(g)
        if xp is not np and axis == g.ndim - 1 and g.size:
            return softmax_kernels.softmax_backward(g, y, zero_mask, scale, causal)  # one fused launch
        if causal:
            zero_mask = _causal_or(xp, zero_mask, g.shape)
        dtype = y.dtype
        g, y = work_array(g), work_array(y)
        dx = empty(xp, g.shape, g.dtype)
        if xp is np and axis == g.ndim - 1 and g.ndim > 1:
            zm = rows_of(zero_mask, g.shape) if zero_mask is not None else None
            blocked(lambda sel: _softmax_grad_rows(
                g[sel], y[sel], dx[sel], -1, scale, zm[sel] if zm is not None else None), g.shape,
                    _row_block(g, False) if zm is None else BLOCK_ELEMENTS)
        else:
            _softmax_grad_rows(g, y, dx, axis, scale, zero_mask)
        return dx.astype(dtype, copy=False)

    @staticmethod
    def backward(ctx, gg):
        # out = s * y * (g - sum(g*y)): d/dg = SoftmaxGrad(gg, y); d/dy = s*(gg*(g - S) - g*sum(gg*y))
        g, y = ctx.saved_tensors
        axis = ctx.axis
        d_g = SoftmaxGrad.apply(gg, y, axis=axis, scale=ctx.scale) if ctx.needs_input_grad[0] else None
        d_y = None
        if ctx.needs_input_grad[1]:
            gg = gg * ctx.scale if ctx.scale != 1.0 else gg
            d_y = gg * (g - (g * y).sum(axis, keepdim=True)) - g * (gg * y).sum(axis, keepdim=True)
        return d_g, d_y


class LogSoftmaxGrad(Op):
    """dx = g - exp(y) * sum(g)."""

    name = "LogSoftmaxGrad"
    save_inputs = (0, 1)

    @staticmethod
    def forward(ctx, g, y, axis):
        ctx.axis = axis
        xp = xp_of(g)
        dtype = y.dtype
        g, y = work_array(g), work_array(y)
        dx = xp.exp(y)
        dx *= row_sum(g, axis)
        xp.subtract(g, dx, out=dx)
        return dx.astype(dtype, copy=False)

    @staticmethod
    def backward(ctx, gg):
        # out = g - p*S(g), p = exp(y): d/dg = gg - S(gg*p); d/dy = -gg * p * S(g)
        g, y = ctx.saved_tensors
        axis = ctx.axis
        p = y.exp()
        d_g = gg - (gg * p).sum(axis, keepdim=True) if ctx.needs_input_grad[0] else None
        d_y = -(gg * p) * g.sum(axis, keepdim=True) if ctx.needs_input_grad[1] else None
        return d_g, d_y


class _SoftmaxBase(Op):
    """softmax (log=False) or log_softmax (log=True) along `axis`; the backward is `grad_op` on
    the saved output."""

    save_outputs = (0,)
    log = False
    grad_op = None

    @classmethod
    def forward(cls, ctx, x, axis):
        ctx.axis = axis
        return _softmax_array(x, axis, log=cls.log)

    @classmethod
    def backward(cls, ctx, g):
        y, = ctx.saved_tensors
        return cls.grad_op.apply(g, y, axis=ctx.axis)


class Softmax(_SoftmaxBase):
    name = "Softmax"
    autocast = "fp32_cuda"
    grad_op = SoftmaxGrad


class LogSoftmax(_SoftmaxBase):
    name = "LogSoftmax"
    autocast = "fp32_cuda"
    log = True
    grad_op = LogSoftmaxGrad


def implicit_softmax_dim(ndim):
    """PyTorch's implicit softmax dim (deprecated there, kept for compatibility)."""
    return 0 if ndim in (0, 1, 3) else 1


def _softmax_common(op_cls, input, dim, dtype, name):
    if dtype is not None:
        input = cast(input, dtypes.as_dtype(dtype))
    if not input.is_floating_point():
        raise RuntimeError(f"{name}: expected a floating point input (or pass dtype=), got {input.dtype.name}")
    if dim is None:
        dim = implicit_softmax_dim(input.ndim)
    axis = _check_dim(dim, max(input.ndim, 1))
    if input.ndim == 0:
        return _scalar_softmax(op_cls, input)
    return op_cls.apply(input, axis=axis)


def _scalar_softmax(op_cls, input):
    """softmax of a 0-d tensor is 1 (log_softmax 0); computed on a 1-element view to keep grads."""
    from ._core import reshape

    return reshape(op_cls.apply(reshape(input, 1), axis=0), ())


@tensor_method()
def softmax(input, dim=None, _stacklevel=3, dtype=None):
    """softmax(x, dim) = exp(x - max) / sum(exp(x - max)) along `dim`."""
    return _softmax_common(Softmax, input, dim, dtype, "softmax")


@tensor_method()
def log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    """log_softmax(x, dim) = x - max - log(sum(exp(x - max))) along `dim`."""
    return _softmax_common(LogSoftmax, input, dim, dtype, "log_softmax")


# ------------------------------------------------------------------ fused attention softmax
def _causal_or(xp, mask, shape):
    """The bool mask `mask` (or None) combined with the causal mask of scores `shape` [..., q, k]."""
    causal = softmax_kernels.causal_mask(*shape[-2:])
    if xp is not np:
        causal = xp.asarray(causal)
    return causal if mask is None else xp.logical_or(mask, causal)


class ScaleMaskSoftmax(Op):
    """softmax(where(mask, fill, x * scale), dim=-1) in one pass chain (attention scores); with
    `causal`, scores [..., q, k] are also masked where key j > i + (k - q) for query i.

    CUDA: one kernel (engine/kernels/softmax.py) that reads a broadcast mask in place and derives
    the causal mask from the row index; its gradient is zero at every masked score."""

    name = "ScaleMaskSoftmax"
    autocast = "fp32_cuda"
    save_outputs = (0,)

    @staticmethod
    def forward(ctx, x, mask, scale, fill, causal=False):
        xp = xp_of(x)
        ctx.scale, ctx.causal = scale, causal
        ctx.zero_mask = None
        if xp is not np and x.size:
            if mask is not None and mask.dtype == np.bool_:
                ctx.zero_mask = mask
            return softmax_kernels.softmax_forward(x, mask, scale, fill, causal)
        causal_fill = None
        if causal and (mask is None or mask.dtype == np.bool_):
            mask = _causal_or(xp, mask, x.shape)
        elif causal:  # an additive mask, then the causal fill
            causal_fill = rows_of(softmax_kernels.causal_mask(*x.shape[-2:]), x.shape)
        dtype = x.dtype
        x = work_array(x)
        if x.size == 0:
            return xp.empty(x.shape, dtype=dtype)
        bits = None
        if mask is not None and mask.dtype == np.bool_:
            # a fully masked row with a finite fill is uniform; its masked entries get no
            # gradient (they are constants in x.masked_fill(mask, fill))
            if np.isfinite(fill) and bool(mask.all(axis=-1).any()):
                ctx.zero_mask = mask
            if xp is np:
                bits = select_bits(mask, fill, x.dtype)
        z = empty(xp, x.shape, x.dtype)

        if bits is not None:
            keep, fill_bits = rows_of(bits[0], x.shape), rows_of(bits[1], x.shape)

        def rows(sel):
            zs = z[sel]
            xp.multiply(x[sel], x.dtype.type(scale), out=zs)
            if bits is not None:
                fill_where(zs, zs, keep[sel], fill_bits[sel])
            elif mask is not None and mask.dtype == np.bool_:
                xp.copyto(zs, x.dtype.type(fill), where=rows_of(mask, x.shape)[sel])
            elif mask is not None:  # an additive float mask
                zs += rows_of(mask, x.shape)[sel].astype(z.dtype, copy=False)
            if causal_fill is not None:
                xp.copyto(zs, x.dtype.type(fill), where=causal_fill[sel])
            _softmax_rows(zs, zs, -1, log=False)

        if xp is np:
            blocked(rows, x.shape)
        else:
            rows((Ellipsis,))
        return z.astype(dtype, copy=False)

    @staticmethod
    def backward(ctx, g, *_):
        y, = ctx.saved_tensors
        dx = SoftmaxGrad.apply(g, y, axis=y.ndim - 1, scale=ctx.scale, zero_mask=ctx.zero_mask, causal=ctx.causal)
        return dx, None


def scale_mask_softmax(input, mask=None, scale=1.0, fill=-10000.0, causal=False):
    """Fused attention softmax over the last dim: `softmax(x * scale masked_fill(mask, fill))`.

    `mask` is a bool tensor broadcastable to `input` whose True entries are masked out (as in
    `Tensor.masked_fill`), or a float tensor added to the scaled scores (an additive mask).
    `causal=True` masks scores [..., q, k] where key j > i + (k - q) for query i (the last q of
    k positions; with a KV cache the first k - q keys are the past), like a bool mask, without a
    mask tensor. Equivalent to `(input * scale).masked_fill(mask, fill).softmax(-1)`, one kernel
    forward and one backward.
    """
    check_float(input, "scale_mask_softmax")
    if causal and input.ndim < 2:
        raise ValueError(f"scale_mask_softmax: causal=True needs scores [..., q, k], got a {input.ndim}-d input")
    if mask is not None:
        try:
            ok = broadcast_shapes(tuple(mask.shape), tuple(input.shape)) == tuple(input.shape)
        except RuntimeError:
            ok = False
        if not ok:
            raise RuntimeError(f"scale_mask_softmax: mask of shape {shape_str(mask.shape)} does not broadcast "
                               f"to input of shape {shape_str(input.shape)}")
        if mask.dtype is not dtypes.bool_ and not mask.is_floating_point():
            raise RuntimeError(f"scale_mask_softmax: mask must be bool or floating, got {mask.dtype.name}")
    if input.ndim == 0:
        raise RuntimeError("scale_mask_softmax: expected an input with at least 1 dimension, got a 0-d tensor")
    return ScaleMaskSoftmax.apply(input, mask, scale=float(scale), fill=float(fill), causal=bool(causal))
