"""SBP rules of engine/ops/comparison.py: comparisons, isclose and maximum/minimum are pointwise;
where(c, x, y) is a selection, linear in (x, y) together: partial x and y give a partial result;
isin(elements, test) is pointwise in `elements` against the whole of `test`."""
from ...ops import comparison
from ..sbp import Signature, broadcast as B, split as S
from .base import Rule, sbp_rule
from .patterns import Pointwise, concrete_ops

sbp_rule(*[c for c in concrete_ops(comparison) if c not in (comparison.Where, comparison.IsIn)])(Pointwise())
sbp_rule(comparison.Where)(Pointwise(groups=[(1, 2)]))


@sbp_rule(comparison.IsIn)
class IsInRule(Rule):
    """Any axis of `elements` may be split (the answer has its shape) while `test` is whole."""

    def signatures(self, shapes, attrs):
        sigs = Rule.signatures(self, shapes, attrs)
        x = shapes[0]
        sigs += [Signature([S(a), B], [S(a)]) for a in range(len(x)) if x[a] > 1]
        return sigs

    def out_shapes(self, shapes, attrs):
        return [tuple(shapes[0])]
