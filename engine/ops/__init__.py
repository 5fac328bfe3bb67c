"""Operator families, one per module: each declares its ops (`Op` subclasses: kernel + backward in
engine ops) and attaches the Tensor methods; the SBP rule of an op in `ops/<family>.py` is in
`engine/distributed/rules/<family>.py`. `PUBLIC_OPS` is what the parity harness must cover.
"""
from . import _core, conversion, creation  # noqa: F401
from . import (  # noqa: F401
    activation, attention, comparison, conv, dropout, elementwise, indexing, linalg, logical, loss, normalization,
    random_ops, reduction, shape, softmax, unary, vision,
)

OP_FAMILIES = (elementwise, unary, comparison, logical, reduction, shape, indexing, linalg, softmax,
               normalization, dropout, loss, conv, random_ops, attention, activation, vision)

PUBLIC_OPS = sorted({name for fam in OP_FAMILIES for name in fam.__all__})
