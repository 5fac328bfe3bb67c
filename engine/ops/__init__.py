"""Operator families. Each module declares its ops (kernel + backward in engine ops) and
attaches Tensor methods; `PUBLIC_OPS` is what the parity harness must cover."""
from . import _core, conversion, creation, elementwise, unary, reduction, shape, indexing, linalg, nn_ops, conv, random_ops  # noqa: F401

OP_FAMILIES = (elementwise, unary, reduction, shape, indexing, linalg, nn_ops, conv, random_ops)

PUBLIC_OPS = sorted({name for fam in OP_FAMILIES for name in fam.__all__})
