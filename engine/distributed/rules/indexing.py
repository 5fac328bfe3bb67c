"""SBP rules of engine/ops/indexing.py: basic indexing keeps a split on an axis the key leaves
whole; masked_fill is pointwise; gather / index_select keep splits off the indexed axis; the
embedding lookup has Megatron's vocab-parallel signature."""
from math import prod

import numpy as np

from ...ops import indexing
from ..boxing import local_slices
from ..sbp import Signature, broadcast as B, partial_sum as P, split as S
from .base import Rule, sbp_rule
from .patterns import Pointwise

sbp_rule(indexing.MaskedFill)(Pointwise())


# ------------------------------------------------------------------ basic indexing x[key]
def _key_axis_map(shape, key):
    """For a basic key: {input axis: (output axis, position in key)} of the axes the key leaves
    whole (full slices, Ellipsis), and the output shape."""
    n_ell = len(shape) - sum(1 for k in key if k is not None and k is not Ellipsis)
    out, a, o = {}, 0, 0
    for pos, k in enumerate(key):
        if k is None:
            o += 1
        elif k is Ellipsis:
            for _ in range(n_ell):
                out[a] = (o, None)
                a += 1
                o += 1
        elif isinstance(k, slice):
            if k.indices(shape[a]) == (0, shape[a], 1):
                out[a] = (o, pos)
            a += 1
            o += 1
        else:  # an int
            a += 1
    return out


def _basic_out_shape(shape, key):
    return tuple(np.broadcast_to(np.empty((), np.int8), tuple(shape))[key].shape)


@sbp_rule(indexing.Index)
class IndexRule(Rule):
    """Basic keys (ints/slices/None/Ellipsis): a split survives on an axis the key leaves whole,
    renumbered to its output position; the shard's key takes that axis whole. Indexing is
    linear: P -> P. Advanced keys (integer/bool arrays) run all-broadcast."""

    def signatures(self, shapes, attrs):
        sigs = Rule.signatures(self, shapes, attrs)
        if not attrs["basic"]:
            return sigs
        x = shapes[0]
        for a, (o, _) in _key_axis_map(x, attrs["key"]).items():
            if x[a] > 1:
                sigs.append(Signature([S(a)], [S(o)]))
        sigs.append(Signature([P], [P]))
        return sigs

    def local_attrs(self, attrs, shapes, in_nd, placement, coords):
        if not attrs["basic"] or not any(s.is_split for s in in_nd[0]):
            return attrs
        amap = _key_axis_map(shapes[0], attrs["key"])
        key = list(attrs["key"])
        for s in in_nd[0]:
            if s.is_split and amap[s.axis][1] is not None:
                key[amap[s.axis][1]] = slice(None)
        return dict(attrs, key=tuple(key))

    def out_shapes(self, shapes, attrs):
        if not attrs["basic"]:
            return None
        return [_basic_out_shape(shapes[0], attrs["key"])]


# ------------------------------------------------------------------ gather / index_select
@sbp_rule(indexing.Gather)
class GatherRule(Rule):
    """gather(x, dim, index): x and index split alike on another axis where they have the same
    extent -> the output (index-shaped) split there."""

    def signatures(self, shapes, attrs):
        sigs = Rule.signatures(self, shapes, attrs)
        x, idx = shapes
        d = attrs["dim"]
        if len(x) != len(idx):
            return sigs
        sigs += [Signature([S(a), S(a)], [S(a)]) for a in range(len(x)) if a != d and x[a] == idx[a] and x[a] > 1]
        return sigs

    def out_shapes(self, shapes, attrs):
        return [tuple(shapes[1])]


@sbp_rule(indexing.IndexSelect)
class IndexSelectRule(Rule):
    """index_select(x, dim, index): x split on another axis with index broadcast -> split
    there; x broadcast with the (1-D) index split -> output split on dim. Linear in x: P -> P."""

    def signatures(self, shapes, attrs):
        sigs = Rule.signatures(self, shapes, attrs)
        x, idx = shapes
        d = attrs["dim"]
        sigs += [Signature([S(a), B], [S(a)]) for a in range(len(x)) if a != d and x[a] > 1]
        if len(idx) == 1 and idx[0] > 1 and len(x):
            sigs.append(Signature([B, S(0)], [S(d)]))
        sigs.append(Signature([P, B], [P]))
        return sigs

    def out_shapes(self, shapes, attrs):
        x, idx = shapes
        if not len(x):
            return None
        out = list(x)
        out[attrs["dim"]] = prod(idx)
        return [tuple(out)]


# ------------------------------------------------------------------ embedding
def split_range(shape, nd, placement, coords, dim):
    """[start, stop) of the logical axis `dim` that the shard at `coords` holds."""
    sl = local_slices(shape, placement, nd, coords)[dim]
    return sl.start, sl.stop


def splits(nd, dim):
    return any(s.is_split and s.axis == dim for s in nd)


@sbp_rule(indexing.Embedding)
class EmbeddingRule(Rule):
    """ids S(a) x table B -> S(a) (data parallel); ids B x table S(1) -> S(last) (embedding dim
    split); ids B x table S(0) -> P, the vocab-parallel lookup: each rank looks up the ids in
    its vocab range [start, stop) (the balanced split of the table rows over that mesh axis)
    and writes zeros elsewhere (indexing.VocabParallelEmbedding); its backward scatters only
    in-range rows into the local shard (padding_idx gets none, on the rank that holds it)."""

    def signatures(self, shapes, attrs):
        ids, w = shapes
        sigs = Rule.signatures(self, shapes, attrs)
        for a in range(len(ids)):
            if ids[a] > 1:
                sigs.append(Signature([S(a), B], [S(a)]))
        if w[0] > 1:
            sigs.append(Signature([B, S(0)], [P]))
        if w[1] > 1:
            sigs.append(Signature([B, S(1)], [S(len(ids))]))
        return sigs

    def kernel(self, op_cls, chosen):
        if any(sig.ins[1] is not None and sig.ins[1] == S(0) for sig in chosen):
            return indexing.VocabParallelEmbedding
        return op_cls

    def local_attrs(self, attrs, shapes, in_nd, placement, coords):
        if not splits(in_nd[1], 0):
            return attrs
        start, stop = split_range(shapes[1], in_nd[1], placement, coords, 0)
        return dict(attrs, start=start, stop=stop)

    def out_shapes(self, shapes, attrs):
        return [tuple(shapes[0]) + (shapes[1][1],)]
