"""Op dispatch and custom autograd Functions.

`Op` is how every engine operator is declared (DESIGN.md "one op, three facts"):
  * `forward(ctx, *arrays, **attrs)`: the kernel, on backend arrays, written once for numpy/cupy;
  * `backward(ctx, *grads)`: the derivative, written in engine ops on Tensors, so that it works
    unchanged on global tensors and can itself be differentiated (`create_graph=True`);
  * SBP signatures, added for global tensors (`sbp_rule`), kept apart from both.
`Op.apply` is the single dispatch path. It is on the hot path of every step, so it does as little
as possible: unwrap, run the kernel, wrap, and record a `Node` only when a gradient is needed.

`Function` is PyTorch's user-facing custom function: forward and backward both on Tensors.
"""
import weakref

import numpy as np

from ..backend.dtypes import bfloat16 as _bf16
from .grad_mode import _state, no_grad
from .graph import Node

_BF16 = _bf16.np

_tensor_cls = None  # engine.tensor.Tensor, set when that module loads (avoids an import cycle)


def _Tensor():
    return _tensor_cls


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
                a = _alias(t)
                a.grad_fn = node
                res[k] = a
        return tuple(res)

    # PyTorch names
    def mark_non_differentiable(self, *tensors):
        self.__dict__.setdefault("_non_diff", set()).update(id(t) for t in tensors)

    def set_materialize_grads(self, value):
        self.__dict__["_materialize"] = bool(value)


class Op:
    """Base class of engine operators. Subclasses set:

    name           -- shown in grad_fn reprs and error messages
    save_inputs    -- indices of inputs the backward reads (kept alive in the graph)
    save_outputs   -- indices of outputs the backward reads
    differentiable -- False for ops with no gradient (comparisons, argmax, random sampling)
    """

    name = None
    save_inputs = ()
    save_outputs = ()
    differentiable = True
    sbp_rule = None  # global tensors: SBP signature inference, see engine.distributed

    @staticmethod
    def forward(ctx, *arrays, **attrs):
        raise NotImplementedError

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError

    @classmethod
    def apply(cls, *inputs, **attrs):
        """Run the op on Tensors (None allowed for optional inputs); returns a Tensor or a tuple."""
        if _global_dispatch is not None:
            for t in inputs:
                if t is not None and t._global is not None:
                    return _global_dispatch(cls, inputs, attrs)
        ctx = Context()
        arrays = [None if t is None else t._data for t in inputs]
        needs_grad = False
        if cls.differentiable and _state.enabled:
            for t in inputs:
                if t is not None and t._requires_grad:
                    needs_grad = True
                    break
        if needs_grad:
            ctx.needs_input_grad = tuple(t is not None and t._requires_grad for t in inputs)
        out = cls.forward(ctx, *arrays, **attrs)
        return _wrap_outputs(cls, ctx, inputs, out, needs_grad, _tensor_cls)


def _saved(t):
    """What a Node keeps of a tensor its backward reads.

    A leaf that requires grad is kept as itself (it can't be rebound by an in-place op, and its
    gradient must reach its own `.grad`). Anything else is kept as an alias: the same array,
    version counter and grad_fn, but a distinct object, so a later recorded in-place op that
    rebinds the original (`y.mul_(y)`) leaves the saved value intact, while `create_graph`
    backward still differentiates through it.
    """
    if t is None or (t.grad_fn is None and t._requires_grad):
        return t
    return _alias(t)


def _alias(t):
    a = t._make(t._data, t._device)
    a._vc = t._vc
    a.grad_fn = t.grad_fn
    a._output_nr = t._output_nr
    a._requires_grad = t._requires_grad
    a._global = t._global
    return a


def _wrap_outputs(cls, ctx, inputs, out, needs_grad, Tensor, device=None):
    if device is None:
        for t in inputs:
            if t is not None:
                device = t._device
                break
    single = not isinstance(out, tuple)
    outs = (out,) if single else out
    for a in outs:
        if isinstance(a, np.generic):
            # numpy turns 0-d results (e.g. 0-d + 0-d) into numpy scalars; a Tensor holds arrays
            outs = tuple(np.asarray(x) if isinstance(x, np.generic) else x for x in outs)
            break
    if not needs_grad:
        res = tuple(Tensor._make(a, device) for a in outs)
        return res[0] if single else res
    node = Node(cls.name or cls.__name__, cls.backward, ctx,
                tuple(None if t is None else t._grad_edge() for t in inputs), len(outs))
    res = []
    for i, a in enumerate(outs):
        t = Tensor._make(a, device)
        if a.dtype.kind in "fc" or a.dtype == _BF16:  # bfloat16 (ml_dtypes) has kind "V"
            t._requires_grad = True
            t.grad_fn = node
            t._output_nr = i
        res.append(t)
    if cls.save_inputs or cls.save_outputs:
        saved = [_saved(inputs[i]) for i in cls.save_inputs]
        if cls.save_outputs:
            ctx._outputs_from = len(saved)
            ctx._node = weakref.ref(node)
            for i in cls.save_outputs:
                a = _alias(res[i])
                a.grad_fn = None
                saved.append(a)
        ctx.save_for_backward(*saved)
    return res[0] if single else tuple(res)


_global_dispatch = None


def set_global_dispatch(fn):
    """Installed by engine.distributed: routes ops with global inputs through SBP inference."""
    global _global_dispatch
    _global_dispatch = fn


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
        Tensor = _tensor_cls
        ctx = FunctionCtx()
        tensor_args = [a if isinstance(a, Tensor) else None for a in args]
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
        shapes = [(o.shape, o.dtype, o.device) if isinstance(o, Tensor) else None for o in outs]

        def backward_fn(c, *grads):
            if materialize:
                grads = tuple(
                    g if g is not None or s is None else _zeros(*s) for g, s in zip(grads, shapes)
                )
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
        res = []
        for i, o in enumerate(outs):
            if isinstance(o, Tensor):
                o = Tensor._make(o._data, o._device)  # never rewire a tensor the caller still holds
                if o.dtype.is_floating_point and id(outs[i]) not in non_diff:
                    o._requires_grad = True
                    o.grad_fn = node
                    o._output_nr = i
            res.append(o)
        return res[0] if single else tuple(res)


def _zeros(shape, dtype, device):
    from .. import zeros

    return zeros(shape, dtype=dtype, device=device)
