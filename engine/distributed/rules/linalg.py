"""SBP rules of engine/ops/linalg.py. The products' signatures are generated from einsum specs
(patterns.Contraction): for matmul, rows of A split -> rows split, columns of B split ->
columns split, the contracted axis split on both -> partial sum, batch axes split alike, a
partial factor times broadcast ones -> partial. Linear is Megatron's column-parallel (W split on
out) and row-parallel (W split on in, x on its last axis, the bias partial with the result)."""
from ...ops import linalg
from ..sbp import Signature, partial_sum as P, split as S
from .base import Rule, sbp_rule
from .patterns import Contraction

sbp_rule(linalg.Matmul)(Contraction("...mk,...kn->...mn"))
sbp_rule(linalg.Linear)(Contraction("...i,oi,o->...o", added=(2,)))  # y = x W^T + b


@sbp_rule(linalg.SwapLast)
class SwapLastRule(Rule):
    """x.mT: a split on one of the last two axes moves to the other."""

    def signatures(self, shapes, attrs):
        nd = len(shapes[0])
        sigs = Rule.signatures(self, shapes, attrs) + [Signature([P], [P])]
        for a in range(nd):
            b = nd - 1 if a == nd - 2 else nd - 2 if a == nd - 1 else a
            sigs.append(Signature([S(a)], [S(b)]))
        return sigs

    def out_shapes(self, shapes, attrs):
        x = list(shapes[0])
        if len(x) >= 2:
            x[-1], x[-2] = x[-2], x[-1]
        return [tuple(x)]
