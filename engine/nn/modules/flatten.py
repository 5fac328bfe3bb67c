"""`Flatten` and `Unflatten`: reshape a range of dims (views, no copy)."""
from ...tensor import _check_dim
from ..module import Module

__all__ = ["Flatten", "Unflatten"]


class Flatten(Module):
    def __init__(self, start_dim=1, end_dim=-1):
        super().__init__()
        self.start_dim = start_dim
        self.end_dim = end_dim

    def forward(self, input):
        shape = list(input.shape)
        if not shape:
            return input.reshape(1)
        s, e = _check_dim(self.start_dim, len(shape)), _check_dim(self.end_dim, len(shape))
        if s > e:
            raise RuntimeError("flatten() has invalid args: start_dim cannot come after end_dim")
        n = 1
        for x in shape[s:e + 1]:
            n *= x
        return input.reshape(shape[:s] + [n] + shape[e + 1:])

    def extra_repr(self):
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Unflatten(Module):
    def __init__(self, dim, unflattened_size):
        super().__init__()
        self.dim = dim
        self.unflattened_size = tuple(unflattened_size)

    def forward(self, input):
        shape = list(input.shape)
        d = _check_dim(self.dim, len(shape))
        return input.reshape(shape[:d] + list(self.unflattened_size) + shape[d + 1:])

    def extra_repr(self):
        return f"dim={self.dim}, unflattened_size={self.unflattened_size}"
