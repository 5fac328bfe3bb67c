"""`Op`: how every engine operator is declared, and the single dispatch path of the engine.

An operator is a subclass of `Op` with two facts about it (docs/engine.md "One op, three facts"):
  * `forward(ctx, *arrays, **attrs)`: the kernel, on backend arrays, written once for numpy/cupy;
  * `backward(ctx, *grads)`: the derivative, written in engine ops on Tensors, so that it can
    itself be differentiated (`create_graph=True`).
The third fact, its SBP rule for global tensors, lives in `engine/distributed/rules/<family>.py`,
the file named like the op's own module here.

`Op.apply` is on the hot path of every step, so it does as little as possible: unwrap, run the
kernel, wrap, and record a `Node` only when a gradient is needed. A call with a global input goes
to the global dispatch that engine.distributed registers with `set_global_dispatch`.
"""
import weakref

import numpy as np

from ..autograd.function import Context, alias, saved_input
from ..autograd.grad_mode import _state
from ..autograd.graph import Node
from ..backend.dtypes import bfloat16 as _bf16
from ..backend.dtypes import float32 as _F32
from ..tensor import Tensor

_BF16 = _bf16.np

_global_dispatch = None
_autocast_cast = None  # engine.ops._core registers its recorded cast (the Cast op) here


def set_autocast_cast(fn):
    global _autocast_cast
    _autocast_cast = fn


def set_global_dispatch(fn):
    """engine.distributed registers `fn(op_cls, inputs, attrs)` here when it loads: it runs ops
    whose inputs are global tensors (SBP inference, boxing, the kernel on shards)."""
    global _global_dispatch
    _global_dispatch = fn


class Op:
    """Base class of engine operators. Subclasses set:

    name           -- shown in grad_fn reprs and error messages
    save_inputs    -- indices of inputs the backward reads (kept alive in the graph); a forward
                      may add more for its call (`ctx.more_saved_inputs`, see saved_input_indices)
    save_outputs   -- indices of outputs the backward reads
    differentiable -- False for ops with no gradient (comparisons, argmax, random sampling)
    autocast       -- what engine.amp.autocast does to its floating inputs (PyTorch's lists):
                      "lower" (to the autocast dtype: matmul, linear, conv, attention),
                      "fp32" (to float32: losses), "fp32_cuda" (to float32 under a CUDA autocast
                      only: softmax, layer_norm), None (run in the inputs' dtypes)
    """

    name = None
    save_inputs = ()
    save_outputs = ()
    differentiable = True
    autocast = None

    @staticmethod
    def forward(ctx, *arrays, **attrs):
        raise NotImplementedError

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError

    @classmethod
    def saved_input_indices(cls, ctx):
        """The inputs this call's backward reads: the class's `save_inputs`, then those its
        forward named in `ctx.more_saved_inputs` for this call only (the fused cross-entropy's
        logits: saved, so that an in-place change before the backward is an error)."""
        return cls.save_inputs + ctx.__dict__.get("more_saved_inputs", ())

    @classmethod
    def apply(cls, *inputs, **attrs):
        """Run the op on Tensors (None allowed for optional inputs); returns a Tensor or a tuple."""
        if cls.autocast is not None and _state.autocast is not None:
            inputs = _autocast_inputs(cls.autocast, _state.autocast, inputs)
        device = None
        try:
            for t in inputs:
                if t is not None:
                    if t._global is not None:
                        if _global_dispatch is None:
                            raise RuntimeError("global tensors need engine.distributed (import engine)")
                        return _global_dispatch(cls, inputs, attrs)
                    if device is None:
                        device = t._device
                    elif t._device is not device and t._device != device:
                        inputs = same_device(cls, inputs)
                        break
        except AttributeError:  # an input that is no engine Tensor (a torch.Tensor, a numpy array)
            check_inputs(cls.name or cls.__name__, inputs)
            raise
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
        tracer = _state.tracer
        if tracer is None:
            out = cls.forward(ctx, *arrays, **attrs)
        else:  # nn.Graph is capturing this step (engine.autograd.trace)
            out = tracer.kernel(cls, ctx, arrays, attrs)
        return wrap_outputs(cls, ctx, inputs, out, needs_grad, attrs)


def foreign_tensor_error(x, where):
    """The TypeError for a torch.Tensor (or Parameter) handed to the engine at `where`, else None.
    torch is never imported: its tensors are told by the module of their type."""
    module = type(x).__module__ or ""
    if module != "torch" and not module.startswith("torch."):
        return None
    name = f"{module}.{type(x).__qualname__}"
    what = "a torch.Tensor" if name == "torch.Tensor" else f"a {name} (a torch.Tensor)"
    return TypeError(f"{where}: got {what}, but engine ops take engine tensors; convert it with engine.tensor(t) "
                     "(a copy) or engine.from_numpy(t.detach().cpu().numpy()) (sharing memory)")


def check_inputs(where, inputs):
    """Raise a TypeError naming the first input of an op that is neither None nor an engine Tensor
    (torch tensors get `foreign_tensor_error`'s advice)."""
    for i, t in enumerate(inputs):
        if t is not None and not isinstance(t, Tensor):
            raise foreign_tensor_error(t, where) or TypeError(
                f"{where}: expected Tensor inputs, but input {i} is a {type(t).__module__}.{type(t).__qualname__}")


def same_device(cls, inputs):
    """The inputs on one device, as PyTorch allows: a 0-dim CPU tensor beside CUDA tensors is
    copied to their device (it acts as a scalar); any other mix is an error naming both devices."""
    devices = [t._device for t in inputs if t is not None and not (t._device.type == "cpu" and t._data.ndim == 0)]
    target = devices[0] if devices else None
    for d in devices:
        if d != target:
            raise RuntimeError(f"{cls.name or cls.__name__}: expected all tensors to be on the same device, "
                               f"but found at least two devices, {target} and {d}")
    return tuple(t if t is None or t._device == target else t.to(target) for t in inputs)


def _autocast_inputs(policy, mode, inputs):
    """The inputs cast as `policy` says under autocast `mode` = (device type, low dtype): floating
    tensors on that device type, float64 excepted (as PyTorch's cached_cast), through the recorded
    Cast op so that gradients return in each input's own dtype (fp32 master weights)."""
    device_type, low = mode
    if policy == "lower":
        target = low
    elif policy == "fp32" or (policy == "fp32_cuda" and device_type == "cuda"):
        target = _F32
    else:
        return inputs
    return tuple(_autocast_cast(t, target) if _casts(t, device_type, target.np) else t for t in inputs)


def _castable(t, device_type):
    """Whether autocast on `device_type` may cast `t`: a floating tensor on that device type,
    float64 excepted (as PyTorch's cached_cast)."""
    if t is None or t._device.type != device_type:
        return False
    dt = t._data.dtype
    return (dt.kind == "f" or dt == _BF16) and dt != np.float64


def _casts(t, device_type, target):
    """Whether autocast on `device_type` casts `t` to the numpy dtype `target`."""
    return _castable(t, device_type) and t._data.dtype != target


def autocast_lowers(t):
    """Whether an active autocast casts `t` to its low dtype in a "lower" op (matmul, linear)."""
    mode = _state.autocast
    return mode is not None and _casts(t, mode[0], mode[1].np)


def autocast_dtype(t):
    """The numpy dtype `t` has inside a "lower" op under the active autocast (its own if none)."""
    return _state.autocast[1].np if autocast_lowers(t) else t._data.dtype


def autocast_unifies(*tensors):
    """Whether an active autocast will cast every one of `tensors` to its low dtype (a
    "lower" op's dtype checks then let mixed float dtypes through, as PyTorch's do)."""
    mode = _state.autocast
    if mode is None:
        return False
    return all(_castable(t, mode[0]) for t in tensors)


def memory_of(a):
    """The allocation array `a` lives in, one object for all its views (numpy's base owner,
    CuPy's Memory), or None for an empty array (no memory to share)."""
    if not isinstance(a, np.ndarray):
        if isinstance(a, np.generic) or not a.size:  # a numpy scalar owns its value
            return None
        return a.data.mem
    if not a.size:
        return None
    b = a.base
    while b is not None:  # as_strided's views go through a DummyArray, which has a .base too
        a = b
        b = getattr(a, "base", None)
    return a


def share_versions(inputs, outputs, cls=None, attrs=None, single=True):
    """Give each output that is a view of an input (the same memory) that input's version
    counter, as PyTorch's views share their base's: a write through either is seen through both
    (saved tensors, autocast's kept copies of parameters). With the op's class and attributes
    (a local op of one tensor input), the view also remembers how it was taken from its base
    (`single`: the op returns one array, not a tuple), and its root base lists it among its
    views, so that a recorded in-place op on the view, or on the root, or on another of its
    views, can write the root and take every view again (engine/ops/inplace.py)."""
    owners = None
    for k, t in enumerate(outputs):
        a = t._data
        base = None
        if a.base is None:  # owns its memory (most outputs): a view only if it is an input's array
            for x in inputs:
                if x is not None and x._data is a:
                    base = x
                    break
        else:
            mem = memory_of(a)
            if mem is None:
                continue
            if owners is None:
                owners = [None if x is None else memory_of(x._data) for x in inputs]
            for x, owner in zip(inputs, owners):
                if owner is mem:
                    base = x
                    break
        if base is None:
            continue
        t._vc = base._vc
        if cls is not None and sum(x is not None for x in inputs) == 1:
            t._view_of = (base, cls, attrs, None if single else k)
            root = base
            while root._view_of is not None:
                root = root._view_of[0]
            views = root.__dict__.get("_views")
            if views is None:
                views = root.__dict__["_views"] = weakref.WeakSet()
            views.add(t)


def wrap_outputs(cls, ctx, inputs, out, needs_grad, attrs=None):
    """Tensors around the kernel's output array(s); with `needs_grad`, a Node recording the call
    and the saved tensors its backward reads."""
    device = None
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
        share_versions(inputs, res, cls, attrs, single)
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
    share_versions(inputs, res, cls, attrs, single)
    keep = cls.saved_input_indices(ctx)
    if keep or cls.save_outputs:
        saved = [saved_input(inputs[i]) for i in keep]
        if cls.save_outputs:
            ctx._outputs_from = len(saved)
            ctx._node = weakref.ref(node)
            for i in cls.save_outputs:
                a = alias(res[i])
                a.grad_fn = None
                saved.append(a)
        ctx.save_for_backward(*saved)
    return res[0] if single else tuple(res)
