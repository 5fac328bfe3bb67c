"""Dropout: y = x * m with the scaled mask m = (u >= p) / (1 - p) a hidden output of the forward,
drawn from an engine Generator (the default one unless given)."""
import numpy as np

from ..backend import xp_of
from ..backend.random import default_generator
from . import inplace as _inplace
from ._core import check_float
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


class ShardDropout(Dropout):
    """Dropout of one shard of a split global tensor (engine/distributed/rules/dropout.py picks it
    under a split signature). One 63-bit seed comes from the op's generator, so generators seeded
    alike stay in lockstep on every rank; the shard's position `shard` on the split mesh axes is
    mixed into it, so shards draw independent masks while ranks holding the same shard draw the
    same one."""

    name = "Dropout"

    @staticmethod
    def forward(ctx, x, p, generator, shard=()):
        xp = xp_of(x)
        seed = int(generator.rng(np).integers(0, 2 ** 63))
        if xp is np:
            rng = np.random.default_rng([seed, *shard])
        else:
            mixed = np.random.SeedSequence([seed, *shard]).generate_state(1, np.uint64)[0]
            rng = xp.random.Generator(xp.random.XORWOW(int(mixed) % 2 ** 63))
        return _masked(xp, x, p, rng)
