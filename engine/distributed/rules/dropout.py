"""SBP rule of engine/ops/dropout.py: dropout is pointwise with two outputs (y, scaled mask).

Under a split signature each rank draws the mask of its own shard (`ShardDropout`), so shards
get independent masks while ranks holding the same shard (broadcast mesh axes) draw the same
one: on the CPU one seed comes from the op's generator, mixed with the shard's position on the
split mesh axes; on CUDA the device stream draws for all shards at once (every rank moves it
alike, in parts of the largest shard's size) and each shard takes its own part (`shard_index`),
which a CUDA graph can replay. The masks therefore differ from a single-process run with the
same seed (not bitwise equal; same distribution). Under the all-broadcast signature every rank
draws the whole mask from its generator: equal on every rank only when the generators are
seeded alike (flow.manual_seed on all ranks)."""
import math

from ...ops import dropout
from .base import sbp_rule
from .patterns import Pointwise


@sbp_rule(dropout.Dropout)
class DropoutRule(Pointwise):
    def __init__(self):
        Pointwise.__init__(self, n_out=2)

    def kernel(self, op_cls, chosen):
        if all(sig.all_broadcast for sig in chosen):
            return op_cls
        return dropout.ShardDropout

    def local_attrs(self, attrs, shapes, in_nd, placement, coords):
        if all(not s.is_split for s in in_nd[0]):
            return attrs
        shard = tuple(int(c) + 1 if s.is_split else 0 for c, s in zip(coords, in_nd[0]))
        index, count, dims = 0, 1, list(shapes[0])
        for c, n, s in zip(coords, placement.mesh.shape, in_nd[0]):
            if s.is_split:  # the shard's place among all shards, row-major over the split axes
                index, count = index * int(n) + int(c), count * int(n)
                dims[s.axis] = -(-dims[s.axis] // int(n))  # the largest shard's extent (balanced splits)
        return dict(attrs, shard=shard, shard_index=(index, count, math.prod(dims)))
