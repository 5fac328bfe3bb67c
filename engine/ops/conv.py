"""Convolution, pooling, resampling and padding (`F.conv2d`, `F.avg_pool2d`, `F.interpolate`, ...).

Why it is built this way:
* conv2d is im2col + one batched matmul. The columns come from a strided *view* of the padded
  input (`as_strided`: kernel offsets and output positions are just strides), copied once; for
  stride 1 each kernel offset is even one contiguous slice of the flattened image (see
  `_im2col`). The backward is two fused ops: `Conv2dGradInput` (matmul, then col2im by adding one
  slice per kernel offset: a loop over kh*kw, never over pixels) and `Conv2dGradWeight` (one
  matmul per group over the whole batch). Both are linear in each input, so their own backwards
  are again conv2d / the grad ops: double backward needs no extra kernels.
* Pools loop over kernel offsets the same way; max_pool2d outputs which offset won (an int output
  only backward reads) and scatters its gradient with one bincount.
* adaptive_avg_pool2d and interpolate (nearest, bilinear) are separable linear maps: out =
  Mh @ x @ Mw^T with small matrices built from PyTorch's index formulas (in float32, as PyTorch
  computes them), so one `Resample2d` op (backward: the transposed matrices) serves all three.
* pad (constant) is its own adjoint with negated widths; reflect/replicate/circular pads are
  gathers along each padded axis, whose adjoint is a scatter-add made of a few slice adds.
"""
import math

import numpy as np

from .op import Op
from ..backend import dtypes, xp_of
from ._core import broadcast_to, const_like, reshape, shape_str
from ._kernels import matmul as _matmul

__all__ = ["conv1d", "conv2d", "avg_pool2d", "max_pool2d", "adaptive_avg_pool2d", "interpolate", "pad"]


# ------------------------------------------------------------------ helpers
def _pair(v, name, op):
    if isinstance(v, (tuple, list)):
        if len(v) == 1:
            v = (v[0], v[0])
        if len(v) != 2:
            raise ValueError(f"{op}: {name} must be an int or a pair of ints, got {v}")
        return int(v[0]), int(v[1])
    return int(v), int(v)


def _as_strided(xp, a, shape, strides):
    if xp is np:
        return np.lib.stride_tricks.as_strided(a, shape, strides, writeable=False)
    return xp.lib.stride_tricks.as_strided(a, shape, strides)


def _pad_hw(x, pads, value=0):
    """Pad the last two dims of a 4-D array by (top, bottom, left, right) with `value`."""
    pt, pb, pl, pr = pads
    if not (pt or pb or pl or pr):
        return x
    xp = xp_of(x)
    n, c, h, w = x.shape
    out = xp.full((n, c, h + pt + pb, w + pl + pr), value, dtype=x.dtype)
    out[:, :, pt:pt + h, pl:pl + w] = x
    return out


def _windows(xpad, kernel, stride, dilation, out_hw):
    """Strided view (N, C, KH, KW, OH, OW) of the padded input: window (kh, kw) of output (oh, ow)."""
    n, c = xpad.shape[:2]
    s_n, s_c, s_h, s_w = xpad.strides
    (kh, kw), (sh, sw), (dh, dw), (oh, ow) = kernel, stride, dilation, out_hw
    return _as_strided(xp_of(xpad), xpad, (n, c, kh, kw, oh, ow),
                       (s_n, s_c, dh * s_h, dw * s_w, sh * s_h, sw * s_w))


def _offset_slices(kernel, stride, dilation, out_hw):
    """For each kernel offset (kh, kw): the (rows, cols) slices of the padded input it touches."""
    (kh, kw), (sh, sw), (dh, dw), (oh, ow) = kernel, stride, dilation, out_hw
    for i in range(kh):
        for j in range(kw):
            yield i * kw + j, (slice(i * dh, i * dh + sh * (oh - 1) + 1, sh),
                               slice(j * dw, j * dw + sw * (ow - 1) + 1, sw))


def _work_dtype(a):
    """Half types are computed in float32 (numpy has no fast float16/bfloat16 matmul)."""
    return np.float32 if a.dtype.itemsize < 4 else a.dtype


def _conv_out(size, k, s, p0, p1, d):
    return (size + p0 + p1 - d * (k - 1) - 1) // s + 1


# ------------------------------------------------------------------ conv2d kernels
# Columns have shape (N, C, KH*KW, OH*Q), or (C, KH*KW, N, OH*Q) with the batch last (for the
# weight gradient), where Q is the width of one output row in the columns. In general Q = OW and
# the columns are a copy of the strided window view. For stride 1 (the common case) Q is the padded
# width Wp: then each kernel offset is ONE contiguous slice of the flattened padded image, so im2col
# is KH*KW long contiguous copies and col2im KH*KW contiguous adds; the Q - OW extra columns of each
# row are junk that the forward drops and that the backward feeds zeros.
def _im2col(x, kernel, stride, dilation, pads, out_hw, batch_last):
    n, c = x.shape[:2]
    kk = kernel[0] * kernel[1]
    if stride != (1, 1):
        win = _windows(_pad_hw(x, pads), kernel, stride, dilation, out_hw)
        p = out_hw[0] * out_hw[1]
        if batch_last:
            return win.transpose(1, 2, 3, 0, 4, 5).reshape(c, kk, n, p), out_hw[1]
        return win.reshape(n, c, kk, p), out_hw[1]
    xp = xp_of(x)
    pt, pb, pl, pr = pads
    xpad = _pad_hw(x, (pt, pb + 1, pl, pr))  # a spare row: the last offset's slice runs KW-1 past the image
    q = xpad.shape[3]
    flat = xpad.reshape(n, c, xpad.shape[2] * q)
    span = out_hw[0] * q
    cols = xp.empty((c, kk, n, span) if batch_last else (n, c, kk, span), dtype=x.dtype)
    for k, off in _flat_offsets(kernel, dilation, q):
        if batch_last:
            cols[:, k] = flat[:, :, off:off + span].transpose(1, 0, 2)
        else:
            cols[:, :, k] = flat[:, :, off:off + span]
    return cols, q


def _flat_offsets(kernel, dilation, q):
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            yield i * kernel[1] + j, i * dilation[0] * q + j * dilation[1]


def _widen(dy, q):
    """dy (N, O, OH, OW) as (N, O, OH*Q), zeros in the junk columns."""
    n, o, oh, ow = dy.shape
    if q == ow:
        return dy.reshape(n, o, oh * ow)
    out = xp_of(dy).zeros((n, o, oh, q), dtype=dy.dtype)
    out[..., :ow] = dy
    return out.reshape(n, o, oh * q)


def _conv2d_forward(x, w, b, stride, pads, dilation, groups):
    xp = xp_of(x)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    out_hw = (_conv_out(h, kh, stride[0], pads[0], pads[1], dilation[0]),
              _conv_out(wd, kw, stride[1], pads[2], pads[3], dilation[1]))
    dt = x.dtype
    wt = _work_dtype(x)
    x, w = x.astype(wt, copy=False), w.astype(wt, copy=False)
    cols, q = _im2col(x, (kh, kw), stride, dilation, pads, out_hw, batch_last=False)
    cols = cols.reshape(n, groups, cg * kh * kw, out_hw[0] * q)
    out = _matmul(xp, w.reshape(groups, o // groups, cg * kh * kw), cols)  # (N, G, Og, OH*Q)
    out = out.reshape(n, o, out_hw[0], q)
    if q != out_hw[1]:
        out = xp.ascontiguousarray(out[..., :out_hw[1]])
    if b is not None:
        out += b.astype(wt, copy=False).reshape(o, 1, 1)
    return out.astype(dt, copy=False)


def _conv2d_grad_input(dy, w, x_shape, stride, pads, dilation, groups):
    xp = xp_of(dy)
    n, c, h, wd = x_shape
    o, cg, kh, kw = w.shape
    oh, ow = dy.shape[2:]
    dt = dy.dtype
    wt = _work_dtype(dy)
    og = o // groups
    pt, pb, pl, pr = pads
    flat = stride == (1, 1)
    q = wd + pl + pr if flat else ow
    wt_m = w.astype(wt, copy=False).reshape(groups, og, cg * kh * kw).transpose(0, 2, 1)  # (G, K, Og)
    dyg = _widen(dy.astype(wt, copy=False), q).reshape(n, groups, og, oh * q)
    # depthwise (Og == 1): an outer product per group; a broadcast multiply beats N*G tiny matmuls
    dcols = wt_m * dyg if og == 1 else _matmul(xp, wt_m, dyg)  # (N, G, K, OH*Q)
    dcols = dcols.reshape(n, c, kh * kw, oh * q)
    hp = h + pt + pb
    if flat:
        dx = xp.zeros((n, c, (hp + 1) * q), dtype=wt)
        span = oh * q
        for k, off in _flat_offsets((kh, kw), dilation, q):
            dx[:, :, off:off + span] += dcols[:, :, k]
        dx = dx.reshape(n, c, hp + 1, q)
    else:
        dcols = dcols.reshape(n, c, kh * kw, oh, ow)
        dx = xp.zeros((n, c, hp, wd + pl + pr), dtype=wt)
        for k, (rows, cols) in _offset_slices((kh, kw), stride, dilation, (oh, ow)):
            dx[:, :, rows, cols] += dcols[:, :, k]
    return xp.ascontiguousarray(dx[:, :, pt:pt + h, pl:pl + wd], dtype=dt)


def _conv2d_grad_weight(dy, x, w_shape, stride, pads, dilation, groups):
    xp = xp_of(dy)
    n, o, oh, ow = dy.shape
    _, cg, kh, kw = w_shape
    dt = dy.dtype
    wt = _work_dtype(dy)
    cols, q = _im2col(x.astype(wt, copy=False), (kh, kw), stride, dilation, pads, (oh, ow), batch_last=True)
    cols = cols.reshape(groups, cg * kh * kw, n * oh * q)  # (G, K, N*OH*Q)
    og = o // groups
    dyg = _widen(dy.astype(wt, copy=False), q).reshape(n, groups, og, oh * q)
    dyg = dyg.transpose(1, 2, 0, 3).reshape(groups, og, n * oh * q)  # (G, Og, N*OH*Q)
    dw = _matmul(xp, dyg, cols.transpose(0, 2, 1))  # (G, Og, Cg*KH*KW)
    return dw.reshape(w_shape).astype(dt, copy=False)


class Conv2d(Op):
    name = "Conv2d"
    autocast = "lower"
    save_inputs = (0, 1)

    @staticmethod
    def forward(ctx, x, w, b, stride, pads, dilation, groups):
        ctx.params = dict(stride=stride, pads=pads, dilation=dilation, groups=groups)
        return _conv2d_forward(x, w, b, stride, pads, dilation, groups)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        need = ctx.needs_input_grad
        dx = Conv2dGradInput.apply(g, w, x_shape=tuple(x.shape), **ctx.params) if need[0] else None
        dw = Conv2dGradWeight.apply(g, x, w_shape=tuple(w.shape), **ctx.params) if need[1] else None
        db = ChannelSum.apply(g) if len(need) > 2 and need[2] else None
        return dx, dw, db


class Conv2dGradInput(Op):
    """dL/dinput of conv2d (a transposed convolution of dy with the weight)."""

    name = "Conv2dGradInput"
    save_inputs = (0, 1)

    @staticmethod
    def forward(ctx, dy, w, x_shape, stride, pads, dilation, groups):
        ctx.params = dict(stride=stride, pads=pads, dilation=dilation, groups=groups)
        return _conv2d_grad_input(dy, w, x_shape, stride, pads, dilation, groups)

    @staticmethod
    def backward(ctx, gdx):
        dy, w = ctx.saved_tensors
        need = ctx.needs_input_grad
        g_dy = Conv2d.apply(gdx, w, None, **ctx.params) if need[0] else None
        g_w = Conv2dGradWeight.apply(dy, gdx, w_shape=tuple(w.shape), **ctx.params) if need[1] else None
        return g_dy, g_w


class Conv2dGradWeight(Op):
    """dL/dweight of conv2d (the correlation of the input with dy, summed over the batch)."""

    name = "Conv2dGradWeight"
    save_inputs = (0, 1)

    @staticmethod
    def forward(ctx, dy, x, w_shape, stride, pads, dilation, groups):
        ctx.params = dict(stride=stride, pads=pads, dilation=dilation, groups=groups)
        return _conv2d_grad_weight(dy, x, w_shape, stride, pads, dilation, groups)

    @staticmethod
    def backward(ctx, gdw):
        dy, x = ctx.saved_tensors
        need = ctx.needs_input_grad
        g_dy = Conv2d.apply(x, gdw, None, **ctx.params) if need[0] else None
        g_x = Conv2dGradInput.apply(dy, gdw, x_shape=tuple(x.shape), **ctx.params) if need[1] else None
        return g_dy, g_x


class ChannelSum(Op):
    """Bias gradient: sum of an (N, C, ...) array over every dim but C."""

    name = "ChannelSum"

    @staticmethod
    def forward(ctx, g):
        ctx.shape = g.shape
        axes = (0,) + tuple(range(2, g.ndim))
        return g.sum(axis=axes, dtype=_work_dtype(g)).astype(g.dtype, copy=False)

    @staticmethod
    def backward(ctx, gb):
        shape = ctx.shape
        return broadcast_to(reshape(gb, (1, shape[1]) + (1,) * (len(shape) - 2)), shape)


def _conv_padding(padding, kernel, dilation, stride, op):
    """(top, bottom, left, right) from an int, a pair, 'valid' or 'same' (extra pad goes bottom/right)."""
    if isinstance(padding, str):
        if padding == "valid":
            return (0, 0, 0, 0)
        if padding != "same":
            raise ValueError(f"{op}: invalid padding string {padding!r}, should be one of 'valid' or 'same'")
        if stride != (1, 1):
            raise ValueError(f"{op}: padding='same' is not supported for strided convolutions")
        pads = []
        for k, d in zip(kernel, dilation):
            total = d * (k - 1)
            pads += [total // 2, total - total // 2]
        return tuple(pads)
    ph, pw = _pair(padding, "padding", op)
    if ph < 0 or pw < 0:
        raise RuntimeError(f"{op}: negative padding is not supported, got {padding}")
    return (ph, ph, pw, pw)


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """2-D cross-correlation over an (N, C, H, W) or unbatched (C, H, W) input, as torch's conv2d."""
    op = "conv2d"
    unbatched = input.ndim == 3
    if input.ndim not in (3, 4):
        raise RuntimeError(f"{op}: expected a 3-D (unbatched) or 4-D (batched) input, got input of shape "
                           f"{shape_str(input.shape)}")
    if weight.ndim != 4:
        raise RuntimeError(f"{op}: expected a 4-D weight (out_channels, in_channels/groups, kH, kW), got "
                           f"weight of shape {shape_str(weight.shape)}")
    x = reshape(input, (1,) + tuple(input.shape)) if unbatched else input
    stride = _pair(stride, "stride", op)
    dilation = _pair(dilation, "dilation", op)
    groups = int(groups)
    _check_conv(x, weight, bias, stride, dilation, groups, op)
    pads = _conv_padding(padding, tuple(weight.shape[2:]), dilation, stride, op)
    for size, k, d, p0, p1 in zip(x.shape[2:], weight.shape[2:], dilation, pads[::2], pads[1::2]):
        if size + p0 + p1 < d * (k - 1) + 1:
            raise RuntimeError(
                f"{op}: calculated padded input size per channel: ({x.shape[2] + pads[0] + pads[1]} x "
                f"{x.shape[3] + pads[2] + pads[3]}). Kernel size: ({weight.shape[2]} x {weight.shape[3]}) "
                f"(dilation {dilation}). Kernel size can't be greater than actual input size")
    out = Conv2d.apply(x, weight, bias, stride=stride, pads=pads, dilation=dilation, groups=groups)
    return reshape(out, tuple(out.shape[1:])) if unbatched else out


def _check_conv(x, w, b, stride, dilation, groups, op):
    if min(stride) <= 0:
        raise RuntimeError(f"{op}: non-positive stride is not supported, got stride={stride}")
    if min(dilation) <= 0:
        raise RuntimeError(f"{op}: dilation should be greater than zero, got dilation={dilation}")
    if groups <= 0:
        raise RuntimeError(f"{op}: non-positive groups is not supported, got groups={groups}")
    if w.shape[0] % groups:
        raise RuntimeError(f"{op}: given groups={groups}, expected weight to be divisible by {groups} at "
                           f"dimension 0, but got weight of size {shape_str(w.shape)} instead")
    if x.shape[1] != w.shape[1] * groups:
        raise RuntimeError(f"{op}: given groups={groups}, weight of size {shape_str(w.shape)}, expected "
                           f"input{shape_str(x.shape)} to have {w.shape[1] * groups} channels, but got "
                           f"{x.shape[1]} channels instead")
    if x.dtype is not w.dtype or (b is not None and b.dtype is not x.dtype):
        raise RuntimeError(f"{op}: input type ({x.dtype.name}), weight type ({w.dtype.name})"
                           + (f" and bias type ({b.dtype.name})" if b is not None else "") + " should be the same")
    if not x.dtype.is_floating_point:
        raise RuntimeError(f"{op}: expected a floating point input, got {x.dtype.name}")
    if b is not None and tuple(b.shape) != (w.shape[0],):
        raise RuntimeError(f"{op}: expected bias of shape [{w.shape[0]}] (out_channels), got bias of shape "
                           f"{shape_str(b.shape)}")


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """1-D cross-correlation over (N, C, L) or (C, L): conv2d on a height-1 image."""
    op = "conv1d"
    if input.ndim not in (2, 3) or weight.ndim != 3:
        raise RuntimeError(f"{op}: expected a 2-D/3-D input and a 3-D weight, got input of shape "
                           f"{shape_str(input.shape)} and weight of shape {shape_str(weight.shape)}")
    unbatched = input.ndim == 2
    x = reshape(input, (1,) + tuple(input.shape)) if unbatched else input
    x4 = reshape(x, (x.shape[0], x.shape[1], 1, x.shape[2]))
    w4 = reshape(weight, (weight.shape[0], weight.shape[1], 1, weight.shape[2]))
    def pair(v, h):
        return (h, v[0] if isinstance(v, (tuple, list)) else v)

    pad = padding if isinstance(padding, str) else pair(padding, 0)
    out = conv2d(x4, w4, bias, pair(stride, 1), pad, pair(dilation, 1), groups)
    out = reshape(out, (out.shape[0], out.shape[1], out.shape[3]))
    return reshape(out, tuple(out.shape[1:])) if unbatched else out


# ------------------------------------------------------------------ pooling
def _pool_out(size, k, s, p, d, ceil_mode):
    eff = d * (k - 1) + 1
    out = (size + 2 * p - eff + ((s - 1) if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _pool_args(input, kernel_size, stride, padding, dilation, ceil_mode, op):
    if input.ndim not in (3, 4):
        raise RuntimeError(f"{op}: expected a 3-D or 4-D input, got input of shape {shape_str(input.shape)}")
    k = _pair(kernel_size, "kernel_size", op)
    s = k if stride is None or (isinstance(stride, (tuple, list)) and len(stride) == 0) else _pair(stride, "stride", op)
    p = _pair(padding, "padding", op)
    d = _pair(dilation, "dilation", op)
    if min(k) <= 0 or min(s) <= 0 or min(d) <= 0:
        raise RuntimeError(f"{op}: kernel_size, stride and dilation must be positive, got kernel_size={k}, "
                           f"stride={s}, dilation={d}")
    for pi, ki, di in zip(p, k, d):
        if pi < 0 or pi > (di * (ki - 1) + 1) // 2:
            raise RuntimeError(f"{op}: pad should be at most half of effective kernel size, but got "
                               f"pad={p}, kernel_size={k} and dilation={d}")
    h, w = input.shape[-2:]
    out = (_pool_out(h, k[0], s[0], p[0], d[0], ceil_mode), _pool_out(w, k[1], s[1], p[1], d[1], ceil_mode))
    if out[0] <= 0 or out[1] <= 0:
        raise RuntimeError(f"{op}: given input size {shape_str(input.shape)}, calculated output size "
                           f"{shape_str(tuple(input.shape[:-2]) + out)} is too small")
    # padded extent needed so every window fits (ceil_mode windows may run past the right pad)
    pads = tuple(v for i in range(2) for v in (p[i], max(p[i], (out[i] - 1) * s[i] + d[i] * (k[i] - 1) + 1
                                                          - input.shape[-2 + i] - p[i])))
    return dict(kernel=k, stride=s, dilation=d, pads=pads, out_hw=out)


def _as4d(input):
    return reshape(input, (1,) + tuple(input.shape)) if input.ndim == 3 else input


def _from4d(out, like):
    return reshape(out, tuple(out.shape[1:])) if like.ndim == 3 else out


def _avg_divisor(size, k, s, p, out, count_include_pad):
    """1-D factor of torch's avg_pool divisor along one axis (the 2-D divisor is an outer product)."""
    start = np.arange(out) * s - p
    end = np.minimum(start + k, size + p)
    full = end - start
    start, end = np.maximum(start, 0), np.minimum(end, size)
    return full if count_include_pad else end - start


def _pool_sum(xpad, kernel, stride, dilation, out_hw, dtype):
    xp = xp_of(xpad)
    n, c = xpad.shape[:2]
    acc = xp.zeros((n, c) + tuple(out_hw), dtype=dtype)
    for _, (rows, cols) in _offset_slices(kernel, stride, dilation, out_hw):
        acc += xpad[:, :, rows, cols]
    return acc


def _pool_scatter(g, in_shape, kernel, stride, dilation, pads, out_hw):
    xp = xp_of(g)
    n, c, h, w = in_shape
    pt, pb, pl, pr = pads
    dx = xp.zeros((n, c, h + pt + pb, w + pl + pr), dtype=g.dtype)
    for _, (rows, cols) in _offset_slices(kernel, stride, dilation, out_hw):
        dx[:, :, rows, cols] += g
    return dx[:, :, pt:pt + h, pl:pl + w]


class AvgPool2d(Op):
    name = "AvgPool2d"

    @staticmethod
    def forward(ctx, x, kernel, stride, dilation, pads, out_hw, divisor):
        ctx.attrs = dict(kernel=kernel, stride=stride, dilation=dilation, pads=pads, out_hw=out_hw, divisor=divisor)
        ctx.in_shape = x.shape
        wt = _work_dtype(x)
        acc = _pool_sum(_pad_hw(x.astype(wt, copy=False), pads), kernel, stride, dilation, out_hw, wt)
        acc /= xp_of(x).asarray(divisor, dtype=wt)
        return acc.astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        return AvgPool2dGrad.apply(g, in_shape=ctx.in_shape, **ctx.attrs)


class AvgPool2dGrad(Op):
    name = "AvgPool2dGrad"

    @staticmethod
    def forward(ctx, g, in_shape, kernel, stride, dilation, pads, out_hw, divisor):
        ctx.attrs = dict(kernel=kernel, stride=stride, dilation=dilation, pads=pads, out_hw=out_hw, divisor=divisor)
        wt = _work_dtype(g)
        gd = g.astype(wt) / xp_of(g).asarray(divisor, dtype=wt)
        dx = _pool_scatter(gd, in_shape, kernel, stride, dilation, pads, out_hw)
        return xp_of(g).ascontiguousarray(dx, dtype=g.dtype)

    @staticmethod
    def backward(ctx, gg):
        return AvgPool2d.apply(gg, **ctx.attrs)


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    """Mean over kernel windows, with torch's ceil_mode and count_include_pad divisor rules."""
    a = _pool_args(input, kernel_size, stride, padding, 1, ceil_mode, "avg_pool2d")
    if not input.is_floating_point():
        raise RuntimeError(f"avg_pool2d: expected a floating point input, got {input.dtype.name}")
    if divisor_override is not None:
        if divisor_override == 0:
            raise RuntimeError("avg_pool2d: divisor must be not zero")
        divisor = np.full(a["out_hw"], float(divisor_override))
    else:
        h, w = input.shape[-2:]
        dh = _avg_divisor(h, a["kernel"][0], a["stride"][0], a["pads"][0], a["out_hw"][0], count_include_pad)
        dw = _avg_divisor(w, a["kernel"][1], a["stride"][1], a["pads"][2], a["out_hw"][1], count_include_pad)
        divisor = np.outer(dh, dw).astype(np.float64)
    return _from4d(AvgPool2d.apply(_as4d(input), divisor=divisor, **a), input)


class MaxPool2d(Op):
    """Outputs the window maxima and (int32) the kernel offset that won, which only backward reads."""

    name = "MaxPool2d"
    save_outputs = (1,)

    @staticmethod
    def forward(ctx, x, kernel, stride, dilation, pads, out_hw):
        xp = xp_of(x)
        ctx.attrs = dict(kernel=kernel, stride=stride, dilation=dilation, pads=pads, out_hw=out_hw)
        ctx.in_shape = x.shape
        is_int = x.dtype.kind in "iu"  # (bfloat16's numpy kind is "V", so test for integers)
        low = np.iinfo(x.dtype).min if is_int else -np.inf
        n, c = x.shape[:2]
        win = _windows(_pad_hw(x, pads, value=low), kernel, stride, dilation, out_hw)
        win = win.reshape(n, c, kernel[0] * kernel[1], out_hw[0], out_hw[1])  # one copy
        arg = win.argmax(axis=2)  # first maximum wins (torch's tie rule)
        if not is_int and bool(xp.isnan(x).any()):  # torch: the *last* NaN of a window wins
            nan = xp.isnan(win)
            last = win.shape[2] - 1 - nan[:, :, ::-1].argmax(axis=2)
            arg = xp.where(nan.any(axis=2), last, arg)
        out = xp.take_along_axis(win, arg[:, :, None], axis=2)[:, :, 0]
        return out, arg.astype(np.int32)

    @staticmethod
    def backward(ctx, g, _):
        (arg,) = ctx.saved_tensors
        return MaxPool2dScatter.apply(g, arg, in_shape=ctx.in_shape, **ctx.attrs)


def _winner_index(arg, padded_hw, kernel, stride, dilation, out_hw):
    """Flat index, into the padded (N, C, Hp, Wp) input, of the element that won each window."""
    xp = xp_of(arg)
    n, c = arg.shape[:2]
    hp, wp = padded_hw
    a = arg.astype(np.int64)
    row = (a // kernel[1]) * dilation[0] + (xp.arange(out_hw[0]) * stride[0]).reshape(-1, 1)
    col = (a % kernel[1]) * dilation[1] + xp.arange(out_hw[1]) * stride[1]
    plane = (xp.arange(n * c) * (hp * wp)).reshape(n, c, 1, 1)
    return plane + row * wp + col


class MaxPool2dScatter(Op):
    """Gradient of max_pool2d: each output gradient goes to the input element that won its window."""

    name = "MaxPool2dGrad"
    save_inputs = (1,)

    @staticmethod
    def forward(ctx, g, arg, in_shape, kernel, stride, dilation, pads, out_hw):
        xp = xp_of(g)
        ctx.attrs = dict(kernel=kernel, stride=stride, dilation=dilation, pads=pads, out_hw=out_hw)
        n, c, h, w = in_shape
        pt, pb, pl, pr = pads
        hp, wp = h + pt + pb, w + pl + pr
        flat = _winner_index(arg, (hp, wp), kernel, stride, dilation, out_hw)
        dx = xp.bincount(flat.reshape(-1), weights=g.reshape(-1), minlength=n * c * hp * wp)
        dx = dx.reshape(n, c, hp, wp)[:, :, pt:pt + h, pl:pl + w]
        return xp.ascontiguousarray(dx, dtype=g.dtype)

    @staticmethod
    def backward(ctx, gg):
        (arg,) = ctx.saved_tensors
        return MaxPool2dGather.apply(gg, arg, **ctx.attrs), None


class MaxPool2dGather(Op):
    """Adjoint of MaxPool2dScatter: read each window's winning element."""

    name = "MaxPool2dGather"
    save_inputs = (1,)

    @staticmethod
    def forward(ctx, x, arg, kernel, stride, dilation, pads, out_hw):
        ctx.attrs = dict(kernel=kernel, stride=stride, dilation=dilation, pads=pads, out_hw=out_hw)
        ctx.in_shape = x.shape
        xpad = _pad_hw(x, pads)
        flat = _winner_index(arg, xpad.shape[2:], kernel, stride, dilation, out_hw)
        return xpad.reshape(-1)[flat]

    @staticmethod
    def backward(ctx, g):
        (arg,) = ctx.saved_tensors
        return MaxPool2dScatter.apply(g, arg, in_shape=ctx.in_shape, **ctx.attrs), None


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """Max over kernel windows (padding counts as -inf); return_indices gives flat h*W+w indices."""
    a = _pool_args(input, kernel_size, stride, padding, dilation, ceil_mode, "max_pool2d")
    if input.dtype is dtypes.bool_:
        raise RuntimeError("max_pool2d: not implemented for 'Bool'")
    out, arg = MaxPool2d.apply(_as4d(input), **a)
    out = _from4d(out, input)
    if not return_indices:
        return out
    return out, _from4d(_max_indices(arg, input.shape[-1], **a), input)


def _max_indices(arg, width, kernel, stride, dilation, pads, out_hw):
    xp = xp_of(arg._data)
    a = arg._data
    kh, kw = a // kernel[1], a % kernel[1]
    rows = xp.arange(out_hw[0]).reshape(-1, 1) * stride[0] - pads[0] + kh * dilation[0]
    cols = xp.arange(out_hw[1]) * stride[1] - pads[2] + kw * dilation[1]
    # elementwise in arg (its window offsets) plus the output position along H/W, which no
    # signature splits: a global arg's shard gives the shard of the indices
    return const_like((rows * width + cols).astype(np.int64), arg, None if arg._global is None else arg.shape)


# ------------------------------------------------------------------ separable resampling
class Resample2d(Op):
    """out = Mh @ x @ Mw^T over the last two dims; Mh, Mw are constant matrices."""

    name = "Resample2d"

    @staticmethod
    def forward(ctx, x, mh, mw):
        xp = xp_of(x)
        ctx.mats = (mh, mw)
        wt = _work_dtype(x)
        mh, mw = xp.asarray(mh, dtype=wt), xp.asarray(mw, dtype=wt)
        out = _matmul(xp, mh, _matmul(xp, x.astype(wt, copy=False), mw.T))
        return out.astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        mh, mw = ctx.mats
        return Resample2d.apply(g, mh=mh.T, mw=mw.T)


def _adaptive_matrix(size, out):
    """Row i averages input[start_i:end_i], start = floor(i*size/out), end = ceil((i+1)*size/out)."""
    m = np.zeros((out, size))
    for i in range(out):
        s, e = (i * size) // out, -((-(i + 1) * size) // out)
        m[i, s:e] = 1.0 / (e - s)
    return m


def adaptive_avg_pool2d(input, output_size):
    """Average over torch's adaptive windows (also for sizes that do not divide the input)."""
    if input.ndim not in (3, 4):
        raise RuntimeError(f"adaptive_avg_pool2d: expected a 3-D or 4-D input, got input of shape "
                           f"{shape_str(input.shape)}")
    h, w = input.shape[-2:]
    if isinstance(output_size, (tuple, list)):
        oh, ow = output_size
    else:
        oh = ow = output_size
    oh, ow = h if oh is None else int(oh), w if ow is None else int(ow)
    if oh < 0 or ow < 0 or (input.numel() and (h == 0 or w == 0)):
        raise RuntimeError(f"adaptive_avg_pool2d: invalid output_size {output_size} for input of shape "
                           f"{shape_str(input.shape)}")
    if not input.is_floating_point():
        raise RuntimeError(f"adaptive_avg_pool2d: expected a floating point input, got {input.dtype.name}")
    return Resample2d.apply(input, mh=_adaptive_matrix(h, oh), mw=_adaptive_matrix(w, ow))


def _scale_value(scale, size, out):
    """torch's compute_scales_value, in float32."""
    if scale is not None and scale > 0:
        return np.float32(1.0 / scale)
    return np.float32(size) / np.float32(out)


def _nearest_matrix(size, out, scale):
    if out == size:
        idx = np.arange(out)
    elif out == 2 * size:
        idx = np.arange(out) >> 1
    else:
        s = _scale_value(scale, size, out)
        idx = np.minimum(np.floor(np.arange(out, dtype=np.float32) * s).astype(np.int64), size - 1)
    m = np.zeros((out, size))
    m[np.arange(out), idx] = 1.0
    return m


def _linear_matrix(size, out, scale, align_corners):
    """torch's upsample_bilinear2d weights along one axis (area_pixel_compute_source_index)."""
    if out == size:  # torch copies an axis whose size does not change, whatever scale_factor says
        return np.eye(size)
    f32 = np.float32
    dst = np.arange(out, dtype=f32)
    if align_corners:
        s = f32(size - 1) / f32(out - 1) if out > 1 else f32(0)
        src = s * dst
    else:
        s = _scale_value(scale, size, out)
        src = np.maximum(s * (dst + f32(0.5)) - f32(0.5), f32(0))
    i0 = np.minimum(np.floor(src).astype(np.int64), size - 1)
    lam = np.clip(src - i0.astype(f32), f32(0), f32(1))
    i1 = i0 + (i0 < size - 1)
    m = np.zeros((out, size))
    rows = np.arange(out)
    np.add.at(m, (rows, i0), (f32(1) - lam).astype(np.float64))
    np.add.at(m, (rows, i1), lam.astype(np.float64))
    return m


def interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                recompute_scale_factor=None, antialias=False):
    """Resize a 4-D (N, C, H, W) input: mode 'nearest' or 'bilinear', torch's index formulas."""
    op = "interpolate"
    if mode not in ("nearest", "bilinear"):
        raise NotImplementedError(f"{op}: mode {mode!r} is not supported (use 'nearest' or 'bilinear')")
    if input.ndim != 4:
        raise NotImplementedError(f"{op}: expected a 4-D (N, C, H, W) input for mode {mode!r}, got input of "
                                  f"shape {shape_str(input.shape)}")
    if antialias:
        raise NotImplementedError(f"{op}: antialias=True is not supported")
    if mode == "nearest" and align_corners is not None:
        raise ValueError("align_corners option can only be set with the interpolating modes: "
                         "linear | bilinear | bicubic | trilinear")
    if (size is None) == (scale_factor is None):
        raise ValueError(f"{op}: exactly one of size or scale_factor must be defined")
    h, w = input.shape[2:]
    scales = (None, None)
    if size is not None:
        oh, ow = (size, size) if isinstance(size, int) else tuple(int(s) for s in size)
        if isinstance(size, (tuple, list)) and len(size) != 2:
            raise ValueError(f"{op}: size must have 2 elements for a 4-D input, got {size}")
    else:
        sf = (scale_factor, scale_factor) if not isinstance(scale_factor, (tuple, list)) else tuple(scale_factor)
        if len(sf) != 2:
            raise ValueError(f"{op}: scale_factor must have 2 elements for a 4-D input, got {scale_factor}")
        oh, ow = int(math.floor(h * float(sf[0]))), int(math.floor(w * float(sf[1])))
        if not recompute_scale_factor:
            scales = (float(sf[0]), float(sf[1]))
    if oh <= 0 or ow <= 0:
        raise ValueError(f"{op}: output size ({oh}, {ow}) must be positive (input {shape_str(input.shape)})")
    if not input.is_floating_point():
        raise RuntimeError(f"{op}: expected a floating point input, got {input.dtype.name}")
    if mode == "nearest":
        mh, mw = _nearest_matrix(h, oh, scales[0]), _nearest_matrix(w, ow, scales[1])
    else:
        ac = bool(align_corners)
        mh, mw = _linear_matrix(h, oh, scales[0], ac), _linear_matrix(w, ow, scales[1], ac)
    return Resample2d.apply(input, mh=mh, mw=mw)


# ------------------------------------------------------------------ pad
class ConstantPad(Op):
    """Constant padding of the trailing dims; negative widths crop. Its adjoint is itself with the
    widths negated and value 0."""

    name = "ConstantPad"

    @staticmethod
    def forward(ctx, x, widths, value):
        xp = xp_of(x)
        ctx.widths = widths
        shape = tuple(s + lo + hi for s, (lo, hi) in zip(x.shape, widths))
        out = xp.full(shape, value, dtype=x.dtype)
        src = tuple(slice(max(-lo, 0), s - max(-hi, 0)) for s, (lo, hi) in zip(x.shape, widths))
        dst = tuple(slice(max(lo, 0), max(lo, 0) + (sl.stop - sl.start)) for sl, (lo, _) in zip(src, widths))
        out[dst] = x[src]
        return out

    @staticmethod
    def backward(ctx, g):
        return ConstantPad.apply(g, widths=tuple((-lo, -hi) for lo, hi in ctx.widths), value=0)


class IndexPad(Op):
    """reflect / replicate / circular padding: a gather along each padded axis."""

    name = "IndexPad"

    @staticmethod
    def forward(ctx, x, index):
        xp = xp_of(x)
        ctx.index, ctx.in_shape = index, x.shape
        for axis, idx in index:
            x = xp.take(x, xp.asarray(idx), axis=axis)
        return x

    @staticmethod
    def backward(ctx, g):
        return IndexPadGrad.apply(g, index=ctx.index, in_shape=ctx.in_shape)


class IndexPadGrad(Op):
    """Adjoint of IndexPad: scatter-add back along each axis (last gathered first). Each axis's index
    is a few runs of consecutive (or reversed) positions, so the scatter is a few slice adds."""

    name = "IndexPadGrad"

    @staticmethod
    def forward(ctx, g, index, in_shape):
        xp = xp_of(g)
        ctx.index = index
        for axis, idx in reversed(index):
            shape = list(g.shape)
            shape[axis] = in_shape[axis]
            acc = xp.zeros(shape, dtype=g.dtype)
            lead = (slice(None),) * axis
            for src, dst in _runs(idx):
                acc[lead + (dst,)] += g[lead + (src,)]
            g = acc
        return g

    @staticmethod
    def backward(ctx, gg):
        return IndexPad.apply(gg, index=ctx.index)


def _runs(idx):
    """Split a gather index into (output slice, input slice) pairs of step +1 or -1; within one pair
    no input position repeats, so `acc[dst] += g[src]` is a correct scatter-add."""
    idx = [int(i) for i in idx]
    start = 0
    while start < len(idx):
        end, step = start + 1, 1
        if end < len(idx) and idx[end] - idx[start] in (1, -1):
            step = idx[end] - idx[start]
            while end < len(idx) and idx[end] - idx[end - 1] == step:
                end += 1
        first, last = idx[start], idx[end - 1]
        stop = last + step if last + step >= 0 else None
        yield slice(start, end), slice(first, stop, step)
        start = end


def _pad_index(n, lo, hi, mode):
    i = np.arange(-lo, n + hi)
    if mode == "reflect":
        i = np.abs(i)
        i = np.where(i > n - 1, 2 * (n - 1) - i, i)
    elif mode == "replicate":
        i = np.clip(i, 0, n - 1)
    else:  # circular, as torch: crop the negative widths first, then wrap within what is left
        lo_crop, hi_crop = max(-lo, 0), max(-hi, 0)
        kept = n - lo_crop - hi_crop
        i = lo_crop + np.mod(np.arange(-max(lo, 0), kept + max(hi, 0)), max(kept, 1))
    return i


def pad(input, pad, mode="constant", value=None):
    """F.pad: `pad` lists (left, right) widths from the last dim backward; negative widths crop."""
    op = "pad"
    pad = tuple(int(p) for p in pad)
    if len(pad) % 2:
        raise RuntimeError(f"{op}: padding length must be divisible by 2, got {len(pad)}")
    nd = len(pad) // 2
    if nd > input.ndim:
        raise RuntimeError(f"{op}: padding length {len(pad)} is too large for a {input.ndim}-D input "
                           f"of shape {shape_str(input.shape)}")
    widths = [(0, 0)] * input.ndim
    for i in range(nd):
        widths[input.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    widths = tuple(widths)
    for s, (lo, hi) in zip(input.shape, widths):
        if s + lo + hi < 0:
            raise RuntimeError(f"{op}: the input size {s}, plus negative padding {lo} and {hi} resulted in a "
                               f"negative output size, which is invalid (input {shape_str(input.shape)}, pad {pad})")
    if mode == "constant":
        return ConstantPad.apply(input, widths=widths, value=0 if value is None else value)
    if mode not in ("reflect", "replicate", "circular"):
        raise NotImplementedError(f"{op}: unknown padding mode {mode!r}")
    if value not in (None, 0):
        raise ValueError(f"{op}: padding mode {mode!r} doesn't take in value argument")
    if not 1 <= nd <= 3 or not nd + 1 <= input.ndim <= nd + 2:
        raise NotImplementedError(f"{op}: {mode} padding of {nd} dims needs a {nd + 1}-D or {nd + 2}-D input, "
                                  f"got input of shape {shape_str(input.shape)}")
    index = []
    for axis, (lo, hi) in enumerate(widths):
        if lo == 0 and hi == 0:
            continue
        n = input.shape[axis]
        if mode == "reflect" and (lo >= n or hi >= n):
            raise RuntimeError(f"{op}: padding size should be less than the corresponding input dimension, "
                               f"but got padding ({lo}, {hi}) at dimension {axis} of input {shape_str(input.shape)}")
        if mode == "circular" and max(lo, hi) > n + min(lo, 0) + min(hi, 0):
            raise RuntimeError(f"{op}: padding value causes wrapping around more than once "
                               f"(padding ({lo}, {hi}) at dimension {axis} of input {shape_str(input.shape)})")
        if mode == "replicate" and n == 0:
            raise RuntimeError(f"{op}: replicate padding of an empty dimension {axis} of input "
                               f"{shape_str(input.shape)}")
        index.append((axis, _pad_index(n, lo, hi, mode)))
    if not index:
        return input
    return IndexPad.apply(input, index=tuple(index))
