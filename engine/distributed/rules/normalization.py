"""SBP rules of engine/ops/normalization.py: layer_norm normalises each row, so rows may be split
(on the first axis: the 2-D view the kernel keeps stays a block of rows); normalize and
cosine_similarity run all-broadcast."""
from ...ops import normalization
from ..sbp import Signature, broadcast as B, split as S
from .base import Rule, sbp_rule


@sbp_rule(normalization.LayerNorm)
class LayerNormRule(Rule):
    """x split on axis 0 with weight and bias broadcast -> y, mean and rstd (hidden outputs)
    split on axis 0."""

    def n_outputs(self, attrs):
        return 3

    def signatures(self, shapes, attrs):
        sigs = Rule.signatures(self, shapes, attrs)
        x, w, b = shapes
        if len(x) > attrs["k"] and x[0] > 1:
            sigs.append(Signature([S(0), None if w is None else B, None if b is None else B], [S(0)] * 3))
        return sigs

    def out_shapes(self, shapes, attrs):
        x, k = tuple(shapes[0]), attrs["k"]
        lead = x[:len(x) - k]
        return [x, lead + (1,) * k, lead + (1,) * k]
