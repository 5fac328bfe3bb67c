"""Reverse-mode automatic differentiation (PyTorch's torch.autograd API).

The layer below tensors: `graph` (nodes and the backward engine), `grad_mode`, and `function`
(saved-tensor contexts, custom Functions). It never imports `Tensor`; it works on objects with
the tensor protocol (see function.is_tensor).
"""
import warnings

from .anomaly import detect_anomaly, is_anomaly_check_nan_enabled, is_anomaly_enabled, set_detect_anomaly
from .function import Function, FunctionCtx, is_tensor
from .grad_mode import _state, enable_grad, inference_mode, is_grad_enabled, no_grad, set_grad_enabled
from .graph import Node, run_backward

__all__ = ["Function", "FunctionCtx", "grad", "backward", "no_grad", "enable_grad",
           "set_grad_enabled", "is_grad_enabled", "inference_mode", "Variable", "detect_anomaly",
           "set_detect_anomaly", "is_anomaly_enabled", "is_anomaly_check_nan_enabled"]


def _as_list(x):
    if x is None:
        return None
    return [x] if not isinstance(x, (list, tuple)) else list(x)


def _default_grads(outputs, grad_outputs):
    grads = _as_list(grad_outputs) or [None] * len(outputs)
    if len(grads) != len(outputs):
        raise RuntimeError(f"grad_outputs has {len(grads)} tensors but outputs has {len(outputs)}")
    res = []
    for o, g in zip(outputs, grads):
        if g is None:
            if o.numel() != 1:
                raise RuntimeError(
                    f"grad can be implicitly created only for scalar outputs; got a tensor of shape "
                    f"{tuple(o.shape)}: pass the gradient explicitly (`gradient=` to backward())"
                )
            g = o._constant_like(1 if _state.grad_root_scale == 1.0 else _state.grad_root_scale)
        elif tuple(g.shape) != tuple(o.shape):
            raise RuntimeError(
                f"gradient of shape {tuple(g.shape)} does not match tensor of shape {tuple(o.shape)}"
            )
        res.append(g)
    return res


def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, inputs=None):
    """Accumulate d(tensors)/d(leaf) into every leaf's `.grad` (only `inputs`' when given)."""
    tensors = _as_list(tensors)
    grads = _default_grads(tensors, grad_tensors)
    if _state.loss_scale is not None:
        grads = [_scaled(o, g) for o, g in zip(tensors, grads)]
    if retain_graph is None:
        retain_graph = create_graph
    if inputs is not None:
        inputs = _as_list(inputs)
        for t, g in zip(inputs, grad(tensors, inputs, grads, retain_graph, create_graph, allow_unused=True)):
            if g is not None and not t.retains_grad:  # a retained one got its .grad during the pass
                t._accumulate_grad(g)
        return
    run_backward(tensors, grads, retain_graph, create_graph)


def _scaled(o, g):
    """The root gradient of `o` times an nn.Graph's loss scale (set_grad_scaler), as
    `scaler.scale(o).backward(g)` gives it: the product in float32, cast to o's dtype."""
    g = g * _state.loss_scale(o)
    return g.to(o.dtype) if g.dtype != o.dtype else g


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False, only_inputs=True,
         allow_unused=None, is_grads_batched=False, materialize_grads=False):
    """Gradients of `outputs` with respect to `inputs`, returned instead of accumulated (torch's
    signature; `only_inputs` is deprecated and ignored there, with a FutureWarning when False, and
    here too; `is_grads_batched=True` (vmap over grad_outputs) is not supported)."""
    if not only_inputs:
        warnings.warn("only_inputs argument is deprecated and is ignored now (defaults to True). To accumulate "
                      "gradient for other parts of the graph, please use torch.autograd.backward.",
                      FutureWarning, stacklevel=2)
    if is_grads_batched:
        raise NotImplementedError("autograd.grad(is_grads_batched=True) is not supported: the engine has no vmap; "
                                  "call autograd.grad once per row of grad_outputs (retain_graph=True)")
    outputs = _as_list(outputs)
    inputs = _as_list(inputs)
    grads = _default_grads(outputs, grad_outputs)
    if retain_graph is None:
        retain_graph = create_graph
    edges = []
    for i, t in enumerate(inputs):
        edge = t._grad_edge()
        if edge is None:
            raise RuntimeError(f"input {i} of autograd.grad does not require grad")
        edges.append(edge)
    result = run_backward(outputs, grads, retain_graph, create_graph, capture=edges)
    for i, (t, g) in enumerate(zip(inputs, result)):
        if g is None:
            if materialize_grads:
                result[i] = t._constant_like(0)
            elif not allow_unused:
                raise RuntimeError(
                    f"One of the differentiated Tensors (input {i}, shape {tuple(t.shape)}) appears to "
                    "not have been used in the graph. Set allow_unused=True if this is the desired behavior."
                )
        elif not create_graph:
            result[i] = g.detach()
    return tuple(result)


class _VariableMeta(type):
    def __instancecheck__(cls, obj):  # every tensor is a Variable, as in torch
        return is_tensor(obj)

    def __call__(cls, data=None, requires_grad=False, volatile=False):
        if volatile:
            warnings.warn("volatile was removed and now has no effect. Use `with torch.no_grad():` instead.",
                          stacklevel=2)
        if data is None:
            raise TypeError("engine.autograd.Variable() needs a tensor: Variable(tensor, requires_grad=...)")
        if not is_tensor(data):
            raise TypeError(f"Variable data has to be a tensor, but got {type(data).__name__}")
        return data.detach().requires_grad_(bool(requires_grad))


class Variable(metaclass=_VariableMeta):
    """torch.autograd.Variable, the legacy wrapper: `Variable(t, requires_grad=rg)` is
    `t.detach().requires_grad_(rg)` (a leaf sharing t's memory), and every tensor is an
    instance of it."""
