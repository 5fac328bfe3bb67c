"""Normalisation: layer_norm (one fused kernel forward, one fused grad op), batch_norm,
instance_norm, group_norm and rms_norm (one shared pair of fused ops over a reshaped view),
normalize (L_p) and cosine_similarity.

layer_norm's row kernels are compiled (engine.backend.jit) where numba is installed: one loop
per row instead of seven numpy passes per block of rows (Swin's [16384, 96] activations: forward
+ backward 5.7 -> 2.2 ms, PyTorch 1.7 ms). The numpy kernels stay the reference and the path for
what the compiled ones do not take (other dtypes, strided rows, CuPy).

Values only the backward needs (layer_norm's normalised input and rstd) are hidden outputs of
the forward, so they are Tensors with a meaning on every rank when tensors are global. The
fused grad ops raise a clear error on double backward.
"""
import functools
import math

import numpy as np

from ..autograd.grad_mode import _state as _grad_state
from ..backend import dtypes, jit, xp_of
from ..tensor import _check_dim
from ._core import (NoDoubleBackward, as_shape, broadcast_shapes, cast, check_float, promote_operands, reshape,
                    shape_str, sum_to, sum_to_array)
from ._kernels import BLOCK_ELEMENTS as NUMPY_BLOCK_ELEMENTS, blocked, empty as _empty, row_dot, work_array
from .op import Op
from ..kernels import layer_norm as layer_norm_kernels
from ..kernels._cuda import acc_dtype

__all__ = ["layer_norm", "layer_norm_into_autocast", "batch_norm", "instance_norm", "group_norm", "rms_norm", "normalize",
           "cosine_similarity"]


# ------------------------------------------------------------------ layer_norm
def _layer_norm_rows_loop(x2, w, b, eps, inv, one, y, mean, rstd):
    """The compiled forward of a block of rows: two passes over each row (in cache) instead of
    numpy's seven over the block, one write (y). `inv` (1 / row length) and `one` come in the
    arrays' dtype, so that float32 rows are computed in float32 (an integer or Python float
    would promote the arithmetic to float64: half the vector width and a conversion per
    element)."""
    m, d = x2.shape
    for i in range(m):
        row = x2[i]
        s = inv - inv
        for j in range(d):
            s += row[j]
        mu = s * inv
        v = inv - inv
        for j in range(d):
            t = row[j] - mu
            v += t * t
        r = one / np.sqrt(v * inv + eps)
        mean[i, 0] = mu
        rstd[i, 0] = r
        y_row = y[i]
        for j in range(d):
            y_row[j] = (row[j] - mu) * r * w[j] + b[j]


def _layer_norm_grad_rows_loop(g2, x2, mean, rstd, w, inv, dx, dw, db):
    """The compiled backward of a block of rows: the normalised rows recomputed from x, mean and
    rstd (as the forward computed them), dx written, the block's dw and db summed in (dtypes as
    in the forward)."""
    m, d = x2.shape
    for i in range(m):
        g_row, x_row, dx_row = g2[i], x2[i], dx[i]
        mu, r = mean[i, 0], rstd[i, 0]
        c1 = inv - inv
        c2 = inv - inv
        for j in range(d):
            h = (x_row[j] - mu) * r
            gw = g_row[j] * w[j]
            c1 += gw
            c2 += gw * h
            dw[j] += g_row[j] * h
            db[j] += g_row[j]
        c1 *= inv
        c2 *= inv
        for j in range(d):
            dx_row[j] = r * (g_row[j] * w[j] - c1 - (x_row[j] - mu) * r * c2)


_layer_norm_rows_jit = jit.kernel(_layer_norm_rows_loop)
_layer_norm_grad_rows_jit = jit.kernel(_layer_norm_grad_rows_loop)
# the compiled kernels keep a row in cache by themselves: larger blocks, fewer calls (each call
# costs ~20 us of argument checking)
BLOCK_ELEMENTS = 1 << 18
# ...and they run at memory speed, so a second thread pays once the rows outgrow a core's cache
# by enough to cover the hand-off (~50-100 us with the GIL, engine.backend.parallel). Forward +
# backward through nn.LayerNorm(384), one thread vs two, same process, alternating (2-core VM,
# 2026-11-28): 393k elements 853 vs 849 us, 786k 2,112 vs 1,739, 1.5M 3,460 vs 2,938. (An earlier
# VM had one thread ahead at 786k, 0.88 vs 0.99 ms: the crossing point moves with the machine.)
# Below this size the rows are one block, one kernel call.
MIN_PARALLEL = 1 << 19


def _block_elements(size, compiled):
    """Elements per row block: from the array's size and kernel only (never the thread count),
    so that dw and db, summed block by block in order, keep their bits."""
    if not compiled:
        return NUMPY_BLOCK_ELEMENTS  # the numpy kernels' temporaries stay in L2
    return BLOCK_ELEMENTS if size >= MIN_PARALLEL else max(size, 1)


def _jit_ok(*arrays):
    """Whether the compiled kernels take these arrays: numpy float32/float64, one dtype, rows
    contiguous."""
    dt = arrays[0].dtype
    return all(isinstance(a, np.ndarray) and a.dtype == dt and a.strides[-1] == a.itemsize for a in arrays) \
        and dt in (np.float32, np.float64)


def _layer_norm_rows(x2, w, b, eps, y, mean, rstd):
    """One block of rows of layer_norm, every result written into the given arrays."""
    xp = xp_of(x2)
    if _layer_norm_rows_jit is not None and _jit_ok(x2, y):
        d, dt = x2.shape[1], x2.dtype
        _layer_norm_rows_jit(x2, w if w is not None else np.ones(d, dt), b if b is not None else np.zeros(d, dt),
                             dt.type(eps), dt.type(1.0 / d), dt.type(1), y, mean, rstd)
        return
    f = x2.dtype.type
    d = x2.shape[1]
    mean[:, 0] = xp.einsum("ij->i", x2)
    mean *= f(1.0 / d)
    xhat = xp.subtract(x2, mean)  # the block's normalised rows (a temporary)
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
    """y = (x - mean) * rstd * w + b over the last k dims. Outputs (y, mean, rstd), the last two
    hidden; the backward recomputes (x - mean) * rstd from x (as PyTorch does) rather than the
    forward writing it out: one array less written and kept (layer_norm forward on [2080, 384]:
    see docs/engine.md)."""

    name = "NativeLayerNorm"
    autocast = "fp32_cuda"
    save_outputs = (1, 2)
    save_inputs = (0, 1)

    @staticmethod
    def forward(ctx, x, w, b, k, eps, half_y=False):
        xp = xp_of(x)
        dtype = x.dtype
        lead, norm = x.shape[:-k] if k else x.shape, x.shape[x.ndim - k:]
        d = math.prod(norm) if norm else 1
        ctx.k, ctx.shape, ctx.has_w, ctx.has_b, ctx.eps = k, x.shape, w is not None, b is not None, eps
        if xp is not np and x.size:  # half_y (layer_norm_into_autocast): float32 rows, y in float16
            return _layer_norm_cuda(x, w, b, lead + (1,) * k, d, eps, np.float16 if half_y else None)
        x2 = work_array(x).reshape(-1, d)
        if x2.size == 0:
            stat = xp.zeros(lead + (1,) * k, dtype=x2.dtype)
            return xp.empty(x.shape, dtype=dtype), stat, stat
        m = x2.shape[0]
        y = _empty(xp, x2.shape, x2.dtype)
        mean = xp.empty((m, 1), dtype=x2.dtype)
        rstd = xp.empty((m, 1), dtype=x2.dtype)
        w2 = work_array(w).reshape(d) if w is not None else None
        b2 = work_array(b).reshape(d) if b is not None else None

        def rows(sel):
            _layer_norm_rows(x2[sel], w2, b2, eps, y[sel], mean[sel], rstd[sel])

        if xp is np:
            blocked(rows, x2.shape, _block_elements(x2.size, _layer_norm_rows_jit is not None and _jit_ok(x2)))
        else:
            rows((Ellipsis,))
        stat_shape = lead + (1,) * k
        return y.reshape(x.shape).astype(dtype, copy=False), mean.reshape(stat_shape), rstd.reshape(stat_shape)

    @staticmethod
    def backward(ctx, g, *_):
        x, w, mean, rstd = ctx.saved_tensors
        if _grad_state.enabled:  # create_graph: the gradients must be differentiable themselves
            norm = tuple(x.shape[x.ndim - ctx.k:])
            g = cast(g, x.dtype)  # layer_norm_into_autocast's float16 y: as after its cast's backward
            dx, dw, db = _norm_backward_composite(g, x, w, tuple(range(x.ndim - ctx.k, x.ndim)), ctx.eps,
                                                  w_shape=norm if ctx.has_w else None,
                                                  b_shape=norm if ctx.has_b else None)
        else:
            dx, dw, db = LayerNormGrad.apply(g, x, mean, rstd, w, k=ctx.k, has_b=ctx.has_b)
        return (dx if ctx.needs_input_grad[0] else None,
                dw if ctx.has_w and ctx.needs_input_grad[1] else None,
                db if ctx.has_b and ctx.needs_input_grad[2] else None)


def _norm_backward_composite(g, x, w, dims, eps, center=True, w_shape=None, b_shape=None):
    """The fused grad ops' formula (LayerNormGrad, AxesNormGrad) in engine ops, with the mean and
    rstd recomputed from x so that they are differentiated too: the backward of a
    `create_graph=True` backward (a gradient penalty through a normalisation layer, MAML). The
    fused grad ops serve every plain backward. Returns (dx, dw, db), the last two summed to
    `w_shape` / `b_shape` (None: not wanted)."""
    xc = x - x.mean(dim=dims, keepdim=True) if center else x
    rstd = ((xc * xc).mean(dim=dims, keepdim=True) + eps).rsqrt()
    xhat = xc * rstd
    gw = g * w if w is not None else g
    inner = gw - gw.mean(dim=dims, keepdim=True) if center else gw
    dx = rstd * (inner - xhat * (gw * xhat).mean(dim=dims, keepdim=True))
    dw = None if w_shape is None else sum_to(g * xhat, w_shape)
    db = None if b_shape is None else sum_to(g, b_shape)
    return dx, dw, db


class LayerNormGrad(NoDoubleBackward, Op):
    """dx = rstd * (g*w - mean(g*w) - xhat * mean(g*w*xhat)), dw = sum(g*xhat), db = sum(g),
    with xhat = (x - mean) * rstd recomputed, over float32 in one pass chain (PyTorch's
    formula)."""

    name = "NativeLayerNormBackward"

    @staticmethod
    def forward(ctx, g, x, mean, rstd, w, k, has_b):
        ctx.op_name = "layer_norm"
        xp = xp_of(g)
        d = math.prod(x.shape[x.ndim - k:]) if k else 1
        if xp is not np and g.size:
            return _layer_norm_grad_cuda(g, x, mean, rstd, w, k, has_b)
        x2 = work_array(x).reshape(-1, d)
        m = x2.shape[0]
        dtype = _grad_dtype(g, x)
        g2 = work_array(g).reshape(m, d)
        if g2.dtype != x2.dtype:
            g2 = g2.astype(x2.dtype)
        mean, rstd = mean.reshape(m, 1), rstd.reshape(m, 1)
        wshape = g.shape[g.ndim - k:]
        empty = xp.zeros(0, dtype=dtype)
        if m == 0 or d == 0:
            zero_w = xp.zeros(wshape, dtype=w.dtype) if w is not None else empty
            return xp.zeros(g.shape, dtype), zero_w, zero_w if has_b else empty
        w2 = work_array(w).reshape(d) if w is not None else None
        dx = _empty(xp, (m, d), x2.dtype)

        def rows(sel):
            return _layer_norm_grad_rows(g2[sel], x2[sel], mean[sel], rstd[sel], w2, dx[sel], has_b)

        # partial (dw, db) per row block, in block order: summed in that order, whatever thread
        # finished first, so dw and db have the same bits on every run and for any thread count
        compiled = _layer_norm_grad_rows_jit is not None and _jit_ok(g2, x2)
        parts = blocked(rows, (m, d), _block_elements(m * d, compiled)) if xp is np else [rows((Ellipsis,))]
        dw = db = empty
        if w is not None:
            dw = as_shape(_sum_in_order([p[0] for p in parts]).astype(w.dtype, copy=False), wshape)
        if has_b:
            db = as_shape(_sum_in_order([p[1] for p in parts]).astype(dtype, copy=False), wshape)
        return dx.reshape(g.shape).astype(dtype, copy=False), dw, db


def _grad_dtype(g, x):
    """The dtype of dx and db: g's, but the rows' for a float16 g beside float32 rows
    (layer_norm_into_autocast's float16 y, as after its cast's backward; torch gives float32)."""
    return x.dtype if g.dtype == np.float16 and x.dtype == np.float32 else g.dtype


def _kernel_dtype(x, *params):
    """The element type the fused CUDA kernels run in: x's, or float32 when a weight's dtype
    differs (a float16 input with float32 weights)."""
    return x.dtype if all(p is None or p.dtype == x.dtype for p in params) else np.dtype(np.float32)


def _layer_norm_cuda(x, w, b, stat_shape, d, eps, y_dtype=None):
    """LayerNorm.forward on CuPy arrays: the fused kernel (engine/kernels/layer_norm.py, one launch);
    y in x's dtype, or `y_dtype` (float16 beside float32 rows, written by the kernel)."""
    dt = _kernel_dtype(x, w, b)
    w2, b2 = (None if p is None else p.reshape(d).astype(dt, copy=False) for p in (w, b))
    y, mean, rstd = layer_norm_kernels.layer_norm_forward(x.reshape(-1, d).astype(dt, copy=False), w2, b2, eps,
                                                          y_dtype)
    return (y.reshape(x.shape).astype(y_dtype or x.dtype, copy=False), mean.reshape(stat_shape),
            rstd.reshape(stat_shape))


def _layer_norm_grad_cuda(g, x, mean, rstd, w, k, has_b):
    """LayerNormGrad.forward on CuPy arrays: the fused kernels (two launches); dx and db in g's
    dtype, dw in w's (as the CPU path)."""
    wshape = x.shape[x.ndim - k:]
    d = math.prod(wshape)
    m = x.size // d
    dt = _kernel_dtype(x, w)
    if acc_dtype(dt) != mean.dtype:  # the forward ran in float32 (a bias of another dtype): so does this
        dt = np.dtype(mean.dtype)
    # layer_norm_into_autocast's float16 y beside float32 rows: its gradient is read as it is
    half_g = g.dtype == np.float16 and x.dtype == dt == np.float32
    out = _grad_dtype(g, x)
    dx, dw, db = layer_norm_kernels.layer_norm_backward(
        g.reshape(m, d) if half_g else g.reshape(m, d).astype(dt, copy=False), x.reshape(m, d).astype(dt, copy=False),
        mean.reshape(m), rstd.reshape(m), None if w is None else w.reshape(d).astype(dt, copy=False), has_b)
    empty = xp_of(g).zeros(0, dtype=out)
    # as_shape, not reshape: a view of the same shape would not own its memory, and the leaf
    # would copy it (a launch per LayerNorm weight and bias)
    return (dx.reshape(g.shape).astype(out, copy=False),
            empty if dw is None else as_shape(dw.astype(w.dtype, copy=False), wshape),
            empty if db is None else as_shape(db.astype(out, copy=False), wshape))


def _sum_in_order(arrays):
    """arrays[0] + arrays[1] + ... left to right, into arrays[0]."""
    total = arrays[0]
    for a in arrays[1:]:
        total += a
    return total


def _layer_norm_grad_rows(g2, x2, mean, rstd, w, dx, has_b):
    """dx for a block of rows (written into dx) and that block's partial dw, db."""
    xp = xp_of(g2)
    f = x2.dtype.type
    d = x2.shape[1]
    if _layer_norm_grad_rows_jit is not None and _jit_ok(g2, x2, dx):
        dw, db = np.zeros(d, x2.dtype), np.zeros(d, x2.dtype)
        _layer_norm_grad_rows_jit(g2, x2, mean, rstd, w if w is not None else np.ones(d, x2.dtype), f(1.0 / d),
                                  dx, dw, db)
        return (dw if w is not None else None), (db if has_b else None)
    xhat = xp.subtract(x2, mean)  # the forward's normalised rows, recomputed
    xhat *= rstd
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


def _layer_norm_args(input, normalized_shape, weight, bias, name="layer_norm"):
    """normalized_shape as a tuple, checked against the input, weight and bias (PyTorch's errors)."""
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    normalized_shape = tuple(int(s) for s in normalized_shape)
    k = len(normalized_shape)
    check_float(input, name)
    if k == 0 or input.ndim < k or tuple(input.shape[input.ndim - k:]) != normalized_shape:
        raise RuntimeError(
            f"{name}: given normalized_shape={list(normalized_shape)}, expected input with shape "
            f"[*, {', '.join(map(str, normalized_shape))}], but got input of size {shape_str(input.shape)}")
    for what, p in (("weight", weight), ("bias", bias)):
        if p is not None and tuple(p.shape) != normalized_shape:
            raise RuntimeError(f"{name}: expected {what} of shape {list(normalized_shape)}, "
                               f"got {shape_str(p.shape)}")
    return normalized_shape


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Layer normalisation over the trailing `normalized_shape` dims (PyTorch's F.layer_norm)."""
    k = len(_layer_norm_args(input, normalized_shape, weight, bias))
    return LayerNorm.apply(input, weight, bias, k=k, eps=float(eps))[0]


def layer_norm_into_autocast(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """layer_norm for an output that only matrix products read (a pre-LN Transformer's branch
    input): under an active autocast on the input's device, a float32 result comes in the
    autocast dtype, as the product's own cast would make it; otherwise it is layer_norm's. Same
    values and gradients as layer_norm followed by that cast. On CUDA, for float32 rows and
    weights under a float16 autocast, the cast is folded into layer_norm's kernels: y is written
    in float16 and the backward reads the float16 gradient as it is (per call, two cast launches
    and a float32 copy of the rows fewer)."""
    normalized_shape = _layer_norm_args(input, normalized_shape, weight, bias, "layer_norm_into_autocast")
    mode = _grad_state.autocast
    if mode is None or mode[0] != input.device.type or input.dtype != dtypes.float32:
        return layer_norm(input, normalized_shape, weight, bias, eps)
    low = mode[1]
    fused = (low == dtypes.float16 and input.device.type == "cuda" and input.numel() > 0
             and all(p is None or p.dtype == dtypes.float32 for p in (weight, bias)))
    if not fused:
        return cast(layer_norm(input, normalized_shape, weight, bias, eps), low)
    return LayerNorm.apply(input, weight, bias, k=len(normalized_shape), eps=float(eps), half_y=True)[0]


# ------------------------------------------------------------------ batch / instance / group / rms norm
# The four are one computation on a view of the input: batch_norm normalises (N, C, S) over axes
# (0, 2), instance_norm over axis 2, group_norm (N, G, C/G, S) over axes (2, 3), rms_norm (M, D)
# over axis 1 without subtracting the mean. The affine weight and bias come reshaped to broadcast
# against that view, so one fused op (and one fused grad op) serves them all.
class AxesNorm(Op):
    """y = (x - mean) * rstd * w + b with the mean and the biased variance over `axes` of x and
    rstd = 1 / sqrt(var + eps); w and b (None allowed) broadcast against x. With center=False
    (rms_norm) the mean is not subtracted and var is the mean square. Outputs (y, mean, var), the
    last two hidden (float32 for half inputs): batch_norm updates its running statistics from
    them, and the backward recomputes rstd and the normalised input from x, mean and var."""

    name = "AxesNorm"
    save_inputs = (0, 1)
    save_outputs = (1, 2)

    @staticmethod
    def forward(ctx, x, w, b, axes, eps, center, op):
        xp = xp_of(x)
        ctx.attrs = dict(axes=axes, eps=eps, center=center, op=op)
        ctx.b_meta = None if b is None else (b.shape, b.dtype)
        xw = work_array(x)
        f = xw.dtype.type
        stat_shape = tuple(1 if i in axes else n for i, n in enumerate(x.shape))
        if x.size == 0:
            return xp.empty(x.shape, x.dtype), xp.zeros(stat_shape, xw.dtype), xp.zeros(stat_shape, xw.dtype)
        if center:
            mean = xw.mean(axis=axes, keepdims=True)
            xc = xw - mean
        else:
            mean = xp.zeros(stat_shape, xw.dtype)
            xc = xw
        var = (xc * xc).mean(axis=axes, keepdims=True)
        scale = f(1) / xp.sqrt(var + f(eps))
        if w is not None:  # rstd * w first: a small array for batch and group norm, one pass less
            scale = scale * w.astype(xw.dtype, copy=False)
        y = xc * scale
        if b is not None:
            y += b.astype(xw.dtype, copy=False)
        return y.astype(x.dtype, copy=False), mean, var

    @staticmethod
    def backward(ctx, g, *_):
        x, w, mean, var = ctx.saved_tensors
        need = ctx.needs_input_grad
        if _grad_state.enabled:  # create_graph (see _norm_backward_composite)
            a = ctx.attrs
            dx, dw, db = _norm_backward_composite(g, x, w, a["axes"], a["eps"], a["center"],
                                                  None if w is None else tuple(w.shape),
                                                  None if ctx.b_meta is None else tuple(ctx.b_meta[0]))
        else:
            dx, dw, db = AxesNormGrad.apply(g, x, w, mean, var, b_meta=ctx.b_meta, **ctx.attrs)
        return (dx if need[0] else None, dw if w is not None and need[1] else None,
                db if ctx.b_meta is not None and need[2] else None)


class BatchNormOp(AxesNorm):
    name = "NativeBatchNorm"  # batch_norm and instance_norm


class GroupNormOp(AxesNorm):
    name = "NativeGroupNorm"
    autocast = "fp32_cuda"


class RMSNormOp(AxesNorm):
    name = "RMSNorm"


class AxesNormGrad(NoDoubleBackward, Op):
    """With xhat = (x - mean) * rstd and gx = g * w (means over `axes`):
    dx = rstd * (gx - mean(gx) - xhat * mean(gx * xhat)) (no mean(gx) term when center=False),
    dw = sum(g * xhat) and db = sum(g) over the axes w and b are broadcast along."""

    name = "AxesNormBackward"

    @staticmethod
    def forward(ctx, g, x, w, mean, var, axes, eps, center, b_meta, op):
        ctx.op_name = op
        xp = xp_of(x)
        xw = work_array(x)
        f = xw.dtype.type
        none = xp.zeros(0, dtype=x.dtype)
        if x.size == 0:
            dw = none if w is None else xp.zeros(w.shape, w.dtype)
            return xp.zeros(x.shape, x.dtype), dw, none if b_meta is None else xp.zeros(*b_meta)
        gw = work_array(g).astype(xw.dtype, copy=False)
        rstd = f(1) / xp.sqrt(var + f(eps))
        xhat = (xw - mean) * rstd if center else xw * rstd
        gx = gw * w.astype(xw.dtype, copy=False) if w is not None else gw
        dx = gx - xhat * (gx * xhat).mean(axis=axes, keepdims=True)
        if center:
            dx -= gx.mean(axis=axes, keepdims=True)
        dx *= rstd
        dw = none if w is None else sum_to_array(gw * xhat, w.shape).astype(w.dtype, copy=False)
        db = none if b_meta is None else sum_to_array(gw, b_meta[0]).astype(b_meta[1], copy=False)
        return dx.astype(x.dtype, copy=False), dw, db


def _check_norm_input(input, op):
    if not input.is_floating_point():
        raise NotImplementedError(f"{op}: not implemented for {input.dtype.name} inputs (floating point only), "
                                  f"got input of shape {shape_str(input.shape)}")


def _check_param(p, name, n, input, op):
    """A per-channel weight, bias or running statistic: n elements, and the input's dtype (float32
    allowed beside a half input, as torch's mixed-dtype CPU kernels)."""
    if p is None:
        return
    if p.numel() != n:
        raise RuntimeError(f"{op}: {name} should contain {n} elements not {p.numel()} (input of shape "
                           f"{shape_str(input.shape)})")
    if p.dtype is not input.dtype and not (input.dtype in (dtypes.float16, dtypes.bfloat16)
                                           and p.dtype is dtypes.float32):
        raise RuntimeError(f"{op}: expected {name} of dtype {input.dtype.name} like the input (or float32 beside "
                           f"a half input), got {p.dtype.name}")


def _channels_view(input):
    """(N, C, *S) as (N, C, prod(S))."""
    n, c = input.shape[0], input.shape[1]
    return reshape(input, (n, c, math.prod(input.shape[2:])))


def _as_broadcast(p, shape):
    return None if p is None else reshape(p, shape)


def _update_running_arrays(running_mean, running_var, mean, var, *tracked, count, momentum):
    """The update on arrays, in place; momentum None: the cumulative average, 1 / the count of
    batches in the array `tracked` as it is at this call (torch's momentum=None)."""
    c = running_mean.size
    m = float(momentum) if momentum is not None else 1.0 / float(tracked[0].reshape(-1)[0])
    mu = mean.reshape(-1, c).mean(axis=0)
    v = var.reshape(-1, c).mean(axis=0) * (count / (count - 1))
    for a, stat in ((running_mean, mu), (running_var, v)):
        a[...] = ((1 - m) * a.astype(stat.dtype) + m * stat).reshape(a.shape).astype(a.dtype)


def _update_running(running_mean, running_var, mean, var, count, momentum, num_batches_tracked=None):
    """running = (1 - momentum) * running + momentum * batch statistic, in place (no autograd, as
    torch's kernels), with the unbiased variance (count / (count - 1)); per-instance statistics
    (instance_norm) are averaged over the batch first. Inside an nn.Graph capture the update is
    recorded, so that every replay updates the running statistics with its own batch's (and,
    for momentum None, its own count of batches)."""
    update = functools.partial(_update_running_arrays, count=count, momentum=momentum)
    args = (running_mean._data, running_var._data, mean._data, var._data)
    if momentum is None:
        args += (num_batches_tracked._data,)
    update(*args)
    running_mean._bump_version()
    running_var._bump_version()
    if _grad_state.tracer is not None:
        _grad_state.tracer.call(update, args, None, "BatchNormRunningStats")


def _normalize_with_stats(x, running_mean, running_var, weight, bias, eps, shape):
    """(x - running_mean) / sqrt(running_var + eps) * weight + bias, the statistics as constants
    (eval-mode batch_norm, instance_norm without input statistics): made of engine ops, so the
    gradients of x, weight and bias (and their double backward) come from autograd."""
    wt = dtypes.float64 if x.dtype is dtypes.float64 else dtypes.float32
    # engine ops on the detached statistics, so global (sharded) running stats box like any input
    mean = reshape(cast(running_mean.detach(), wt), shape)
    rstd = (reshape(cast(running_var.detach(), wt), shape) + eps) ** -0.5
    y = (cast(x, wt) - mean) * rstd
    if weight is not None:
        y = y * reshape(weight, shape)
    if bias is not None:
        y = y + reshape(bias, shape)
    return cast(y, x.dtype)


def _running_stats_norm(input, running_mean, running_var, weight, bias, use_input_stats, axes, count, momentum, eps,
                        op, num_batches_tracked=None):
    """The shared body of batch_norm and instance_norm on (N, C, *): normalise with the running
    statistics, or with the input's statistics over `axes` of the (N, C, L) view (then update the
    running ones in place, `count` elements per statistic)."""
    _check_norm_input(input, op)
    c = input.shape[1]
    for name, p in (("running_mean", running_mean), ("running_var", running_var), ("weight", weight),
                    ("bias", bias)):
        _check_param(p, name, c, input, op)
    x = _channels_view(input)
    if not use_input_stats:
        y = _normalize_with_stats(x, running_mean, running_var, weight, bias, eps, (1, c, 1))
        return reshape(y, tuple(input.shape))
    y, mean, var = BatchNormOp.apply(x, _as_broadcast(weight, (1, c, 1)), _as_broadcast(bias, (1, c, 1)),
                                     axes=axes, eps=float(eps), center=True, op=op)
    if running_mean is not None and input.numel() > 0:
        _update_running(running_mean, running_var, mean, var, count, momentum, num_batches_tracked)
    return reshape(y, tuple(input.shape))


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5,
               *, _num_batches_tracked=None):
    """Batch normalisation over (N, C, *): statistics per channel over the batch and the spatial
    dims. Training normalises with the batch mean and biased variance and, when running stats
    are given, updates them in place with the unbiased variance; eval uses the running stats.
    (`_num_batches_tracked`, the BatchNorm modules' buffer, with momentum None: the cumulative
    average, the count read when the update runs, so that a captured nn.Graph's replays count.)"""
    if momentum is None and _num_batches_tracked is None:
        raise ValueError("batch_norm: momentum=None (a cumulative average) is the BatchNorm modules' option; "
                         "F.batch_norm takes a float momentum, as torch's")
    op = "batch_norm"
    if input.numel() == 0:  # torch returns an empty copy before any check of the statistics
        return input.clone()
    if input.ndim < 2:
        raise RuntimeError(f"{op}: expected an input of shape (N, C, *) with at least 2 dims, got input of shape "
                           f"{shape_str(input.shape)}")
    if (running_mean is None) != (running_var is None):
        raise ValueError(f"{op}: running_mean and running_var must either both be None or neither be None")
    count = input.shape[0] * math.prod(input.shape[2:])
    if training and count == 1:
        raise ValueError(f"Expected more than 1 value per channel when training, got input size "
                         f"{shape_str(input.shape)}")
    if training and eps <= 0:
        raise ValueError(f"{op}: eps must be positive during training, but got {eps}")
    if eps < 0:
        raise ValueError(f"{op}: eps must be non-negative, but got {eps}")
    if not training and running_mean is None:
        raise RuntimeError(f"{op}: running_mean must be defined in evaluation mode")
    return _running_stats_norm(input, running_mean, running_var, weight, bias, training, (0, 2), count, momentum,
                               eps, op, _num_batches_tracked)


def instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats=True,
                  momentum=0.1, eps=1e-5):
    """Instance normalisation over (N, C, *): statistics per sample and channel over the spatial
    dims. With running stats and use_input_stats they are updated with the batch average of the
    instances' statistics; use_input_stats=False normalises with the running stats instead."""
    op = "instance_norm"
    spatial = math.prod(input.shape[2:])
    if use_input_stats and spatial == 1:
        raise ValueError(f"Expected more than 1 spatial element when training, got input size "
                         f"{shape_str(input.shape)}")
    if input.ndim < 2:
        raise RuntimeError(f"{op}: expected an input of shape (N, C, *) with at least 2 dims, got input of shape "
                           f"{shape_str(input.shape)}")
    if (running_mean is None) != (running_var is None):
        raise ValueError(f"{op}: running_mean and running_var must either both be None or neither be None")
    if not use_input_stats and running_mean is None:
        raise RuntimeError(f"{op}: expected running_mean and running_var to be defined when use_input_stats is "
                           f"false")
    return _running_stats_norm(input, running_mean, running_var, weight, bias, use_input_stats, (2,), spatial,
                               momentum, eps, op)


def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    """Group normalisation over (N, C, *): the C channels in num_groups groups, statistics per
    sample and group; weight and bias per channel."""
    op = "group_norm"
    if input.ndim < 2:
        raise RuntimeError(f"{op}: expected at least 2 dimensions for input tensor but received {input.ndim}")
    n, c = input.shape[0], input.shape[1]
    g = int(num_groups)
    if g <= 0 or c % g:
        raise RuntimeError(f"{op}: expected number of channels in input to be divisible by num_groups, but got "
                           f"input of shape {shape_str(input.shape)} and num_groups={num_groups}")
    spatial = math.prod(input.shape[2:])
    if n * c // g * spatial == 1:
        raise ValueError(f"Expected more than 1 value per channel when training, got input size "
                         f"{[n * c // g, g] + list(input.shape[2:])}")
    _check_norm_input(input, op)
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and (p.ndim != 1 or p.numel() != c):
            raise RuntimeError(f"{op}: expected {name} to be a vector of size equal to the number of channels in "
                               f"input, but got {name} of shape {shape_str(p.shape)} and input of shape "
                               f"{shape_str(input.shape)}")
        _check_param(p, name, c, input, op)
    x = reshape(input, (n, g, c // g, spatial))
    shape = (1, g, c // g, 1)
    y = GroupNormOp.apply(x, _as_broadcast(weight, shape), _as_broadcast(bias, shape), axes=(2, 3),
                          eps=float(eps), center=True, op=op)[0]
    return reshape(y, tuple(input.shape))


def rms_norm(input, normalized_shape, weight=None, eps=None):
    """Root-mean-square normalisation over the trailing `normalized_shape` dims: x / sqrt(mean(x^2)
    + eps) * weight. eps=None is torch's default: the machine epsilon of the dtype the input is
    computed in (float32 for half inputs)."""
    op = "rms_norm"
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    normalized_shape = tuple(int(n) for n in normalized_shape)
    k = len(normalized_shape)
    if k == 0:
        raise RuntimeError(f"{op}: expected normalized_shape to be at least 1-dimensional, i.e., containing at "
                           f"least one element, but got normalized_shape = []")
    if input.ndim < k or tuple(input.shape[input.ndim - k:]) != normalized_shape:
        raise RuntimeError(f"{op}: given normalized_shape={list(normalized_shape)}, expected input with shape "
                           f"[*, {', '.join(map(str, normalized_shape))}], but got input of size "
                           f"{shape_str(input.shape)}")
    if weight is not None and tuple(weight.shape) != normalized_shape:
        raise RuntimeError(f"{op}: expected weight to be of same shape as normalized_shape, but got weight of "
                           f"shape {shape_str(weight.shape)} and normalized_shape = {list(normalized_shape)}")
    _check_norm_input(input, op)
    d = math.prod(normalized_shape)
    _check_param(weight, "weight", d, input, op)
    if eps is None:
        eps = float(np.finfo(np.float64 if input.dtype is dtypes.float64 else np.float32).eps)
    lead = math.prod(input.shape[:input.ndim - k])
    y = RMSNormOp.apply(reshape(input, (lead, d)), _as_broadcast(weight, (1, d)), None, axes=(1,),
                        eps=float(eps), center=False, op=op)[0]
    return reshape(y, tuple(input.shape))


# ------------------------------------------------------------------ normalize / cosine_similarity
class Normalize(Op):
    """y = x / max(||x||_p, eps) along `axis`."""

    name = "Normalize"
    autocast = "fp32_cuda"
    save_inputs = (0,)

    @staticmethod
    def forward(ctx, x, p, axis, eps):
        xp = xp_of(x)
        ctx.p, ctx.axis, ctx.eps = p, axis, eps
        xw = work_array(x)
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
        return xp.sqrt(row_dot(x, x, axis) if axis == x.ndim - 1 else (x * x).sum(axis=axis, keepdims=True))
    if p == 1:
        return a.sum(axis=axis, keepdims=True)
    if p == float("inf"):
        return a.max(axis=axis, keepdims=True)
    if p == 0:  # the count of nonzeros, as torch.norm(p=0); its gradient is zero
        return (a != 0).sum(axis=axis, keepdims=True).astype(x.dtype)
    return (a ** p).sum(axis=axis, keepdims=True) ** (1.0 / p)


class NormalizeGrad(NoDoubleBackward, Op):
    """With n = ||x||_p > eps: dx = g / n - (sum(g x) / n^2) dn/dx, dn/dx = |x|^(p-1) sign(x) / n^(p-1)."""

    name = "NormalizeBackward"

    @staticmethod
    def forward(ctx, g, x, p, axis, eps):
        ctx.op_name = "normalize"
        xp = xp_of(x)
        xw, gw = work_array(x), work_array(g)
        f = xw.dtype.type
        n = _pnorm(xw, p, axis)
        clamped = n <= f(eps)
        nc = xp.maximum(n, f(eps))
        dx = gw / nc
        if p == float("inf"):
            a = xp.abs(xw)
            dn = (a == n) * xp.sign(xw)
            dn = dn / xp.maximum(dn.astype(bool).sum(axis=axis, keepdims=True), 1)
        elif p == 0:
            dn = xp.zeros_like(xw)
        else:
            safe_n = xp.where(n > 0, n, f(1))
            dn = xp.sign(xw) * (xp.abs(xw) ** (p - 1)) / safe_n ** (p - 1) if p != 2 else xw / safe_n
        coef = (gw * xw).sum(axis=axis, keepdims=True) / (nc * nc)
        dx = dx - xp.where(clamped, f(0), coef * dn)
        return dx.astype(x.dtype, copy=False)


def normalize(input, p=2.0, dim=1, eps=1e-12, out=None):
    """L_p-normalise `input` along `dim` (F.normalize)."""
    check_float(input, "normalize")
    axis = _check_dim(dim, max(input.ndim, 1))
    return Normalize.apply(input, p=float(p), axis=axis, eps=float(eps))


class CosineSimilarity(Op):
    """sum(x1 x2) / (max(||x1||, eps) max(||x2||, eps)) along `axis` (inputs pre-broadcast)."""

    name = "CosineSimilarity"
    autocast = "fp32_cuda"
    save_inputs = (0, 1)

    @staticmethod
    def forward(ctx, a, b, axis, eps):
        xp = xp_of(a)
        ctx.axis, ctx.eps = axis, eps
        aw, bw = work_array(a), work_array(b)
        f = aw.dtype.type
        na = xp.maximum(xp.sqrt((aw * aw).sum(axis=axis)), f(eps))
        nb = xp.maximum(xp.sqrt((bw * bw).sum(axis=axis)), f(eps))
        return ((aw * bw).sum(axis=axis) / (na * nb)).astype(a.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return CosineSimilarityGrad.apply(g, a, b, axis=ctx.axis, eps=ctx.eps)


class CosineSimilarityGrad(NoDoubleBackward, Op):
    name = "CosineSimilarityBackward"

    @staticmethod
    def forward(ctx, g, a, b, axis, eps):
        ctx.op_name = "cosine_similarity"
        xp = xp_of(a)
        aw, bw, gw = work_array(a), work_array(b), xp.expand_dims(work_array(g), axis)
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
    check_float(x1, "cosine_similarity")
    shape = broadcast_shapes(tuple(x1.shape), tuple(x2.shape))
    x1, x2 = broadcast_to(x1, shape), broadcast_to(x2, shape)
    axis = _check_dim(dim, max(len(shape), 1))
    if not shape:  # two scalars: the one-element vectors' similarity, returned 0-dim as torch
        return CosineSimilarity.apply(x1.reshape(1), x2.reshape(1), axis=0, eps=float(eps)).reshape(())
    return CosineSimilarity.apply(x1, x2, axis=axis, eps=float(eps))
