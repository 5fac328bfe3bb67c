"""Reverse-mode automatic differentiation (PyTorch's torch.autograd API)."""
from .function import Function, FunctionCtx, Op
from .grad_mode import enable_grad, inference_mode, is_grad_enabled, no_grad, set_grad_enabled
from .graph import Node, run_backward

__all__ = ["Function", "FunctionCtx", "grad", "backward", "no_grad", "enable_grad",
           "set_grad_enabled", "is_grad_enabled", "inference_mode"]


def _as_list(x):
    if x is None:
        return None
    return [x] if not isinstance(x, (list, tuple)) else list(x)


def _default_grads(outputs, grad_outputs):
    from ..ops.creation import ones_like

    grads = _as_list(grad_outputs) or [None] * len(outputs)
    if len(grads) != len(outputs):
        raise RuntimeError(f"grad_outputs has {len(grads)} tensors but outputs has {len(outputs)}")
    res = []
    for o, g in zip(outputs, grads):
        if g is None:
            if o.numel() != 1:
                raise RuntimeError(
                    f"grad can be implicitly created only for scalar outputs; got shape {tuple(o.shape)}"
                )
            g = ones_like(o)
        res.append(g)
    return res


def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, inputs=None):
    tensors = _as_list(tensors)
    grads = _default_grads(tensors, grad_tensors)
    if retain_graph is None:
        retain_graph = create_graph
    if inputs is not None:
        inputs = _as_list(inputs)
        for t, g in zip(inputs, grad(tensors, inputs, grads, retain_graph, create_graph, allow_unused=True)):
            if g is not None:
                t._accumulate_grad(g)
        return
    run_backward(tensors, grads, retain_graph, create_graph)


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False, allow_unused=None,
         materialize_grads=False):
    """Gradients of `outputs` with respect to `inputs`, returned instead of accumulated."""
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
                from ..ops.creation import zeros_like

                result[i] = zeros_like(t)
            elif not allow_unused:
                raise RuntimeError(
                    f"One of the differentiated Tensors (input {i}, shape {tuple(t.shape)}) appears to "
                    "not have been used in the graph. Set allow_unused=True if this is the desired behavior."
                )
        elif not create_graph:
            result[i] = g.detach()
    return tuple(result)
