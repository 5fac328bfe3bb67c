"""Convolution, pooling, resampling and padding (`F.conv2d`, `F.avg_pool2d`, `F.interpolate`, ...).

Why it is built this way:
* On x86-64 Linux float32 convolutions (and half types, computed in float32) run on oneDNN's
  direct kernels (engine.backend.onednn: each pass is planned once, about 2x faster than the
  im2col path below on small 3x3 convolutions); everything else, and everything when oneDNN is
  off, runs the numpy kernels below, which stay the reference.
* conv2d is im2col + one batched matmul. The columns come from a strided *view* of the padded
  input (`as_strided`: kernel offsets and output positions are just strides), copied once; for
  stride 1 each kernel offset is even one contiguous slice of the flattened image (see
  `_im2col`). The backward is two fused ops: `Conv2dGradInput` (matmul, then col2im by adding one
  slice per kernel offset: a loop over kh*kw, never over pixels) and `Conv2dGradWeight` (one
  matmul per group over the whole batch). Both are linear in each input, so their own backwards
  are again conv2d / the grad ops: double backward needs no extra kernels.
* conv_transpose2d is Conv2dGradInput's kernel used forward (the transposed weight (in, out/groups,
  kh, kw) reads as conv2d's (out, in/groups, kh, kw)); its backward is conv2d and Conv2dGradWeight.
* Pools loop over kernel offsets the same way; max_pool2d outputs which offset won (an int output
  only backward reads) and scatters its gradient with one bincount.
* adaptive_max_pool2d finds each window's winner on the arrays (the windows differ in size, so
  each is padded to the largest by repeating its last row / column, which changes neither the max
  nor torch's tie and NaN rules), then reads the winners with `gather`, whose backward is the
  scatter-add.
* The 1-D ops (conv1d, conv_transpose1d, max/avg/adaptive_avg/adaptive_max_pool1d) check their
  1-D arguments, then run the 2-D op on a height-1 view.
* adaptive_avg_pool2d and interpolate (every mode: nearest, nearest-exact, (bi/tri)linear, bicubic,
  area, antialiased) are separable linear maps: out =
  Mh @ x @ Mw^T with small matrices built from PyTorch's index formulas (in float32, as PyTorch
  computes them), so one `Resample2d` op (backward: the transposed matrices) serves all three.
* pad (constant) is its own adjoint with negated widths; reflect/replicate/circular pads are
  gathers along each padded axis, whose adjoint is a scatter-add made of a few slice adds.
"""
import math

import numpy as np

from .op import Op, autocast_unifies
from ..backend import dtypes, onednn, xp_of
from ..kernels import scatter_add as scatter_kernels
from ..tensor import Tensor
from ._core import broadcast_to, const_like, replicated, reshape, shape_str
from .indexing import gather
from .linalg import _TORCH_NAMES
from ._kernels import matmul as _matmul

__all__ = ["conv1d", "conv2d", "conv_transpose1d", "conv_transpose2d", "avg_pool1d", "avg_pool2d", "max_pool1d",
           "max_pool2d", "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_max_pool1d", "adaptive_max_pool2d",
           "interpolate", "pad"]


# ------------------------------------------------------------------ helpers
def _pair(v, name, op):
    if isinstance(v, (tuple, list)):
        if len(v) == 1:
            v = (v[0], v[0])
        if len(v) != 2:
            raise RuntimeError(f"{op}: expected {name} to be a single int or a list of 2 ints, got {name}={list(v)}")
        return int(v[0]), int(v[1])
    return int(v), int(v)


def _single(v, name, op):
    """A 1-D op's size argument: an int or a one-element tuple/list."""
    if isinstance(v, (tuple, list)):
        if len(v) != 1:
            raise RuntimeError(f"{op}: expected {name} to be a single int or a list of 1 int, got {name}={list(v)}")
        return int(v[0])
    return int(v)


def _with_height(t):
    """(..., L) -> (..., 1, L): the 1-D ops run as their 2-D versions on a height-1 image."""
    return reshape(t, tuple(t.shape[:-1]) + (1, t.shape[-1]))


def _without_height(t):
    return reshape(t, tuple(t.shape[:-2]) + (t.shape[-1],))


def _as_batched(t, ndim):
    """A batch axis in front of an unbatched (ndim - 1)-D input."""
    return reshape(t, (1,) + tuple(t.shape)) if t.ndim == ndim - 1 else t


def _unbatched_like(out, input, ndim):
    return reshape(out, tuple(out.shape[1:])) if input.ndim == ndim - 1 else out


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
    """Half types are computed in float32 (numpy has no fast float16/bfloat16 matmul); integers in
    int64, cast back modulo 2^bits as torch's wrapping integer kernels give."""
    if a.dtype.kind in "iu":
        return np.dtype(np.int64)
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
    if b is not None:
        b = b.astype(wt, copy=False)
    out = onednn.conv2d(x, w, b, out_hw, stride, pads, dilation, groups)
    if out is not None:
        return out.astype(dt, copy=False)
    cols, q = _im2col(x, (kh, kw), stride, dilation, pads, out_hw, batch_last=False)
    cols = cols.reshape(n, groups, cg * kh * kw, out_hw[0] * q)
    out = _matmul(xp, w.reshape(groups, o // groups, cg * kh * kw), cols)  # (N, G, Og, OH*Q)
    out = out.reshape(n, o, out_hw[0], q)
    if q != out_hw[1]:
        out = xp.ascontiguousarray(out[..., :out_hw[1]])
    if b is not None:
        out += b.reshape(o, 1, 1)
    return out.astype(dt, copy=False)


def _conv2d_grad_input(dy, w, x_shape, stride, pads, dilation, groups):
    xp = xp_of(dy)
    n, c, h, wd = x_shape
    o, cg, kh, kw = w.shape
    oh, ow = dy.shape[2:]
    dt = dy.dtype
    wt = _work_dtype(dy)
    dy, w = dy.astype(wt, copy=False), w.astype(wt, copy=False)
    dx = onednn.conv2d_grad_input(dy, w, x_shape, stride, pads, dilation, groups)
    if dx is not None:
        return dx.astype(dt, copy=False)
    og = o // groups
    pt, pb, pl, pr = pads
    flat = stride == (1, 1)
    q = wd + pl + pr if flat else ow
    wt_m = w.reshape(groups, og, cg * kh * kw).transpose(0, 2, 1)  # (G, K, Og)
    dyg = _widen(dy, q).reshape(n, groups, og, oh * q)
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
    dy, x = dy.astype(wt, copy=False), x.astype(wt, copy=False)
    dw = onednn.conv2d_grad_weight(dy, x, w_shape, stride, pads, dilation, groups)
    if dw is not None:
        return dw.astype(dt, copy=False)
    cols, q = _im2col(x, (kh, kw), stride, dilation, pads, (oh, ow), batch_last=True)
    cols = cols.reshape(groups, cg * kh * kw, n * oh * q)  # (G, K, N*OH*Q)
    og = o // groups
    dyg = _widen(dy, q).reshape(n, groups, og, oh * q)
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


def _check_conv(x, w, b, stride, dilation, groups, op, transposed=False):
    """torch's convolution argument checks. A transposed convolution's weight is (in_channels,
    out_channels/groups, k...): the input has w.shape[0] channels and the output w.shape[1]*groups."""
    if min(stride) <= 0:
        raise RuntimeError(f"{op}: non-positive stride is not supported, got stride={stride}")
    if min(dilation) <= 0:
        raise RuntimeError(f"{op}: dilation should be greater than zero, got dilation={dilation}")
    if groups <= 0:
        raise RuntimeError(f"{op}: non-positive groups is not supported, got groups={groups}")
    if w.shape[0] % groups:
        raise RuntimeError(f"{op}: given groups={groups}, expected weight to be divisible by {groups} at "
                           f"dimension 0, but got weight of size {shape_str(w.shape)} instead")
    in_channels = w.shape[0] if transposed else w.shape[1] * groups
    if x.shape[1] != in_channels:
        raise RuntimeError(f"{op}: given groups={groups}, weight of size {shape_str(w.shape)}, expected "
                           f"input{shape_str(x.shape)} to have {in_channels} channels, but got "
                           f"{x.shape[1]} channels instead")
    operands = (x, w) if b is None else (x, w, b)
    if (x.dtype is not w.dtype or (b is not None and b.dtype is not x.dtype)) and not autocast_unifies(*operands):
        raise RuntimeError(f"{op}: input type ({x.dtype.name}), weight type ({w.dtype.name})"
                           + (f" and bias type ({b.dtype.name})" if b is not None else "") + " should be the same")
    _check_conv_dtype(x, dilation, transposed)
    out_channels = w.shape[1] * groups if transposed else w.shape[0]
    if b is not None and tuple(b.shape) != (out_channels,):
        raise RuntimeError(f"{op}: expected bias of shape [{out_channels}] (out_channels), got bias of shape "
                           f"{shape_str(b.shape)}")


def _check_conv_dtype(x, dilation, transposed):
    """torch's CPU convolution kernels: floats and int64 everywhere, the other integer types only in
    the plain (neither dilated nor transposed) kernel, bool in none; an empty batch runs none."""
    dt = x.dtype
    if dt.is_floating_point or dt is dtypes.int64 or x.shape[0] == 0:
        return
    if transposed:
        kernel = "slow_conv_transpose2d_out_cpu"
    elif max(dilation) > 1:
        kernel = "slow_conv_dilated<>"
    elif dt is dtypes.bool_:
        kernel = "slow_conv2d_cpu"
    else:
        return
    raise NotImplementedError(f'"{kernel}" not implemented for \'{_TORCH_NAMES[dt.name]}\'')


def _check_conv1d_ranks(input, weight, op):
    if input.ndim not in (2, 3):
        raise RuntimeError(f"{op}: expected a 2-D (unbatched) or 3-D (batched) input, got input of shape "
                           f"{shape_str(input.shape)}")
    if weight.ndim != 3:
        raise RuntimeError(f"{op}: expected a 3-D weight, got weight of shape {shape_str(weight.shape)}")


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """1-D cross-correlation over (N, C, L) or (C, L): conv2d on a height-1 image (arguments
    checked here first, so that errors show the 1-D shapes)."""
    op = "conv1d"
    _check_conv1d_ranks(input, weight, op)
    x = _as_batched(input, 3)
    s, d = _single(stride, "stride", op), _single(dilation, "dilation", op)
    _check_conv(x, weight, bias, (s,), (d,), int(groups), op)
    pad = padding if isinstance(padding, str) else (0, _single(padding, "padding", op))
    if isinstance(padding, str) and padding == "same" and s != 1:
        raise ValueError(f"{op}: padding='same' is not supported for strided convolutions")
    out = _without_height(conv2d(_with_height(x), _with_height(weight), bias, (1, s), pad, (1, d), groups))
    return _unbatched_like(out, input, 3)


# ------------------------------------------------------------------ transposed convolution
class ConvTranspose2d(Op):
    """conv_transpose2d: the input gradient of conv2d (the same kernel as Conv2dGradInput, with the
    transposed weight (in, out/groups, kh, kw) read as conv2d's (out, in/groups, kh, kw)) plus a
    bias. Its derivatives are conv2d itself (input) and Conv2dGradWeight with the roles of input
    and output gradient swapped (weight)."""

    name = "ConvTranspose2d"
    autocast = "lower"
    save_inputs = (0, 1)

    @staticmethod
    def forward(ctx, x, w, b, out_hw, stride, pads, dilation, groups):
        ctx.params = dict(stride=stride, pads=pads, dilation=dilation, groups=groups)
        c = w.shape[1] * groups
        out = _conv2d_grad_input(x, w, (x.shape[0], c) + tuple(out_hw), stride, pads, dilation, groups)
        if b is not None:
            out += b.reshape(c, 1, 1)
        return out

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        need = ctx.needs_input_grad
        dx = dw = db = None
        if need[0]:
            dx = Conv2d.apply(g, w, None, **ctx.params)
            if tuple(dx.shape[2:]) != tuple(x.shape[2:]):
                # output_padding >= stride (allowed below the dilation): the output's last rows and
                # columns are read by no input position; conv2d of g then covers positions past
                # the input's, which get no gradient
                dx = dx[:, :, :x.shape[2], :x.shape[3]]
        if need[1]:
            dw = Conv2dGradWeight.apply(x, g, w_shape=tuple(w.shape), **ctx.params)
        if len(need) > 2 and need[2]:
            db = ChannelSum.apply(g)
        return dx, dw, db


def _transpose_args(x, weight, bias, stride, padding, output_padding, dilation, groups, op):
    """Checks torch makes for a transposed convolution; returns the output size and padding."""
    if isinstance(padding, str):
        raise TypeError(f"{op}: argument 'padding' must be an int or a tuple of ints, not str ({padding!r})")
    groups = int(groups)
    _check_conv(x, weight, bias, stride, dilation, groups, op, transposed=True)
    if min(padding) < 0:
        raise RuntimeError(f"{op}: negative padding is not supported, got padding={padding}")
    if min(output_padding) < 0:
        raise RuntimeError(f"{op}: negative output_padding is not supported, got output_padding={output_padding}")
    for op_, s, d in zip(output_padding, stride, dilation):
        if op_ >= s and op_ >= d:
            raise RuntimeError(f"{op}: output padding must be smaller than either stride or dilation, but got "
                               f"output_padding={output_padding}, stride={stride} and dilation={dilation}")
    out = tuple((size - 1) * s - 2 * p + d * (k - 1) + op_ + 1 for size, s, p, d, k, op_ in
                zip(x.shape[2:], stride, padding, dilation, weight.shape[2:], output_padding))
    if min(out) <= 0:
        raise RuntimeError(f"{op}: given input of shape {shape_str(x.shape)}, weight of shape "
                           f"{shape_str(weight.shape)}, stride={stride}, padding={padding} and dilation="
                           f"{dilation}, the calculated output size {list(out)} is too small")
    return out


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """2-D transposed convolution ("deconvolution") over (N, C, H, W) or (C, H, W), as torch's:
    H_out = (H - 1) * stride - 2 * padding + dilation * (kH - 1) + output_padding + 1."""
    op = "conv_transpose2d"
    if input.ndim not in (3, 4):
        raise RuntimeError(f"{op}: expected a 3-D (unbatched) or 4-D (batched) input, got input of shape "
                           f"{shape_str(input.shape)}")
    if weight.ndim != 4:
        raise RuntimeError(f"{op}: expected a 4-D weight (in_channels, out_channels/groups, kH, kW), got "
                           f"weight of shape {shape_str(weight.shape)}")
    x = _as_batched(input, 4)
    stride, dilation = _pair(stride, "stride", op), _pair(dilation, "dilation", op)
    padding = padding if isinstance(padding, str) else _pair(padding, "padding", op)
    output_padding = _pair(output_padding, "output_padding", op)
    out_hw = _transpose_args(x, weight, bias, stride, padding, output_padding, dilation, groups, op)
    pads = (padding[0], padding[0], padding[1], padding[1])
    out = ConvTranspose2d.apply(x, weight, bias, out_hw=out_hw, stride=stride, pads=pads, dilation=dilation,
                                groups=int(groups))
    return _unbatched_like(out, input, 4)


def conv_transpose1d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """1-D transposed convolution over (N, C, L) or (C, L): conv_transpose2d on a height-1 image."""
    op = "conv_transpose1d"
    _check_conv1d_ranks(input, weight, op)
    x = _as_batched(input, 3)
    s, d = _single(stride, "stride", op), _single(dilation, "dilation", op)
    if isinstance(padding, str):
        raise TypeError(f"{op}: argument 'padding' must be an int or a tuple of ints, not str ({padding!r})")
    p, op_ = _single(padding, "padding", op), _single(output_padding, "output_padding", op)
    _transpose_args(x, weight, bias, (s,), (p,), (op_,), (d,), groups, op)
    out = conv_transpose2d(_with_height(x), _with_height(weight), bias, (1, s), (0, p), (0, op_), groups, (1, d))
    return _unbatched_like(_without_height(out), input, 3)


# ------------------------------------------------------------------ pooling
def _pool_out(size, k, s, p, d, ceil_mode):
    eff = d * (k - 1) + 1
    out = (size + 2 * p - eff + ((s - 1) if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _pool_args(input, kernel_size, stride, padding, dilation, ceil_mode, op):
    """Kernel, stride, dilation, padded extents and output size of a 2-D pool, with torch's checks:
    a 3-D or 4-D input whose non-batch dims are non-empty, positive sizes, 0 <= pad <= kernel // 2
    (the kernel size, not the dilated extent, as torch's max_pool2d checks)."""
    if input.ndim not in (3, 4):
        raise RuntimeError(f"{op}: expected a 3-D or 4-D input, got input of shape {shape_str(input.shape)}")
    if 0 in tuple(input.shape[input.ndim - 3:]):
        raise RuntimeError(f"{op}: expected a 3-D or 4-D (batch mode) input with non-zero sizes except an optional "
                           f"zero batch size, got input of shape {shape_str(input.shape)}")
    k = _pair(kernel_size, "kernel_size", op)
    s = k if stride is None or (isinstance(stride, (tuple, list)) and len(stride) == 0) else _pair(stride, "stride", op)
    p = _pair(padding, "padding", op)
    d = _pair(dilation, "dilation", op)
    if min(k) <= 0 or min(s) <= 0 or min(d) <= 0:
        raise RuntimeError(f"{op}: kernel_size, stride and dilation must be positive, got kernel_size={k}, "
                           f"stride={s}, dilation={d}")
    if min(p) < 0:
        raise RuntimeError(f"{op}: pad must be non-negative, got padding={p}")
    for pi, ki in zip(p, k):
        if pi > ki // 2:
            raise RuntimeError(f"{op}: pad should be at most half of kernel size, but got pad={p}, kernel_size={k}")
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
    return _as_batched(input, 4)


def _from4d(out, like):
    return _unbatched_like(out, like, 4)


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
        d = xp_of(x).asarray(divisor, dtype=wt)
        if acc.dtype.kind == "i":  # int64 (torch's only integer avg_pool): C's division, toward zero
            q = acc // d
            return q + (((acc - q * d) != 0) & ((acc < 0) != (d < 0)))
        acc /= d
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
    return _avg_pool(input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override,
                     "avg_pool2d")


def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    """Mean over windows of the last dim of (N, C, L) or (C, L): avg_pool2d on a height-1 image."""
    op = "avg_pool1d"
    if input.ndim not in (2, 3):
        raise RuntimeError(f"{op}: expected a 2-D or 3-D input, got input of shape {shape_str(input.shape)}")
    k = _single(kernel_size, "kernel_size", op)
    s = None if stride is None or (isinstance(stride, (tuple, list)) and len(stride) == 0) else \
        (1, _single(stride, "stride", op))
    out = _avg_pool(_with_height(input), (1, k), s, (0, _single(padding, "padding", op)), ceil_mode,
                    count_include_pad, None, op)
    return _without_height(out)


def _avg_pool(input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, op):
    a = _pool_args(input, kernel_size, stride, padding, 1, ceil_mode, op)
    if not input.is_floating_point() and input.dtype is not dtypes.int64:  # torch's kernel is avg_pool2d's
        raise NotImplementedError(f'"avg_pool2d" not implemented for \'{_TORCH_NAMES[input.dtype.name]}\'')
    if divisor_override is not None:
        if divisor_override == 0:
            raise RuntimeError(f"{op}: divisor must be not zero")
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
        dx = scatter_kernels.bincount(flat.reshape(-1), g.reshape(-1), n * c * hp * wp, size=n * c * hp * wp)
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
    return _max_pool(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices, "max_pool2d")


def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """Max over windows of the last dim of (N, C, L) or (C, L): max_pool2d on a height-1 image;
    return_indices gives positions along L."""
    op = "max_pool1d"
    if input.ndim not in (2, 3):
        raise RuntimeError(f"{op}: expected a 2-D or 3-D (batch mode) input, got input of shape "
                           f"{shape_str(input.shape)}")
    if not return_indices and not input.is_floating_point():
        # torch's max_pool1d kernel has no integer version (its return_indices path does)
        raise NotImplementedError(f"{op}: not implemented for integer inputs ({input.dtype.name}) unless "
                                  f"return_indices=True")
    k = _single(kernel_size, "kernel_size", op)
    s = None if stride is None or (isinstance(stride, (tuple, list)) and len(stride) == 0) else \
        (1, _single(stride, "stride", op))
    out = _max_pool(_with_height(input), (1, k), s, (0, _single(padding, "padding", op)),
                    (1, _single(dilation, "dilation", op)), ceil_mode, return_indices, op)
    if return_indices:
        return _without_height(out[0]), _without_height(out[1])
    return _without_height(out)


def _max_pool(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices, op):
    a = _pool_args(input, kernel_size, stride, padding, dilation, ceil_mode, op)
    if input.dtype is dtypes.bool_:
        raise NotImplementedError(f"{op}: not implemented for 'Bool'")
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
    if input.ndim < 3:
        raise ValueError(f"adaptive_avg_pool2d: Input dimension should be at least 3, got input of shape "
                         f"{shape_str(input.shape)}")
    if input.ndim != 4 and input.ndim != 3:
        raise RuntimeError(f"adaptive_avg_pool2d: expected a 3-D or 4-D input, got input of shape "
                           f"{shape_str(input.shape)}")
    h, w = input.shape[-2:]
    if isinstance(output_size, (tuple, list)):
        if len(output_size) != 2:
            raise RuntimeError(f"adaptive_avg_pool2d: output_size must be 2, got {output_size!r}")
        oh, ow = output_size
    else:
        oh = ow = output_size
    oh, ow = h if oh is None else int(oh), w if ow is None else int(ow)
    return _adaptive_avg_pool(input, oh, ow, output_size, "adaptive_avg_pool2d")


def adaptive_avg_pool1d(input, output_size):
    """Average over torch's adaptive windows along the last dim of (N, C, L) or (C, L)."""
    op = "adaptive_avg_pool1d"
    if input.ndim not in (2, 3):
        raise RuntimeError(f"{op}: expected a 2-D or 3-D input, got input of shape {shape_str(input.shape)}")
    if output_size is None or (isinstance(output_size, (tuple, list)) and None in output_size):
        raise TypeError(f"{op}: output_size must be an int or a tuple of one int, got {output_size!r}")
    out = _adaptive_avg_pool(_with_height(input), 1, _single(output_size, "output_size", op), output_size, op)
    return _without_height(out)


def _adaptive_avg_pool(input, oh, ow, output_size, op):
    h, w = input.shape[-2:]
    if oh < 0 or ow < 0 or (input.numel() and (h == 0 or w == 0)):
        raise RuntimeError(f"{op}: invalid output_size {output_size} for input of shape {shape_str(input.shape)}")
    if not input.is_floating_point():
        raise NotImplementedError(f"{op}: integer inputs are not supported, got {input.dtype.name}")
    return Resample2d.apply(input, mh=_adaptive_matrix(h, oh), mw=_adaptive_matrix(w, ow))


def _adaptive_taps(size, out):
    """(out, K) input positions of torch's adaptive windows [floor(i*size/out), ceil((i+1)*size/out)),
    K the widest; a narrower window repeats its last position."""
    i = np.arange(out)
    start, end = (i * size) // out, -((-(i + 1) * size) // out)
    width = int((end - start).max()) if out else 0
    return np.minimum(start[:, None] + np.arange(width), end[:, None] - 1)


def _adaptive_max_index(x, oh, ow):
    """Flat h*W+w index of each adaptive window's maximum of an (N, C, H, W) array: the first
    maximum, or the last NaN, as torch's kernel."""
    xp = xp_of(x)
    n, c, h, w = x.shape
    if oh * ow == 0:
        return xp.zeros((n, c, oh, ow), dtype=np.int64)
    rows, cols = _adaptive_taps(h, oh), _adaptive_taps(w, ow)
    flat = (rows[:, None, :, None] * w + cols[None, :, None, :]).reshape(oh, ow, rows.shape[1] * cols.shape[1])
    win = x.reshape(n, c, h * w)[:, :, xp.asarray(flat)]  # (N, C, OH, OW, KH*KW)
    arg = win.argmax(axis=-1)
    if x.dtype.kind not in "iu" and bool(xp.isnan(win).any()):
        nan = xp.isnan(win)
        arg = xp.where(nan.any(axis=-1), win.shape[-1] - 1 - nan[..., ::-1].argmax(axis=-1), arg)
    return xp.take_along_axis(xp.broadcast_to(xp.asarray(flat), win.shape), arg[..., None], axis=-1)[..., 0]


def adaptive_max_pool2d(input, output_size, return_indices=False):
    """Max over torch's adaptive windows of (N, C, H, W) or (C, H, W); `None` in output_size keeps
    that input size; return_indices gives flat h*W+w positions (int64)."""
    op = "adaptive_max_pool2d"
    sizes = tuple(output_size) if isinstance(output_size, (tuple, list)) else (output_size, output_size)
    if isinstance(output_size, (tuple, list)) and input.ndim <= len(sizes):  # torch's _list_with_default
        raise ValueError(f"Input dimension should be at least {len(sizes) + 1}")
    if input.ndim not in (3, 4):
        raise RuntimeError(f"{op}(): Expected 3D or 4D tensor, but got: {shape_str(input.shape)}")
    if len(sizes) != 2:
        raise RuntimeError(f"{op}(): internal error: output_size.size() must be 2")
    oh, ow = (int(input.shape[-2 + i]) if v is None else int(v) for i, v in enumerate(sizes))
    return _adaptive_max_pool(input, oh, ow, return_indices, op)


def adaptive_max_pool1d(input, output_size, return_indices=False):
    """Max over torch's adaptive windows along the last dim of (N, C, L) or (C, L)."""
    op = "adaptive_max_pool1d"
    if input.ndim not in (2, 3):
        raise RuntimeError(f"Expected 2 to 3 dimensions, but got {input.ndim}-dimensional tensor for argument #1 "
                           f"'self' (while checking arguments for {op})")
    if output_size is None:
        raise TypeError(f"{op}(): argument 'output_size' (position 2) must be tuple of ints, not NoneType")
    if isinstance(output_size, (tuple, list)) and len(output_size) != 1:
        raise RuntimeError(f"{op}() argument 'output_size' should contain one int (got {len(output_size)})")
    ol = int(output_size[0] if isinstance(output_size, (tuple, list)) else output_size)
    out = _adaptive_max_pool(_with_height(input), 1, ol, return_indices, op)
    return tuple(_without_height(t) for t in out) if return_indices else _without_height(out)


def _adaptive_max_pool(input, oh, ow, return_indices, op):
    if oh < 0 or ow < 0:
        raise RuntimeError(f"Trying to create tensor with negative dimension {min(oh, ow)}: "
                           f"{list(input.shape[:-2]) + [oh, ow]}")
    for dim in range(1 if input.ndim == 4 else 0, input.ndim):
        if input.shape[dim] == 0:
            raise RuntimeError(f"adaptive_max_pool2d(): Expected input to have non-zero size for non-batch "
                               f"dimensions, but input has sizes {list(input.shape)} with dimension {dim} being empty")
    if not input.is_floating_point():
        raise NotImplementedError(f'"adaptive_max_pool2d" not implemented for \'{input.dtype.name}\'')
    x = replicated(_as4d(input))  # (a global input: the winners are found on the whole value)
    n, c, h, w = x.shape
    index = const_like(_adaptive_max_index(x._data, oh, ow).astype(np.int64), x)  # (N, C, OH, OW)
    flat = reshape(index, (n, c, oh * ow))
    out = reshape(gather(reshape(x, (n, c, h * w)), 2, flat), (n, c, oh, ow))
    if not return_indices:
        return _from4d(out, input)
    return _from4d(out, input), _from4d(index, input)


_MODES = {"nearest": None, "nearest-exact": None, "area": None, "linear": 1, "bilinear": 2, "bicubic": 2,
          "trilinear": 3}
_CUBIC_A = -0.75


def _scale(n_in, n_out, align_corners, scale, dtype):
    if align_corners:
        return dtype((n_in - 1) / (n_out - 1)) if n_out > 1 else dtype(0)
    if scale is not None and scale > 0:
        return dtype(1.0) / dtype(scale)
    return dtype(n_in) / dtype(n_out)


def _nearest_matrix(n_in, n_out, scale, exact):
    w = np.zeros((n_out, n_in))
    dst = np.arange(n_out)
    if n_out == 2 * n_in and not exact:  # (a same-size axis never gets here: interpolate copies it)
        src = dst >> 1
    else:
        s = _scale(n_in, n_out, False, scale, np.float32)
        pos = (dst.astype(np.float32) + np.float32(0.5 if exact else 0.0)) * s
        src = np.minimum(np.floor(pos).astype(np.int64), n_in - 1)
    w[dst, src] = 1.0
    return w


def _linear_matrix(n_in, n_out, scale, align_corners, dtype):
    w = np.zeros((n_out, n_in))
    s = _scale(n_in, n_out, align_corners, scale, dtype)
    dst = np.arange(n_out).astype(dtype)
    src = s * dst if align_corners else np.maximum(s * (dst + dtype(0.5)) - dtype(0.5), dtype(0))
    i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    i1 = np.minimum(i0 + 1, n_in - 1)
    lam = (src - i0).astype(np.float64)
    rows = np.arange(n_out)
    np.add.at(w, (rows, i0), 1.0 - lam)
    np.add.at(w, (rows, i1), lam)
    return w


def _keys(x, a):
    """Keys' cubic convolution kernel at distance x."""
    x = np.abs(x)
    return np.where(x <= 1.0, ((a + 2) * x - (a + 3)) * x * x + 1,
                    np.where(x < 2.0, ((a * x - 5 * a) * x + 8 * a) * x - 4 * a, 0.0))


def _cubic_matrix(n_in, n_out, scale, align_corners, dtype):
    w = np.zeros((n_out, n_in))
    s = _scale(n_in, n_out, align_corners, scale, dtype)
    dst = np.arange(n_out).astype(dtype)
    src = s * dst if align_corners else s * (dst + dtype(0.5)) - dtype(0.5)
    i = np.floor(src).astype(np.int64)
    t = (src - np.floor(src)).astype(np.float64)
    rows = np.arange(n_out)
    for k in range(4):  # taps at offsets -1, 0, 1, 2 from floor(src)
        np.add.at(w, (rows, np.clip(i - 1 + k, 0, n_in - 1)), _keys(t + 1 - k, _CUBIC_A))
    return w


def _antialias_matrix(n_in, n_out, scale, align_corners, cubic, dtype):
    """torch's antialiased (PIL-style) filter: when shrinking, the kernel widens by the scale and
    each row's weights are normalised to sum to 1. Bicubic uses Keys' a = -0.5 here, as PIL."""
    s = float(_scale(n_in, n_out, align_corners, scale, dtype))
    size = 4 if cubic else 2
    support = size * 0.5 * s if s >= 1.0 else size * 0.5
    invscale = 1.0 / s if s >= 1.0 else 1.0

    def taps(x):
        return _keys(x, -0.5) if cubic else np.maximum(0.0, 1.0 - np.abs(x))

    w = np.zeros((n_out, n_in))
    for i in range(n_out):
        center = s * (i + 0.5)
        lo = max(int(center - support + 0.5), 0)
        hi = min(int(center + support + 0.5), n_in)
        row = taps((np.arange(lo, hi) - center + 0.5) * invscale)
        total = row.sum()
        w[i, lo:hi] = row / total if total != 0 else row
    return w


def _axis_matrix(mode, n_in, n_out, scale, align_corners, dtype, antialias=False):
    if antialias:
        return _antialias_matrix(n_in, n_out, scale, align_corners, mode == "bicubic", dtype)
    if mode in ("nearest", "nearest-exact"):
        return _nearest_matrix(n_in, n_out, scale, mode == "nearest-exact")
    if mode == "area":
        return _adaptive_matrix(n_in, n_out)
    if mode == "bicubic":
        return _cubic_matrix(n_in, n_out, scale, align_corners, dtype)
    return _linear_matrix(n_in, n_out, scale, align_corners, dtype)


def _as_list(value, n, what):
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"Input and {what} must have the same number of spatial dimensions, but got input with "
                             f"spatial dimensions of {n} and {what} of length {len(value)}.")
        return list(value)
    return [value] * n


def _output_sizes(input, size, scale_factor, recompute_scale_factor):
    spatial = tuple(input.shape[2:])
    n = len(spatial)
    if size is not None and scale_factor is not None:
        raise ValueError("interpolate: only one of size or scale_factor should be defined "
                         "(exactly one of size or scale_factor must be given)")
    if size is None and scale_factor is None:
        raise ValueError("interpolate: either size or scale_factor should be defined")
    if size is not None:
        if recompute_scale_factor:
            raise ValueError("recompute_scale_factor is not meaningful with an explicit size.")
        sizes = [int(s) for s in _as_list(size, n, "output_size")]
        return sizes, [None] * n
    scales = [float(s) for s in _as_list(scale_factor, n, "scale_factor")]
    sizes = [int(math.floor(d * s)) for d, s in zip(spatial, scales)]
    return sizes, ([None] * n if recompute_scale_factor else scales)


def interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                recompute_scale_factor=None, antialias=False):
    if not isinstance(input, Tensor):
        raise TypeError(f"interpolate: expected a Tensor input, got {type(input).__name__}")
    if mode not in _MODES:
        raise NotImplementedError(f"interpolate: mode {mode!r} is not supported (one of {', '.join(_MODES)})")
    linear_like = mode in ("linear", "bilinear", "bicubic", "trilinear")
    if align_corners is not None and not linear_like:
        raise ValueError("align_corners option can only be set with the interpolating modes: "
                         "linear | bilinear | bicubic | trilinear")
    if antialias and (mode not in ("bilinear", "bicubic") or input.dim() != 4):
        raise ValueError("Anti-alias option is restricted to bilinear and bicubic modes and requires a 4-D tensor")
    if input.dim() not in (3, 4, 5):
        raise NotImplementedError(f"interpolate: input of shape {shape_str(input.shape)}: expected a 3-D, 4-D or "
                                  f"5-D (N, C, *spatial) input for mode {mode!r}")
    want = _MODES[mode]
    if want is not None and input.dim() - 2 != want:
        raise NotImplementedError(f"Got {input.dim()}D input, but {mode} mode needs {want + 2}D input")
    if not input.is_floating_point():
        raise NotImplementedError(f"interpolate: integer inputs are not supported, got {input.dtype.name}")
    sizes, scales = _output_sizes(input, size, scale_factor, recompute_scale_factor)
    for d, s in zip(input.shape[2:], sizes):
        if s <= 0 or d <= 0:
            raise RuntimeError(f"interpolate: input {shape_str(input.shape)} and output {sizes} sizes should be "
                               "greater than 0")
    precision = np.float64 if input.dtype.name == "float64" else np.float32
    # torch copies an axis whose size does not change, whatever scale_factor says, in every mode
    # but plain bicubic (whose kernel runs on every axis)
    cubic = mode == "bicubic" and not antialias
    mats = [_axis_matrix(mode, n_in, n_out, scale, bool(align_corners), precision, antialias)
            if n_in != n_out or (cubic and scale is not None and scale != 1.0) else np.eye(n_in)
            for n_in, n_out, scale in zip(input.shape[2:], sizes, scales)]
    if len(mats) == 1:  # (N, C, L) as (N, C, 1, L)
        return _without_height(Resample2d.apply(_with_height(input), mh=np.eye(1), mw=mats[0]))
    if len(mats) == 2:
        return Resample2d.apply(input, mh=mats[0], mw=mats[1])
    out = Resample2d.apply(input, mh=mats[1], mw=mats[2])  # (N, C, D, H, W): H and W, then D as "rows"
    out = Resample2d.apply(out.transpose(2, 3), mh=mats[0], mw=np.eye(sizes[2]))  # (N, C, H', D, W')
    return out.transpose(2, 3)


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
