"""SBP rules of engine/ops/softmax.py: a softmax needs its whole axis on one rank, so any other
axis may be split; the fused attention softmax works over the last axis."""
from ...ops import softmax
from ..sbp import Signature, split as S
from .base import Rule, sbp_rule
from .patterns import Pointwise

sbp_rule(softmax.ScaleMaskSoftmax)(Pointwise(last_whole=True))  # scores and mask broadcast alike


@sbp_rule(softmax.Softmax, softmax.LogSoftmax)
class RowwiseRule(Rule):
    """softmax/log_softmax over `axis`: any other axis may be split."""

    def signatures(self, shapes, attrs):
        axis = attrs["axis"] % max(len(shapes[0]), 1)
        sigs = Rule.signatures(self, shapes, attrs)
        sigs += [Signature([S(a)], [S(a)]) for a in range(len(shapes[0])) if a != axis and shapes[0][a] > 1]
        return sigs

    def out_shapes(self, shapes, attrs):
        return [tuple(shapes[0])]
