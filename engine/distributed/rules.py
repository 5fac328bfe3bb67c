"""SBP signatures of the engine's ops, kept apart from their kernels (as PyTorch DTensor keeps op
strategies apart from kernels).

A `Rule` lists, for one mesh axis, the signatures an op can run under (`Signature(ins, outs)`),
translates shape-valued attributes to the shard (`local_attrs`) and may give logical output
shapes outright (`out_shapes`). Ops without a rule run under the default "all broadcast"
signature, which is always valid: inputs are gathered and every rank computes the whole result.
A rule only adds cheaper options. Gradient ops never need one: backwards run on shards (see
dispatch.py).
"""
from ..ops import _core, conv, elementwise, indexing, linalg, nn_ops, reduction, shape as shape_ops, unary
from .sbp import Signature, broadcast as B, partial_sum as P, split as S


class Rule:
    # set by rules whose signatures are valid only for some numbers of parts (see `allows`)
    checks_parts = False

    def allows(self, sig, shapes, attrs, parts):
        """Whether `sig` is valid when input i's axes are cut into `parts[i]` = {axis: parts}
        (the product over every mesh axis that splits it so far). Only asked when
        `checks_parts` is set."""
        return True

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
    inputs that may be partial while the others are broadcast (x * w with x partial); `groups`
    lists sets of inputs that may be partial together, the others broadcast (where(c, x, y):
    x and y). `last_whole`: the last axis is never split (a softmax over it follows)."""

    def __init__(self, linear=False, scales=(), n_out=1, groups=(), last_whole=False):
        self.linear, self.scales, self.n_out = linear, tuple(scales), n_out
        self.groups, self.last_whole = tuple(groups), last_whole

    def n_outputs(self, attrs):
        return self.n_out

    def signatures(self, shapes, attrs):
        sigs = Rule.signatures(self, shapes, attrs)
        out = _broadcast_shape(shapes)
        nd = len(out)
        for a in range(nd):
            if out[a] == 1 or (self.last_whole and a == nd - 1):
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
        for group in tuple((i,) for i in self.scales) + self.groups:
            ins = [None if s is None else B for s in shapes]
            for i in group:
                if ins[i] is not None:
                    ins[i] = P
            sigs.append(Signature(ins, [P] * self.n_out))
        return sigs

    def out_shapes(self, shapes, attrs):
        out = tuple(_broadcast_shape(shapes))
        return [out] * self.n_out


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
        done = set()
        for k, s in enumerate(in_nd[0]):
            if s.is_split and s.axis not in done:
                done.add(s.axis)
                b = amap[s.axis]
                if src[s.axis] == dst[b]:
                    dst[b] = _local_extent(src[s.axis], in_nd[0], placement, coords, s.axis)
                else:
                    n = _prod(placement.hierarchy[j] for j, t in enumerate(in_nd[0]) if t == s)
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

    def out_shapes(self, shapes, attrs):
        return [tuple(shapes[0][d] for d in attrs["dims"])]


class SwapLastRule(Rule):
    def signatures(self, shapes, attrs):
        nd = len(shapes[0])
        sigs = Rule.signatures(self, shapes, attrs) + [Signature([P], [P])]
        for a in range(nd):
            b = nd - 1 if a == nd - 2 else nd - 2 if a == nd - 1 else a
            sigs.append(Signature([S(a)], [S(b)]))
        return sigs

    def out_shapes(self, shapes, attrs):
        x = list(shapes[0])
        if len(x) >= 2:
            x[-1], x[-2] = x[-2], x[-1]
        return [tuple(x)]


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

    def out_shapes(self, shapes, attrs):
        a, b = shapes
        if len(a) < 2 or len(b) < 2:
            return None
        return [tuple(_broadcast_shape([a[:-2], b[:-2]])) + (a[-2], b[-1])]


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

    def out_shapes(self, shapes, attrs):
        return [tuple(shapes[0][:-1]) + (shapes[1][0],)]


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

    def out_shapes(self, shapes, attrs):
        return [tuple(shapes[0])]


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

    def out_shapes(self, shapes, attrs):
        x, k = tuple(shapes[0]), attrs["k"]
        lead = x[:len(x) - k]
        return [x, lead + (1,) * k, lead + (1,) * k, (_prod(lead), _prod(x[len(x) - k:]))]


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

    def out_shapes(self, shapes, attrs):
        x = shapes[0]
        axes = attrs.get("axes")
        axes = tuple(range(len(x))) if axes is None else tuple(a % max(len(x), 1) for a in axes)
        if attrs.get("keepdim", False):
            return [tuple(1 if a in axes else d for a, d in enumerate(x))]
        return [tuple(d for a, d in enumerate(x) if a not in axes)]


register(ReduceRule(P, linear=True), reduction.Sum)
register(ReduceRule(None, linear=False), reduction.Mean)
# amax over a split axis would need a partial max whose gradient goes only to the rank holding
# the maximum; the local backward cannot know it, so only the other axes may stay split
register(ReduceRule(None, linear=False), reduction.Amax)


# ------------------------------------------------------------------ selection and masking
register(Pointwise(groups=[(1, 2)]), unary.Where)  # where(c, P, P) -> P: a selection is linear
register(Pointwise(), indexing.MaskedFill)
register(Pointwise(last_whole=True), nn_ops.ScaleMaskSoftmax)


class DropoutRule(Pointwise):
    """Dropout is pointwise with two outputs (y, scaled mask). Under a split signature each rank
    draws the mask of its own shard (`ShardDropout`): one 63-bit seed comes from the op's
    generator (so generators seeded alike stay in lockstep on every rank), and the shard's
    position on the split mesh axes is mixed into it, so shards get independent masks while
    ranks holding the same shard (broadcast mesh axes) draw the same one. The masks therefore
    differ from a single-process run with the same seed (not bitwise equal; same distribution).
    Under the all-broadcast signature every rank draws the whole mask from its generator: equal
    on every rank only when the generators are seeded alike (flow.manual_seed on all ranks)."""

    def __init__(self):
        Pointwise.__init__(self, n_out=2)

    def kernel(self, op_cls, chosen):
        if all(sig.all_broadcast for sig in chosen):
            return op_cls
        return ShardDropout

    def local_attrs(self, attrs, shapes, in_nd, placement, coords):
        if all(not s.is_split for s in in_nd[0]):
            return attrs
        shard = tuple(int(c) + 1 if s.is_split else 0 for c, s in zip(coords, in_nd[0]))
        return dict(attrs, shard=shard)


class ShardDropout(nn_ops.Dropout):
    name = "Dropout"

    @staticmethod
    def forward(ctx, x, p, generator, shard=()):
        import numpy as np

        from ..backend import xp_of

        xp = xp_of(x)
        seed = int(generator.rng(np).integers(0, 2 ** 63))
        if xp is np:
            rng = np.random.default_rng([seed, *shard])
        else:
            mixed = np.random.SeedSequence([seed, *shard]).generate_state(1, np.uint64)[0]
            rng = xp.random.Generator(xp.random.XORWOW(int(mixed) % 2 ** 63))
        work = np.float64 if x.dtype == np.float64 else np.float32
        u = rng.random(x.shape, dtype=work)
        keep = u >= work(p)
        mask = xp.multiply(keep, work(1.0 / (1.0 - p)), out=u) if p < 1 else xp.zeros(x.shape, work)
        mask = mask.astype(x.dtype, copy=False)
        return xp.multiply(x, mask), mask


register(DropoutRule(), nn_ops.Dropout)


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
    import numpy as np

    return tuple(np.broadcast_to(np.empty((), np.int8), tuple(shape))[key].shape)


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


register(IndexRule(), indexing.Index)


# ------------------------------------------------------------------ cat / stack / split / unbind
class CatRule(Rule):
    def signatures(self, shapes, attrs):
        sigs = Rule.signatures(self, shapes, attrs)
        if any(attrs["skip"]):
            return sigs
        d, x = attrs["dim"], shapes[0]
        sigs += [Signature([S(a)] * len(shapes), [S(a)]) for a in range(len(x)) if a != d and x[a] > 1]
        sigs.append(Signature([P] * len(shapes), [P]))
        return sigs

    def out_shapes(self, shapes, attrs):
        if any(attrs["skip"]):
            return None
        d = attrs["dim"]
        out = list(shapes[0])
        out[d] = sum(s[d] for s in shapes)
        return [tuple(out)]


class StackRule(Rule):
    def signatures(self, shapes, attrs):
        sigs = Rule.signatures(self, shapes, attrs)
        d, x = attrs["dim"], shapes[0]
        sigs += [Signature([S(a)] * len(shapes), [S(a + (a >= d))]) for a in range(len(x)) if x[a] > 1]
        sigs.append(Signature([P] * len(shapes), [P]))
        return sigs

    def out_shapes(self, shapes, attrs):
        out = list(shapes[0])
        out.insert(attrs["dim"], len(shapes))
        return [tuple(out)]


class SplitRule(Rule):
    def n_outputs(self, attrs):
        return len(attrs["sizes"])

    def signatures(self, shapes, attrs):
        sigs = Rule.signatures(self, shapes, attrs)
        d, x, n = attrs["dim"], shapes[0], len(attrs["sizes"])
        sigs += [Signature([S(a)], [S(a)] * n) for a in range(len(x)) if a != d and x[a] > 1]
        sigs.append(Signature([P], [P] * n))
        return sigs

    def out_shapes(self, shapes, attrs):
        out = []
        for size in attrs["sizes"]:
            s = list(shapes[0])
            s[attrs["dim"]] = size
            out.append(tuple(s))
        return out


class UnbindRule(Rule):
    def signatures(self, shapes, attrs):
        d, x = attrs["dim"], shapes[0]
        n = x[d]
        sigs = [Signature([B], [B] * n)]
        sigs += [Signature([S(a)], [S(a - (a > d))] * n) for a in range(len(x)) if a != d and x[a] > 1]
        sigs.append(Signature([P], [P] * n))
        return sigs

    def out_shapes(self, shapes, attrs):
        x = list(shapes[0])
        n = x.pop(attrs["dim"])
        return [tuple(x)] * n


register(CatRule(), shape_ops.Cat)
register(StackRule(), shape_ops.Stack)
register(SplitRule(), shape_ops.Split)
register(UnbindRule(), shape_ops.Unbind)


# ------------------------------------------------------------------ ops along one axis
class AlongAxesRule(Rule):
    """Ops that work along the axes in attribute `key` (an int, a tuple, or None for all):
    any other axis may be split (same shape out); `linear` adds P -> P."""

    def __init__(self, key, linear=False, extra=None, same_shape=True):
        self.key, self.linear, self.extra, self.same_shape = key, linear, extra, same_shape

    def _axes(self, shapes, attrs):
        x = shapes[0]
        v = attrs.get(self.key)
        if self.extra is not None:
            v = self.extra(attrs, x)
        if v is None:
            return set(range(len(x)))
        v = (v,) if isinstance(v, int) else tuple(v)
        return {d % max(len(x), 1) for d in v}

    def signatures(self, shapes, attrs):
        sigs = Rule.signatures(self, shapes, attrs)
        x = shapes[0]
        busy = self._axes(shapes, attrs)
        sigs += [Signature([S(a)], [S(a)]) for a in range(len(x)) if a not in busy and x[a] > 1]
        if self.linear:
            sigs.append(Signature([P], [P]))
        return sigs

    def out_shapes(self, shapes, attrs):
        return [tuple(shapes[0])] if self.same_shape else None


register(AlongAxesRule("dim", linear=True), reduction.Cumsum)
register(AlongAxesRule("dim"), reduction.Cumprod)
register(AlongAxesRule("dims", linear=True), shape_ops.Flip, shape_ops.Roll)
register(AlongAxesRule(None, linear=True, extra=lambda attrs, x: (len(x) - 2, len(x) - 1)), shape_ops.Tril)

register(ReduceRule(None, linear=False), reduction.Var, reduction.Std, reduction.LogSumExp)


class ArgMaxRule(Rule):
    def signatures(self, shapes, attrs):
        sigs = Rule.signatures(self, shapes, attrs)
        d, x = attrs["dim"], shapes[0]
        if d is None:
            return sigs
        for a in range(len(x)):
            if a != d and x[a] > 1:
                sigs.append(Signature([S(a)], [S(a if attrs["keepdim"] or a < d else a - 1)]))
        return sigs

    def out_shapes(self, shapes, attrs):
        d, x = attrs["dim"], list(shapes[0])
        if d is None:
            return None
        if attrs["keepdim"]:
            x[d] = 1
        else:
            del x[d]
        return [tuple(x)]


register(ArgMaxRule(), reduction.ArgMax)


# ------------------------------------------------------------------ gather / index_select
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
        out[attrs["dim"]] = _prod(idx)
        return [tuple(out)]


register(GatherRule(), indexing.Gather)
register(IndexSelectRule(), indexing.IndexSelect)


# ------------------------------------------------------------------ convolution and pooling
class BatchRule(Rule):
    """Per-sample ops on (N, C, H, W): the batch split on the data input, the other inputs
    (weights, bias) broadcast -> every output split on the batch. `channels`: also the channel
    axis (pooling and resampling work per channel)."""

    def __init__(self, n_out=1, channels=False):
        self.n_out, self.channels = n_out, channels

    def n_outputs(self, attrs):
        return self.n_out

    def signatures(self, shapes, attrs):
        sigs = Rule.signatures(self, shapes, attrs)
        x = shapes[0]
        rest = [None if s is None else B for s in shapes[1:]]
        for a in ((0, 1) if self.channels else (0,)):
            if len(x) > a and x[a] > 1:
                sigs.append(Signature([S(a)] + rest, [S(a)] * self.n_out))
        return sigs


register(BatchRule(), conv.Conv2d)
register(BatchRule(channels=True), conv.AvgPool2d)  # pooling wrappers always pass 4-D inputs
# resampling mixes only the last two axes (3-D or 4-D input), linearly
register(AlongAxesRule(None, linear=True, extra=lambda attrs, x: (len(x) - 2, len(x) - 1), same_shape=False),
         conv.Resample2d)
register(BatchRule(n_out=2, channels=True), conv.MaxPool2d)
