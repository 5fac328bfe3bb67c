"""SBP rules of engine/ops/elementwise.py: arithmetic is pointwise; + and - are linear (partial
in, partial out), * keeps a partial factor times a broadcast one partial, / a partial dividend."""
from ...ops import elementwise
from .base import sbp_rule
from .patterns import Pointwise

sbp_rule(elementwise.Neg, elementwise.Add, elementwise.AddHalfToFloat, elementwise.Sub)(Pointwise(linear=True))
sbp_rule(elementwise.Mul)(Pointwise(scales=(0, 1)))
sbp_rule(elementwise.Div)(Pointwise(scales=(0,)))
sbp_rule(elementwise.FloorDivide, elementwise.Fmod, elementwise.Remainder, elementwise.Pow,
         elementwise.PowScalar, elementwise.Atan2, elementwise.Addcmul, elementwise.Addcdiv)(Pointwise())
