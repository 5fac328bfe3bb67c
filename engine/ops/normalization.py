"""Normalisation: layer_norm (one fused kernel forward, one fused grad op), normalize (L_p) and
cosine_similarity.

layer_norm's row kernels are compiled (engine.backend.jit) where numba is installed: one loop
per row instead of seven numpy passes per block of rows (Swin's [16384, 96] activations: forward
+ backward 5.7 -> 2.2 ms, PyTorch 1.7 ms). The numpy kernels stay the reference and the path for
what the compiled ones do not take (other dtypes, strided rows, CuPy).

Values only the backward needs (layer_norm's normalised input and rstd) are hidden outputs of
the forward, so they are Tensors with a meaning on every rank when tensors are global. The
fused grad ops raise a clear error on double backward.
"""
import numpy as np

from ..backend import jit, xp_of
from ..tensor import _check_dim
from ._core import NoDoubleBackward, broadcast_shapes, check_float, promote_operands, shape_str
from ._kernels import blocked, empty as _empty, row_dot, work_array
from .op import Op

__all__ = ["layer_norm", "normalize", "cosine_similarity"]


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
BLOCK_ELEMENTS = (1 << 18) if _layer_norm_rows_jit is not None else (1 << 16)


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
    def forward(ctx, x, w, b, k, eps):
        xp = xp_of(x)
        dtype = x.dtype
        lead, norm = x.shape[:-k] if k else x.shape, x.shape[x.ndim - k:]
        d = int(np.prod(norm)) if norm else 1
        x2 = work_array(x).reshape(-1, d)
        ctx.k, ctx.shape, ctx.has_w, ctx.has_b = k, x.shape, w is not None, b is not None
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
            blocked(rows, x2.shape, BLOCK_ELEMENTS)
        else:
            rows((Ellipsis,))
        stat_shape = lead + (1,) * k
        return y.reshape(x.shape).astype(dtype, copy=False), mean.reshape(stat_shape), rstd.reshape(stat_shape)

    @staticmethod
    def backward(ctx, g, *_):
        x, w, mean, rstd = ctx.saved_tensors
        dx, dw, db = LayerNormGrad.apply(g, x, mean, rstd, w, k=ctx.k, has_b=ctx.has_b)
        return (dx if ctx.needs_input_grad[0] else None,
                dw if ctx.has_w and ctx.needs_input_grad[1] else None,
                db if ctx.has_b and ctx.needs_input_grad[2] else None)


class LayerNormGrad(NoDoubleBackward, Op):
    """dx = rstd * (g*w - mean(g*w) - xhat * mean(g*w*xhat)), dw = sum(g*xhat), db = sum(g),
    with xhat = (x - mean) * rstd recomputed, over float32 in one pass chain (PyTorch's
    formula)."""

    name = "NativeLayerNormBackward"

    @staticmethod
    def forward(ctx, g, x, mean, rstd, w, k, has_b):
        ctx.op_name = "layer_norm"
        xp = xp_of(g)
        d = int(np.prod(x.shape[x.ndim - k:])) if k else 1
        x2 = work_array(x).reshape(-1, d)
        m = x2.shape[0]
        dtype = g.dtype
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
        parts = blocked(rows, (m, d), BLOCK_ELEMENTS) if xp is np else [rows((Ellipsis,))]
        dw = db = empty
        if w is not None:
            dw = _sum_in_order([p[0] for p in parts]).reshape(wshape).astype(w.dtype, copy=False)
        if has_b:
            db = _sum_in_order([p[1] for p in parts]).reshape(wshape).astype(dtype, copy=False)
        return dx.reshape(g.shape).astype(dtype, copy=False), dw, db


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


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Layer normalisation over the trailing `normalized_shape` dims (PyTorch's F.layer_norm)."""
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    normalized_shape = tuple(int(s) for s in normalized_shape)
    k = len(normalized_shape)
    check_float(input, "layer_norm")
    if k == 0 or input.ndim < k or tuple(input.shape[input.ndim - k:]) != normalized_shape:
        raise RuntimeError(
            f"layer_norm: given normalized_shape={list(normalized_shape)}, expected input with shape "
            f"[*, {', '.join(map(str, normalized_shape))}], but got input of size {shape_str(input.shape)}")
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and tuple(p.shape) != normalized_shape:
            raise RuntimeError(f"layer_norm: expected {name} of shape {list(normalized_shape)}, "
                               f"got {shape_str(p.shape)}")
    return LayerNorm.apply(input, weight, bias, k=k, eps=float(eps))[0]


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
    return CosineSimilarity.apply(x1, x2, axis=axis, eps=float(eps))
