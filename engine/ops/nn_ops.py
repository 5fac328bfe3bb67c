"""Neural-network ops: softmax family, layer_norm, dropout and the losses.

These are the hot ops of a Transformer step (attention softmax, layer norm, the LM cross-entropy),
so each one is a single fused kernel on backend arrays with a single fused gradient op, instead
of a chain of small engine ops:

* kernels work in place on temporaries they own (`x - max` is allocated once, then `exp`,
  normalisation and the mask are applied with `out=`), so a softmax makes one output array;
* row and column sums go through einsum, about twice as fast as `a.sum(axis)` on the CPU;
* float16/bfloat16 inputs are computed in float32 and cast back (as PyTorch accumulates them);
* extra facts that only backward needs (layer_norm's normalised input and rstd, the softmax of a
  cross-entropy, the dropout mask) are hidden outputs of the forward, picked off by the wrapper.

Backward of the forward ops is one fused `...Grad` op. The grad ops of softmax/log_softmax are
themselves differentiable (their backward is written in engine ops); the loss and layer_norm grad
ops raise a clear error on double backward.
"""
import numpy as np

from .op import Op
from ..backend import dtypes, xp_of
from ..backend.random import default_generator
from ..tensor import Tensor, _check_dim, tensor_method
from . import inplace as _inplace
from ._core import broadcast_shapes, cast, promote_operands, shape_str, sum_to_array
from ..backend.parallel import parallel_for, parallel_ufunc
from ._kernels import BLOCK_ELEMENTS, blocked, fill_where, rows_of, select_bits

__all__ = ["softmax", "log_softmax", "scale_mask_softmax", "layer_norm", "dropout",
           "cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss",
           "binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div",
           "normalize", "cosine_similarity"]

_LOW_PRECISION = (np.dtype(np.float16), dtypes.bfloat16.np)


# ------------------------------------------------------------------ array helpers
def _work(a):
    """float16/bfloat16 arrays are computed in float32 (PyTorch accumulates them in float)."""
    return a.astype(np.float32) if a.dtype in _LOW_PRECISION else a


def _row_sum(a, axis):
    """Sum over `axis`, keepdims. The last axis goes through einsum, about twice as fast as
    `a.sum(-1)` on the CPU and, unlike a BLAS `a @ ones`, immune to BLAS thread contention."""
    if axis == a.ndim - 1 and a.size:
        return xp_of(a).einsum("...i->...", a)[..., None]
    return a.sum(axis=axis, keepdims=True, dtype=a.dtype)


def _row_dot(a, b, axis):
    """sum(a * b) over `axis`, keepdims, without materialising a * b on the last axis."""
    xp = xp_of(a)
    if axis == a.ndim - 1 and a.shape == b.shape:
        return xp.einsum("...i,...i->...", a, b)[..., None]
    return (a * b).sum(axis=axis, keepdims=True, dtype=a.dtype)


def _reduce(loss, reduction):
    """Apply a loss reduction to an array of per-element losses (a 0-d array for sum/mean)."""
    if reduction == "none":
        return loss
    xp = xp_of(loss)
    if reduction == "sum":
        return xp.asarray(loss.sum(dtype=loss.dtype))
    if loss.size == 0:
        return xp.asarray(xp.nan, dtype=loss.dtype)
    return xp.asarray(loss.sum(dtype=loss.dtype) / loss.dtype.type(loss.size))


def _check_reduction(reduction, op, extra=()):
    allowed = ("none", "mean", "sum") + tuple(extra)
    if reduction not in allowed:
        raise ValueError(f"{op}: reduction must be one of {', '.join(map(repr, allowed))}, got {reduction!r}")


def _check_float(t, op, what="input"):
    if not t.is_floating_point():
        raise RuntimeError(f"{op}: expected a floating point {what}, got {t.dtype.name} of shape {shape_str(t.shape)}")


class _NoDoubleBackward:
    """Mixin for fused grad ops whose own derivative is not implemented."""

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(f"double backward (create_graph=True) through {ctx.op_name} is not supported")


# ------------------------------------------------------------------ softmax / log_softmax
def _softmax_array(x, axis, log):
    """Numerically stable (log-)softmax: one output array, every step in place on it. On the CPU
    with a last-axis softmax, row blocks run on all threads."""
    xp = xp_of(x)
    out_dtype = x.dtype
    x = _work(x)
    if x.size == 0:
        return xp.empty(x.shape, dtype=out_dtype)
    if xp is np and axis == x.ndim - 1 and x.ndim > 1:
        out = np.empty(x.shape, dtype=x.dtype)
        blocked(lambda sel: _softmax_rows(x[sel], out[sel], -1, log), x.shape)
    else:
        out = xp.empty(x.shape, dtype=x.dtype)
        _softmax_rows(x, out, axis, log)
    return out.astype(out_dtype, copy=False)


def _softmax_rows(x, z, axis, log):
    """z = (log_)softmax(x) along `axis`, written into z."""
    xp = xp_of(x)
    axis %= x.ndim
    xp.subtract(x, x.max(axis=axis, keepdims=True), out=z)
    if log:
        e = xp.exp(z)
        z -= xp.log(_row_sum(e, axis))
    else:
        xp.exp(z, out=z)
        z *= 1 / _row_sum(z, axis)
    return z


def _softmax_grad_rows(g, y, dx, axis, scale, zero_mask):
    xp = xp_of(g)
    axis %= g.ndim
    xp.subtract(g, _row_dot(g, y, axis), out=dx)
    dx *= y
    if scale != 1.0:
        dx *= dx.dtype.type(scale)
    if zero_mask is not None:
        xp.copyto(dx, 0, where=zero_mask)


class SoftmaxGrad(Op):
    """dx = y * (g - sum(g * y)); also the input gradient of scale_mask_softmax (times scale)."""

    name = "SoftmaxGrad"
    save_inputs = (0, 1)

    @staticmethod
    def forward(ctx, g, y, axis, scale=1.0, zero_mask=None):
        ctx.axis, ctx.scale = axis, scale
        xp = xp_of(g)
        dtype = y.dtype
        g, y = _work(g), _work(y)
        dx = xp.empty(g.shape, dtype=g.dtype)
        if xp is np and axis == g.ndim - 1 and g.ndim > 1:
            zm = rows_of(zero_mask, g.shape) if zero_mask is not None else None
            blocked(lambda sel: _softmax_grad_rows(
                g[sel], y[sel], dx[sel], -1, scale, zm[sel] if zm is not None else None), g.shape)
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
        g, y = _work(g), _work(y)
        dx = xp.exp(y)
        dx *= _row_sum(g, axis)
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
    grad_op = SoftmaxGrad


class LogSoftmax(_SoftmaxBase):
    name = "LogSoftmax"
    log = True
    grad_op = LogSoftmaxGrad


def _softmax_dim(ndim):
    """PyTorch's implicit softmax dim (deprecated there, kept for compatibility)."""
    return 0 if ndim in (0, 1, 3) else 1


def _softmax_common(op_cls, input, dim, dtype, name):
    if dtype is not None:
        input = cast(input, dtypes.as_dtype(dtype))
    if not input.is_floating_point():
        raise RuntimeError(f"{name}: expected a floating point input (or pass dtype=), got {input.dtype.name}")
    if dim is None:
        dim = _softmax_dim(input.ndim)
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
class ScaleMaskSoftmax(Op):
    """softmax(where(mask, fill, x * scale), dim=-1) in one pass chain (attention scores)."""

    name = "ScaleMaskSoftmax"
    save_outputs = (0,)

    @staticmethod
    def forward(ctx, x, mask, scale, fill):
        xp = xp_of(x)
        dtype = x.dtype
        x = _work(x)
        ctx.scale = scale
        ctx.zero_mask = None
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
        z = xp.empty(x.shape, dtype=x.dtype)

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
            _softmax_rows(zs, zs, -1, log=False)

        if xp is np:
            blocked(rows, x.shape)
        else:
            rows((Ellipsis,))
        return z.astype(dtype, copy=False)

    @staticmethod
    def backward(ctx, g, *_):
        y, = ctx.saved_tensors
        dx = SoftmaxGrad.apply(g, y, axis=y.ndim - 1, scale=ctx.scale, zero_mask=ctx.zero_mask)
        return dx, None


def scale_mask_softmax(input, mask=None, scale=1.0, fill=-10000.0):
    """Fused attention softmax over the last dim: `softmax(x * scale masked_fill(mask, fill))`.

    `mask` is a bool tensor broadcastable to `input` whose True entries are masked out (as in
    `Tensor.masked_fill`), or a float tensor added to the scaled scores (an additive mask).
    Equivalent to `(input * scale).masked_fill(mask, fill).softmax(-1)`, one kernel forward and
    one backward.
    """
    _check_float(input, "scale_mask_softmax")
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
    return ScaleMaskSoftmax.apply(input, mask, scale=float(scale), fill=float(fill))


# ------------------------------------------------------------------ layer_norm
def _layer_norm_rows(x2, w, b, eps, y, mean, rstd, xhat):
    """One block of rows of layer_norm, every result written into the given arrays."""
    xp = xp_of(x2)
    f = x2.dtype.type
    d = x2.shape[1]
    mean[:, 0] = xp.einsum("ij->i", x2)
    mean *= f(1.0 / d)
    xp.subtract(x2, mean, out=xhat)
    rstd[:, 0] = xp.einsum("ij,ij->i", xhat, xhat)
    rstd *= f(1.0 / d)
    rstd += f(eps)
    xp.sqrt(rstd, out=rstd)
    xp.divide(f(1), rstd, out=rstd)
    xhat *= rstd
    if w is not None:
        xp.multiply(xhat, w, out=y)
        if b is not None:
            y += b
    elif b is not None:
        xp.add(xhat, b, out=y)
    else:
        y[...] = xhat


class LayerNorm(Op):
    """y = (x - mean) * rstd * w + b over the last k dims. Outputs (y, mean, rstd, xhat): the
    last three are hidden; xhat = (x - mean) * rstd is kept so backward need not recompute it."""

    name = "NativeLayerNorm"
    save_outputs = (2, 3)
    save_inputs = (1,)

    @staticmethod
    def forward(ctx, x, w, b, k, eps):
        xp = xp_of(x)
        dtype = x.dtype
        lead, norm = x.shape[:-k] if k else x.shape, x.shape[x.ndim - k:]
        d = int(np.prod(norm)) if norm else 1
        x2 = _work(x).reshape(-1, d)
        ctx.k, ctx.shape, ctx.has_w, ctx.has_b = k, x.shape, w is not None, b is not None
        if x2.size == 0:
            stat = xp.zeros(lead + (1,) * k, dtype=x2.dtype)
            return xp.empty(x.shape, dtype=dtype), stat, stat, xp.empty(x2.shape, x2.dtype)
        m = x2.shape[0]
        y = xp.empty(x2.shape, dtype=x2.dtype)
        xhat = xp.empty(x2.shape, dtype=x2.dtype)
        mean = xp.empty((m, 1), dtype=x2.dtype)
        rstd = xp.empty((m, 1), dtype=x2.dtype)
        w2 = _work(w).reshape(d) if w is not None else None
        b2 = _work(b).reshape(d) if b is not None else None

        def rows(sel):
            _layer_norm_rows(x2[sel], w2, b2, eps, y[sel], mean[sel], rstd[sel], xhat[sel])

        if xp is np:
            blocked(rows, x2.shape)
        else:
            rows((Ellipsis,))
        stat_shape = lead + (1,) * k
        return (y.reshape(x.shape).astype(dtype, copy=False), mean.reshape(stat_shape),
                rstd.reshape(stat_shape), xhat)

    @staticmethod
    def backward(ctx, g, *_):
        w, rstd, xhat = ctx.saved_tensors
        dx, dw, db = LayerNormGrad.apply(g, xhat, rstd, w, k=ctx.k, has_b=ctx.has_b)
        return (dx if ctx.needs_input_grad[0] else None,
                dw if ctx.has_w and ctx.needs_input_grad[1] else None,
                db if ctx.has_b and ctx.needs_input_grad[2] else None)


class LayerNormGrad(_NoDoubleBackward, Op):
    """dx = rstd * (g*w - mean(g*w) - xhat * mean(g*w*xhat)), dw = sum(g*xhat), db = sum(g),
    over float32 in one pass chain (PyTorch's formula)."""

    name = "NativeLayerNormBackward"

    @staticmethod
    def forward(ctx, g, xhat, rstd, w, k, has_b):
        ctx.op_name = "layer_norm"
        xp = xp_of(g)
        m, d = xhat.shape
        dtype = g.dtype
        g2 = _work(g).reshape(m, d)
        if g2.dtype != xhat.dtype:
            g2 = g2.astype(xhat.dtype)
        rstd = rstd.reshape(m, 1)
        wshape = g.shape[g.ndim - k:]
        empty = xp.zeros(0, dtype=dtype)
        if m == 0 or d == 0:
            zero_w = xp.zeros(wshape, dtype=w.dtype) if w is not None else empty
            return xp.zeros(g.shape, dtype), zero_w, zero_w if has_b else empty
        w2 = _work(w).reshape(d) if w is not None else None
        dx = xp.empty((m, d), dtype=xhat.dtype)

        parts = []  # partial (dw, db) per block; list.append is atomic across threads

        def rows(sel):
            parts.append(_layer_norm_grad_rows(g2[sel], xhat[sel], rstd[sel], w2, dx[sel], has_b))

        if xp is np:
            blocked(rows, (m, d))
        else:
            rows((Ellipsis,))
        dw = db = empty
        if w is not None:
            dw = parts[0][0]
            for p in parts[1:]:
                dw += p[0]
            dw = dw.reshape(wshape).astype(w.dtype, copy=False)
        if has_b:
            db = parts[0][1]
            for p in parts[1:]:
                db += p[1]
            db = db.reshape(wshape).astype(dtype, copy=False)
        return dx.reshape(g.shape).astype(dtype, copy=False), dw, db


def _layer_norm_grad_rows(g2, xhat, rstd, w, dx, has_b):
    """dx for a block of rows (written into dx) and that block's partial dw, db."""
    xp = xp_of(g2)
    f = xhat.dtype.type
    d = xhat.shape[1]
    dw = xp.einsum("ij,ij->j", g2, xhat) if w is not None else None
    db = xp.einsum("ij->j", g2) if has_b else None
    if w is not None:
        xp.multiply(g2, w, out=dx)
    else:
        dx[...] = g2
    c1 = xp.einsum("ij->i", dx)[:, None]
    c1 *= f(1.0 / d)
    c2 = xp.einsum("ij,ij->i", dx, xhat)[:, None]
    c2 *= f(1.0 / d)
    # dx = rstd*gw - (rstd*c2)*xhat - rstd*c1
    dx *= rstd
    c2 *= rstd
    c1 *= rstd
    t = xp.multiply(xhat, c2)
    dx -= t
    dx -= c1
    return dw, db


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Layer normalisation over the trailing `normalized_shape` dims (PyTorch's F.layer_norm)."""
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    normalized_shape = tuple(int(s) for s in normalized_shape)
    k = len(normalized_shape)
    _check_float(input, "layer_norm")
    if k == 0 or input.ndim < k or tuple(input.shape[input.ndim - k:]) != normalized_shape:
        raise RuntimeError(
            f"layer_norm: given normalized_shape={list(normalized_shape)}, expected input with shape "
            f"[*, {', '.join(map(str, normalized_shape))}], but got input of size {shape_str(input.shape)}")
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and tuple(p.shape) != normalized_shape:
            raise RuntimeError(f"layer_norm: expected {name} of shape {list(normalized_shape)}, "
                               f"got {shape_str(p.shape)}")
    return LayerNorm.apply(input, weight, bias, k=k, eps=float(eps))[0]


# ------------------------------------------------------------------ dropout
class Dropout(Op):
    """y = x * m with m = (u >= p) / (1 - p); the scaled mask m is a hidden output."""

    name = "Dropout"
    save_outputs = (1,)

    @staticmethod
    def forward(ctx, x, p, generator):
        xp = xp_of(x)
        work = np.float64 if x.dtype == np.float64 else np.float32
        u = generator.rng(xp).random(x.shape, dtype=work)
        keep = u >= work(p)
        mask = xp.multiply(keep, work(1.0 / (1.0 - p)), out=u) if p < 1 else xp.zeros(x.shape, work)
        mask = mask.astype(x.dtype, copy=False)
        return xp.multiply(x, mask), mask

    @staticmethod
    def backward(ctx, g, *_):
        mask, = ctx.saved_tensors
        return g * mask


def dropout(input, p=0.5, training=True, inplace=False, generator=None):
    """Zero each element with probability p and scale survivors by 1/(1-p) (identity when not
    training). The mask comes from `generator` (the default generator unless given)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0.0:
        return input
    _check_float(input, "dropout")
    gen = generator or default_generator
    if inplace:
        _inplace.check_inplace_allowed(input, "dropout_")
        if _inplace.records(input):
            return _inplace.rebind(input, Dropout.apply(input, p=float(p), generator=gen)[0], "dropout_")
        y, _ = Dropout.forward(None, input._data, float(p), gen)
        return _inplace.write(input, y, "dropout_")
    return Dropout.apply(input, p=float(p), generator=gen)[0]


# ------------------------------------------------------------------ class-index targets
def _class_last(x):
    """[N, C, d1, ...] -> ([N*d1*..., C] array, (N, d1, ...)); [C] -> ([1, C], ())."""
    xp = xp_of(x)
    if x.ndim == 1:
        return x.reshape(1, -1), ()
    c = x.shape[1]
    lead = (x.shape[0],) + x.shape[2:]
    moved = xp.moveaxis(x, 1, -1) if x.ndim > 2 else x
    return moved.reshape(-1, c), lead


def _class_back(dx2, shape):
    """Inverse of `_class_last` for a gradient laid out as [M, C]."""
    xp = xp_of(dx2)
    if len(shape) == 1:
        return dx2.reshape(shape)
    if len(shape) == 2:
        return dx2
    lead = (shape[0],) + tuple(shape[2:])
    return xp.moveaxis(dx2.reshape(lead + (shape[1],)), -1, 1)


def _check_targets(op, input, target, c, ignore_index):
    """Index targets: integer dtype, shape = input without the class dim, ids in [0, C)."""
    want = (tuple(input.shape[:1]) + tuple(input.shape[2:])) if input.ndim > 1 else ()
    if target.is_floating_point() or target.dtype is dtypes.bool_:
        raise RuntimeError(
            f"{op}: expected target of class indices (int64) with shape {list(want)}, got a "
            f"{target.dtype.name} target of shape {shape_str(target.shape)} for input of shape "
            f"{shape_str(input.shape)} (class probabilities must have the input's shape)")
    if tuple(target.shape) != want:
        raise ValueError(
            f"{op}: expected target of shape {list(want)} for input of shape {shape_str(input.shape)} "
            f"(class dim 1), got target of shape {shape_str(target.shape)}")
    t = target._data
    if t.size:
        bad = (t != ignore_index) & ((t < 0) | (t >= c))
        if bool(bad.any()):
            value = int(t[bad].reshape(-1)[0])
            raise IndexError(
                f"{op}: target {value} is out of bounds for {c} classes (input shape "
                f"{shape_str(input.shape)}, target shape {shape_str(target.shape)}, "
                f"ignore_index={ignore_index})")


def _check_class_weight(op, weight, c):
    if weight is not None and tuple(weight.shape) != (c,):
        raise RuntimeError(f"{op}: weight tensor should be defined either for all {c} classes or no "
                           f"classes but got weight tensor of shape: {shape_str(weight.shape)}")


def _index_setup(x2, t, w, ignore_index):
    """Per-sample (row index, safe target, sample weight, total weight) for index targets."""
    xp = xp_of(x2)
    m = x2.shape[0]
    t = t.reshape(-1).astype(np.int64, copy=False)
    valid = t != ignore_index
    safe_t = xp.where(valid, t, 0)
    sw = valid.astype(x2.dtype)
    if w is not None:
        sw *= _work(w).astype(x2.dtype, copy=False)[safe_t]
    return xp.arange(m), safe_t, sw, valid


def _blocked_ce_ok(x2):
    return isinstance(x2, np.ndarray) and x2.dtype.kind == "f" and x2.flags.c_contiguous \
        and x2.size >= (1 << 17)


def _cross_entropy_index_blocked(ctx, x2, lead, target, w, ignore_index, reduction, dtype):
    """CrossEntropy.forward for index targets without label smoothing on a large CPU array:
    the same per-row arithmetic as the generic path (max, x - max, exp, row sum, log, scale),
    run on blocks of ~64 Ki elements spread over the engine's threads, so `x - max` never
    leaves the cache and the [M, C] softmax is written once (the generic path makes 3 passes
    over two [M, C] arrays on one thread)."""
    m, c = x2.shape
    rows, safe_t, sw, valid = _index_setup(x2, target, w, ignore_index)
    p = np.empty_like(x2)
    lse = np.empty((m, 1), x2.dtype)
    zt = np.empty(m, x2.dtype)
    step = max(1, BLOCK_ELEMENTS // c)

    def run(b0, b1):
        for s0 in range(b0 * step, min(b1 * step, m), step):
            s1 = min(s0 + step, m)
            xb = x2[s0:s1]
            z = np.subtract(xb, xb.max(axis=1, keepdims=True))
            zt[s0:s1] = z[np.arange(s1 - s0), safe_t[s0:s1]]
            e = np.exp(z, out=p[s0:s1])
            sb = _row_sum(e, 1)
            np.log(sb, out=lse[s0:s1])
            e *= 1 / sb

    parallel_for(run, -(-m // step), work=x2.size)
    per = (lse[:, 0] - zt) * sw
    if reduction == "mean":
        denom = sw.sum(dtype=sw.dtype)
        ctx.denom = denom
        loss = per.sum(dtype=per.dtype) / denom
    else:
        ctx.denom = 1
        loss = _reduce(per.reshape(lead), reduction)
    return np.asarray(loss).astype(dtype, copy=False), p


class CrossEntropy(Op):
    """Fused log_softmax + nll (index targets) or soft-target cross-entropy (probabilities).

    Outputs (loss, p): p = softmax(x) laid out as [M, C] is hidden, for the fused gradient
    g * (p * sum(q) - q), where q is the effective target distribution times class weights.
    """

    name = "CrossEntropyLoss"
    save_inputs = (1, 2)
    save_outputs = (1,)

    @staticmethod
    def forward(ctx, x, target, w, ignore_index, reduction, smoothing, prob):
        xp = xp_of(x)
        dtype = x.dtype
        ctx.shape, ctx.attrs = x.shape, (ignore_index, reduction, smoothing, prob)
        x2, lead = _class_last(_work(x))
        m, c = x2.shape
        if x2.size == 0:
            ctx.denom = 1
            loss = xp.zeros(lead if reduction == "none" else (), x2.dtype)
            if reduction == "mean":
                loss = xp.asarray(xp.nan, dtype=x2.dtype)
            return loss.astype(dtype), x2.copy()
        if not prob and not smoothing and _blocked_ce_ok(x2):
            return _cross_entropy_index_blocked(ctx, x2, lead, target, w, ignore_index, reduction, dtype)
        z = xp.subtract(x2, x2.max(axis=1, keepdims=True))
        e = xp.exp(z)
        s = _row_sum(e, 1)
        lse = xp.log(s)  # log_softmax = z - lse
        e *= 1 / s  # e is now the softmax p
        f = z.dtype.type
        if prob:
            q = _work(target).astype(z.dtype, copy=False)
            q2, _ = _class_last(q)
            if smoothing:
                q2 = q2 * f(1 - smoothing) + f(smoothing / c)
            if w is not None:
                q2 = q2 * _work(w).astype(z.dtype, copy=False)
            # -sum(q * (z - lse)) = sum(q) * lse - sum(q * z)
            per = (_row_sum(xp.ascontiguousarray(q2), 1) * lse)[:, 0] - xp.einsum("ij,ij->i", q2, z)
            per = per.reshape(lead)
            loss = _reduce(per, "sum" if reduction == "mean" else reduction)
            if reduction == "mean":
                loss = loss / f(m)
            ctx.denom = m if reduction == "mean" else 1
            return xp.asarray(loss).astype(dtype, copy=False), e
        rows, safe_t, sw, valid = _index_setup(x2, target, w, ignore_index)
        nll = (lse[:, 0] - z[rows, safe_t]) * sw
        if smoothing:
            # smooth term: -sum_c w_c * logp_c = sum(w) * lse - sum(w * z)
            if w is not None:
                wc = _work(w).astype(z.dtype, copy=False)
                smooth = wc.sum() * lse[:, 0] - xp.einsum("ij,j->i", z, wc)
            else:
                smooth = f(c) * lse[:, 0] - _row_sum(z, 1)[:, 0]
            smooth *= valid
            per = nll * f(1 - smoothing) + smooth * f(smoothing / c)
        else:
            per = nll
        if reduction == "mean":
            denom = sw.sum(dtype=sw.dtype)
            ctx.denom = denom
            loss = per.sum(dtype=per.dtype) / denom
        else:
            ctx.denom = 1
            loss = _reduce(per.reshape(lead), reduction)
        return xp.asarray(loss).astype(dtype, copy=False), e

    @staticmethod
    def backward(ctx, g, *_):
        target, w, p = ctx.saved_tensors
        dx, dt = CrossEntropyGrad.apply(g, p, target, w, shape=ctx.shape, attrs=ctx.attrs, denom=ctx.denom,
                                        need_target=ctx.needs_input_grad[1])
        return dx, (dt if ctx.needs_input_grad[1] else None), None


class CrossEntropyGrad(_NoDoubleBackward, Op):
    name = "CrossEntropyLossBackward"

    @staticmethod
    def forward(ctx, g, p, target, w, shape, attrs, denom, need_target):
        ctx.op_name = "cross_entropy"
        xp = xp_of(p)
        ignore_index, reduction, smoothing, prob = attrs
        m, c = p.shape
        f = p.dtype.type
        g = _work(g).astype(p.dtype, copy=False)
        gs = g.reshape(-1)[:, None] if reduction == "none" else g.reshape(1, 1)
        if reduction == "mean":
            gs = gs / denom  # a 0-d array of the work dtype (sum of weights) or an int
        out_dtype = target.dtype if prob else g.dtype
        empty = xp.zeros(0, out_dtype)
        if m == 0:
            return xp.zeros(shape, dtype=g.dtype), (xp.zeros(target.shape, out_dtype) if prob else empty)
        wc = _work(w).astype(p.dtype, copy=False) if w is not None else None
        if prob:
            q2, _ = _class_last(_work(target).astype(p.dtype, copy=False))
            qe = q2 * f(1 - smoothing) + f(smoothing / c) if smoothing else q2
            if wc is not None:
                qe = qe * wc
            dx = p * _row_sum(xp.ascontiguousarray(qe), 1)
            dx -= qe
            dx *= gs
            dt = empty
            if need_target:
                logp = xp.log(p)  # p = softmax > 0 wherever the loss is finite
                dt = -logp * gs
                if smoothing:
                    dt *= f(1 - smoothing)
                if wc is not None:
                    dt *= wc
                dt = _class_back(dt, shape).astype(target.dtype, copy=False)
            return _class_back(dx, shape).astype(g.dtype, copy=False), dt
        rows, safe_t, sw, valid = _index_setup(p, target, w, ignore_index)
        gsw = gs * sw[:, None]  # per-sample gradient scale
        # nll part: (1-eps) * sw * (p - onehot); smoothing part: eps/C * valid * (sum(w) p - w)
        if not smoothing and isinstance(p, np.ndarray):
            dx = parallel_ufunc(np.multiply, p, gsw)  # [M, C]: split over the engine's threads
        else:
            dx = p * gsw if not smoothing else p * (gsw * f(1 - smoothing))
        dx[rows, safe_t] -= gsw[:, 0] * f(1 - smoothing)
        if smoothing:
            gv = gs * valid[:, None] * f(smoothing / c)
            if wc is not None:
                dx += p * (gv * wc.sum())
                dx -= gv * wc
            else:
                dx += p * (gv * f(c))
                dx -= gv
        return _class_back(dx, shape).astype(g.dtype, copy=False), empty


def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                  reduction="mean", label_smoothing=0.0):
    """Cross-entropy of logits `input` ([N, C] or [N, C, d1, ...], class dim 1, or [C]) against
    class indices (int) or class probabilities (float, input's shape); one fused kernel."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction, "cross_entropy")
    _check_float(input, "cross_entropy")
    if input.ndim == 0:
        raise RuntimeError("cross_entropy: input must have at least 1 dimension (classes), got a 0-d tensor")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be between 0.0 and 1.0, got {label_smoothing}")
    c = input.shape[1] if input.ndim > 1 else input.shape[0]
    _check_class_weight("cross_entropy", weight, c)
    prob = target.is_floating_point() and tuple(target.shape) == tuple(input.shape)
    if prob:
        if target.dtype != input.dtype:
            target = cast(target, input.dtype)
    else:
        _check_targets("cross_entropy", input, target, c, ignore_index)
    return CrossEntropy.apply(input, target, weight, ignore_index=int(ignore_index), reduction=reduction,
                              smoothing=float(label_smoothing), prob=prob)[0]


class NllLoss(Op):
    """loss_i = -w[t_i] * x[i, t_i] (ignored targets contribute 0); 'mean' divides by sum(w[t])."""

    name = "NllLoss"
    save_inputs = (1, 2)

    @staticmethod
    def forward(ctx, x, target, w, ignore_index, reduction):
        xp = xp_of(x)
        dtype = x.dtype
        x2, lead = _class_last(_work(x))
        ctx.shape, ctx.attrs = x.shape, (ignore_index, reduction)
        rows, safe_t, sw, valid = _index_setup(x2, target, w, ignore_index)
        per = -x2[rows, safe_t] * sw
        if reduction == "mean":
            ctx.denom = sw.sum(dtype=sw.dtype)
            loss = per.sum(dtype=per.dtype) / ctx.denom if x2.shape[0] else xp.asarray(xp.nan, per.dtype)
        else:
            ctx.denom = 1
            loss = _reduce(per.reshape(lead), reduction)
        return xp.asarray(loss).astype(dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        target, w = ctx.saved_tensors
        return NllLossGrad.apply(g, target, w, shape=ctx.shape, attrs=ctx.attrs, denom=ctx.denom), None, None


class NllLossGrad(Op):
    """Scatter -g * w[t] / denom into the target positions (linear in g)."""

    name = "NllLossBackward"
    save_inputs = (1, 2)

    @staticmethod
    def forward(ctx, g, target, w, shape, attrs, denom):
        xp = xp_of(g)
        ctx.attrs, ctx.denom, ctx.shape = attrs, denom, shape
        ignore_index, reduction = attrs
        dtype = g.dtype
        g = _work(g)
        m = int(np.prod(shape[:1] + shape[2:])) if len(shape) > 1 else 1
        c = shape[1] if len(shape) > 1 else shape[0]
        dx = xp.zeros((m, c), dtype=g.dtype)
        if m:
            rows, safe_t, sw, _ = _index_setup(dx, target, w, ignore_index)
            gs = g.reshape(-1) if reduction == "none" else g.reshape(1)
            if reduction == "mean":
                gs = gs / denom
            dx[rows, safe_t] = -gs * sw
        return _class_back(dx, shape).astype(dtype, copy=False)

    @staticmethod
    def backward(ctx, gg):
        target, w = ctx.saved_tensors
        return NllLoss.apply(gg, target, w, ignore_index=ctx.attrs[0], reduction=ctx.attrs[1]) \
            if ctx.needs_input_grad[0] else None, None, None


def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean"):
    """Negative log-likelihood of log-probabilities `input` (class dim 1) at integer `target`."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction, "nll_loss")
    _check_float(input, "nll_loss")
    if input.ndim == 0:
        raise RuntimeError("nll_loss: input must have at least 1 dimension (classes), got a 0-d tensor")
    c = input.shape[1] if input.ndim > 1 else input.shape[0]
    _check_class_weight("nll_loss", weight, c)
    _check_targets("nll_loss", input, target, c, ignore_index)
    return NllLoss.apply(input, target, weight, ignore_index=int(ignore_index), reduction=reduction)


def _legacy_reduction(size_average, reduce, reduction):
    """PyTorch's deprecated size_average/reduce flags mapped to `reduction`."""
    if size_average is None and reduce is None:
        return reduction
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    return "none" if not reduce else ("mean" if size_average else "sum")


# ------------------------------------------------------------------ pointwise losses
def _pointwise_loss(kind, x, t, extra):
    """Per-element loss of `kind` on float arrays (broadcast), returned in x's work dtype."""
    xp = xp_of(x)
    f = x.dtype.type
    if kind == "mse":
        d = x - t
        return xp.multiply(d, d, out=d)
    if kind == "l1":
        return xp.abs(x - t)
    if kind == "smooth_l1":
        beta = extra["beta"]
        d = xp.abs(x - t)
        if beta == 0:
            return d
        return xp.where(d < beta, f(0.5 / beta) * d * d, d - f(0.5 * beta))
    if kind == "huber":
        delta = extra["delta"]
        d = xp.abs(x - t)
        return xp.where(d < delta, f(0.5) * d * d, f(delta) * (d - f(0.5 * delta)))
    if kind == "bce":
        logx = xp.maximum(xp.log(x), f(-100))
        log1mx = xp.maximum(xp.log1p(-x), f(-100))
        return -(t * logx + (1 - t) * log1mx)
    if kind == "bce_logits":
        pw = extra.get("pos_weight")
        sp_neg = xp.logaddexp(f(0), -x)  # softplus(-x), stable
        if pw is None:
            return (1 - t) * x + sp_neg
        return (1 - t) * x + (1 + (pw - 1) * t) * sp_neg
    if kind == "kl":
        if extra["log_target"]:
            return xp.exp(t) * (t - x)
        safe = xp.where(t == 0, f(1), t)
        return xp.where(t == 0, f(0), t * xp.log(safe)) - t * x  # xlogy(t, t) - t x
    raise ValueError(kind)


def _pointwise_grads(kind, x, t, extra, need_t):
    """(d loss / d x, d loss / d t) per element, for the losses of `_pointwise_loss`."""
    xp = xp_of(x)
    f = x.dtype.type
    dt = None
    if kind == "mse":
        dx = x - t
        dx *= f(2)
        dt = -dx if need_t else None
    elif kind in ("l1", "smooth_l1", "huber"):
        d = x - t
        if kind == "l1" or (kind == "smooth_l1" and extra["beta"] == 0):
            dx = xp.sign(d)
        elif kind == "smooth_l1":
            beta = extra["beta"]
            dx = xp.where(xp.abs(d) < beta, d / f(beta), xp.sign(d))
        else:
            delta = extra["delta"]
            dx = xp.clip(d, -delta, delta)
        dt = -dx if need_t else None
    elif kind == "bce":
        dx = (x - t) / xp.maximum((1 - x) * x, f(1e-12))
        if need_t:
            dt = xp.maximum(xp.log1p(-x), f(-100)) - xp.maximum(xp.log(x), f(-100))
    elif kind == "bce_logits":
        pw = extra.get("pos_weight")
        sig = 1 / (1 + xp.exp(-x))
        if pw is None:
            dx = sig - t
            dt = -x if need_t else None
        else:
            lw = 1 + (pw - 1) * t
            dx = lw * sig - pw * t
            if need_t:
                dt = -x + (pw - 1) * xp.logaddexp(f(0), -x)
    elif kind == "kl":
        if extra["log_target"]:
            et = xp.exp(t)
            dx = -et
            dt = et * (t - x + 1) if need_t else None
        else:
            dx = -t
            if need_t:
                safe = xp.where(t == 0, f(1), t)
                dt = xp.log(safe) - x + 1
    else:
        raise ValueError(kind)
    return dx, dt


class PointwiseLoss(Op):
    """Fused elementwise loss (mse, l1, smooth_l1, bce, bce_with_logits, kl_div) with an optional
    elementwise weight, broadcasting input/target like PyTorch, and the reduction."""

    name = "PointwiseLoss"
    save_inputs = (0, 1, 2)

    @staticmethod
    def forward(ctx, x, t, w, kind, reduction, extra):
        dtype = x.dtype
        ctx.kind, ctx.reduction, ctx.extra = kind, reduction, extra
        xw, tw = _work(x), _work(t)
        ex = _array_extra(extra, xw.dtype)
        loss = _pointwise_loss(kind, xw, tw, ex)
        if w is not None:
            loss = loss * _work(w)
        if reduction == "batchmean":
            n = x.shape[0] if x.ndim else 1
            red = _reduce(loss, "sum") / loss.dtype.type(n)
        else:
            red = _reduce(loss, reduction)
        ctx.n = {"mean": loss.size, "batchmean": x.shape[0] if x.ndim else 1}.get(reduction, 1)
        return xp_of(x).asarray(red).astype(dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        x, t, w = ctx.saved_tensors
        need_t = ctx.needs_input_grad[1]
        dx, dt = PointwiseLossGrad.apply(g, x, t, w, kind=ctx.kind, reduction=ctx.reduction, extra=ctx.extra,
                                         n=ctx.n, need_t=need_t)
        return (dx if ctx.needs_input_grad[0] else None), (dt if need_t else None), None


class PointwiseLossGrad(_NoDoubleBackward, Op):
    name = "PointwiseLossBackward"

    @staticmethod
    def forward(ctx, g, x, t, w, kind, reduction, extra, n, need_t):
        ctx.op_name = kind
        xp = xp_of(x)
        xw, tw = _work(x), _work(t)
        gw = _work(g).astype(xw.dtype, copy=False)
        if reduction in ("mean", "batchmean") and n:
            gw = gw / gw.dtype.type(n)
        dx, dt = _pointwise_grads(kind, xw, tw, _array_extra(extra, xw.dtype), need_t)
        scale = gw if w is None else gw * _work(w)
        dx = sum_to_array(xp.multiply(dx, scale), x.shape).astype(x.dtype, copy=False)
        if dt is None:
            return dx, xp.zeros(0, x.dtype)
        dt = sum_to_array(xp.multiply(dt, scale), t.shape).astype(t.dtype, copy=False)
        return dx, dt


def _array_extra(extra, dtype):
    """Hyper-parameters as scalars / arrays of the computation dtype."""
    out = dict(extra)
    pw = out.get("pos_weight")
    if pw is not None:
        out["pos_weight"] = _work(pw._data).astype(dtype, copy=False)
    return out


def _loss_operands(op, input, target, same_shape=False):
    _check_float(input, op)
    if not isinstance(target, Tensor):
        raise TypeError(f"{op}: target must be a Tensor, got {type(target).__name__}")
    if same_shape and tuple(target.shape) != tuple(input.shape):
        raise ValueError(f"{op}: target size ({shape_str(target.shape)}) must be the same as input size "
                         f"({shape_str(input.shape)})")
    if not target.is_floating_point():
        target = cast(target, input.dtype)
    input, target = promote_operands(input, target)
    broadcast_shapes(tuple(input.shape), tuple(target.shape))
    return input, target


def _run_pointwise(kind, input, target, weight, reduction, extra, op, same_shape=False, extra_red=()):
    reduction_ = reduction
    _check_reduction(reduction_, op, extra_red)
    input, target = _loss_operands(op, input, target, same_shape)
    if weight is not None:
        if broadcast_shapes(tuple(weight.shape), tuple(input.shape)) != tuple(input.shape):
            raise RuntimeError(f"{op}: weight of shape {shape_str(weight.shape)} does not broadcast to input "
                               f"of shape {shape_str(input.shape)}")
        if weight.dtype != input.dtype:
            weight = cast(weight, input.dtype)
    return PointwiseLoss.apply(input, target, weight, kind=kind, reduction=reduction, extra=extra)


def mse_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    """Mean squared error (input - target)^2, broadcasting like PyTorch."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    return _run_pointwise("mse", input, target, weight, reduction, {}, "mse_loss")


def l1_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    """Mean absolute error |input - target|."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    return _run_pointwise("l1", input, target, None, reduction, {}, "l1_loss")


def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction="mean", beta=1.0):
    """0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if beta < 0:
        raise RuntimeError(f"smooth_l1_loss does not support negative values for beta, got {beta}")
    return _run_pointwise("smooth_l1", input, target, None, reduction, {"beta": float(beta)}, "smooth_l1_loss")


def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    """-(t log x + (1 - t) log(1 - x)) on probabilities x, logs clamped at -100 like PyTorch."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if tuple(target.shape) != tuple(input.shape):
        raise ValueError(f"binary_cross_entropy: using a target size ({shape_str(target.shape)}) that is "
                         f"different to the input size ({shape_str(input.shape)}) is deprecated. Please "
                         "ensure they have the same size.")
    if input.numel():
        vals = input._data if input._global is None else input._host()
        lo, hi = float(vals.min()), float(vals.max())
        if lo < 0 or hi > 1:
            raise RuntimeError(f"binary_cross_entropy: all elements of input should be between 0 and 1, "
                               f"got values in [{lo}, {hi}]")
    return _run_pointwise("bce", input, target, weight, reduction, {}, "binary_cross_entropy")


def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None,
                                     reduction="mean", pos_weight=None):
    """BCE on logits in the stable form (1 - t) x + lw * softplus(-x), lw = 1 + (pos_weight - 1) t."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    extra = {}
    if pos_weight is not None:
        broadcast_shapes(tuple(pos_weight.shape), tuple(input.shape))
        # an attribute of the kernel, which runs on all-broadcast inputs: the logical value
        extra["pos_weight"] = pos_weight.detach() if pos_weight._global is None else \
            Tensor._make(pos_weight._host(), input._device)
    return _run_pointwise("bce_logits", input, target, weight, reduction, extra,
                          "binary_cross_entropy_with_logits", same_shape=True)


def kl_div(input, target, size_average=None, reduce=None, reduction="mean", log_target=False):
    """KL(target || exp(input)) pointwise: t (log t - x) (or exp(t) (t - x) with log_target)."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    return _run_pointwise("kl", input, target, None, reduction, {"log_target": bool(log_target)}, "kl_div",
                          extra_red=("batchmean",))


# ------------------------------------------------------------------ normalize / cosine_similarity
class Normalize(Op):
    """y = x / max(||x||_p, eps) along `axis`."""

    name = "Normalize"
    save_inputs = (0,)

    @staticmethod
    def forward(ctx, x, p, axis, eps):
        xp = xp_of(x)
        ctx.p, ctx.axis, ctx.eps = p, axis, eps
        xw = _work(x)
        norm = _pnorm(xw, p, axis)
        return (xw / xp.maximum(norm, xw.dtype.type(eps))).astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return NormalizeGrad.apply(g, x, p=ctx.p, axis=ctx.axis, eps=ctx.eps)


def _pnorm(x, p, axis):
    xp = xp_of(x)
    a = xp.abs(x)
    if p == 2:
        return xp.sqrt(_row_dot(x, x, axis) if axis == x.ndim - 1 else (x * x).sum(axis=axis, keepdims=True))
    if p == 1:
        return a.sum(axis=axis, keepdims=True)
    if p == float("inf"):
        return a.max(axis=axis, keepdims=True)
    return (a ** p).sum(axis=axis, keepdims=True) ** (1.0 / p)


class NormalizeGrad(_NoDoubleBackward, Op):
    """With n = ||x||_p > eps: dx = g / n - (sum(g x) / n^2) dn/dx, dn/dx = |x|^(p-1) sign(x) / n^(p-1)."""

    name = "NormalizeBackward"

    @staticmethod
    def forward(ctx, g, x, p, axis, eps):
        ctx.op_name = "normalize"
        xp = xp_of(x)
        xw, gw = _work(x), _work(g)
        f = xw.dtype.type
        n = _pnorm(xw, p, axis)
        clamped = n <= f(eps)
        nc = xp.maximum(n, f(eps))
        dx = gw / nc
        if p == float("inf"):
            a = xp.abs(xw)
            dn = (a == n) * xp.sign(xw)
            dn = dn / xp.maximum(dn.astype(bool).sum(axis=axis, keepdims=True), 1)
        else:
            safe_n = xp.where(n > 0, n, f(1))
            dn = xp.sign(xw) * (xp.abs(xw) ** (p - 1)) / safe_n ** (p - 1) if p != 2 else xw / safe_n
        coef = (gw * xw).sum(axis=axis, keepdims=True) / (nc * nc)
        dx = dx - xp.where(clamped, f(0), coef * dn)
        return dx.astype(x.dtype, copy=False)


def normalize(input, p=2.0, dim=1, eps=1e-12, out=None):
    """L_p-normalise `input` along `dim` (F.normalize)."""
    _check_float(input, "normalize")
    axis = _check_dim(dim, max(input.ndim, 1))
    return Normalize.apply(input, p=float(p), axis=axis, eps=float(eps))


class CosineSimilarity(Op):
    """sum(x1 x2) / (max(||x1||, eps) max(||x2||, eps)) along `axis` (inputs pre-broadcast)."""

    name = "CosineSimilarity"
    save_inputs = (0, 1)

    @staticmethod
    def forward(ctx, a, b, axis, eps):
        xp = xp_of(a)
        ctx.axis, ctx.eps = axis, eps
        aw, bw = _work(a), _work(b)
        f = aw.dtype.type
        na = xp.maximum(xp.sqrt((aw * aw).sum(axis=axis)), f(eps))
        nb = xp.maximum(xp.sqrt((bw * bw).sum(axis=axis)), f(eps))
        return ((aw * bw).sum(axis=axis) / (na * nb)).astype(a.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return CosineSimilarityGrad.apply(g, a, b, axis=ctx.axis, eps=ctx.eps)


class CosineSimilarityGrad(_NoDoubleBackward, Op):
    name = "CosineSimilarityBackward"

    @staticmethod
    def forward(ctx, g, a, b, axis, eps):
        ctx.op_name = "cosine_similarity"
        xp = xp_of(a)
        aw, bw, gw = _work(a), _work(b), xp.expand_dims(_work(g), axis)
        f = aw.dtype.type
        ra = xp.sqrt((aw * aw).sum(axis=axis, keepdims=True))
        rb = xp.sqrt((bw * bw).sum(axis=axis, keepdims=True))
        na, nb = xp.maximum(ra, f(eps)), xp.maximum(rb, f(eps))
        dot = (aw * bw).sum(axis=axis, keepdims=True)
        cos = dot / (na * nb)
        # d/da [dot/(na nb)] = b/(na nb) - cos * a / (na * ra) (norm term only when not clamped)
        ka = xp.where(ra > f(eps), cos / (na * xp.where(ra > 0, ra, f(1))), f(0))
        kb = xp.where(rb > f(eps), cos / (nb * xp.where(rb > 0, rb, f(1))), f(0))
        da = gw * (bw / (na * nb) - ka * aw)
        db = gw * (aw / (na * nb) - kb * bw)
        return da.astype(a.dtype, copy=False), db.astype(b.dtype, copy=False)


def cosine_similarity(x1, x2, dim=1, eps=1e-8):
    """Cosine similarity of x1 and x2 (broadcast) along `dim`."""
    from ._core import broadcast_to

    x1, x2 = promote_operands(x1, x2)
    _check_float(x1, "cosine_similarity")
    shape = broadcast_shapes(tuple(x1.shape), tuple(x2.shape))
    x1, x2 = broadcast_to(x1, shape), broadcast_to(x2, shape)
    axis = _check_dim(dim, max(len(shape), 1))
    return CosineSimilarity.apply(x1, x2, axis=axis, eps=float(eps))
