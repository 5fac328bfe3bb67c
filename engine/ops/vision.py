"""Vision functions of torch.nn.functional beyond convolution and pooling: `pixel_shuffle` /
`pixel_unshuffle`, `unfold` / `fold` (im2col / col2im).

Why it is built this way:
* These names live in `F` only, as in torch (`torch.unfold` is not `F.unfold`), so they are a
  family of their own that engine/__init__.py does not star-import into `engine.*`.
* pixel_shuffle / pixel_unshuffle are a reshape, a permute and a reshape of engine ops: exactly
  torch's own decomposition, so autograd gives the gradient (and double backward) for free.
* unfold and fold are one linear map and its adjoint: `Im2Col` reads the strided window view of
  the padded input (conv.py's `_windows`), `Col2Im` adds each kernel offset's column block back
  (a loop over kh*kw, never over pixels). Each is the other's backward, so gradients of any order
  need no further kernels.
"""
from ..backend import xp_of
from ._core import reshape, shape_str
from .conv import _offset_slices, _pad_hw, _windows, _work_dtype
from .op import Op

__all__ = ["pixel_shuffle", "pixel_unshuffle", "unfold", "fold"]


# ------------------------------------------------------------------ pixel shuffle
def _check_factor(input, factor, op, arg):
    """torch's argument checks shared by pixel_shuffle and pixel_unshuffle."""
    if isinstance(factor, bool) or not isinstance(factor, int):
        raise TypeError(f"{op}(): argument '{arg}' (position 2) must be int, not {type(factor).__name__}")
    if input.ndim < 3:
        raise RuntimeError(f"{op} expects input to have at least 3 dimensions, but got input with "
                           f"{input.ndim} dimension(s)")
    if factor <= 0:
        raise RuntimeError(f"{op} expects a positive {arg}, but got {factor}")


def pixel_shuffle(input, upscale_factor):
    """(*, C*r*r, H, W) -> (*, C, H*r, W*r): depth to space, as torch (sub-pixel convolution)."""
    r = upscale_factor
    _check_factor(input, r, "pixel_shuffle", "upscale_factor")
    *lead, c, h, w = input.shape
    if c % (r * r):
        raise RuntimeError(f"pixel_shuffle expects its input's 'channel' dimension to be divisible by the square "
                           f"of upscale_factor, but input.size(-3)={c} is not divisible by {r * r}")
    k = len(lead)
    x = reshape(input, (*lead, c // (r * r), r, r, h, w))
    x = x.permute(*range(k), k, k + 3, k + 1, k + 4, k + 2)  # (*, C, H, r, W, r)
    return reshape(x, (*lead, c // (r * r), h * r, w * r))


def pixel_unshuffle(input, downscale_factor):
    """(*, C, H*r, W*r) -> (*, C*r*r, H, W): the inverse of pixel_shuffle."""
    r = downscale_factor
    _check_factor(input, r, "pixel_unshuffle", "downscale_factor")
    *lead, c, h, w = input.shape
    for name, size, dim in (("height", h, -2), ("width", w, -1)):
        if size % r:
            raise RuntimeError(f"pixel_unshuffle expects {name} to be divisible by downscale_factor, but "
                               f"input.size({dim})={size} is not divisible by {r}")
    k = len(lead)
    x = reshape(input, (*lead, c, h // r, r, w // r, r))
    x = x.permute(*range(k), k, k + 2, k + 4, k + 1, k + 3)  # (*, C, r, r, H/r, W/r)
    return reshape(x, (*lead, c * r * r, h // r, w // r))


# ------------------------------------------------------------------ unfold / fold
def _pair_arg(v, name):
    """torch's `_pair` followed by im2col's "It is expected <name> equals to 2" check."""
    v = tuple(v) if isinstance(v, (tuple, list)) else (v, v)
    if len(v) != 2:
        raise RuntimeError(f"It is expected {name} equals to 2, but got size {len(v)}")
    return int(v[0]), int(v[1])


def _window_args(kernel_size, dilation, padding, stride):
    """(kernel, dilation, padding, stride) pairs with torch's positivity checks, in its order."""
    k, d, p, s = (_pair_arg(v, n) for v, n in ((kernel_size, "kernel_size"), (dilation, "dilation"),
                                                 (padding, "padding"), (stride, "stride")))
    if min(k) <= 0:
        raise RuntimeError(f"kernel size should be greater than zero, but got kernel_height: {k[0]} "
                           f"kernel_width: {k[1]}")
    if min(s) <= 0:
        raise RuntimeError(f"stride should be greater than zero, but got stride_height: {s[0]} stride_width: {s[1]}")
    if min(d) <= 0:
        raise RuntimeError(f"dilation should be greater than zero, but got dilation_height: {d[0]} "
                           f"dilation_width: {d[1]}")
    if min(p) < 0:
        raise RuntimeError(f"padding should be non-negative, but got pad_height: {p[0]} pad_width: {p[1]}")
    return k, d, p, s


def _blocks(size, k, d, p, s):
    """Number of sliding blocks along one axis (floor division rounds toward -inf, as torch's)."""
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _float_only(input, kernel):
    if not input.is_floating_point():
        raise NotImplementedError(f'"{kernel}_out_cpu" not implemented for \'{input.dtype.name}\'')


class Im2Col(Op):
    """(N, C, H, W) -> (N, C*kh*kw, L): every sliding block as a column (channel-major, then the
    kernel offset), L blocks in row-major order."""

    name = "Im2Col"

    @staticmethod
    def forward(ctx, x, kernel, dilation, pads, stride, blocks):
        ctx.attrs = dict(kernel=kernel, dilation=dilation, pads=pads, stride=stride, blocks=blocks)
        ctx.size = x.shape[2:]
        n, c = x.shape[:2]
        win = _windows(_pad_hw(x, pads), kernel, stride, dilation, blocks)  # (N, C, KH, KW, OH, OW)
        return win.reshape(n, c * kernel[0] * kernel[1], blocks[0] * blocks[1])

    @staticmethod
    def backward(ctx, g):
        return Col2Im.apply(g, size=ctx.size, **ctx.attrs)


class Col2Im(Op):
    """(N, C*kh*kw, L) -> (N, C, H, W): each column added back where its block lies (overlaps sum)."""

    name = "Col2Im"

    @staticmethod
    def forward(ctx, cols, size, kernel, dilation, pads, stride, blocks):
        ctx.attrs = dict(kernel=kernel, dilation=dilation, pads=pads, stride=stride, blocks=blocks)
        xp = xp_of(cols)
        n, ckk = cols.shape[:2]
        kk = kernel[0] * kernel[1]
        pt, pb, pl, pr = pads
        h, w = size
        parts = cols.astype(_work_dtype(cols), copy=False).reshape(n, ckk // kk, kk, *blocks)
        out = xp.zeros((n, ckk // kk, h + pt + pb, w + pl + pr), dtype=parts.dtype)
        for k, (rows, cs) in _offset_slices(kernel, stride, dilation, blocks):
            out[:, :, rows, cs] += parts[:, :, k]
        return xp.ascontiguousarray(out[:, :, pt:pt + h, pl:pl + w], dtype=cols.dtype)

    @staticmethod
    def backward(ctx, g):
        return Im2Col.apply(g, **ctx.attrs)


def _batched(input, ndim):
    return reshape(input, (1, *input.shape)) if input.ndim == ndim - 1 else input


def _unbatched(out, input, ndim):
    return reshape(out, tuple(out.shape[1:])) if input.ndim == ndim - 1 else out


def unfold(input, kernel_size, dilation=1, padding=0, stride=1):
    """im2col of (N, C, H, W) or (C, H, W): the sliding blocks as columns (N, C*kh*kw, L)."""
    k, d, p, s = _window_args(kernel_size, dilation, padding, stride)
    if input.ndim < 3:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-max(input.ndim, 1)}, "
                         f"{max(input.ndim, 1) - 1}], but got {input.ndim})")
    if input.ndim > 4 or 0 in tuple(input.shape[-3:]):
        raise RuntimeError("Expected 3D or 4D (batch mode) tensor with possibly 0 batch size and other non-zero "
                           f"dimensions for input, but got: {shape_str(input.shape)}")
    h, w = input.shape[-2:]
    blocks = (_blocks(h, k[0], d[0], p[0], s[0]), _blocks(w, k[1], d[1], p[1], s[1]))
    if min(blocks) < 1:
        raise RuntimeError(f"Given input with spatial size ({h}, {w}), kernel_size={k}, dilation={d}, padding={p}, "
                           f"calculated shape of the array of sliding blocks as {blocks}, but its components must "
                           f"be at least one.")
    _float_only(input, "im2col")
    out = Im2Col.apply(_batched(input, 4), kernel=k, dilation=d, pads=(p[0], p[0], p[1], p[1]), stride=s,
                       blocks=blocks)
    return _unbatched(out, input, 4)


def fold(input, output_size, kernel_size, dilation=1, padding=0, stride=1):
    """col2im: sum the columns (N, C*kh*kw, L) or (C*kh*kw, L) back into (N, C, *output_size)."""
    size = _pair_arg(output_size, "output_size")
    k, d, p, s = _window_args(kernel_size, dilation, padding, stride)
    if input.ndim not in (2, 3) or 0 in tuple(input.shape[-2:]):
        raise RuntimeError("Expected 2D or 3D (batch mode) tensor for input with possibly 0 batch size and non-zero "
                           f"dimensions for input, but got: {shape_str(input.shape)}")
    ckk, length = input.shape[-2:]
    if ckk % (k[0] * k[1]):
        raise RuntimeError(f"Expected size of input's dimension 1 to be divisible by the product of kernel_size, but "
                           f"got input.size(1)={ckk} and kernel_size={k}.")
    blocks = (_blocks(size[0], k[0], d[0], p[0], s[0]), _blocks(size[1], k[1], d[1], p[1], s[1]))
    given = f"Given output_size={size}, kernel_size={k}, dilation={d}, padding={p}, stride={s}, "
    if length != blocks[0] * blocks[1]:
        raise RuntimeError(f"{given}expected size of input's dimension 2 to match the calculated number of sliding "
                           f"blocks {blocks[0]} * {blocks[1]} = {blocks[0] * blocks[1]}, but got input.size(2)="
                           f"{length}.")
    if min(blocks) < 1:
        raise RuntimeError(f"{given}calculated shape of the array of sliding blocks as {blocks}, which is too small "
                           "(non-positive)")
    _float_only(input, "col2im")
    out = Col2Im.apply(_batched(input, 3), size=size, kernel=k, dilation=d, pads=(p[0], p[0], p[1], p[1]), stride=s,
                       blocks=blocks)
    return _unbatched(out, input, 3)
