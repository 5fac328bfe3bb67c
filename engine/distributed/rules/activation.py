"""SBP rules of engine/ops/activation.py: every kernel op there is pointwise (one shard in, the
same shard out); the composed activations (glu, prelu, softsign, tanhshrink) are made of ops
with rules of their own."""
from ...ops import activation
from .base import sbp_rule
from .patterns import Pointwise, concrete_ops

sbp_rule(*concrete_ops(activation))(Pointwise())
