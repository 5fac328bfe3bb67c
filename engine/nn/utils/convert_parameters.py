"""`parameters_to_vector` / `vector_to_parameters`, as torch.nn.utils: flatten parameters into one
vector (differentiable: a cat of views) and write a vector back into them (through `.data`, so
the parameters become views of the vector, as in torch)."""
from ...ops.shape import cat
from ...tensor import Tensor

__all__ = ["parameters_to_vector", "vector_to_parameters"]


def _check_param_device(param, device):
    """All parameters must sit on one device (torch's TypeError otherwise); returns that device."""
    if device is not None and param.device != device:
        raise TypeError("Found two parameters on different devices, this is currently not supported.")
    return param.device


def _typename(obj):
    """torch.typename of a non-tensor: the qualified class name, builtins unqualified."""
    cls = type(obj)
    return cls.__qualname__ if cls.__module__ in ("", "builtins") else f"{cls.__module__}.{cls.__qualname__}"


def parameters_to_vector(parameters):
    """One 1-D tensor holding every parameter's values in order."""
    device = None
    vec = []
    for param in parameters:
        device = _check_param_device(param, device)
        vec.append(param.view(-1))
    return cat(vec)


def vector_to_parameters(vec, parameters):
    """Give each parameter, in order, the next `numel()` values of `vec` (its `.data` becomes a
    view of `vec`)."""
    if not isinstance(vec, Tensor):
        raise TypeError(f"expected torch.Tensor, but got: {_typename(vec)}")
    device = None
    pointer = 0
    for param in parameters:
        device = _check_param_device(param, device)
        num_param = param.numel()
        param.data = vec[pointer:pointer + num_param].view_as(param).data
        pointer += num_param
