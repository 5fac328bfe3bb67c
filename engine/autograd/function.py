"""Saved-tensor contexts and PyTorch's custom autograd `Function`.

`Context` carries what a backward needs (the tensors saved for it, with in-place checks); engine
operators (`engine.ops.op.Op`) and custom Functions both use it. `Function` is PyTorch's
user-facing custom function: forward and backward both on Tensors.

Autograd sits below the tensor layer and never imports `Tensor`: it works on any object with the
tensor protocol (`_grad_edge`, `_make`, `detach`, `_data`, ...), which engine.tensor.Tensor has.
"""
from ..backend import xp_for
from .grad_mode import _state, no_grad
from .graph import Node


def is_tensor(x):
    """Whether `x` takes part in autograd (has the tensor protocol)."""
    return hasattr(type(x), "_grad_edge")


class Context:
    """Carries what a backward needs. `saved` holds the Tensors named by the op's `save_inputs` /
    `save_outputs`; `ctx.save_for_backward` lets a backward keep other Tensors."""

    __slots__ = ("saved", "_versions", "needs_input_grad", "_outputs_from", "_node", "__dict__")

    def __init__(self):
        self.saved = ()
        self._versions = None
        self._outputs_from = None  # saved[k] for k >= this are outputs of the op itself

    def save_for_backward(self, *tensors):
        self.saved = tensors
        self._versions = tuple(t._version if t is not None else 0 for t in tensors)

    @property
    def saved_tensors(self):
        if self._versions is not None:
            for t, v in zip(self.saved, self._versions):
                if t is not None and t._version != v:
                    raise RuntimeError(
                        f"one of the variables needed for gradient computation has been modified by "
                        f"an inplace operation: tensor of shape {tuple(t.shape)} is at version "
                        f"{t._version}; expected version {v} instead."
                    )
        if self._outputs_from is None:
            return self.saved
        # An op's own outputs are stored without grad_fn: a stored link back to the node would
        # be a reference cycle keeping every activation alive until the cycle collector runs.
        # They get it back here, on fresh aliases, for create_graph backwards.
        node = self._node()
        res = list(self.saved)
        for k in range(self._outputs_from, len(res)):
            t = res[k]
            if t is not None and node is not None and t._requires_grad:
                a = alias(t)
                a.grad_fn = node
                res[k] = a
        return tuple(res)

    # PyTorch names
    def mark_non_differentiable(self, *tensors):
        self.__dict__.setdefault("_non_diff", set()).update(id(t) for t in tensors)

    def set_materialize_grads(self, value):
        self.__dict__["_materialize"] = bool(value)


def saved_input(t):
    """What a Node keeps of a tensor its backward reads.

    A leaf that requires grad is kept as itself (it can't be rebound by an in-place op, and its
    gradient must reach its own `.grad`). Anything else is kept as an alias: the same array,
    version counter and grad_fn, but a distinct object, so a later recorded in-place op that
    rebinds the original (`y.mul_(y)`) leaves the saved value intact, while `create_graph`
    backward still differentiates through it.
    """
    if t is None or (t.grad_fn is None and t._requires_grad):
        return t
    return alias(t)


def alias(t):
    a = t._make(t._data, t._device)
    a._vc = t._vc
    a.grad_fn = t.grad_fn
    a._output_nr = t._output_nr
    a._requires_grad = t._requires_grad
    a._global = t._global
    return a


class FunctionCtx(Context):
    pass


class Function:
    """A custom differentiable function, as in PyTorch:

        class Exp(flow.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                y = x.exp(); ctx.save_for_backward(y); return y
            @staticmethod
            def backward(ctx, gy):
                y, = ctx.saved_tensors; return gy * y
    """

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError

    @classmethod
    def apply(cls, *args, **kwargs):
        ctx = FunctionCtx()
        tensor_args = [a if is_tensor(a) else None for a in args]
        needs_grad = _state.enabled and any(t is not None and t.requires_grad for t in tensor_args)
        ctx.needs_input_grad = tuple(t is not None and t.requires_grad for t in tensor_args)
        with no_grad():
            out = cls.forward(ctx, *args, **kwargs)
        single = not isinstance(out, tuple)
        outs = (out,) if single else out
        if not needs_grad:
            return out
        non_diff = ctx.__dict__.get("_non_diff", set())
        materialize = ctx.__dict__.get("_materialize", True)
        # outputs are fresh tensors sharing the returned arrays: never rewire one the caller holds
        outputs = [o.detach() if is_tensor(o) else o for o in outs]
        zeros = [_zeros_maker(o) if is_tensor(o) else None for o in outputs]

        def backward_fn(c, *grads):
            if materialize:
                grads = tuple(g if g is not None or z is None else z() for g, z in zip(grads, zeros))
            res = cls.backward(c, *grads)
            if not isinstance(res, tuple):
                res = (res,)
            if len(res) < len(args):
                res = res + (None,) * (len(args) - len(res))
            for i, (g, t) in enumerate(zip(res, tensor_args)):
                if g is not None and t is not None and tuple(g.shape) != tuple(t.shape):
                    raise RuntimeError(
                        f"Function {cls.__name__} returned an invalid gradient at index {i} - got "
                        f"{list(g.shape)} but expected shape compatible with {list(t.shape)}"
                    )
            return res[: len(args)]

        node = Node(cls.__name__, backward_fn, ctx,
                    tuple(t._grad_edge() if t is not None and t.requires_grad else None for t in tensor_args),
                    len(outs))
        for i, o in enumerate(outputs):
            if is_tensor(o) and o.dtype.is_floating_point and id(outs[i]) not in non_diff:
                o._requires_grad = True
                o.grad_fn = node
                o._output_nr = i
        return outputs[0] if single else tuple(outputs)


def _zeros_maker(t):
    """A maker of zeros laid out like `t` (shard shape, dtype, device, global layout: zeros are
    a valid value of every SBP), holding no reference to `t` or its array."""
    make, shape, dtype, device, meta = t._make, t._data.shape, t._data.dtype, t._device, t._global

    def zeros():
        z = make(xp_for(device).zeros(shape, dtype=dtype), device)
        z._global = meta
        return z

    return zeros
