"""SBP rules of engine/ops/_core.py: dtype cast and copy, broadcast and its adjoint, reshape."""
from math import prod

from ...ops import _core
from ..boxing import local_shape
from ..sbp import Signature, partial_sum as P, split as S
from .base import Rule, sbp_rule
from .patterns import Pointwise

sbp_rule(_core.Cast, _core.Clone)(Pointwise(linear=True))


@sbp_rule(_core.SumTo)
class SumToRule(Rule):
    """Reduce a broadcast gradient: a split axis that survives stays split, a summed one -> P."""

    def signatures(self, shapes, attrs):
        sigs = Rule.signatures(self, shapes, attrs)
        (src,), dst = shapes, attrs["shape"]
        lead = len(src) - len(dst)
        for a in range(len(src)):
            j = a - lead
            if j >= 0 and dst[j] == src[a]:
                sigs.append(Signature([S(a)], [S(j)]))
            else:
                sigs.append(Signature([S(a)], [P]))
        sigs.append(Signature([P], [P]))
        return sigs

    def local_attrs(self, attrs, shapes, in_nd, placement, coords):
        src, dst = shapes[0], list(attrs["shape"])
        lead = len(src) - len(dst)
        local = local_shape(src, placement, in_nd[0], coords)
        for s in in_nd[0]:
            if s.is_split and s.axis >= lead and dst[s.axis - lead] == src[s.axis]:
                dst[s.axis - lead] = local[s.axis]
        return dict(attrs, shape=tuple(dst))

    def out_shapes(self, shapes, attrs):
        return [tuple(attrs["shape"])]


@sbp_rule(_core.BroadcastTo)
class BroadcastToRule(Rule):
    """An input axis kept by the broadcast may stay split (renumbered by the new leading axes)."""

    def signatures(self, shapes, attrs):
        sigs = Rule.signatures(self, shapes, attrs)
        (src,), dst = shapes, attrs["shape"]
        lead = len(dst) - len(src)
        for a in range(len(src)):
            if src[a] == dst[a + lead] and src[a] > 1:
                sigs.append(Signature([S(a)], [S(a + lead)]))
        return sigs

    def local_attrs(self, attrs, shapes, in_nd, placement, coords):
        src, dst = shapes[0], list(attrs["shape"])
        lead = len(dst) - len(src)
        local = local_shape(src, placement, in_nd[0], coords)
        for s in in_nd[0]:
            if s.is_split:
                dst[s.axis + lead] = local[s.axis]
        return dict(attrs, shape=tuple(dst))

    def out_shapes(self, shapes, attrs):
        return [tuple(attrs["shape"])]


def _reshape_axis_map(src, dst):
    """For each input axis a, the output axis b its split can move to: the axes start at the
    same flat offset and one extent is a whole multiple of the other."""
    out = {}
    for a in range(len(src)):
        before = prod(src[:a])
        for b in range(len(dst)):
            if prod(dst[:b]) == before and src[a] > 1 and dst[b] > 1 and (
                    src[a] % dst[b] == 0 or dst[b] % src[a] == 0):
                out[a] = b
                break
    return out


@sbp_rule(_core.Reshape)
class ReshapeRule(Rule):
    """A split survives a reshape when its axis starts a group of matching sizes; the shard's
    target shape scales that axis. When the two extents are equal the split may be uneven (the
    blocks are the same rows); otherwise the smaller extent must divide evenly into the parts."""

    checks_parts = True

    def signatures(self, shapes, attrs):
        sigs = Rule.signatures(self, shapes, attrs)
        src, dst = shapes[0], tuple(attrs["shape"])
        for a, b in _reshape_axis_map(src, dst).items():
            sigs.append(Signature([S(a)], [S(b)]))
        sigs.append(Signature([P], [P]))
        return sigs

    def allows(self, sig, shapes, attrs, parts):
        src, dst = shapes[0], tuple(attrs["shape"])
        s = sig.ins[0]
        if not s.is_split:
            return True
        b = _reshape_axis_map(src, dst)[s.axis]
        n = parts[0].get(s.axis, 1)
        return src[s.axis] == dst[b] or min(src[s.axis], dst[b]) % n == 0

    def local_attrs(self, attrs, shapes, in_nd, placement, coords):
        src, dst = shapes[0], list(attrs["shape"])
        amap = _reshape_axis_map(src, tuple(dst))
        local = local_shape(src, placement, in_nd[0], coords)
        done = set()
        for s in in_nd[0]:
            if s.is_split and s.axis not in done:
                done.add(s.axis)
                b = amap[s.axis]
                if src[s.axis] == dst[b]:
                    dst[b] = local[s.axis]
                else:
                    dst[b] //= prod(placement.hierarchy[j] for j, t in enumerate(in_nd[0]) if t == s)
        return dict(attrs, shape=tuple(dst))

    def out_shapes(self, shapes, attrs):
        return [tuple(attrs["shape"])]
