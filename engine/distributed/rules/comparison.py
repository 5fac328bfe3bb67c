"""SBP rules of engine/ops/comparison.py: comparisons, isclose and maximum/minimum are pointwise;
where(c, x, y) is a selection, linear in (x, y) together: partial x and y give a partial result."""
from ...ops import comparison
from .base import sbp_rule
from .patterns import Pointwise, concrete_ops

sbp_rule(*[c for c in concrete_ops(comparison) if c is not comparison.Where])(Pointwise())
sbp_rule(comparison.Where)(Pointwise(groups=[(1, 2)]))
