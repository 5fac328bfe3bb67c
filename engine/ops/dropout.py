"""Dropout: y = x * m with the scaled mask m = (u >= p) / (1 - p) a hidden output of the forward,
drawn from an engine Generator (the default one unless given); and the fused
bias + dropout + residual add (LiBai's bias_dropout_fusion), whose CUDA kernel draws the same u
inside itself and keeps no mask."""
import numpy as np

from ..backend import xp_of
from ..backend.random import default_generator
from ..kernels import dropout_add as dropout_add_kernels
from ..kernels import philox
from . import inplace as _inplace
from ._core import check_float, sum_to
from .op import Op

__all__ = ["dropout"]


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


def dropout(input, p=0.5, training=True, inplace=False, generator=None):
    """Zero each element with probability p and scale survivors by 1/(1-p) (identity when not
    training). The mask comes from `generator` (the default generator unless given)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
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
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
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
