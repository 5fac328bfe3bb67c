"""SBP rules of engine/ops/reduction.py. Summing over a split axis leaves a partial sum; the other
reductions keep the reduced axes whole (a mean would need a rescale, a max/min a partial max
whose gradient reaches only the rank holding the extremum, which a local backward cannot know),
so only their other axes may stay split."""
from ...ops import reduction
from ..sbp import Signature, partial_sum as P, split as S
from .base import Rule, sbp_rule
from .patterns import AlongAxes, Reduce

sbp_rule(reduction.Sum)(Reduce(P, linear=True))
sbp_rule(reduction.Mean, reduction.Amax, reduction.Var, reduction.Std, reduction.LogSumExp)(Reduce())
sbp_rule(reduction.Cumsum)(AlongAxes("dim", linear=True))
sbp_rule(reduction.Cumprod, reduction.LogCumSumExp)(AlongAxes("dim"))


@sbp_rule(reduction.ArgMax)
class ArgMaxRule(Rule):
    """argmax/argmin along `dim`: any other axis may be split (renumbered without keepdim)."""

    def signatures(self, shapes, attrs):
        sigs = Rule.signatures(self, shapes, attrs)
        d, x = attrs["dim"], shapes[0]
        if d is None:
            return sigs
        for a in range(len(x)):
            if a != d and x[a] > 1:
                sigs.append(Signature([S(a)], [S(a if attrs["keepdim"] or a < d else a - 1)]))
        return sigs

    def out_shapes(self, shapes, attrs):
        d, x = attrs["dim"], list(shapes[0])
        if d is None:
            return None
        if attrs["keepdim"]:
            x[d] = 1
        else:
            del x[d]
        return [tuple(x)]
