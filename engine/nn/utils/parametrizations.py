"""`engine.nn.utils.parametrizations.weight_norm`: torch's parametrization form of weight norm
(`parametrize.register_parametrization` with `_WeightNorm`, unsafe=True): the weight is
computed from `parametrizations.weight.original0` (g) and `original1` (v), torch's state_dict
keys. Not kept: torch's load_state_dict pre-hook that renames old `weight_g` / `weight_v` keys
(engine Modules have no load-state-dict pre-hooks); load such a checkpoint by renaming them."""
from ..module import Module
from . import parametrize
from .weight_norm import _weight_norm, norm_except_dim

__all__ = ["weight_norm"]


class _WeightNorm(Module):
    def __init__(self, dim=0):
        super().__init__()
        self.dim = -1 if dim is None else dim

    def forward(self, weight_g, weight_v):
        return _weight_norm(weight_v, weight_g, self.dim)

    def right_inverse(self, weight):
        return norm_except_dim(weight, 2, self.dim), weight


def weight_norm(module, name="weight", dim=0):
    """Reparametrise `module.<name>` as g * v / ||v|| through parametrize."""
    parametrize.register_parametrization(module, name, _WeightNorm(dim), unsafe=True)
    return module
