"""Rule patterns that many ops share: pointwise broadcasting, work along some axes, reductions,
per-sample ops, and contractions written as an einsum spec (matmul, linear)."""
from ..sbp import Signature, broadcast as B, partial_sum as P, split as S
from .base import Rule


def broadcast_shape(shapes):
    """The broadcast of the present `shapes` (None entries are absent inputs)."""
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


def concrete_ops(module):
    """Every op class defined in `module` (an engine.ops family) except the abstract bases, whose
    names start with "_": for families whose ops all follow one pattern (every op of unary.py is
    pointwise)."""
    from ...ops.op import Op

    found, stack = [], [Op]
    while stack:
        for c in stack.pop().__subclasses__():
            stack.append(c)
            if c.__module__ == module.__name__ and c not in found and not c.__name__.startswith("_"):
                found.append(c)
    return found


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
        out = broadcast_shape(shapes)
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
        out = tuple(broadcast_shape(shapes))
        return [out] * self.n_out


class AlongAxes(Rule):
    """Ops that work along the axes in attribute `key` (an int, a tuple, or None for all), or
    along `axes(attrs, shape)`: any other axis may be split (same shape out); `linear` adds
    P -> P."""

    def __init__(self, key=None, linear=False, axes=None, same_shape=True):
        self.key, self.linear, self.axes, self.same_shape = key, linear, axes, same_shape

    def _busy(self, shapes, attrs):
        x = shapes[0]
        v = self.axes(attrs, x) if self.axes is not None else attrs.get(self.key)
        if v is None:
            return set(range(len(x)))
        v = (v,) if isinstance(v, int) else tuple(v)
        return {d % max(len(x), 1) for d in v}

    def signatures(self, shapes, attrs):
        sigs = Rule.signatures(self, shapes, attrs)
        x = shapes[0]
        busy = self._busy(shapes, attrs)
        sigs += [Signature([S(a)], [S(a)]) for a in range(len(x)) if a not in busy and x[a] > 1]
        if self.linear:
            sigs.append(Signature([P], [P]))
        return sigs

    def out_shapes(self, shapes, attrs):
        return [tuple(shapes[0])] if self.same_shape else None


def last_two_axes(attrs, shape):
    return (len(shape) - 2, len(shape) - 1)


class Reduce(Rule):
    """Reductions over attribute `axes` (None: all) with `keepdim`: reducing a split axis gives
    `partial` (P for sum; None where no partial form exists, then the axis must be whole); other
    split axes survive, renumbered when the reduced axes are dropped; `linear` adds P -> P."""

    def __init__(self, partial=None, linear=False):
        self.partial, self.linear = partial, linear

    @staticmethod
    def _axes(x, attrs):
        axes = attrs.get("axes")
        return tuple(range(len(x))) if axes is None else tuple(a % max(len(x), 1) for a in axes)

    def signatures(self, shapes, attrs):
        x = shapes[0]
        axes = self._axes(x, attrs)
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
        axes = self._axes(x, attrs)
        if attrs.get("keepdim", False):
            return [tuple(1 if a in axes else d for a, d in enumerate(x))]
        return [tuple(d for a, d in enumerate(x) if a not in axes)]


class PerSample(Rule):
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


class Contraction(Rule):
    """The signatures of a product written as an einsum `spec`, e.g. matmul "...mk,...kn->...mn"
    and linear "...i,oi,o->...o" with `added=(2,)` (the bias is summed into the product, not
    multiplied). "..." are leading batch axes that broadcast. Generated, per mesh axis:

      * a batch axis: the operands that span it split there, those that broadcast along it stay
        broadcast -> the output split there (data parallelism, listed first);
      * an output letter: the operands that have it split there, the others broadcast -> the
        output split there (rows of A, columns of B);
      * a contracted letter: the operands that have it split there -> partial sum; an added
        operand (the bias) goes partial with it, so that it is counted once;
      * one multiplied operand partial, the others broadcast (and added ones partial) ->
        partial: the product is linear in each factor.

    An operand with fewer axes than its spec (a 1-D matmul operand) leaves only the default."""

    def __init__(self, spec, added=()):
        lhs, self.out = spec.replace(" ", "").split("->")
        self.operands = lhs.split(",")
        self.added = tuple(added)

    def _layout(self, shapes):
        """Per present operand: {letter: axis}, its batch axes, or None if a shape is too short."""
        layout = []
        for term, shape in zip(self.operands, shapes):
            if shape is None:
                layout.append(None)
                continue
            letters = term.replace("...", "")
            batch = len(shape) - len(letters)
            if batch < 0 or (batch and "..." not in term):
                return None
            layout.append(({c: batch + i for i, c in enumerate(letters)}, batch))
        return layout

    def signatures(self, shapes, attrs):
        sigs = Rule.signatures(self, shapes, attrs)
        layout = self._layout(shapes)
        if layout is None:
            return sigs
        out_letters = self.out.replace("...", "")
        n_batch = max((lay[1] for lay in layout if lay is not None), default=0)
        out_axis = {c: n_batch + i for i, c in enumerate(out_letters)}

        def spread(letter, absent):
            return [None if lay is None else S(lay[0][letter]) if letter in lay[0] else absent(i)
                    for i, lay in enumerate(layout)]

        for o, extent in enumerate(self._batch(shapes, layout)):
            if extent > 1:
                sigs.append(Signature([None if lay is None else _on_batch_axis(shape, lay[1] - n_batch + o, extent)
                                       for shape, lay in zip(shapes, layout)], [S(o)]))
        for c in out_letters:
            sigs.append(Signature(spread(c, lambda i: B), [S(out_axis[c])]))
        contracted = [c for c in dict.fromkeys("".join(self.operands).replace(".", "")) if c not in out_letters]
        for c in contracted:
            sigs.append(Signature(spread(c, lambda i: P if i in self.added else B), [P]))
        for k in range(len(layout)):
            if k not in self.added and layout[k] is not None:
                sigs.append(Signature([None if lay is None else P if i == k or i in self.added else B
                                       for i, lay in enumerate(layout)], [P]))
        return sigs

    @staticmethod
    def _batch(shapes, layout):
        return broadcast_shape([shape[:lay[1]] if lay is not None else None
                                for shape, lay in zip(shapes, layout)] + [()])

    def out_shapes(self, shapes, attrs):
        layout = self._layout(shapes)
        if layout is None:
            return None
        batch = self._batch(shapes, layout)
        sizes = {c: shape[axis] for shape, lay in zip(shapes, layout) if lay is not None
                 for c, axis in lay[0].items()}
        return [tuple(batch) + tuple(sizes[c] for c in self.out.replace("...", ""))]


def _on_batch_axis(shape, axis, extent):
    """An operand's SBP for an output batch axis of `extent`, which is the operand's own `axis`
    (negative: the operand has no such axis): split where it spans the axis, else broadcast."""
    return S(axis) if axis >= 0 and shape[axis] == extent else B
