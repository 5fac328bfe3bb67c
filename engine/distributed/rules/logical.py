"""SBP rules of engine/ops/logical.py: every logical and bitwise op is pointwise."""
from ...ops import logical
from .base import sbp_rule
from .patterns import Pointwise, concrete_ops

sbp_rule(*concrete_ops(logical))(Pointwise())
