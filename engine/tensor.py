"""The Tensor: a backend array plus autograd metadata.

Operators are not defined here: each op family in `engine/ops` attaches its methods and Python
operators with `tensor_method`, so this file stays about what a tensor *is* (data, dtype, device,
gradient bookkeeping) and each family keeps its code in one place. `engine/tensor.pyi` lists every
method with the module that defines it (generated, kept in sync by tests/test_tensor_stub.py).

A global tensor (engine.distributed) is a Tensor whose `_data` is this rank's shard and whose
`_global` is its `GlobalMeta` (placement, SBP, logical shape). This layer sits below
engine.distributed and never imports it: what it needs of a global tensor it asks the meta
(`logical_value`, `leaf_gradient`, `without_partial`).
"""
import copy
import numbers
import weakref

import numpy as np

from . import autograd
from .autograd.grad_mode import _state as _grad_state
from .autograd.graph import AccumulateGrad, RemovableHandle
from .backend import array_from_data, as_device, default_device, deterministic, dtypes, xp_for, xp_of


class Size(tuple):
    """Shape of a tensor: a tuple with `numel()`, printed like PyTorch's."""

    def numel(self):
        n = 1
        for s in self:
            n *= s
        return n

    def __repr__(self):
        return f"engine.Size({list(self)})"


class Tensor:
    __slots__ = ("_data", "_device", "_requires_grad", "grad", "grad_fn", "_output_nr", "_vc",
                 "_acc_ref", "_leaf_hooks", "_global", "_view_of", "__weakref__", "__dict__")

    # numpy must defer to Tensor in `ndarray * Tensor`
    __array_priority__ = 1000

    def __init__(self, data=None, *args, dtype=None, device=None, requires_grad=False):
        """`Tensor(data)` copies like `tensor(data)` but as the default float dtype (PyTorch's legacy
        constructor: `Tensor([1, 2])` is float32); `Tensor(2, 3)` makes an uninitialised float tensor."""
        if data is None:
            data = []
        dev = as_device(device) if device is not None else None
        if isinstance(data, int) and not isinstance(data, bool):
            dev = dev or default_device()
            dt = dtypes.as_dtype(dtype) or dtypes.get_default_dtype()
            array = deterministic.fill_uninitialized(xp_for(dev).empty(tuple(int(s) for s in (data,) + args),
                                                                       dtype=dt.np))
        else:
            if dtype is None and not isinstance(data, Tensor):
                dtype = dtypes.get_default_dtype()
            array, dev = array_from_data(data._data if isinstance(data, Tensor) else data, dtype, dev)
        self._init(array, dev)
        if requires_grad:
            self.requires_grad_(True)

    def _init(self, data, device):
        self._data = data
        self._device = device
        self._requires_grad = False
        self.grad = None
        self.grad_fn = None
        self._output_nr = 0
        self._vc = [0]
        self._acc_ref = None
        self._leaf_hooks = None
        self._global = None
        self._view_of = None  # (base, op class, attrs, output index) when this tensor is a view of base

    @classmethod
    def _make(cls, data, device):
        """A tensor around `data` without __init__'s conversions: the constructor of every op
        output, so it does only attribute stores."""
        t = object.__new__(cls)
        t._init(data, device)
        return t

    def __deepcopy__(self, memo):
        if self.grad_fn is not None:
            raise RuntimeError("Only Tensors created explicitly by the user (graph leaves) support the "
                               "deepcopy protocol at the moment")
        if id(self) in memo:
            return memo[id(self)]
        new = type(self)._make(self._data.copy(), self._device)
        memo[id(self)] = new
        new._requires_grad = self._requires_grad
        new._global = self._global
        if self.grad is not None:
            new.grad = copy.deepcopy(self.grad, memo)
        new.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return new

    # ---------------------------------------------------------------- metadata
    @property
    def data(self):
        """The same storage without autograd history (like `tensor.data` in PyTorch)."""
        return self.detach()

    @data.setter
    def data(self, value):
        if tuple(value.shape) != tuple(self.shape):
            raise RuntimeError(f"data of shape {tuple(value.shape)} cannot replace shape {tuple(self.shape)}")
        self._data = value._data
        self._device = value._device
        self._global = value._global
        # one memory, one version counter (PyTorch keeps the tensor's own here): a write through
        # `value` must be seen by whatever relies on this tensor's version (saved tensors,
        # autocast's kept copies of parameters tied this way)
        self._vc = value._vc

    @property
    def shape(self):
        g = self._global
        if g is None:
            return Size(self._data.shape)
        if g.shape is None:
            raise RuntimeError(f"this rank is not in the placement {g.placement!r} of this global tensor, "
                               "so its logical shape is unknown here")
        return Size(g.shape)

    def size(self, dim=None):
        shape = self.shape
        if dim is None:
            return shape
        return shape[_check_dim(dim, len(shape))]

    @property
    def ndim(self):
        return len(self.shape)

    def dim(self):
        return len(self.shape)

    ndimension = dim

    def numel(self):
        return self.shape.numel()

    nelement = numel

    def __len__(self):
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    @property
    def dtype(self):
        return dtypes.from_numpy_dtype(self._data.dtype)

    @property
    def device(self):
        return self._device

    @property
    def is_cuda(self):
        return self._device.type == "cuda"

    def is_floating_point(self):
        return self._data.dtype.kind == "f" or self._data.dtype == dtypes.bfloat16.np

    def element_size(self):
        return self._data.dtype.itemsize

    @property
    def itemsize(self):
        return self._data.dtype.itemsize

    @property
    def nbytes(self):
        return self.numel() * self._data.dtype.itemsize

    def is_complex(self):
        return False  # no engine dtype is complex

    def get_device(self):
        """The CUDA device index, -1 on the CPU (torch's)."""
        return self._device.index if self._device.type == "cuda" else -1

    def data_ptr(self):
        """The address of the first element (of this rank's shard), 0 when there is none, as torch."""
        a = self._data
        if a.size == 0:
            return 0
        return a.__array_interface__["data"][0] if isinstance(a, np.ndarray) else a.data.ptr

    def new(self, *args, size=None, device=None):
        """The legacy constructor in this tensor's dtype: `x.new(2, 3)` or `x.new(size)` as
        `new_empty`, `x.new(data)` as `new_tensor` of a sequence, `x.new(t)` an alias of `t` (which
        must have x's dtype and device), `x.new()` empty."""
        if size is not None or (len(args) == 1 and isinstance(args[0], Size)):
            if size is not None and args:
                raise TypeError("new() got both positional arguments and size=")
            args = tuple(args[0] if size is None else size)
        elif len(args) == 1 and (isinstance(args[0], bool) or not isinstance(args[0], numbers.Integral)):
            data = args[0]
            if isinstance(data, Tensor):
                if data.dtype != self.dtype or (device is not None and data._device != as_device(device)):
                    raise TypeError(f"new(): expected a tensor of dtype {self.dtype} (got {data.dtype} on {data.device})")
                return data[...]
            if not isinstance(data, (list, tuple, np.ndarray)) and not hasattr(data, "__cuda_array_interface__"):
                raise TypeError(f"new(): data must be a sequence (got {type(data).__name__})")
            return self.new_tensor(data, device=device)
        elif not args:
            args = (0,)
        if not all(isinstance(s, numbers.Integral) and not isinstance(s, bool) for s in args):
            raise TypeError(f"new(): sizes must be ints, got {tuple(type(s).__name__ for s in args)}")
        return self.new_empty(tuple(int(s) for s in args), device=device)

    @property
    def is_global(self):
        return self._global is not None

    @property
    def is_local(self):
        return self._global is None

    # ---------------------------------------------------------------- autograd
    @property
    def requires_grad(self):
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value):
        if self.grad_fn is not None and not value:
            raise RuntimeError(
                "you can only change requires_grad flags of leaf variables. If you want to use a "
                "computed variable in a subgraph that doesn't require differentiation use "
                "var_no_grad = var.detach()."
            )
        if value and not self.is_floating_point():
            raise RuntimeError(f"only Tensors of floating point dtype can require gradients, got {self.dtype}")
        self._requires_grad = bool(value)

    def requires_grad_(self, requires_grad=True):
        self.requires_grad = requires_grad
        return self

    @property
    def _version(self):
        """Bumped by every in-place write; saved tensors check it before backward uses them."""
        return self._vc[0]

    def _bump_version(self):
        self._vc[0] += 1

    @property
    def is_leaf(self):
        return self.grad_fn is None

    def _grad_edge(self):
        if self.grad_fn is not None:
            return (self.grad_fn, self._output_nr)
        if not self._requires_grad:
            return None
        acc = self._acc_ref() if self._acc_ref is not None else None
        if acc is None:
            acc = AccumulateGrad(self)
            self._acc_ref = weakref.ref(acc)
        return (acc, 0)

    def _as_own_gradient(self, grad):
        """`grad` in this leaf's global layout and dtype, as `.grad` holds it."""
        if self._global is not None:
            grad = self._global.leaf_gradient(self, grad)
        elif grad._global is not None:
            raise RuntimeError(f"a local leaf of shape {tuple(self.shape)} received a global gradient")
        if grad._data.dtype != self._data.dtype and self._data.dtype.kind != "c":
            # as PyTorch's engine: a gradient takes its leaf's dtype (a float32 parameter used by
            # a float16 op under autocast gets a float32 gradient)
            grad = grad.to(self.dtype)
        return grad

    def _accumulate_grad(self, grad, adoptable=False):
        if self._leaf_hooks:
            for hook in list(self._leaf_hooks):
                res = hook(grad)
                if res is not None:
                    grad = res
        grad = self._as_own_gradient(grad)
        if self.grad is None:
            # A gradient may share its array with another leaf's gradient, a retained output or
            # a user's tensor: then .grad gets its own copy. A fresh array that nothing else
            # holds (the common case: the output of the last backward op) is adopted as is.
            if grad.grad_fn is None and not adoptable:
                grad = grad.clone()
            self.grad = grad
            tracer = _grad_state.tracer
            if tracer is not None:  # nn.Graph is capturing this step
                tracer.set_grad(self, grad)
            if _grad_state.cuda_graph is not None:  # a CUDA graph capture: replays give it back
                _grad_state.cuda_graph.set_grad(self, grad)
        elif _grad_state.tracer is not None:
            # a second gradient in a captured step (a block checkpointed and used elsewhere):
            # the sum is a recorded kernel, and the replay hands it to the leaf in place of the first
            self.grad = self.grad + grad
            _grad_state.tracer.set_grad(self, self.grad, replace=True)
        elif grad.grad_fn is None and self.grad.grad_fn is None:
            self.grad._data += grad._data
            self.grad._vc[0] += 1
            if _grad_state.cuda_graph is not None:  # the graph writes this buffer: it keeps it alive
                _grad_state.cuda_graph.set_grad(self, self.grad)
        else:
            self.grad = self.grad + grad
            if _grad_state.cuda_graph is not None:
                _grad_state.cuda_graph.set_grad(self, self.grad)

    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        """Accumulate d(self)/d(leaf) into every leaf's `.grad` (see engine.autograd.backward)."""
        autograd.backward(self, gradient, retain_graph, create_graph, inputs)

    def _constant_like(self, value):
        """A fresh constant with this tensor's shape, dtype, device and layout: autograd's seed
        and missing gradients. On a global tensor every shard is filled, and a partial layout
        reads as broadcast (a fill is the value itself, not a sum of shards)."""
        t = Tensor._make(xp_of(self._data).full_like(self._data, value), self._device)
        if self._global is not None:
            t._global = self._global.without_partial()
        return t

    def register_hook(self, hook):
        """`hook(grad) -> Tensor or None` runs when this tensor's gradient is computed."""
        if not self._requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        if self.grad_fn is None:
            if self._leaf_hooks is None:
                self._leaf_hooks = []
            hooks = self._leaf_hooks
        else:
            node = self.grad_fn
            if node.pre_hooks is None:
                node.pre_hooks = {}
            hooks = node.pre_hooks.setdefault(self._output_nr, [])
        hooks.append(hook)
        return RemovableHandle(hooks, hook)

    def retain_grad(self):
        if self.grad_fn is None:
            return
        node = self.grad_fn
        if node.retained is None:
            node.retained = {}
        node.retained[self._output_nr] = weakref.ref(self)

    @property
    def retains_grad(self):
        n = self.grad_fn
        return n is not None and n.retained is not None and self._output_nr in n.retained

    def detach(self):
        t = Tensor._make(self._data, self._device)
        t._global = self._global
        t._vc = self._vc  # shares the version counter: in-place writes stay detectable
        return t

    def detach_(self):
        self.grad_fn = None
        self._requires_grad = False
        return self

    # ---------------------------------------------------------------- conversion to Python
    def numpy(self):
        if self._requires_grad:
            raise RuntimeError("Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead.")
        if self._device.type != "cpu":
            raise TypeError(f"can't convert {self._device} tensor to numpy. Use Tensor.cpu() first.")
        if _grad_state.tracer is not None:
            _grad_state.tracer.host_read(self, "Tensor.numpy()")
        return self._local_array()

    def _local_array(self):
        return self._data if self._global is None else self._host()

    def item(self):
        if self.numel() != 1:
            raise RuntimeError(f"a Tensor with {self.numel()} elements cannot be converted to Scalar")
        return self._host().reshape(()).item()

    def tolist(self):
        return self._host().tolist()

    def _host(self):
        """The logical value as a numpy array (a global tensor is gathered first: a collective
        call, every rank of its placement must make it)."""
        if _grad_state.tracer is not None:
            _grad_state.tracer.host_read(self, "reading a tensor's value (item/tolist/bool/float/int)")
        a = self._data if self._global is None else self._global.logical_value(self._data)
        return a if isinstance(a, np.ndarray) else a.get()

    def __bool__(self):
        if self.numel() != 1:
            raise RuntimeError(f"Boolean value of Tensor with {self.numel()} elements is ambiguous")
        return bool(self.item())

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __index__(self):
        if self.is_floating_point() or self.numel() != 1:
            raise TypeError("only integer tensors of a single element can be converted to an index")
        return int(self.item())

    def __array__(self, dtype=None, copy=None):
        a = self._host()
        return a.astype(dtype) if dtype is not None else a

    def __hash__(self):
        return id(self)

    def __iter__(self):
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.shape[0]))

    def __format__(self, spec):
        """A 0-dim tensor formats as its Python number (`f"{loss:.4f}"`, as torch); any other
        tensor only with an empty spec (its str)."""
        if self.ndim == 0:
            return self.item().__format__(spec)
        return object.__format__(self, spec)

    def __repr__(self):
        a = self._host()
        if a.dtype == dtypes.bfloat16.np:
            a = a.astype(np.float32)
        body = np.array2string(a, separator=", ", prefix="tensor(", precision=4,
                               threshold=1000, edgeitems=3)
        extras = []
        if self._device.type != "cpu":
            extras.append(f"device='{self._device}'")
        if self.dtype not in (dtypes.float32, dtypes.int64, dtypes.bool_):
            extras.append(f"dtype={self.dtype}")
        if self._global is not None:
            extras.append(repr(self._global))
        if self.grad_fn is not None:
            extras.append(f"grad_fn={self.grad_fn!r}")
        elif self._requires_grad:
            extras.append("requires_grad=True")
        return "tensor(" + body + "".join(", " + e for e in extras) + ")"

    __str__ = __repr__


def tensor_method(*names):
    """Attach a function to Tensor under each of `names` (used by the op families)."""

    def deco(fn):
        for n in names or (fn.__name__,):
            setattr(Tensor, n, fn)
        return fn

    return deco


def _check_dim(dim, ndim, name="dim"):
    """Normalise a possibly negative dim, with PyTorch's error for out-of-range dims."""
    lo, hi = (-ndim, ndim - 1) if ndim > 0 else (-1, 0)
    if not isinstance(dim, int) and isinstance(dim, numbers.Integral):
        dim = int(dim)  # a numpy integer, as torch takes it
    if not isinstance(dim, int) or not lo <= dim <= hi:
        raise IndexError(f"Dimension out of range (expected to be in range of [{lo}, {hi}], but got {dim})")
    return dim + ndim if dim < 0 else dim


class Parameter(Tensor):
    """A leaf tensor that a Module registers as a parameter."""

    def __new__(cls, data=None, requires_grad=True):
        if data is None:
            data = Tensor._make(np.empty((0,), dtype=dtypes.get_default_dtype().np), default_device())
        t = Tensor._make.__func__(cls, data._data, data._device)
        t._global = data._global
        t._vc = data._vc  # as torch's Parameter(data), a detach of data: the same version counter
        t._requires_grad = requires_grad
        return t

    def __init__(self, data=None, requires_grad=True):
        pass

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()

    def __reduce_ex__(self, proto):
        raise TypeError("Parameters are saved with engine.save (safetensors), not pickle")

