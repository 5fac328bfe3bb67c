"""`spectral_norm` / `remove_spectral_norm`: torch.nn.utils.spectral_norm, the forward-pre-hook form.

The parameter `name` becomes `name_orig`, with buffers `name_u` and `name_v` (the power
iteration's singular vectors, drawn from N(0, 1) and normalised at registration, as torch). Before
each forward `module.name = W / sigma` with sigma = u . (W_mat v), W_mat the weight with `dim`
first, flattened to a matrix. In training mode `n_power_iterations` steps first update u and v in
place (without gradient, as torch); in eval mode the stored u and v are used. The state_dict keys
are torch's (`weight_orig`, `weight_u`, `weight_v`), so checkpoints load across. Not kept: torch's
state-dict version hooks for checkpoints from before torch 1.1.
"""
from ...autograd.grad_mode import no_grad
from ...ops.normalization import normalize
from ...tensor import Parameter
from ..modules.conv import _ConvTransposeNd
from .weight_norm import _find_hook, _remove_hook

__all__ = ["spectral_norm", "remove_spectral_norm"]


class SpectralNorm:
    """The forward pre-hook recomputing `module.<name>` as `<name>_orig` / sigma."""

    _version = 1

    def __init__(self, name="weight", n_power_iterations=1, dim=0, eps=1e-12):
        self.name = name
        self.dim = dim
        if n_power_iterations <= 0:
            raise ValueError("Expected n_power_iterations to be positive, but got "
                             f"n_power_iterations={n_power_iterations}")
        self.n_power_iterations = n_power_iterations
        self.eps = eps

    def reshape_weight_to_matrix(self, weight):
        mat = weight
        if self.dim != 0:
            mat = mat.permute(self.dim, *[d for d in range(mat.dim()) if d != self.dim])
        return mat.reshape(mat.shape[0], -1)

    def compute_weight(self, module, do_power_iteration):
        weight = getattr(module, self.name + "_orig")
        u = getattr(module, self.name + "_u")
        v = getattr(module, self.name + "_v")
        mat = self.reshape_weight_to_matrix(weight)
        if do_power_iteration:
            with no_grad():
                for _ in range(self.n_power_iterations):
                    v.copy_(normalize(mat.t().mv(u), dim=0, eps=self.eps))  # the buffers, in place (out=)
                    u.copy_(normalize(mat.mv(v), dim=0, eps=self.eps))
                u, v = u.clone(), v.clone()  # later in-place updates must not reach this step's graph
        sigma = u.dot(mat.mv(v))
        return weight / sigma

    def remove(self, module):
        with no_grad():
            weight = self.compute_weight(module, do_power_iteration=False)
        for suffix in ("", "_u", "_v", "_orig"):
            delattr(module, self.name + suffix)
        module.register_parameter(self.name, Parameter(weight.detach()))

    def __call__(self, module, inputs):
        setattr(module, self.name, self.compute_weight(module, do_power_iteration=module.training))

    @staticmethod
    def apply(module, name, n_power_iterations, dim, eps):
        if _find_hook(module, SpectralNorm, name) is not None:
            raise RuntimeError(f"Cannot register two spectral_norm hooks on the same parameter {name}")
        fn = SpectralNorm(name, n_power_iterations, dim, eps)
        weight = module._parameters[name]
        if weight is None:
            raise ValueError(f"`SpectralNorm` cannot be applied as parameter `{name}` is None")
        with no_grad():
            h, w = fn.reshape_weight_to_matrix(weight).shape
            u = normalize(weight.new_empty(h).normal_(0, 1), dim=0, eps=fn.eps)
            v = normalize(weight.new_empty(w).normal_(0, 1), dim=0, eps=fn.eps)
        delattr(module, fn.name)
        module.register_parameter(fn.name + "_orig", weight)
        setattr(module, fn.name, weight.detach())
        module.register_buffer(fn.name + "_u", u)
        module.register_buffer(fn.name + "_v", v)
        module.register_forward_pre_hook(fn)
        return fn


def spectral_norm(module, name="weight", n_power_iterations=1, eps=1e-12, dim=None):
    """Divide `module.<name>` by its largest singular value, estimated by power iteration
    (torch.nn.utils.spectral_norm; dim defaults to 1 for transposed convolutions, else 0)."""
    if dim is None:
        dim = 1 if isinstance(module, _ConvTransposeNd) else 0
    SpectralNorm.apply(module, name, n_power_iterations, dim, eps)
    return module


def remove_spectral_norm(module, name="weight"):
    """Replace the spectral norm of `module.<name>` by a plain parameter holding W / sigma."""
    return _remove_hook(module, SpectralNorm, name, "spectral_norm")
