"""`weight_norm` / `remove_weight_norm`: torch.nn.utils.weight_norm, the forward-pre-hook form.

The parameter `name` is replaced by `name_g` (the norm over every dim but `dim`, kept with size-1
dims; a 0-dim norm of the whole tensor for dim=None) and `name_v` (the direction), and before each
forward `module.name = v * (g / norm_except_dim(v))`, recomputed in engine ops so gradients reach
g and v. The state_dict keys are torch's (`weight_g`, `weight_v`), so checkpoints load across.
As torch, dim=-1 means "the whole tensor" (torch's norm_except_dim rule), and it warns that
parametrizations.weight_norm is the newer form.
"""
import warnings

from ...tensor import Parameter

__all__ = ["weight_norm", "remove_weight_norm", "norm_except_dim"]


def norm_except_dim(v, pow=2, dim=0):
    """torch.norm_except_dim: the `pow`-norm over every dim but `dim` (size-1 dims kept); dim=-1:
    the norm of the whole tensor (0-dim)."""
    if dim == -1:
        return v.norm(pow)
    dim = dim % v.ndim
    return v.norm(pow, dim=[d for d in range(v.ndim) if d != dim], keepdim=True)


def _weight_norm(v, g, dim):
    """torch._weight_norm: v scaled to norm g along `dim`."""
    return v * (g / norm_except_dim(v, 2, dim))


def _find_hook(module, cls, name):
    """The forward pre-hook entry of type `cls` for parameter `name`, or None."""
    for entry in module._forward_pre_hooks:
        if isinstance(entry.fn, cls) and entry.fn.name == name:
            return entry
    return None


def _remove_hook(module, cls, name, what):
    """remove_weight_norm / remove_spectral_norm: undo the `cls` hook on parameter `name`."""
    entry = _find_hook(module, cls, name)
    if entry is None:
        raise ValueError(f"{what} of '{name}' not found in {module}")
    entry.fn.remove(module)
    module._forward_pre_hooks.remove(entry)
    return module


class WeightNorm:
    """The forward pre-hook recomputing `module.<name>` from `<name>_g` and `<name>_v`."""

    def __init__(self, name, dim):
        self.name = name
        self.dim = -1 if dim is None else dim

    def compute_weight(self, module):
        return _weight_norm(getattr(module, self.name + "_v"), getattr(module, self.name + "_g"), self.dim)

    @staticmethod
    def apply(module, name, dim):
        warnings.warn("torch.nn.utils.weight_norm is deprecated in favor of "
                      "torch.nn.utils.parametrizations.weight_norm.", FutureWarning, stacklevel=3)
        if _find_hook(module, WeightNorm, name) is not None:
            raise RuntimeError(f"Cannot register two weight_norm hooks on the same parameter {name}")
        fn = WeightNorm(name, dim)
        weight = getattr(module, name)
        del module._parameters[name]
        module.register_parameter(name + "_g", Parameter(norm_except_dim(weight, 2, fn.dim).detach()))
        module.register_parameter(name + "_v", Parameter(weight.detach()))
        setattr(module, name, fn.compute_weight(module))
        module.register_forward_pre_hook(fn)
        return fn

    def remove(self, module):
        weight = self.compute_weight(module)
        delattr(module, self.name)
        del module._parameters[self.name + "_g"]
        del module._parameters[self.name + "_v"]
        setattr(module, self.name, Parameter(weight.detach()))

    def __call__(self, module, inputs):
        setattr(module, self.name, self.compute_weight(module))


def weight_norm(module, name="weight", dim=0):
    """Reparametrise `module.<name>` as g * v / ||v|| (torch.nn.utils.weight_norm)."""
    WeightNorm.apply(module, name, dim)
    return module


def remove_weight_norm(module, name="weight"):
    """Fold the weight norm back into a plain parameter `module.<name>`."""
    return _remove_hook(module, WeightNorm, name, "weight_norm")
