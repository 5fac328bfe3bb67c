"""Dropout: y = x * m with the scaled mask m = (u >= p) / (1 - p) a hidden output of the forward,
drawn from an engine Generator (the default one unless given); and the fused
bias + dropout + residual add (LiBai's bias_dropout_fusion), whose CUDA kernel draws the same u
inside itself and keeps no mask.

The channel dropouts (dropout1d/2d/3d, feature_alpha_dropout) and alpha_dropout follow torch's
`_dropout_impl`: one noise value per (sample, channel) (or per element for alpha_dropout) is drawn
as a constant and the input is multiplied by it (plus alpha dropout's shift) with engine ops, so
the gradient is g * noise and in-place calls go through `mul_` / `add_`'s in-place rule."""
import math
import warnings

import numpy as np

from ..backend import xp_of
from ..backend.random import default_generator
from ..kernels import dropout_add as dropout_add_kernels
from ..kernels import philox
from . import inplace as _inplace
from ._core import check_float, const_like, sum_to
from .op import Op

__all__ = ["dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout"]


def scaled_keep_mask(xp, shape, dtype, p, rng):
    """The scaled keep-mask m = (u >= p) / (1 - p) of `dtype`, u uniform from `rng` (one draw of
    `shape`; the fused attention core draws its dropout mask here too)."""
    work = np.float64 if dtype == np.float64 else np.float32
    u = rng.random(shape, dtype=work)
    keep = u >= work(p)
    mask = xp.multiply(keep, work(1.0 / (1.0 - p)), out=u) if p < 1 else xp.zeros(shape, work)
    return mask.astype(dtype, copy=False)


def _masked(xp, x, p, rng):
    """(x * m, m): the scaled keep-mask m = (u >= p) / (1 - p), u uniform from `rng`."""
    mask = scaled_keep_mask(xp, x.shape, x.dtype, p, rng)
    return xp.multiply(x, mask), mask


class Dropout(Op):
    """y = x * m with m = (u >= p) / (1 - p); the scaled mask m is a hidden output."""

    name = "Dropout"
    save_outputs = (1,)

    @staticmethod
    def forward(ctx, x, p, generator):
        xp = xp_of(x)
        return _masked(xp, x, p, generator.rng(xp))

    @staticmethod
    def backward(ctx, g, *_):
        mask, = ctx.saved_tensors
        return g * mask


def _check_p(p):
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")


def dropout(input, p=0.5, training=True, inplace=False, generator=None):
    """Zero each element with probability p and scale survivors by 1/(1-p) (identity when not
    training). The mask comes from `generator` (the default generator unless given)."""
    _check_p(p)
    if not training or p == 0.0:
        return input
    check_float(input, "dropout")
    gen = generator or default_generator
    if inplace:
        _inplace.check_inplace_allowed(input, "dropout_")
        if _inplace.records(input):
            return _inplace.rebind(input, Dropout.apply(input, p=float(p), generator=gen)[0], "dropout_")
        y, _ = Dropout.forward(None, input._data, float(p), gen)
        return _inplace.write(input, y, "dropout_")
    return Dropout.apply(input, p=float(p), generator=gen)[0]


# ------------------------------------------------------------------ channel and alpha dropout
_SELU_ALPHA_SCALED = 1.7580993408473766  # -SELU's negative saturation (scale * alpha), torch's constant


def _noise_shape(input, feature, batched):
    """Elementwise noise, or one value per (sample, channel) broadcast over the rest; an unbatched
    input is a batch of one, as torch's unsqueeze(0) makes it."""
    if not feature:
        return tuple(input.shape)
    if input.ndim < (2 if batched else 1):
        raise RuntimeError("Feature dropout requires at least 2 dimensions in the input")
    lead = 2 if batched else 1
    return tuple(input.shape[:lead]) + (1,) * (input.ndim - lead)


def _alpha_noise(keep, p):
    """(multiplier, shift) of alpha dropout from the 0/1 keep mask: dropped units go to SELU's
    saturation and an affine map a*x + b keeps mean 0 and variance 1 (torch's formula)."""
    a = 1.0 / math.sqrt((_SELU_ALPHA_SCALED ** 2 * p + 1) * (1 - p))
    return keep * keep.dtype.type(a), (keep - 1) * keep.dtype.type(_SELU_ALPHA_SCALED * a) + \
        keep.dtype.type(_SELU_ALPHA_SCALED * a * p)


def _noised(input, p, training, inplace, feature, alpha, batched=True):
    """torch's _dropout_impl: identity when not training, p == 0 or empty; input * 0 when p == 1;
    else input * noise (+ shift for alpha dropout), the noise drawn from the default generator."""
    if p == 0 or not training or input.numel() == 0:
        return input
    shape = _noise_shape(input, feature, batched)
    if not input.is_floating_point():
        raise RuntimeError(f"result type Float can't be cast to the desired output type {input.dtype.name}")
    if p == 1:
        return input.mul_(0) if inplace else input * 0
    xp = xp_of(input._data)
    rng = default_generator.rng(xp)
    if alpha:
        keep = (rng.random(shape, dtype=np.float64 if input.dtype.name == "float64" else np.float32) >= p)
        mult, shift = _alpha_noise(keep.astype(input._data.dtype), p)
    else:
        mult, shift = scaled_keep_mask(xp, shape, input._data.dtype, p, rng), None
    mult = const_like(mult, input)
    if inplace:
        input.mul_(mult)
        return input if shift is None else input.add_(const_like(shift, input))
    out = input * mult
    return out if shift is None else out + const_like(shift, input)


def _deprecated_rank(op, ndim, spatial, allowed):
    warnings.warn(f"{op}: Received a {ndim}-D input to {op}, which is deprecated and will result in an error in a "
                  "future release. To retain the behavior and silence this warning, please use dropout instead. "
                  f"Note that {op} exists to provide channel-wise dropout on inputs with {spatial} spatial "
                  "dimensions, a channel dimension, and an optional batch dimension (i.e. "
                  f"{allowed[0]}D or {allowed[1]}D inputs).", stacklevel=3)


def dropout1d(input, p=0.5, training=True, inplace=False):
    """Zero whole channels of (N, C, L) or (C, L) with probability p, scaling the rest by 1/(1-p)."""
    _check_p(p)
    if input.ndim not in (2, 3):
        raise RuntimeError(f"dropout1d: Expected 2D or 3D input, but received a {input.ndim}D input. Note that "
                           "dropout1d exists to provide channel-wise dropout on inputs with 1 spatial dimension, a "
                           "channel dimension, and an optional batch dimension (i.e. 2D or 3D inputs).")
    return _noised(input, p, training, inplace, feature=True, alpha=False, batched=input.ndim == 3)


def dropout2d(input, p=0.5, training=True, inplace=False):
    """Zero whole channels of (N, C, H, W) with probability p. As torch, a 3-D input is read as
    (N, C, L) (with a warning), and other ranks are deprecated but still run."""
    _check_p(p)
    if input.ndim not in (3, 4):
        _deprecated_rank("dropout2d", input.ndim, 2, (3, 4))
    if input.ndim == 3:
        warnings.warn("dropout2d: Received a 3D input to dropout2d and assuming that channel-wise 1D dropout "
                      "behavior is desired - input is interpreted as shape (N, C, L), where C is the channel dim. "
                      "This behavior will change in a future release to interpret the input as one without a "
                      "batch dimension, i.e. shape (C, H, W). To maintain the 1D channel-wise dropout behavior, "
                      "please switch to using dropout1d instead.", stacklevel=2)
    return _noised(input, p, training, inplace, feature=True, alpha=False)


def dropout3d(input, p=0.5, training=True, inplace=False):
    """Zero whole channels of (N, C, D, H, W) or (C, D, H, W) with probability p."""
    _check_p(p)
    if input.ndim not in (4, 5):
        _deprecated_rank("dropout3d", input.ndim, 3, (4, 5))
    return _noised(input, p, training, inplace, feature=True, alpha=False, batched=input.ndim == 5)


def alpha_dropout(input, p=0.5, training=False, inplace=False):
    """Dropout for SELU networks: dropped units take SELU's saturation value, then an affine map
    keeps zero mean and unit variance. Off by default (training=False), as torch's function."""
    _check_p(p)
    return _noised(input, p, training, inplace, feature=False, alpha=True)


def feature_alpha_dropout(input, p=0.5, training=False, inplace=False):
    """alpha_dropout of whole channels (one draw per sample and channel)."""
    _check_p(p)
    return _noised(input, p, training, inplace, feature=True, alpha=True)


class _ShardOfDraw:
    """A device stream's draw for `count` shards at once, in parts of the largest shard's size
    (`largest` elements: balanced splits differ by one row), of which this shard takes part
    `index`: every rank moves its stream past the same whole draw (generators seeded alike stay
    in lockstep), shards get disjoint numbers, ranks holding the same shard the same ones. All
    on the device stream, so a CUDA graph replays it with new numbers (engine/cuda_graphs.py)."""

    def __init__(self, stream, index, count, largest):
        self.stream, self.index, self.count, self.largest = stream, index, count, largest

    def random(self, shape, dtype=np.float64):
        n = int(np.prod(shape, dtype=np.int64))
        if n > self.largest:
            raise ValueError(f"tensor-parallel dropout: a shard of {n} elements, the largest shard has {self.largest}")
        kind = philox.uniform_kind(dtype)
        part = philox.groups(kind, self.largest)
        seed, offset = self.stream.reserve(kind, part * self.count * philox.PER_GROUP[kind], "tensor-parallel dropout")
        return philox.draw(self.stream.xp, kind, n, seed, offset + self.index * part).reshape(shape)


class ShardDropout(Dropout):
    """Dropout of one shard of a split global tensor (engine/distributed/rules/dropout.py picks it
    under a split signature): shards draw independent masks while ranks holding the same shard
    draw the same one, and generators seeded alike stay in lockstep on every rank. On the CPU one
    63-bit seed comes from the op's generator and the shard's position `shard` on the split mesh
    axes is mixed into it; on CUDA the device stream draws for all shards at once and this one
    takes part `shard_index` = (its index, the number of shards, the largest shard's elements)."""

    name = "Dropout"

    @staticmethod
    def forward(ctx, x, p, generator, shard=(), shard_index=None):
        xp = xp_of(x)
        if xp is np:
            seed = int(generator.rng(np).integers(0, 2 ** 63))
            rng = np.random.default_rng([seed, *shard])
        else:
            rng = _ShardOfDraw(generator.rng(xp), *(shard_index or (0, 1, x.size)))
        return _masked(xp, x, p, rng)


# ------------------------------------------------------------------ bias + dropout + residual add
class BiasDropoutAdd(Op):
    """y = residual + dropout(x + bias), bias [d] over the last dim and residual like x (each
    optional). The u come from the generator as Dropout's do (the same elements are dropped as by
    `dropout(x + bias) + residual` from the same generator state). On CUDA one kernel draws them
    from the device stream at its (seed, offset) and the backward draws them again (no mask kept,
    x + bias never written out); on the CPU the scaled mask is kept for the backward."""

    name = "BiasDropoutAdd"

    @staticmethod
    def forward(ctx, x, bias, residual, p, generator):
        ctx.p = p
        ctx.bias_shape = None if bias is None else bias.shape
        xp = xp_of(x)
        if xp is not np:
            ctx.replay = seed, offset = generator.rng(xp).reserve(dropout_add_kernels.uniform_kind(x.dtype), x.size,
                                                                   "bias + dropout + add")
            return dropout_add_kernels.bias_dropout_add(x, bias, residual, p, seed, offset)
        ctx.replay = mask = scaled_keep_mask(np, x.shape, x.dtype, p, generator.rng(np))
        y = np.multiply(x if bias is None else x + bias, mask)
        if residual is not None:
            y += residual
        return y

    @staticmethod
    def backward(ctx, g):
        need_x, need_b, need_r = ctx.needs_input_grad
        dx = DropoutReplay.apply(g, p=ctx.p, replay=ctx.replay) if need_x or need_b else None
        return (dx if need_x else None,
                sum_to(dx, ctx.bias_shape) if need_b else None,
                g if need_r else None)


class DropoutReplay(Op):
    """g times the scaled keep-mask of a BiasDropoutAdd forward: `replay` is that mask (CPU) or
    the (seed, offset) its CUDA kernel drew from. Linear in g, so its backward is itself."""

    name = "BiasDropoutAddGrad"

    @staticmethod
    def forward(ctx, g, p, replay):
        ctx.p, ctx.replay = p, replay
        if xp_of(g) is np:
            return np.multiply(g, replay)
        return dropout_add_kernels.dropout_grad(g, p, *replay)

    @staticmethod
    def backward(ctx, gg):
        return DropoutReplay.apply(gg, p=ctx.p, replay=ctx.replay)


def bias_dropout_add(input, bias, residual, p=0.5, training=True, generator=None):
    """residual + dropout(input + bias): `bias` [d] over the last dim and `residual` of input's
    shape, each optional, both of input's dtype; fused on CUDA (see BiasDropoutAdd). Not in
    __all__: libai's layers call it for bias_dropout_fusion."""
    _check_p(p)
    check_float(input, "bias_dropout_add")
    if bias is not None and (tuple(bias.shape) != tuple(input.shape[-1:]) or bias.dtype != input.dtype):
        raise ValueError(f"bias_dropout_add: bias must be [{input.shape[-1] if input.ndim else ''}] "
                         f"{input.dtype.name} as the input's last dim, got {list(bias.shape)} {bias.dtype.name}")
    if residual is not None and (tuple(residual.shape) != tuple(input.shape) or residual.dtype != input.dtype):
        raise ValueError(f"bias_dropout_add: residual must be {list(input.shape)} {input.dtype.name} as the "
                         f"input, got {list(residual.shape)} {residual.dtype.name}")
    if not training or p == 0.0:
        out = input if bias is None else input + bias
        return out if residual is None else out + residual
    return BiasDropoutAdd.apply(input, bias, residual, p=float(p), generator=generator or default_generator)
