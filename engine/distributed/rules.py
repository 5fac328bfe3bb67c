"""SBP signatures of the engine's ops, kept apart from their kernels (as PyTorch DTensor keeps op
strategies apart from kernels).

A `Rule` lists, for one mesh axis, the signatures an op can run under (`Signature(ins, outs)`),
translates shape-valued attributes to the shard (`local_attrs`) and may give logical output
shapes outright (`out_shapes`). Ops without a rule run under the default "all broadcast"
signature, which is always valid: inputs are gathered and every rank computes the whole result.
A rule only adds cheaper options. Gradient ops never need one: backwards run on shards (see
dispatch.py).
"""
from ..ops import _core, elementwise, linalg, nn_ops, reduction, shape as shape_ops, unary
from .dispatch import Signature
from .sbp import broadcast as B, partial_sum as P, split as S


class Rule:
    def signatures(self, shapes, attrs):
        present = [s is not None for s in shapes]
        n_out = self.n_outputs(attrs)
        return [Signature([B if p else None for p in present], [B] * n_out)]

    def local_attrs(self, attrs, shapes, in_nd, placement, coords):
        return attrs

    def out_shapes(self, shapes, attrs):
        return None

    def n_outputs(self, attrs):
        return 1

    def kernel(self, op_cls, chosen):
        """The Op whose forward/backward run on the shards under the chosen signatures (one per
        mesh axis); usually the op itself."""
        return op_cls

    def decompose(self, inputs, attrs):
        """Return the result computed with other global ops, or None to dispatch normally."""
        return None


DEFAULT = Rule()
_RULES = {}


def register(rule, *op_classes):
    for c in op_classes:
        _RULES[c] = rule


def rule_for(op_cls):
    return _RULES.get(op_cls, DEFAULT)


def _with_default(rule, shapes, attrs, sigs):
    return Rule.signatures(rule, shapes, attrs) + sigs


# ------------------------------------------------------------------ pointwise (broadcasting)
def _broadcast_shape(shapes):
    nd = max(len(s) for s in shapes if s is not None)
    out = [1] * nd
    for s in shapes:
        if s is None:
            continue
        for i, d in enumerate(s):
            j = nd - len(s) + i
            if d != 1:
                out[j] = d
    return out


class Pointwise(Rule):
    """Broadcasting elementwise ops: split any output axis (inputs that span it split too, the
    others stay broadcast); `linear` ops also map all-partial to partial; `scales` lists the
    inputs that may be partial while the others are broadcast (x * w with x partial)."""

    def __init__(self, linear=False, scales=(), n_out=1):
        self.linear, self.scales, self.n_out = linear, tuple(scales), n_out

    def n_outputs(self, attrs):
        return self.n_out

    def signatures(self, shapes, attrs):
        sigs = Rule.signatures(self, shapes, attrs)
        out = _broadcast_shape(shapes)
        nd = len(out)
        for a in range(nd):
            if out[a] == 1:
                continue
            ins = []
            for s in shapes:
                if s is None:
                    ins.append(None)
                    continue
                j = a - (nd - len(s))
                ins.append(S(j) if j >= 0 and s[j] == out[a] else B)
            sigs.append(Signature(ins, [S(a)] * self.n_out))
        if self.linear:
            sigs.append(Signature([None if s is None else P for s in shapes], [P] * self.n_out))
        for i in self.scales:
            ins = [None if s is None else B for s in shapes]
            ins[i] = P
            sigs.append(Signature(ins, [P] * self.n_out))
        return sigs


_POINTWISE_LINEAR = Pointwise(linear=True)
register(_POINTWISE_LINEAR, _core.Cast, _core.Clone, elementwise.Neg, elementwise.Add, elementwise.Sub)
register(Pointwise(scales=(0, 1)), elementwise.Mul)
register(Pointwise(scales=(0,)), elementwise.Div)
register(Pointwise(), elementwise.FloorDivide, elementwise.Fmod, elementwise.Remainder)


def _unary_pointwise_classes():
    abstract = {"_Compare", "_FusedGrad", "_Logical", "_Piecewise", "_Pointwise", "_Predicate", "_SavesInput"}
    seen, stack = [], [unary.Op]
    found = []
    while stack:
        c = stack.pop()
        for s in c.__subclasses__():
            if s not in seen:
                seen.append(s)
                stack.append(s)
                if s.__module__ == unary.__name__ and s.__name__ not in abstract:
                    found.append(s)
    return found


register(Pointwise(), *[c for c in _unary_pointwise_classes() if c is not unary.GeluExact])
register(Pointwise(n_out=2), unary.GeluExact)


# ------------------------------------------------------------------ broadcast and its adjoint
def _local_extent(extent, nd, placement, coords, dim):
    from .sbp import balanced_range

    for k, s in enumerate(nd):
        if s.is_split and s.axis == dim:
            start, stop = balanced_range(extent, placement.hierarchy[k], coords[k])
            extent = stop - start
    return extent


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
        for k, s in enumerate(in_nd[0]):
            if s.is_split and s.axis >= lead and dst[s.axis - lead] == src[s.axis]:
                dst[s.axis - lead] = _local_extent(src[s.axis], in_nd[0], placement, coords, s.axis)
        return dict(attrs, shape=tuple(dst))

    def out_shapes(self, shapes, attrs):
        return [tuple(attrs["shape"])]


class BroadcastToRule(Rule):
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
        for s in in_nd[0]:
            if s.is_split:
                dst[s.axis + lead] = _local_extent(src[s.axis], in_nd[0], placement, coords, s.axis)
        return dict(attrs, shape=tuple(dst))

    def out_shapes(self, shapes, attrs):
        return [tuple(attrs["shape"])]


register(SumToRule(), _core.SumTo)
register(BroadcastToRule(), _core.BroadcastTo)


# ------------------------------------------------------------------ reshape / permute
def _prod(xs):
    n = 1
    for x in xs:
        n *= x
    return n


def _reshape_axis_map(src, dst):
    """For each input axis a, the output axis b its split can move to: the axes start at the
    same flat offset and one extent is a whole multiple of the other."""
    out = {}
    for a in range(len(src)):
        before = _prod(src[:a])
        for b in range(len(dst)):
            if _prod(dst[:b]) == before and src[a] > 1 and dst[b] > 1 and (
                    src[a] % dst[b] == 0 or dst[b] % src[a] == 0):
                out[a] = b
                break
    return out


class ReshapeRule(Rule):
    """A split survives a reshape when its axis starts a group of matching sizes; the shard's
    target shape scales that axis. Only even splits (the divisibility makes the blocks match)."""

    def signatures(self, shapes, attrs):
        sigs = Rule.signatures(self, shapes, attrs)
        src, dst = shapes[0], tuple(attrs["shape"])
        for a, b in _reshape_axis_map(src, dst).items():
            sigs.append(Signature([S(a)], [S(b)]))
        sigs.append(Signature([P], [P]))
        return sigs

    def local_attrs(self, attrs, shapes, in_nd, placement, coords):
        src, dst = shapes[0], list(attrs["shape"])
        amap = _reshape_axis_map(src, tuple(dst))
        for k, s in enumerate(in_nd[0]):
            if s.is_split:
                b = amap[s.axis]
                n = placement.hierarchy[k]
                small = min(src[s.axis], dst[b])
                if small % n:
                    raise ValueError(f"reshape: a split of extent {small} over {n} ranks is uneven; "
                                     f"box to broadcast first")
                dst[b] //= n
        return dict(attrs, shape=tuple(dst))

    def out_shapes(self, shapes, attrs):
        return [tuple(attrs["shape"])]


register(ReshapeRule(), _core.Reshape)


class PermuteRule(Rule):
    def signatures(self, shapes, attrs):
        dims = attrs["dims"]
        sigs = Rule.signatures(self, shapes, attrs)
        sigs += [Signature([S(d)], [S(i)]) for i, d in enumerate(dims)]
        sigs.append(Signature([P], [P]))
        return sigs


class SwapLastRule(Rule):
    def signatures(self, shapes, attrs):
        nd = len(shapes[0])
        sigs = Rule.signatures(self, shapes, attrs) + [Signature([P], [P])]
        for a in range(nd):
            b = nd - 1 if a == nd - 2 else nd - 2 if a == nd - 1 else a
            sigs.append(Signature([S(a)], [S(b)]))
        return sigs


register(PermuteRule(), shape_ops.Permute)
register(SwapLastRule(), linalg.SwapLast)


# ------------------------------------------------------------------ matrix products
class MatmulRule(Rule):
    """A(..., m, k) @ B(..., k, n): rows of A split -> rows split; columns of B split -> columns
    split; the contracted axis split on both -> partial sum; batch axes split on both (or on A
    when B is a plain matrix); partial times broadcast stays partial."""

    def signatures(self, shapes, attrs):
        sigs = Rule.signatures(self, shapes, attrs)
        a, b = shapes
        if len(a) < 2 or len(b) < 2:
            return sigs
        nd = max(len(a), len(b))
        la, lb = nd - len(a), nd - len(b)
        sigs.append(Signature([S(len(a) - 2), B], [S(nd - 2)]))
        sigs.append(Signature([B, S(len(b) - 1)], [S(nd - 1)]))
        sigs.append(Signature([S(len(a) - 1), S(len(b) - 2)], [P]))
        sigs.append(Signature([P, B], [P]))
        sigs.append(Signature([B, P], [P]))
        for o in range(nd - 2):
            ia, ib = o - la, o - lb
            if ia >= 0 and ib >= 0 and a[ia] == b[ib] and a[ia] > 1:
                sigs.append(Signature([S(ia), S(ib)], [S(o)]))
            elif ia >= 0 and a[ia] > 1 and (ib < 0 or b[ib] == 1):
                sigs.append(Signature([S(ia), B], [S(o)]))
            elif ib >= 0 and b[ib] > 1 and (ia < 0 or a[ia] == 1):
                sigs.append(Signature([B, S(ib)], [S(o)]))
        return sigs


class LinearRule(Rule):
    """y = x W^T + b (W is [out, in]): Megatron's column-parallel (W split on out) and
    row-parallel (W split on in, x split on its last axis, result partial) layouts, plus splits
    of x's batch axes. A partial result gets a partial bias (B -> P keeps it on one rank)."""

    def signatures(self, shapes, attrs):
        sigs = Rule.signatures(self, shapes, attrs)
        x, w, b = shapes
        has_b = b is not None
        bias = (lambda s: s if has_b else None)
        last = len(x) - 1
        for a in range(last):
            if x[a] > 1:
                sigs.append(Signature([S(a), B, bias(B)], [S(a)]))
        sigs.append(Signature([B, S(0), bias(S(0))], [S(last)]))
        sigs.append(Signature([S(last), S(1), bias(P)], [P]))
        sigs.append(Signature([P, B, bias(P)], [P]))
        return sigs


register(MatmulRule(), linalg.Matmul)
register(LinearRule(), linalg.Linear)


# ------------------------------------------------------------------ normalisation
class RowwiseRule(Rule):
    """softmax/log_softmax over `axis`: any other axis may be split."""

    def signatures(self, shapes, attrs):
        axis = attrs["axis"] % max(len(shapes[0]), 1)
        sigs = Rule.signatures(self, shapes, attrs)
        sigs += [Signature([S(a)], [S(a)]) for a in range(len(shapes[0])) if a != axis and shapes[0][a] > 1]
        return sigs


register(RowwiseRule(), nn_ops.Softmax, nn_ops.LogSoftmax)


class LayerNormRule(Rule):
    """Rows split on the first axis (the 2-D view the kernel keeps stays a block of rows)."""

    def n_outputs(self, attrs):
        return 4

    def signatures(self, shapes, attrs):
        sigs = Rule.signatures(self, shapes, attrs)
        x, w, b = shapes
        if len(x) > attrs["k"] and x[0] > 1:
            sigs.append(Signature([S(0), None if w is None else B, None if b is None else B], [S(0)] * 4))
        return sigs


register(LayerNormRule(), nn_ops.LayerNorm)


# ------------------------------------------------------------------ reductions
class ReduceRule(Rule):
    """Reducing a split axis gives a partial result (sum -> P, amax -> P(max)); other split
    axes survive, renumbered when the reduced axes are dropped."""

    def __init__(self, partial, linear):
        self.partial, self.linear = partial, linear

    def signatures(self, shapes, attrs):
        x = shapes[0]
        axes = attrs.get("axes")
        axes = tuple(range(len(x))) if axes is None else tuple(a % max(len(x), 1) for a in axes)
        keep = attrs.get("keepdim", False)
        sigs = Rule.signatures(self, shapes, attrs)
        for a in range(len(x)):
            if x[a] <= 1:
                continue
            if a in axes:
                if self.partial is not None:
                    sigs.append(Signature([S(a)], [self.partial]))
            else:
                out_a = a if keep else a - sum(1 for d in axes if d < a)
                sigs.append(Signature([S(a)], [S(out_a)]))
        if self.linear:
            sigs.append(Signature([P], [P]))
        return sigs


register(ReduceRule(P, linear=True), reduction.Sum)
register(ReduceRule(None, linear=False), reduction.Mean)
# amax over a split axis would need a partial max whose gradient goes only to the rank holding
# the maximum; the local backward cannot know it, so only the other axes may stay split
register(ReduceRule(None, linear=False), reduction.Amax)
