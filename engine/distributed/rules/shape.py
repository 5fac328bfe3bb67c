"""SBP rules of engine/ops/shape.py: layout ops move a split with the axis it is on, and are
linear (partial in, partial out)."""
from ...ops import shape
from ..sbp import Signature, broadcast as B, partial_sum as P, split as S
from .base import Rule, sbp_rule
from .patterns import AlongAxes, last_two_axes

sbp_rule(shape.Flip, shape.Roll)(AlongAxes("dims", linear=True))
sbp_rule(shape.Tril)(AlongAxes(axes=last_two_axes, linear=True))


@sbp_rule(shape.Permute)
class PermuteRule(Rule):
    """A split moves with its axis to the axis's new position."""

    def signatures(self, shapes, attrs):
        dims = attrs["dims"]
        sigs = Rule.signatures(self, shapes, attrs)
        sigs += [Signature([S(d)], [S(i)]) for i, d in enumerate(dims)]
        sigs.append(Signature([P], [P]))
        return sigs

    def out_shapes(self, shapes, attrs):
        return [tuple(shapes[0][d] for d in attrs["dims"])]


@sbp_rule(shape.Cat)
class CatRule(Rule):
    """Every input split alike on an axis other than the joined one -> split there."""

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


@sbp_rule(shape.Stack)
class StackRule(Rule):
    """Every input split alike on an axis -> split on that axis of the output (shifted past the
    new one)."""

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


@sbp_rule(shape.Split)
class SplitRule(Rule):
    """Split on an axis other than the cut one -> every piece split there."""

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


@sbp_rule(shape.Unbind)
class UnbindRule(Rule):
    """Split on an axis other than the removed one -> every slice split there (renumbered)."""

    def signatures(self, shapes, attrs):
        d, x = attrs["dim"], shapes[0]
        n = x[d]  # one output per slice
        sigs = [Signature([B], [B] * n)]
        sigs += [Signature([S(a)], [S(a - (a > d))] * n) for a in range(len(x)) if a != d and x[a] > 1]
        sigs.append(Signature([P], [P] * n))
        return sigs

    def out_shapes(self, shapes, attrs):
        x = list(shapes[0])
        n = x.pop(attrs["dim"])
        return [tuple(x)] * n
