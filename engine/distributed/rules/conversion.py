"""SBP rules of engine/ops/conversion.py: a device move keeps every layout (each rank moves its
own shard; `.cpu()` / `.cuda()` of a global tensor then change its placement's device type)."""
from ...ops import conversion
from .base import sbp_rule
from .patterns import Pointwise

sbp_rule(conversion.ToDevice)(Pointwise(linear=True))
