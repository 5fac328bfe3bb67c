"""SBP rules of engine/ops/unary.py: every op there is pointwise (one shard in, the same shard
out); exact GELU has a second output (the normal CDF its backward reuses)."""
from ...ops import unary
from .base import sbp_rule
from .patterns import Pointwise, concrete_ops

sbp_rule(*[c for c in concrete_ops(unary) if c is not unary.GeluExact])(Pointwise())
sbp_rule(unary.GeluExact)(Pointwise(n_out=2))
