"""SBP rules of the engine's ops, one file per op family: the rule of an op defined in
`engine/ops/<family>.py` is in `rules/<family>.py`, registered with `sbp_rule` where it is
written. `base.py` says what a rule is; `patterns.py` holds the shapes rules share (pointwise,
reductions, einsum-spec contractions). Ops without a rule run all-broadcast."""
from . import (  # noqa: F401  (each module registers its rules)
    _core, activation, comparison, conv, conversion, dropout, elementwise, indexing, linalg, logical, loss,
    normalization, reduction, shape, softmax, unary,
)
from .base import Rule, registered_ops, rule_for, sbp_rule  # noqa: F401
