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
* affine_grid is torch's `affine_grid_generator`: a constant base grid (torch's linspace formula)
  times theta^T, one engine matmul, so theta's gradient (and double backward) is autograd's.
* grid_sample (4-D: bilinear, nearest, bicubic; 5-D: trilinear ("bilinear"), nearest) is one
  `GridSampler` op. Each output point reads a few *taps* (2^d corners, 1 nearest pixel, 4x4
  bicubic taps): per spatial axis a list of (index, in-bounds, weight, d weight / d coordinate)
  built from torch's coordinate formulas (GridSampler.h: unnormalize, clip, reflect, with their
  gradient multipliers), combined over the axes. The forward gathers each tap for all points and
  channels at once (a loop over the taps, never over pixels); `GridSamplerGrad` scatters the
  input gradient with one bincount and sums the grid gradient from the same taps (zero for
  nearest, as torch). Like torch's grid_sampler_2d_backward it has no derivative of its own.
"""
import itertools
import warnings

import numpy as np

from ..backend import xp_of
from ..kernels import scatter_add as scatter_kernels
from ..tensor import Tensor
from ._core import NoDoubleBackward, reshape, shape_str
from .conv import _offset_slices, _pad_hw, _windows, _work_dtype
from .linalg import _TORCH_NAMES, matmul
from .op import Op

__all__ = ["pixel_shuffle", "pixel_unshuffle", "unfold", "fold", "affine_grid", "grid_sample"]


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


# ------------------------------------------------------------------ affine_grid / grid_sample
_ALIGN_WARNING = ("Default grid_sample and affine_grid behavior has changed to align_corners=False since 1.3.0. "
                  "Please specify align_corners=True if the old behavior is desired. See the documentation of "
                  "grid_sample for details.")


def _linspace_from_neg_one(xp, n, align_corners, dtype):
    """torch's `linspace(-1, 1, n)` (the halves computed from each end, as its kernel), scaled by
    (n-1)/n without align_corners; a single point is 0."""
    if n <= 1:
        return xp.zeros((1,), dtype=dtype)
    i = xp.arange(n, dtype=dtype)
    step = dtype(2) / dtype(n - 1)
    r = xp.where(i < n // 2, dtype(-1) + step * i, dtype(1) - step * (n - 1 - i)).astype(dtype)
    return r if align_corners else (r * dtype(n - 1) / dtype(n)).astype(dtype)


def affine_grid(theta, size, align_corners=None):
    """Sampling grid (N, H, W, 2) / (N, D, H, W, 3) of the affine maps theta (N, 2, 3) / (N, 3, 4)."""
    if align_corners is None:
        warnings.warn(_ALIGN_WARNING, stacklevel=2)
        align_corners = False
    if not theta.is_floating_point():
        raise ValueError(f"Expected theta to have floating point type, but got {theta.dtype}")
    size = tuple(int(s) for s in size)
    if len(size) not in (4, 5):
        raise NotImplementedError("affine_grid only supports 4D and 5D sizes, for 2D and 3D affine transforms, "
                                  f"respectively. Got size {size}.")
    d = len(size) - 2
    if theta.ndim != 3 or tuple(theta.shape[-2:]) != (d, d + 1):
        raise ValueError(f"Expected a batch of {d}D affine matrices of shape Nx{d}x{d + 1} for size {size}. "
                         f"Got {shape_str(theta.shape)}.")
    spatial = size[2:]
    if align_corners and min(spatial) == 1:
        warnings.warn("Since version 1.3.0, affine_grid behavior has changed for unit-size grids when "
                      "align_corners=True. This is not an intended use case of affine_grid. See the documentation "
                      "of affine_grid for details.", stacklevel=2)
    elif min(size) <= 0:
        raise ValueError(f"Expected non-zero, positive output size. Got {size}")
    if theta.shape[0] != size[0]:
        raise RuntimeError(f"Expected size for first two dimensions of batch2 tensor to be: [{size[0]}, {d + 1}] "
                           f"but got: [{theta.shape[0]}, {d + 1}].")
    xp = xp_of(theta._data)
    dt = theta._data.dtype.type if theta.dtype.name != "bfloat16" else np.float32
    axes = [_linspace_from_neg_one(xp, n, align_corners, dt) for n in reversed(spatial)]  # x (W) first
    mesh = xp.meshgrid(*axes[::-1], indexing="ij")[::-1]  # x, y(, z) over (D,) H, W
    base = xp.stack([*mesh, xp.ones_like(mesh[0])], axis=-1).reshape(-1, d + 1).astype(theta._data.dtype)
    base = Tensor._make(base, theta._device)
    if theta._global is not None:  # the same base grid on every rank
        base._global = theta._global.constant(base._data.shape)
    grid = matmul(base, theta.transpose(1, 2))  # (N, prod(spatial), d)
    return reshape(grid, (size[0], *spatial, d))


def _unnormalize(c, size, align_corners):
    """Grid value in [-1, 1] -> pixel coordinate, and d coordinate / d grid value."""
    if align_corners:
        return (c + 1) / 2 * (size - 1), (size - 1) / 2
    return ((c + 1) * size - 1) / 2, size / 2


def _clip(xp, c, size):
    """torch's clip_coordinates, and its gradient (0 on and beyond the borders)."""
    return xp.minimum(xp.maximum(c, 0), size - 1), (c > 0) & (c < size - 1)


def _reflect(xp, c, twice_low, twice_high):
    """torch's reflect_coordinates, and its gradient (+-1)."""
    if twice_low == twice_high:
        return xp.zeros_like(c), xp.zeros_like(c)
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    c = c - low
    sign = 1 - 2 * (c < 0).astype(c.dtype)
    c = xp.abs(c)
    extra = xp.fmod(c, span)
    even = xp.fmod(xp.floor(c / span), 2) == 0
    return xp.where(even, extra + low, span - extra + low).astype(c.dtype), xp.where(even, sign, -sign)


def _pad_coords(xp, c, size, padding_mode, align_corners):
    """torch's compute_coordinates: the pixel coordinate after the padding rule, and its gradient
    multiplier (None for zeros padding: 1)."""
    if padding_mode == "border":
        return _clip(xp, c, size)
    if padding_mode == "reflection":
        c, g = _reflect(xp, c, 0, 2 * (size - 1)) if align_corners else _reflect(xp, c, -1, 2 * size - 1)
        c, g2 = _clip(xp, c, size)
        return c, g * g2
    return c, None


_CUBIC_A = -0.75


def _cubic(t):
    """The four bicubic tap weights at fraction t (torch's get_cubic_upsample_coefficients) and
    their derivatives d/dt."""
    a = _CUBIC_A

    def c1(x):
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def c2(x):
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    def d1(x):
        return (3 * (a + 2) * x - 2 * (a + 3)) * x

    def d2(x):
        return (3 * a * x - 10 * a) * x + 8 * a

    return ([c2(t + 1), c1(t), c1(1 - t), c2(2 - t)],
            [d2(t + 1), d1(t), -d1(1 - t), -d2(2 - t)])


def _axis_taps(xp, c, size, mode, padding_mode, align_corners):
    """The taps of one spatial axis: ([(coordinate, weight, d weight / d coordinate)], multiplier
    from the grid value to the coordinate)."""
    src, scale = _unnormalize(c, size, align_corners)
    if mode == "bicubic":  # the padding rule applies to each tap's integer coordinate
        lo = xp.floor(src)
        w, dw = _cubic(src - lo)
        taps = [(_pad_coords(xp, lo + (k - 1), size, padding_mode, align_corners)[0], w[k], dw[k]) for k in range(4)]
        return taps, scale
    src, g = _pad_coords(xp, src, size, padding_mode, align_corners)
    mult = scale if g is None else g * src.dtype.type(scale)
    if mode == "nearest":
        return [(xp.rint(src), xp.ones_like(src), 0)], mult
    lo = xp.floor(src)
    frac = src - lo
    return [(lo, 1 - frac, -1), (lo + 1, frac, 1)], mult


def _taps(x, grid, mode, padding_mode, align_corners):
    """Every tap of every output point, as a list of (flat index (N, M), inside (N, M), weight
    (N, M), [d weight / d coordinate of axis a]), the weight and the index 0 where the tap falls
    outside the input; and per axis the multiplier from grid values to coordinates."""
    xp = xp_of(x)
    spatial = x.shape[2:]
    d = len(spatial)
    n = grid.shape[0]
    g = grid.reshape(n, _numel(grid.shape[1:-1]), d)
    per_axis, mults = [], []
    for a, size in enumerate(spatial):  # grid's last entry is x (the last axis)
        taps, mult = _axis_taps(xp, g[..., d - 1 - a], size, mode, padding_mode, align_corners)
        per_axis.append([(c, (c >= 0) & (c <= size - 1), w, dw) for c, w, dw in taps])
        mults.append(mult)
    strides = [_numel(spatial[a + 1:]) for a in range(d)]
    out = []
    for combo in itertools.product(*per_axis):
        flat, inside, weight = 0, True, 1
        for (c, ok, w, _), s in zip(combo, strides):
            flat = flat + xp.where(ok, c, 0).astype(np.int64) * s
            inside = inside & ok
            weight = weight * w
        weight = xp.where(inside, weight, 0).astype(x.dtype)
        dws = []
        for a in range(d):
            dw = combo[a][3]
            for b in range(d):
                if b != a:
                    dw = dw * combo[b][2]
            dws.append(dw)
        out.append((flat, inside, weight, dws))
    return out, mults


def _numel(shape):
    return int(np.prod(shape, dtype=np.int64))


def _gather(xf, flat):
    """xf (N, C, P) read at flat (N, M) for every channel -> (N, C, M)."""
    xp = xp_of(xf)
    n, c = xf.shape[:2]
    return xf[xp.arange(n).reshape(-1, 1, 1), xp.arange(c).reshape(1, -1, 1), flat[:, None, :]]


def _sampler_forward(x, grid, mode, padding_mode, align_corners):
    xp = xp_of(x)
    wt = _work_dtype(x)
    x, grid = x.astype(wt, copy=False), grid.astype(wt, copy=False)
    n, c = x.shape[:2]
    xf = x.reshape(n, c, _numel(x.shape[2:]))
    taps, _ = _taps(x, grid, mode, padding_mode, align_corners)
    out = xp.zeros((n, c, _numel(grid.shape[1:-1])), dtype=wt)
    for flat, inside, weight, _ in taps:
        out += weight[:, None, :] * xp.where(inside[:, None, :], _gather(xf, flat), 0)
    return out


class GridSampler(Op):
    """grid_sample of (N, C, *S) at the points of grid (N, *O, d) -> (N, C, *O)."""

    name = "GridSampler"
    save_inputs = (0, 1)

    @staticmethod
    def forward(ctx, x, grid, mode, padding_mode, align_corners):
        ctx.attrs = dict(mode=mode, padding_mode=padding_mode, align_corners=align_corners)
        out = _sampler_forward(x, grid, mode, padding_mode, align_corners)
        return out.reshape(x.shape[:2] + grid.shape[1:-1]).astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        x, grid = ctx.saved_tensors
        need = ctx.needs_input_grad
        dx, dgrid = GridSamplerGrad.apply(g, x, grid, need=need, **ctx.attrs)
        return (dx if need[0] else None), (dgrid if need[1] else None)


class GridSamplerGrad(NoDoubleBackward, Op):
    """The input gradient (scattered to each tap with one bincount) and the grid gradient (the
    taps' weight derivatives against the sampled values; zero for nearest) of grid_sample."""

    name = "GridSamplerGrad"

    @staticmethod
    def forward(ctx, g, x, grid, need, mode, padding_mode, align_corners):
        ctx.op_name = "grid_sampler"
        xp = xp_of(x)
        wt = _work_dtype(x)
        n, c = x.shape[:2]
        d = grid.shape[-1]
        g = g.astype(wt, copy=False).reshape(n, c, _numel(grid.shape[1:-1]))
        xw, gridw = x.astype(wt, copy=False), grid.astype(wt, copy=False)
        p = _numel(x.shape[2:])
        xf = xw.reshape(n, c, p)
        taps, mults = _taps(xw, gridw, mode, padding_mode, align_corners)
        dx = xp.zeros(x.shape, dtype=x.dtype)
        if need[0]:
            plane = (xp.arange(n * c, dtype=np.int64) * p).reshape(n, c, 1)
            targets = xp.concatenate([(plane + flat[:, None, :]).reshape(-1) for flat, _, _, _ in taps])
            values = xp.concatenate([(g * weight[:, None, :]).reshape(-1) for _, _, weight, _ in taps])
            dx = scatter_kernels.bincount(targets, values, minlength=n * c * p, size=n * c * p)
            dx = dx.reshape(x.shape).astype(x.dtype)
        dgrid = xp.zeros(grid.shape, dtype=grid.dtype)
        if need[1] and mode != "nearest":
            dsrc = [0] * d
            for flat, inside, _, dws in taps:
                gv = (g * xp.where(inside[:, None, :], _gather(xf, flat), 0)).sum(axis=1)
                for a in range(d):
                    dsrc[a] = dsrc[a] + gv * dws[a]
            dg = xp.stack([dsrc[a] * mults[a] for a in reversed(range(d))], axis=-1)
            dgrid = dg.reshape(grid.shape).astype(grid.dtype)
        return dx, dgrid


_SAMPLE_MODES = ("bilinear", "nearest", "bicubic")
_PADDING_MODES = ("zeros", "border", "reflection")


def grid_sample(input, grid, mode="bilinear", padding_mode="zeros", align_corners=None):
    """Sample input (N, C, H, W) / (N, C, D, H, W) at the normalised points of grid (N, Ho, Wo, 2)
    / (N, Do, Ho, Wo, 3), as torch.nn.functional.grid_sample."""
    if mode not in _SAMPLE_MODES:
        raise ValueError("nn.functional.grid_sample(): expected mode to be 'bilinear', 'nearest' or 'bicubic', "
                         f"but got: '{mode}'")
    if padding_mode not in _PADDING_MODES:
        raise ValueError("nn.functional.grid_sample(): expected padding_mode to be 'zeros', 'border', or "
                         f"'reflection', but got: '{padding_mode}'")
    if align_corners is None:
        warnings.warn(_ALIGN_WARNING, stacklevel=2)
        align_corners = False
    sizes = f"input with sizes {list(input.shape)} and grid with sizes {list(grid.shape)}"
    if input.ndim == 0 or grid.ndim == 0 or input.shape[0] != grid.shape[0]:
        raise RuntimeError(f"grid_sampler(): expected grid and input to have same batch size, but got {sizes}")
    if grid.shape[-1] != input.ndim - 2:
        raise RuntimeError(f"grid_sampler(): expected grid to have size {input.ndim - 2} in last dimension, but got "
                           f"grid with sizes {list(grid.shape)}")
    for i in range(2, input.ndim):
        if input.shape[i] == 0:
            raise RuntimeError(f"grid_sampler(): expected input to have non-empty spatial dimensions, but input has "
                               f"sizes {list(input.shape)} with dimension {i} being empty")
    if input.ndim != 4 and not (input.ndim == 5 and grid.ndim == 5):
        raise RuntimeError(f"grid_sampler(): expected 5D input and grid with same number of dimensions, but got "
                           f"{sizes}")
    if input.ndim == 4 and grid.ndim != 4:
        raise RuntimeError(f"grid_sampler(): expected 4D input and grid with same number of dimensions, but got "
                           f"{sizes}")
    if input.ndim == 5 and mode == "bicubic":
        raise RuntimeError("grid_sampler(): bicubic interpolation only supports 4D input")
    if not input.is_floating_point():
        kernel = "grid_sampler_2d_cpu_kernel_impl" if input.ndim == 4 else "grid_sampler_3d_cpu"
        raise NotImplementedError(f'"{kernel}" not implemented for \'{_TORCH_NAMES[input.dtype.name]}\'')
    if grid.dtype != input.dtype:
        raise RuntimeError(f"expected scalar type {_TORCH_NAMES[input.dtype.name]} but found "
                           f"{_TORCH_NAMES.get(grid.dtype.name, grid.dtype.name)}")
    return GridSampler.apply(input, grid, mode=mode, padding_mode=padding_mode, align_corners=bool(align_corners))
