"""SBP rules of engine/ops/unary.py: every op there is pointwise (one shard in, the same shard
out)."""
from ...ops import unary
from .base import sbp_rule
from .patterns import Pointwise, concrete_ops

sbp_rule(*concrete_ops(unary))(Pointwise())
