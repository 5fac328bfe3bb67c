"""Losses: cross_entropy (fused log_softmax + nll, index or probability targets, label
smoothing), nll_loss, and the pointwise losses (mse, l1, smooth_l1, binary cross-entropy with
and without logits, kl_div).

Each is one fused kernel with one fused gradient op (no double backward). The cross-entropy
keeps softmax(x) as a hidden output for its gradient, and on a large CPU array runs row blocks
on the engine's threads. On CUDA, index targets without class weights take the fused kernel of
engine/kernels/cross_entropy.py (one launch forward, one backward): its hidden output is the
gradient per unit of loss, and it checks the targets' range on the device (a row with a target
out of range gets a NaN loss and gradient) instead of reading them back; ENGINE_CUDA_SYNC_CHECKS=1
restores the host check and its IndexError. `VocabStats` and `VocabCrossEntropy` are the phases of
the vocab-parallel cross-entropy on a shard of the classes, for its SBP rule.
"""
import math
import warnings

import numpy as np

from ..autograd.grad_mode import _state as _grad_state
from ..backend import dtypes, host_checks, xp_of
from ..backend.parallel import parallel_for, parallel_ufunc
from ..kernels import cross_entropy as ce_kernels
from ..tensor import Tensor
from ._core import (NoDoubleBackward, broadcast_shapes, cast, check_float, promote_operands, shape_str, sum_to,
                    sum_to_array)
from ._kernels import BLOCK_ELEMENTS, blocked, empty, ignore_fp_errors, row_sum, work_array
from .comparison import where as _where
from .indexing import in_range
from .op import Op
from .softmax import COMPILED_ROW_BLOCK, _softmax_rows as softmax_rows, softmax_compiled

__all__ = ["cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
           "binary_cross_entropy_with_logits", "kl_div", "margin_ranking_loss", "cosine_embedding_loss"]


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


def _reduce_weighted(ctx, per, sw, lead, reduction):
    """The loss from per-sample losses `per` (already weighted by `sw`): "mean" divides by the
    total weight, kept in ctx.denom for the gradient; the other reductions as _reduce."""
    if reduction == "mean":
        ctx.denom = sw.sum(dtype=sw.dtype)
        return per.sum(dtype=per.dtype) / ctx.denom
    ctx.denom = 1
    return _reduce(per.reshape(lead), reduction)


def _check_reduction(reduction, op, extra=()):
    allowed = ("none", "mean", "sum") + tuple(extra)
    if reduction not in allowed:
        raise ValueError(f"{op}: reduction must be one of {', '.join(map(repr, allowed))}, got {reduction!r}")


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


def _check_targets(op, input, target, c, ignore_index, values=True):
    """Index targets: integer dtype, shape = input without the class dim, ids in [0, C) (that
    last check, a read of the targets on the host, only with `values`)."""
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
    if values and t.size:
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
        sw *= work_array(w).astype(x2.dtype, copy=False)[safe_t]
    return xp.arange(m), safe_t, sw, valid


def _fused_ce(x, prob, w):
    """Whether CrossEntropy takes the fused CUDA kernel: CuPy logits, index targets, no weights."""
    return not prob and w is None and xp_of(x) is not np


def targets_checked_on_device(input, weight, prob):
    """Whether cross_entropy leaves the targets' range to the fused kernels (a CUDA input, local
    or 2-D global (vocab-parallel), index targets, no class weights; not in the
    ENGINE_CUDA_SYNC_CHECKS=1 debug mode): an out-of-range target then gives a NaN loss instead
    of a host read and an IndexError."""
    return (input._global is None or input.ndim == 2) and input._device.type == "cuda" and not prob \
        and weight is None and not host_checks(input._data)


def _cross_entropy_fused(ctx, x2, lead, target, ignore_index, reduction, smoothing, dtype):
    """CrossEntropy.forward on CUDA: the per-row loss and statistics (max, sum of exp; the hidden
    output) from one kernel, the reduction on the device. The backward recomputes the gradient
    from the logits (saved for this call: changing them in place before the backward is an
    error, as for any saved input) and the statistics: nothing of [M, C] is written in between
    (engine/kernels/cross_entropy.py)."""
    xp = xp_of(x2)
    t = target.reshape(-1).astype(np.int64, copy=False)
    per, stats = ce_kernels.cross_entropy_fwd(x2, t, ignore_index, smoothing)
    ctx.fused, ctx.more_saved_inputs = True, (0,)
    if reduction == "mean":
        ctx.denom = (t != ignore_index).sum(dtype=per.dtype)
        loss = per.sum(dtype=per.dtype) / ctx.denom
    else:
        ctx.denom = 1
        loss = _reduce(per.reshape(lead), reduction)
    return xp.asarray(loss).astype(dtype, copy=False), stats


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
    if x2.dtype == np.float32 and softmax_compiled():
        return _cross_entropy_index_compiled(ctx, x2, lead, rows, safe_t, sw, reduction, dtype)
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
            sb = row_sum(e, 1)
            np.log(sb, out=lse[s0:s1])
            e *= 1 / sb

    parallel_for(run, -(-m // step), work=x2.size, per_thread=4)
    loss = _reduce_weighted(ctx, (lse[:, 0] - zt) * sw, sw, lead, reduction)
    return np.asarray(loss).astype(dtype, copy=False), p


def _cross_entropy_index_compiled(ctx, x2, lead, rows, safe_t, sw, reduction, dtype):
    """The float32 index-target forward through the compiled softmax rows (one pass per row in
    cache, on the engine's threads; [2048, 1000]: 2.5 ms against the blocked numpy path's 7.0).
    The loss of a row is -log p[target] = lse - z[target]; a row whose target probability
    underflows (a logit 87 below the row's max) gets lse - z[target] computed exactly instead."""
    p = empty(np, x2.shape, x2.dtype)  # from the buffer pool: no page faults on a fresh [M, C]
    blocked(lambda sel: softmax_rows(x2[sel], p[sel], -1, log=False), x2.shape, COMPILED_ROW_BLOCK)
    pt = p[rows, safe_t]
    with ignore_fp_errors(np):
        per = -np.log(pt)
    low = np.flatnonzero(pt < _TINY_P)
    if low.size:
        xs = x2[low].astype(np.float64)
        mx = xs.max(axis=1, keepdims=True)
        lse = np.log(np.exp(xs - mx).sum(axis=1)) + mx[:, 0]
        per[low] = (lse - xs[np.arange(low.size), safe_t[low]]).astype(np.float32)
    loss = _reduce_weighted(ctx, per * sw, sw, lead, reduction)
    return np.asarray(loss).astype(dtype, copy=False), p


_TINY_P = np.float32(2.0 ** -100)  # below this, -log p[target] is computed from the logits instead


class CrossEntropy(Op):
    """Fused log_softmax + nll (index targets) or soft-target cross-entropy (probabilities).

    Outputs (loss, p): p = softmax(x) laid out as [M, C] is hidden, for the fused gradient
    g * (p * sum(q) - q), where q is the effective target distribution times class weights.
    """

    name = "CrossEntropyLoss"
    autocast = "fp32"
    save_inputs = (1, 2)
    save_outputs = (1,)

    @staticmethod
    def forward(ctx, x, target, w, ignore_index, reduction, smoothing, prob, float32_loss=False):
        xp = xp_of(x)
        dtype = x.dtype
        ctx.shape, ctx.attrs, ctx.dtype, ctx.fused = x.shape, (ignore_index, reduction, smoothing, prob), dtype, False
        if x.size and _fused_ce(x, prob, w):  # float32_loss: float16 logits the kernel reads as float32
            return _cross_entropy_fused(ctx, *_class_last(x), target, ignore_index, reduction, smoothing,
                                        np.dtype(np.float32) if float32_loss else dtype)
        if float32_loss:
            raise AssertionError("CrossEntropy(float32_loss=True) is for the fused CUDA kernel only")
        x2, lead = _class_last(work_array(x))
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
        s = row_sum(e, 1)
        lse = xp.log(s)  # log_softmax = z - lse
        e *= 1 / s  # e is now the softmax p
        f = z.dtype.type
        if prob:
            q = work_array(target).astype(z.dtype, copy=False)
            q2, _ = _class_last(q)
            if smoothing:
                q2 = q2 * f(1 - smoothing) + f(smoothing / c)
            if w is not None:
                q2 = q2 * work_array(w).astype(z.dtype, copy=False)
            # -sum(q * (z - lse)) = sum(q) * lse - sum(q * z)
            per = (row_sum(xp.ascontiguousarray(q2), 1) * lse)[:, 0] - xp.einsum("ij,ij->i", q2, z)
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
                wc = work_array(w).astype(z.dtype, copy=False)
                smooth = wc.sum() * lse[:, 0] - xp.einsum("ij,j->i", z, wc)
            else:
                smooth = f(c) * lse[:, 0] - row_sum(z, 1)[:, 0]
            smooth *= valid
            per = nll * f(1 - smoothing) + smooth * f(smoothing / c)
        else:
            per = nll
        loss = _reduce_weighted(ctx, per, sw, lead, reduction)
        return xp.asarray(loss).astype(dtype, copy=False), e

    @staticmethod
    def backward(ctx, g, *_):
        if ctx.fused:
            target, _, x, stats = ctx.saved_tensors
            return CrossEntropyRowsGrad.apply(g, stats, target, x, shape=ctx.shape, attrs=ctx.attrs,
                                              denom=ctx.denom, dtype=ctx.dtype), None, None
        target, w, p = ctx.saved_tensors
        dx, dt = CrossEntropyGrad.apply(g, p, target, w, shape=ctx.shape, attrs=ctx.attrs, denom=ctx.denom,
                                        need_target=ctx.needs_input_grad[1])
        return dx, (dt if ctx.needs_input_grad[1] else None), None


def _row_scale(g, reduction, denom, acc):
    """The upstream gradient of each row: g per row ('none') or the one g (/ denom for 'mean')."""
    gs = g.reshape(-1).astype(acc, copy=False)
    return gs / denom if reduction == "mean" else gs


class UnitGradScale(NoDoubleBackward, Op):
    """dx = dunit * g_row: the fused cross-entropy's backward from its gradient per unit of loss
    dunit [M, C], laid out back like the logits (`shape`) in their dtype."""

    name = "CrossEntropyLossBackward"

    @staticmethod
    def forward(ctx, g, dunit, shape, reduction, denom, dtype):
        ctx.op_name = "cross_entropy"
        dx = ce_kernels.cross_entropy_bwd(dunit, _row_scale(g, reduction, denom, dunit.dtype), dtype)
        return _class_back(dx, shape)


class CrossEntropyRowsGrad(NoDoubleBackward, Op):
    """dx of the single-device fused cross-entropy: dunit recomputed from the logits (an input:
    an nn.Graph replay binds them to the step's own) and the forward's row statistics, times
    g_row, in one kernel; laid out back like the logits (`shape`) in their dtype."""

    name = "CrossEntropyLossBackward"

    @staticmethod
    def forward(ctx, g, stats, target, logits, shape, attrs, denom, dtype):
        ctx.op_name = "cross_entropy"
        ignore_index, reduction, smoothing, _ = attrs
        t = target.reshape(-1).astype(np.int64, copy=False)
        dx = ce_kernels.cross_entropy_bwd_rows(_class_last(logits)[0], stats, t,
                                               _row_scale(g, reduction, denom, stats.dtype), ignore_index, smoothing,
                                               dtype)
        return _class_back(dx, shape)


class CrossEntropyGrad(NoDoubleBackward, Op):
    name = "CrossEntropyLossBackward"

    @staticmethod
    def forward(ctx, g, p, target, w, shape, attrs, denom, need_target):
        ctx.op_name = "cross_entropy"
        xp = xp_of(p)
        ignore_index, reduction, smoothing, prob = attrs
        m, c = p.shape
        f = p.dtype.type
        g = work_array(g).astype(p.dtype, copy=False)
        gs = g.reshape(-1)[:, None] if reduction == "none" else g.reshape(1, 1)
        if reduction == "mean":
            gs = gs / denom  # a 0-d array of the work dtype (sum of weights) or an int
        out_dtype = target.dtype if prob else g.dtype
        empty = xp.zeros(0, out_dtype)
        if m == 0:
            return xp.zeros(shape, dtype=g.dtype), (xp.zeros(target.shape, out_dtype) if prob else empty)
        wc = work_array(w).astype(p.dtype, copy=False) if w is not None else None
        if prob:
            q2, _ = _class_last(work_array(target).astype(p.dtype, copy=False))
            qe = q2 * f(1 - smoothing) + f(smoothing / c) if smoothing else q2
            if wc is not None:
                qe = qe * wc
            dx = p * row_sum(xp.ascontiguousarray(qe), 1)
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
    check_float(input, "cross_entropy")
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
        _check_targets("cross_entropy", input, target, c, ignore_index,
                       values=not targets_checked_on_device(input, weight, prob))
    attrs = dict(ignore_index=int(ignore_index), reduction=reduction, smoothing=float(label_smoothing), prob=prob)
    if _kernel_reads_half(input, weight, prob):
        saved, _grad_state.autocast = _grad_state.autocast, None
        try:
            return CrossEntropy.apply(input, target, weight, float32_loss=True, **attrs)[0]
        finally:
            _grad_state.autocast = saved
    return CrossEntropy.apply(input, target, weight, **attrs)[0]


def _kernel_reads_half(input, weight, prob):
    """Whether a CUDA autocast leaves float16 logits to the fused kernel instead of casting them
    to float32 (its "fp32" policy): the kernel reads them as float32 and computes in float32, so
    the loss (float32) and the gradient (float16, rounded once from float32) are bit for bit the
    cast path's, without its two passes over the logits (GPT-2 124M on an H200: the float16 ->
    float32 cast of the [8192, 50304] logits and its gradient's cast back, ~4 ms of a 41 ms step,
    and the kernels reading half the bytes). Local logits, or global ones broadcast on every mesh
    axis (split ones go to the vocab-parallel ops; partial sums are summed in float32 first)."""
    mode = _grad_state.autocast
    if mode is None or mode[0] != "cuda" or input._device.type != "cuda" or input.dtype != dtypes.float16:
        return False
    if prob or weight is not None or input.numel() == 0:
        return False
    return input._global is None or all(s.is_broadcast for s in input._global.sbp)


class NllLoss(Op):
    """loss_i = -w[t_i] * x[i, t_i] (ignored targets contribute 0); 'mean' divides by sum(w[t])."""

    name = "NllLoss"
    autocast = "fp32"
    save_inputs = (1, 2)

    @staticmethod
    def forward(ctx, x, target, w, ignore_index, reduction):
        xp = xp_of(x)
        dtype = x.dtype
        x2, lead = _class_last(work_array(x))
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
        g = work_array(g)
        m = math.prod(shape[:1] + shape[2:]) if len(shape) > 1 else 1
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
    check_float(input, "nll_loss")
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
    reduction = "none" if not reduce else ("mean" if size_average else "sum")
    warnings.warn(f"size_average and reduce args will be deprecated, please use reduction='{reduction}' instead.",
                  UserWarning, stacklevel=3)
    return reduction


# ------------------------------------------------------------------ pointwise losses
_EPSILON = float(np.float32(1e-12))  # torch's EPSILON of its loss kernels is a float: 1e-12 rounded to float32


def _pointwise_loss(kind, x, t, extra):
    """Per-element loss of `kind` on float arrays (broadcast), returned in x's work dtype."""
    xp = xp_of(x)
    f = x.dtype.type
    if kind == "mse":
        d = xp.asarray(x - t)  # asarray: 0-dim operands give a numpy scalar
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
        dx = (x - t) / xp.maximum((1 - x) * x, f(_EPSILON))
        if need_t:
            dt = xp.log1p(-x) - xp.log(x)  # torch's -logit(x): unclamped, +-inf at x = 0 or 1
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
                # torch differentiates xlogy(t, t): log(t) + t / t, which is 0/0 = nan at t == 0
                safe = xp.where(t == 0, f(1), t)
                dt = xp.where(t == 0, f(np.nan), xp.log(safe) + 1) - x
    else:
        raise ValueError(kind)
    return dx, dt


class PointwiseLoss(Op):
    """Fused elementwise loss (mse, l1, smooth_l1, bce, bce_with_logits, kl_div) with an optional
    elementwise weight, broadcasting input/target like PyTorch, and the reduction."""

    name = "PointwiseLoss"
    autocast = "fp32"
    save_inputs = (0, 1, 2)

    @staticmethod
    def forward(ctx, x, t, w, kind, reduction, extra):
        dtype = x.dtype
        ctx.kind, ctx.reduction, ctx.extra = kind, reduction, extra
        xw, tw = work_array(x), work_array(t)
        ex = _array_extra(extra, xw.dtype)
        with ignore_fp_errors(xp_of(x)):  # log(0) in bce / kl_div: silent (then clamped), as torch
            loss = _pointwise_loss(kind, xw, tw, ex)
        if w is not None:
            loss = loss * work_array(w)
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
        if _grad_state.enabled and ctx.kind in _COMPOSITE_GRADS and ctx.extra.get("pos_weight") is None:
            dx, dt = _pointwise_backward_composite(ctx, g, x, t, w)  # create_graph
        else:
            dx, dt = PointwiseLossGrad.apply(g, x, t, w, kind=ctx.kind, reduction=ctx.reduction, extra=ctx.extra,
                                             n=ctx.n, need_t=need_t)
        return (dx if ctx.needs_input_grad[0] else None), (dt if need_t else None), None


def _pointwise_backward_composite(ctx, g, x, t, w):
    """`_pointwise_grads` in engine ops for the losses a second derivative is taken through (a
    `create_graph=True` backward: gradient penalties, MAML); the others keep the fused op, which
    refuses it with a clear error."""
    kind, extra, d = ctx.kind, ctx.extra, x - t
    if kind == "mse":
        dl, dtl = d * 2, d * -2
    elif kind == "bce_logits":
        dl, dtl = x.sigmoid() - t, -x
    else:
        if kind == "huber":
            dl = d.clamp(-extra["delta"], extra["delta"])
        elif kind == "smooth_l1" and extra["beta"] > 0:
            dl = _where(d.abs() < extra["beta"], d / extra["beta"], d.sign())
        else:  # l1, smooth_l1 with beta 0
            dl = d.sign()
        dtl = -dl
    scale = g / ctx.n if ctx.reduction in ("mean", "batchmean") and ctx.n else g
    if w is not None:
        scale = scale * w
    return sum_to(dl * scale, x.shape), sum_to(dtl * scale, t.shape)


_COMPOSITE_GRADS = ("mse", "l1", "smooth_l1", "huber", "bce_logits")


class PointwiseLossGrad(NoDoubleBackward, Op):
    name = "PointwiseLossBackward"

    @staticmethod
    def forward(ctx, g, x, t, w, kind, reduction, extra, n, need_t):
        ctx.op_name = kind
        xp = xp_of(x)
        xw, tw = work_array(x), work_array(t)
        gw = work_array(g).astype(xw.dtype, copy=False)
        if reduction in ("mean", "batchmean") and n:
            gw = gw / gw.dtype.type(n)
        with ignore_fp_errors(xp):
            dx, dt = _pointwise_grads(kind, xw, tw, _array_extra(extra, xw.dtype), need_t)
        scale = gw if w is None else gw * work_array(w)
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
        out["pos_weight"] = work_array(pw._data).astype(dtype, copy=False)
    return out


def _loss_operands(op, input, target, same_shape=False):
    check_float(input, op)
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


def huber_loss(input, target, reduction="mean", delta=1.0, weight=None):
    """0.5 d^2 where |d| < delta, else delta (|d| - 0.5 delta): smooth_l1 scaled by delta."""
    if weight is not None:
        raise NotImplementedError("huber_loss: the weight argument is not implemented")
    if delta <= 0:
        raise RuntimeError(f"huber_loss does not support non-positive values for delta, got {delta}")
    return _run_pointwise("huber", input, target, None, reduction, {"delta": float(delta)}, "huber_loss")


def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    """-(t log x + (1 - t) log(1 - x)) on probabilities x, logs clamped at -100 like PyTorch."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if tuple(target.shape) != tuple(input.shape):
        raise ValueError(f"binary_cross_entropy: using a target size ({shape_str(target.shape)}) that is "
                         f"different to the input size ({shape_str(input.shape)}) is deprecated. Please "
                         "ensure they have the same size.")
    if input.numel() and host_checks(input._data):  # on a GPU only with ENGINE_CUDA_SYNC_CHECKS=1
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
            Tensor._make(pos_weight._global.logical_value(pos_weight._data), input._device)
    return _run_pointwise("bce_logits", input, target, weight, reduction, extra,
                          "binary_cross_entropy_with_logits", same_shape=True)


def kl_div(input, target, size_average=None, reduce=None, reduction="mean", log_target=False):
    """KL(target || exp(input)) pointwise: t (log t - x) (or exp(t) (t - x) with log_target)."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if reduction == "mean":
        warnings.warn("reduction: 'mean' divides the total loss by both the batch size and the support size."
                      "'batchmean' divides only by the batch size, and aligns with the KL div math definition."
                      "'mean' will be changed to behave the same as 'batchmean' in the next major release.",
                      UserWarning, stacklevel=2)
    return _run_pointwise("kl", input, target, None, reduction, {"log_target": bool(log_target)}, "kl_div",
                          extra_red=("batchmean",))


# ------------------------------------------------------------------ losses composed of engine ops
def _apply_reduction(loss, reduction, op):
    _check_reduction(reduction, op)
    if reduction == "mean":
        return loss.mean()
    return loss.sum() if reduction == "sum" else loss


def margin_ranking_loss(input1, input2, target, margin=0.0, size_average=None, reduce=None, reduction="mean"):
    """max(0, -target * (input1 - input2) + margin), torch's composition (so its gradient at the
    hinge, where it passes the gradient, is torch's too)."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if not (input1.ndim == input2.ndim == target.ndim):
        raise RuntimeError(f"margin_ranking_loss : All input tensors should have same dimension but got sizes: "
                           f"input1: {shape_str(input1.shape)}, input2: {shape_str(input2.shape)}, "
                           f"target: {shape_str(target.shape)} ")
    return _apply_reduction((-target * (input1 - input2) + margin).clamp_min(0), reduction, "margin_ranking_loss")




def cosine_embedding_loss(input1, input2, target, margin=0.0, size_average=None, reduce=None, reduction="mean"):
    """1 - cos(x1, x2) where target == 1, max(0, cos(x1, x2) - margin) where target == -1 (0
    elsewhere), cos over the last dim of [N, D] (target [N]) or [D] (target 0-d) inputs."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    tdim = target.ndim
    if tdim not in (0, 1):
        raise RuntimeError(f"cosine_embedding_loss: 0D or 1D target tensor expected, multi-target not supported, "
                           f"got target of shape {shape_str(target.shape)}")
    if tdim == 1 and (input1.ndim != 2 or input2.ndim != 2):
        raise RuntimeError(f"cosine_embedding_loss: 1D target tensor expects 2D input tensors, but found inputs "
                           f"with sizes {shape_str(input1.shape)} and {shape_str(input2.shape)}.")
    if tdim == 0 and (input1.ndim != 1 or input2.ndim != 1):
        raise RuntimeError(f"cosine_embedding_loss: 0D target tensor expects 1D input tensors, but found inputs "
                           f"with sizes {shape_str(input1.shape)} and {shape_str(input2.shape)}.")
    prod = (input1 * input2).sum(tdim)
    mag1 = (input1 * input1).sum(tdim) + _EPSILON
    mag2 = (input2 * input2).sum(tdim) + _EPSILON
    cos = prod / (mag1 * mag2).sqrt()
    pos = _where(target == 1, 1 - cos, 0.0)
    neg = _where(target == -1, (cos - margin).clamp_min(0), 0.0)
    return _apply_reduction(pos + neg, reduction, "cosine_embedding_loss")


# ------------------------------------------------------------------ pieces of a class-split cross-entropy
# engine/distributed/rules/loss.py decomposes the cross-entropy of logits split on the class
# axis into global ops built from these two (see indexing.in_range for masked lookups on a shard).
class ClassMax(Op):
    """max over `axis` keeping it (size 1); no gradient: used as a constant shift."""

    name = "ClassMax"
    differentiable = False

    @staticmethod
    def forward(ctx, x, axis):
        return x.max(axis=axis, keepdims=True)


class TargetGather(Op):
    """out = x[..., t - start, ...] along `axis` where start <= t < start + x.shape[axis], else 0.
    `target` has x's shape without `axis`."""

    name = "TargetGather"
    save_inputs = (1,)

    @staticmethod
    def forward(ctx, x, target, axis, start=0):
        xp = xp_of(x)
        ctx.shape, ctx.axis, ctx.start = x.shape, axis, start
        safe, mask = in_range(xp, target, start, x.shape[axis])
        vals = xp.take_along_axis(x, xp.expand_dims(safe, axis), axis=axis)
        vals = xp.squeeze(vals, axis=axis)
        return xp.where(mask, vals, xp.zeros((), dtype=x.dtype)).astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        target = ctx.saved_tensors[0]
        return TargetScatter.apply(g, target, shape=ctx.shape, axis=ctx.axis, start=ctx.start), None


class TargetScatter(Op):
    """Adjoint of TargetGather: zeros of `shape` with g written at the in-range targets."""

    name = "TargetScatter"
    save_inputs = (1,)

    @staticmethod
    def forward(ctx, g, target, shape, axis, start=0):
        xp = xp_of(g)
        ctx.axis, ctx.start = axis, start
        out = xp.zeros(shape, dtype=g.dtype)
        safe, mask = in_range(xp, target, start, shape[axis])
        vals = xp.where(mask, g, xp.zeros((), dtype=g.dtype)).astype(g.dtype, copy=False)
        xp.put_along_axis(out, xp.expand_dims(safe, axis), xp.expand_dims(vals, axis), axis=axis)
        return out

    @staticmethod
    def backward(ctx, gg):
        target = ctx.saved_tensors[0]
        return TargetGather.apply(gg, target, axis=ctx.axis, start=ctx.start), None


# ------------------------------------------------------------------ the fused phases of a vocab-parallel cross-entropy
# On a shard x [M, Cl] of the classes (columns start..start+Cl of `classes`): m = ClassMax, all-reduced
# (max); stats = VocabStats, all-reduced (sum); then VocabCrossEntropy gives the loss of every row and
# keeps the shard's gradient per unit of loss (engine/kernels/cross_entropy.py has the formulas).
class VocabStats(Op):
    """[M, 3] per row of the shard x [M, Cl]: sum of exp(x - m), x[t] - m where the target t is in
    the shard (else 0), sum of x - m; m [M] or [M, 1] is the row max over all shards. No
    gradient: the loss's gradient is VocabCrossEntropy's."""

    name = "VocabStats"
    differentiable = False

    @staticmethod
    def forward(ctx, x, m, target, start=0):
        return ce_kernels.vocab_stats(x, m, target, start)


class VocabCrossEntropy(Op):
    """Outputs (loss [M], dunit [M, Cl]) of the shard x [M, Cl] given the all-reduced max `m` and
    `stats` (constants: their dependence on x is in dunit, the exact gradient of the loss with
    respect to the shard); the loss in x's dtype, dunit hidden, in the accumulation dtype."""

    name = "VocabCrossEntropy"
    save_outputs = (1,)

    @staticmethod
    def forward(ctx, x, m, stats, target, classes, ignore_index=-100, smoothing=0.0, start=0):
        loss, dunit = ce_kernels.vocab_loss(x, m, stats, target, start, classes, ignore_index, smoothing)
        ctx.shape, ctx.dtype = x.shape, x.dtype
        return loss.astype(x.dtype, copy=False), dunit

    @staticmethod
    def backward(ctx, g, _):
        dunit, = ctx.saved_tensors
        return UnitGradScale.apply(g, dunit, shape=ctx.shape, reduction="none", denom=1, dtype=ctx.dtype), None, \
            None, None
