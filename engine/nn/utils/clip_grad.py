"""Gradient clipping: `clip_grad_norm_` and `clip_grad_value_` (torch.nn.utils semantics).

Both work on the gradients' backend arrays in place (no autograd, nothing recorded). The total norm
is the `norm_type`-norm of the per-gradient norms, accumulated in float32 (float64 when every
gradient is float64) and kept on the device of the first gradient, so nothing waits for the GPU
unless `error_if_nonfinite=True` asks for a check. Gradients are then scaled by
min(1, max_norm / (total_norm + 1e-6)), as torch does.

Gradients on one CUDA device go through the multi-tensor kernels of engine/kernels/grad_norm.py:
the norm of all of them in two launches (one more per extra gradient dtype; sharded global
gradients are reduced over their ranks once per layout, not once per gradient), the clip in one,
the coefficient computed on the device. Norm types 0, -inf and below 0, and CPU gradients, take
the per-gradient path.
"""
import math

import numpy as np

from ...backend import dtypes, to_device, xp_of
from ...kernels import grad_norm as mt_norm
from ...ops.creation import tensor
from ...tensor import Tensor

__all__ = ["clip_grad_norm_", "clip_grad_value_", "get_total_norm", "clip_grads_with_norm_"]


def _grads(parameters):
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    return [p.grad for p in parameters if p.grad is not None]


def _as_float(a, acc):
    return a if a.dtype == acc else a.astype(acc)


def _array_norm(xp, a, p, acc):
    """The p-norm of a whole array as a 0-d array of dtype `acc`."""
    if a.size == 0:
        return xp.zeros((), dtype=acc)
    a = _as_float(a, acc)
    if p == 2.0:
        flat = a.reshape(-1)
        return xp.sqrt(xp.dot(flat, flat))
    if p == 1.0:
        return xp.sum(xp.abs(a), dtype=acc)
    if p == math.inf:
        return xp.max(xp.abs(a))
    if p == -math.inf:
        return xp.min(xp.abs(a))
    if p == 0.0:
        return xp.asarray(xp.count_nonzero(a), dtype=acc)
    return xp.sum(xp.abs(a) ** p, dtype=acc) ** (1.0 / p)


def _grad_norm(g, p, acc):
    """The p-norm of one gradient; for a sharded global gradient, of the whole logical tensor."""
    xp = xp_of(g._data)
    n = _array_norm(xp, g._data, p, acc)
    meta = g._global
    if meta is None or not any(s.is_split or s.is_partial for s in meta.sbp):
        return n
    if p in (math.inf, -math.inf):
        return meta.reduce_over_splits(xp.asarray(n).reshape(1), "max" if p > 0 else "min")[0]
    if p == 0.0:
        return meta.reduce_over_splits(xp.asarray(n).reshape(1))[0]
    return meta.reduce_over_splits(xp.asarray(n ** p).reshape(1))[0] ** (1.0 / p)


def get_total_norm(tensors, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """The `norm_type`-norm of the norms of `tensors` (torch.nn.utils.get_total_norm) as a 0-d
    tensor, accumulated in float32 (float64 when every tensor is float64). A sharded global
    tensor counts with its whole logical value. A pipeline stage computes its own total with
    this and combines the stages' totals (libai's trainer) before `clip_grads_with_norm_`."""
    tensors = [tensors] if isinstance(tensors, Tensor) else [t for t in tensors if t is not None]
    norm_type = float(norm_type)
    if not tensors:
        return tensor(0.0)
    acc = dtypes.float64.np if all(g._data.dtype == dtypes.float64.np for g in tensors) else dtypes.float32.np
    dev = tensors[0]._device
    xp = xp_of(tensors[0]._data)
    if _one_cuda_device(tensors) and mt_norm.supported_norm(norm_type):
        total = _fused_total_norm(xp, tensors, norm_type, acc)
    else:
        norms = [to_device(_grad_norm(g, norm_type, acc), dev) for g in tensors]
        total = _array_norm(xp, xp.stack(norms), norm_type, acc)
    if error_if_nonfinite and not bool(xp.isfinite(total)):
        raise RuntimeError(
            f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, so it "
            "cannot be clipped. To disable this error and scale the gradients by the non-finite norm "
            "anyway, set `error_if_nonfinite=False`"
        )
    return Tensor._make(xp.asarray(total, dtype=acc), dev)


def _one_cuda_device(tensors):
    dev = tensors[0]._device
    return dev.type == "cuda" and all(t._device == dev for t in tensors)


def _fused_total_norm(xp, tensors, norm_type, acc):
    """get_total_norm's total with the multi-tensor kernels: one norm per layout of sharded
    global tensors (reduced over the ranks that split them), all other tensors together."""
    layouts = {}
    for t in tensors:
        meta = t._global
        key = (meta.placement, meta.sbp) if meta is not None and any(s.is_split or s.is_partial for s in meta.sbp) \
            else None
        layouts.setdefault(key, (meta, []))[1].append(t._data)
    if list(layouts) == [None]:
        return mt_norm.grad_norm(layouts[None][1], norm_type, acc)
    mode = mt_norm.norm_mode(norm_type)
    raws = []
    for key, (meta, arrays) in layouts.items():
        raw = mt_norm.grad_norm(arrays, norm_type, acc, root=False).reshape(1)
        raws.append(raw if key is None else meta.reduce_over_splits(raw, "max" if mode == mt_norm.MAX_ABS else "sum"))
    raws = xp.concatenate(raws)
    raw = raws.max() if mode == mt_norm.MAX_ABS else raws.sum(dtype=acc)
    return mt_norm.finish_norm(xp, raw, mode, norm_type)


def clip_grads_with_norm_(parameters, max_norm, total_norm, foreach=None):
    """Scale the gradients of `parameters` by min(1, max_norm / (total_norm + 1e-6)) in place
    (torch.nn.utils.clip_grads_with_norm_); `total_norm` is a 0-d tensor or a number."""
    grads = _grads(parameters)
    if not grads:
        return
    if _one_cuda_device(grads):
        _fused_clip(grads, max_norm, total_norm)
        return
    total = total_norm._data if isinstance(total_norm, Tensor) else total_norm
    xp = xp_of(grads[0]._data)
    acc = xp.asarray(total).dtype if isinstance(total_norm, Tensor) else dtypes.float32.np
    coef = xp.minimum(float(max_norm) / (xp.asarray(total) + 1e-6), 1.0).astype(acc)
    with np.errstate(invalid="ignore"):  # a non-finite norm scales to nan, silently as in torch
        for g in grads:
            a = g._data
            xp_of(a).multiply(a, to_device(coef, g._device), out=a, casting="unsafe")
            g._bump_version()


def _fused_clip(grads, max_norm, total_norm):
    """The clip of gradients on one CUDA device: one multi-tensor launch per gradient dtype,
    reading the norm on the device (a number is copied there as float32)."""
    dev = grads[0]._device
    xp = xp_of(grads[0]._data)
    if isinstance(total_norm, Tensor):
        total = to_device(total_norm._data, dev)
        if total.dtype not in (np.float32, np.float64):
            total = total.astype(np.float32)
    else:
        total = xp.asarray(total_norm, dtype=np.float32)
    mt_norm.scale_grads([g._data for g in grads], total.reshape(()), float(max_norm))
    for g in grads:
        g._bump_version()


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """Scale all gradients so that their joint `norm_type`-norm is at most `max_norm`.

    Returns the total norm (before clipping) as a 0-d tensor. `foreach` is accepted for torch
    compatibility; every path here is already one in-place ufunc per gradient.
    """
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    parameters = list(parameters)
    total = get_total_norm(_grads(parameters), norm_type, error_if_nonfinite)
    clip_grads_with_norm_(parameters, max_norm, total)
    return total


def clip_grad_value_(parameters, clip_value, foreach=None):
    """Clamp every gradient element into [-clip_value, clip_value] in place."""
    clip_value = float(clip_value)
    for g in _grads(parameters):
        a = g._data
        xp_of(a).clip(a, -clip_value, clip_value, out=a)
        g._bump_version()
