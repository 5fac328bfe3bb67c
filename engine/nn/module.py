"""`Module`: the base class of every layer, with PyTorch's registration and traversal rules.

Assigning a `Parameter` or a `Module` to an attribute registers it (in `_parameters` /
`_modules`), so `parameters()`, `state_dict()`, `to()` and friends find it by walking the tree;
`register_buffer` adds tensors that are state but not trained (running statistics, masks).
Names, ordering and `state_dict` keys follow PyTorch exactly, so checkpoints and tests can be
compared key for key with an equivalent torch model.

Conversions (`to`, `half`, `cuda`, ...) swap a parameter's storage in place instead of making a
new Parameter: optimizers that already hold the parameter keep working. `load_state_dict` copies
values into the existing storage for the same reason, and checks every key and shape before it
copies anything, so a failed load never leaves a half-loaded model.
"""
import warnings
from collections import OrderedDict, namedtuple

from ..autograd.function import Function
from ..autograd.grad_mode import no_grad
from ..autograd.graph import RemovableHandle
from ..backend import as_device, dtypes, to_device, xp_of
from ..ops.conversion import parse_to_args
from ..ops.formats import check_memory_format
from ..tensor import Parameter, Tensor

__all__ = ["Module"]


class _IncompatibleKeys(namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])):
    """What `load_state_dict` returns; prints `<All keys matched successfully>` when both are empty."""

    def __repr__(self):
        if not self.missing_keys and not self.unexpected_keys:
            return "<All keys matched successfully>"
        return super().__repr__()

    __str__ = __repr__


def _addindent(s, num_spaces):
    lines = s.split("\n")
    if len(lines) == 1:
        return s
    first = lines.pop(0)
    return first + "\n" + "\n".join(num_spaces * " " + line for line in lines)


_structure = [0]  # bumped whenever a module's parameter, buffer or submodule is (re)assigned


def structure_version():
    """A count of the assignments of parameters, buffers and submodules to any module: nn.Graph
    takes a new trace when it changed, since a tape reads the tensor objects it was traced with."""
    return _structure[0]


def _shape_list(t):
    return list(t.shape)


def _parse_to(args, kwargs):
    """Split `Module.to(...)` arguments into (device, dtype), like Tensor.to."""
    device = kwargs.pop("device", None)
    dtype = kwargs.pop("dtype", None)
    kwargs.pop("non_blocking", None)
    check_memory_format("Module.to", kwargs.pop("memory_format", None))
    if kwargs:
        raise TypeError(f"Module.to() got unexpected keyword arguments {sorted(kwargs)}")
    device, dtype = parse_to_args(args, device, dtype)
    if dtype is not None:
        dtype = dtypes.as_dtype(dtype)
        if not dtype.is_floating_point:
            raise TypeError(f"nn.Module.to only accepts floating point dtypes, but got desired dtype={dtype}")
    return (as_device(device) if device is not None else None), dtype


class Module:
    """Base class for all neural network modules (see the module docstring)."""

    dump_patches = False
    _version = 1
    training: bool

    def __init__(self, *args, **kwargs):
        if args or kwargs:
            raise TypeError(f"{type(self).__name__}.__init__() got unexpected arguments")
        sa = object.__setattr__
        sa(self, "training", True)
        sa(self, "_parameters", OrderedDict())
        sa(self, "_buffers", OrderedDict())
        sa(self, "_non_persistent_buffers_set", set())
        sa(self, "_modules", OrderedDict())
        sa(self, "_forward_pre_hooks", [])
        sa(self, "_forward_hooks", [])
        sa(self, "_backward_pre_hooks", [])
        sa(self, "_backward_hooks", [])

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f'Module [{type(self).__name__}] is missing the required "forward" function')

    # ------------------------------------------------------------------ registration
    def _check_init(self):
        if "_parameters" not in self.__dict__:
            raise AttributeError("cannot assign to a Module before Module.__init__() call")

    def register_parameter(self, name, param):
        self._check_init()
        self._check_name(name, "parameter", self._parameters)
        _structure[0] += 1
        if param is None:
            self._parameters[name] = None
            return
        if not isinstance(param, Parameter):
            raise TypeError(f"cannot assign '{type(param).__name__}' object to parameter '{name}' "
                            "(engine.nn.Parameter or None required)")
        if param.grad_fn is not None:
            raise ValueError(f"Cannot assign non-leaf Tensor to parameter '{name}'. Model parameters must "
                             "be created explicitly. To express '{name}' as a function of another Tensor, "
                             "compute the value in the forward() method.")
        self._parameters[name] = param

    def register_buffer(self, name, tensor, persistent=True):
        self._check_init()
        self._check_name(name, "buffer", self._buffers)
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"cannot assign '{type(tensor).__name__}' object to buffer '{name}' "
                            "(engine Tensor or None required)")
        _structure[0] += 1
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent_buffers_set.discard(name)
        else:
            self._non_persistent_buffers_set.add(name)

    def add_module(self, name, module):
        if not isinstance(module, Module) and module is not None:
            raise TypeError(f"{type(module).__name__} is not a Module subclass")
        self._check_init()
        self._check_name(name, "module", self._modules)
        _structure[0] += 1
        self._modules[name] = module

    register_module = add_module

    def _check_name(self, name, kind, own):
        if not isinstance(name, str):
            raise TypeError(f"{kind} name should be a string. Got {type(name).__name__}")
        if name == "":
            raise KeyError(f'{kind} name can\'t be empty string ""')
        if "." in name:
            raise KeyError(f'{kind} name can\'t contain ".", got: {name}')
        if hasattr(self, name) and name not in own:
            raise KeyError(f"attribute '{name}' already exists")

    def __setattr__(self, name, value):
        d = self.__dict__
        params = d.get("_parameters")
        if isinstance(value, Parameter):
            if params is None:
                raise AttributeError("cannot assign parameters before Module.__init__() call")
            self._remove_from(name, d, self._buffers, self._modules, self._non_persistent_buffers_set)
            self.register_parameter(name, value)
        elif params is not None and name in params:
            if value is not None:
                raise TypeError(f"cannot assign '{type(value).__name__}' as parameter '{name}' "
                                "(engine.nn.Parameter or None expected)")
            self.register_parameter(name, value)
        elif isinstance(value, Module):
            modules = d.get("_modules")
            if modules is None:
                raise AttributeError("cannot assign module before Module.__init__() call")
            self._remove_from(name, d, self._parameters, self._buffers, self._non_persistent_buffers_set)
            _structure[0] += 1
            modules[name] = value
        elif d.get("_modules") is not None and name in d["_modules"]:
            if value is not None:
                raise TypeError(f"cannot assign '{type(value).__name__}' as child module '{name}' "
                                "(engine.nn.Module or None expected)")
            _structure[0] += 1
            d["_modules"][name] = value
        elif d.get("_buffers") is not None and name in d["_buffers"]:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"cannot assign '{type(value).__name__}' as buffer '{name}' "
                                "(engine Tensor or None expected)")
            _structure[0] += 1
            d["_buffers"][name] = value
        else:
            object.__setattr__(self, name, value)

    @staticmethod
    def _remove_from(name, d, *containers):
        d.pop(name, None)
        for c in containers:
            if isinstance(c, set):
                c.discard(name)
            else:
                c.pop(name, None)

    def __getattr__(self, name):
        # only called when normal lookup fails: look in the registries
        d = self.__dict__
        for reg in ("_parameters", "_buffers", "_modules"):
            r = d.get(reg)
            if r is not None and name in r:
                return r[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name):
        for reg in (self._parameters, self._buffers, self._modules):
            if name in reg:
                _structure[0] += 1
                del reg[name]
                self._non_persistent_buffers_set.discard(name)
                return
        object.__delattr__(self, name)

    def __dir__(self):
        keys = set(dir(type(self))) | set(self.__dict__)
        keys |= set(self._parameters) | set(self._buffers) | set(self._modules)
        return sorted(k for k in keys if not k[0].isdigit())

    # ------------------------------------------------------------------ traversal
    def _named_members(self, get_members, prefix="", recurse=True, remove_duplicate=True):
        memo = set()
        modules = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse else [(prefix, self)]
        for module_prefix, module in modules:
            for k, v in get_members(module):
                if v is None or (remove_duplicate and id(v) in memo):
                    continue
                if remove_duplicate:
                    memo.add(id(v))
                yield (module_prefix + ("." if module_prefix else "") + k, v)

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        return self._named_members(lambda m: m._parameters.items(), prefix, recurse, remove_duplicate)

    def parameters(self, recurse=True):
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix="", recurse=True, remove_duplicate=True):
        return self._named_members(lambda m: m._buffers.items(), prefix, recurse, remove_duplicate)

    def buffers(self, recurse=True):
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def named_children(self):
        memo = set()
        for name, module in self._modules.items():
            if module is not None and id(module) not in memo:
                memo.add(id(module))
                yield name, module

    def children(self):
        for _, m in self.named_children():
            yield m

    def named_modules(self, memo=None, prefix="", remove_duplicate=True):
        if memo is None:
            memo = set()
        if id(self) in memo:
            return
        if remove_duplicate:
            memo.add(id(self))
        yield prefix, self
        for name, module in self._modules.items():
            if module is None:
                continue
            sub = prefix + ("." if prefix else "") + name
            yield from module.named_modules(memo, sub, remove_duplicate)

    def modules(self):
        for _, m in self.named_modules():
            yield m

    def get_submodule(self, target):
        if target == "":
            return self
        mod = self
        for item in target.split("."):
            if not isinstance(mod, Module) or item not in mod._modules:
                raise AttributeError(f"{mod._get_name()} has no attribute `{item}`")
            mod = mod._modules[item]
            if mod is None:
                raise AttributeError(f"`{item}` is None, not an nn.Module")
        return mod

    def get_parameter(self, target):
        return self._get_registered(target, "_parameters", "parameter")

    def get_buffer(self, target):
        return self._get_registered(target, "_buffers", "buffer")

    def _get_registered(self, target, registry, kind):
        """The entry `name` of `registry` (`_parameters` / `_buffers`) in the submodule of "path.name"."""
        module_path, _, name = target.rpartition(".")
        mod = self.get_submodule(module_path)
        entries = getattr(mod, registry)
        if name not in entries:
            raise AttributeError(f"{mod._get_name()} has no {kind} `{name}`")
        return entries[name]

    # ------------------------------------------------------------------ modes and grads
    def train(self, mode=True):
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        self.training = mode
        for m in self.children():
            m.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def requires_grad_(self, requires_grad=True):
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none=True):
        for p in self.parameters():
            g = p.grad
            if g is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                if g.grad_fn is not None:
                    g = g.detach()
                    p.grad = g
                g._data.fill(0)
                g._bump_version()

    def apply(self, fn):
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    # ------------------------------------------------------------------ conversion
    def _apply(self, fn, recurse=True):
        """Apply `fn(tensor) -> tensor` to every parameter, gradient and buffer.

        Parameters keep their identity: only their storage is swapped, so an optimizer built
        before `model.to(...)` still updates the model's parameters."""
        if recurse:
            for m in self.children():
                m._apply(fn)
        with no_grad():
            for p in self._parameters.values():
                if p is None:
                    continue
                _swap_storage(p, fn(p))
                if p.grad is not None:
                    _swap_storage(p.grad, fn(p.grad))
            for k, b in self._buffers.items():
                if b is not None:
                    self._buffers[k] = fn(b)
        return self

    def to(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and isinstance(args[0], type):
            # OneFlow's nn.Graph idiom: `m.to(nn.graph.GraphModule)` is the module's graph settings
            # (activation checkpointing, pipeline stage); `m.to(nn.Module)` the module itself
            if issubclass(args[0], Module):
                return self
            if getattr(args[0], "of_module", None) is not None:
                return args[0].of_module(self)
        device, dtype = _parse_to(args, dict(kwargs))

        def convert(t):
            if device is not None:
                t = t.to(device)
            if dtype is not None and t.is_floating_point():
                t = t.to(dtype)
            return t

        return self._apply(convert)

    def cuda(self, device=None):
        dev = as_device("cuda" if device is None else device)  # an int means cuda:<int>
        return self._apply(lambda t: t.to(dev))

    def cpu(self):
        return self._apply(lambda t: t.to("cpu"))

    def type(self, dst_type):
        return self._apply(lambda t: t.to(dtypes.as_dtype(dst_type)))

    def to_global(self, placement=None, sbp=None):
        """OneFlow's `Module.to_global`: `t.to_global(placement=placement, sbp=sbp)` applied in
        place to every parameter, its gradient and every buffer; returns self.

        `sbp` is one SBP or a tuple (one per mesh axis of `placement`), as `Tensor.to_global`.
        A local tensor is read as this rank's shard (with B every rank must hold the same values:
        same seed); a global one is boxed to the new layout (placement None keeps its placement,
        sbp None its SBP). Parameters keep their identity (an optimizer that holds them still
        updates them; convert before its first step, whose state has the old layout) and stay
        leaves: gradients then flow as for any global leaf. Collective: every rank of the
        placement calls it. An error names the parameter or buffer it is about and leaves the
        module unchanged."""
        return self._apply_named(lambda t: t.to_global(placement=placement, sbp=sbp), "to_global")

    def to_local(self):
        """OneFlow's `Module.to_local`: every parameter, gradient and buffer becomes this rank's
        shard (`Tensor.to_local`), in place; returns self. Every tensor must be global."""
        return self._apply_named(lambda t: t.to_local(), "to_local")

    def _apply_named(self, fn, what):
        """`_apply(fn)` in two passes: every tensor is converted before any is replaced, so an
        error (re-raised naming the tensor's key) leaves the module unchanged."""
        names = {}
        for name, p in self.named_parameters():
            names.setdefault(id(p), f"parameter {name!r}")
            if p.grad is not None:
                names.setdefault(id(p.grad), f"gradient of parameter {name!r}")
        for name, b in self.named_buffers():
            names.setdefault(id(b), f"buffer {name!r}")

        def convert(t):
            try:
                return fn(t)
            except (ValueError, RuntimeError, TypeError) as e:
                about = names.get(id(t), "a tensor")
                try:
                    err = type(e)(f"{type(self).__name__}.{what}: {about} (shape {list(t.shape)}): {e}")
                except Exception:  # an exception type that does not take one message
                    raise e from None
                raise err from e

        converted = {}

        def collect(t):
            if id(t) not in converted:  # a shared parameter is visited once per owner
                converted[id(t)] = convert(t)
            return t

        self._apply(collect)
        return self._apply(lambda t: converted[id(t)])

    def _float_cast(self, dt):
        return self._apply(lambda t: t.to(dt) if t.is_floating_point() else t)

    def float(self):
        return self._float_cast(dtypes.float32)

    def double(self):
        return self._float_cast(dtypes.float64)

    def half(self):
        return self._float_cast(dtypes.float16)

    def bfloat16(self):
        return self._float_cast(dtypes.bfloat16)

    # ------------------------------------------------------------------ state dict
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        for name, p in self._parameters.items():
            if p is not None:
                destination[prefix + name] = p if keep_vars else p.detach()
        for name, b in self._buffers.items():
            if b is not None and name not in self._non_persistent_buffers_set:
                destination[prefix + name] = b if keep_vars else b.detach()

    def state_dict(self, *args, destination=None, prefix="", keep_vars=False):
        """Parameters and persistent buffers by dotted name, in PyTorch's order (an OrderedDict)."""
        if args:  # torch's deprecated positional form: state_dict(destination, prefix, keep_vars)
            destination = args[0]
            if len(args) > 1:
                prefix = args[1]
            if len(args) > 2:
                keep_vars = args[2]
        if destination is None:
            destination = OrderedDict()
        self._save_to_state_dict(destination, prefix, keep_vars)
        for name, m in self._modules.items():
            if m is not None:
                m.state_dict(destination=destination, prefix=prefix + name + ".", keep_vars=keep_vars)
        return destination

    def _local_state(self):
        """(key, module, name, tensor) for every entry state_dict would hold, in order."""
        out = []
        for mod_prefix, m in self.named_modules(remove_duplicate=False):
            p = mod_prefix + "." if mod_prefix else ""
            for name, t in m._parameters.items():
                if t is not None:
                    out.append((p + name, m, name, t))
            for name, t in m._buffers.items():
                if t is not None and name not in m._non_persistent_buffers_set:
                    out.append((p + name, m, name, t))
        return out

    def load_state_dict(self, state_dict, strict=True, assign=False):
        """Copy `state_dict` into this module's parameters and buffers (in place).

        Checks everything first: with strict=True missing and unexpected keys are errors, and a
        shape mismatch is always an error; all problems are reported in one RuntimeError and
        nothing is copied. Returns `(missing_keys, unexpected_keys)`."""
        if not isinstance(state_dict, dict):
            raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict).__name__}.")
        expected = self._local_state()
        expected_keys = set()
        missing, errors, todo = [], [], []
        for key, module, name, t in expected:
            expected_keys.add(key)
            if key not in state_dict:
                missing.append(key)
                continue
            src = state_dict[key]
            if not isinstance(src, Tensor):
                try:
                    from ..ops.creation import as_tensor

                    src = as_tensor(src)
                except Exception:
                    errors.append(f'While copying the parameter named "{key}", expected a Tensor '
                                  f"from checkpoint but received {type(src).__name__}")
                    continue
            if tuple(src.shape) != tuple(t.shape):
                errors.append(f"size mismatch for {key}: copying a param with shape {_shape_list(src)} "
                              f"from checkpoint, the shape in current model is {_shape_list(t)}.")
                continue
            todo.append((module, name, t, src))
        unexpected = [k for k in state_dict if k not in expected_keys]
        if strict:
            if unexpected:
                errors.insert(0, "Unexpected key(s) in state_dict: {}. ".format(
                    ", ".join(f'"{k}"' for k in unexpected)))
            if missing:
                errors.insert(0, "Missing key(s) in state_dict: {}. ".format(
                    ", ".join(f'"{k}"' for k in missing)))
        if errors:
            raise RuntimeError("Error(s) in loading state_dict for {}:\n\t{}".format(
                self._get_name(), "\n\t".join(errors)))
        with no_grad():
            for module, name, t, src in todo:
                if assign:
                    _assign(module, name, t, src)
                else:
                    _copy_into(t, src)
        return _IncompatibleKeys(missing, unexpected)

    # ------------------------------------------------------------------ hooks and call
    def register_forward_pre_hook(self, hook, *, prepend=False, with_kwargs=False):
        """`hook(module, args)` (or `hook(module, args, kwargs)` with with_kwargs=True) runs
        before forward; returning a value replaces the inputs."""
        entry = _Hook(hook, with_kwargs)
        if prepend:
            self._forward_pre_hooks.insert(0, entry)
        else:
            self._forward_pre_hooks.append(entry)
        return RemovableHandle(self._forward_pre_hooks, entry)

    def register_forward_hook(self, hook, *, prepend=False, with_kwargs=False, always_call=False):
        """`hook(module, args, output)` (or `hook(module, args, kwargs, output)`) runs after
        forward; returning a value replaces the output."""
        entry = _Hook(hook, with_kwargs)
        if prepend:
            self._forward_hooks.insert(0, entry)
        else:
            self._forward_hooks.append(entry)
        return RemovableHandle(self._forward_hooks, entry)

    def register_full_backward_pre_hook(self, hook, *, prepend=False):
        """`hook(module, grad_output) -> new grad_output or None` runs when the gradients of the
        module's outputs have been computed, before those of its inputs (PyTorch's)."""
        return self._add_hook(self._backward_pre_hooks, hook, prepend)

    def register_full_backward_hook(self, hook, *, prepend=False):
        """`hook(module, grad_input, grad_output) -> new grad_input or None` runs when the
        gradients of the module's positional tensor inputs have been computed (None for an
        input that needs none); returning a tuple replaces them (PyTorch's)."""
        return self._add_hook(self._backward_hooks, hook, prepend)

    def register_backward_hook(self, hook):
        """Deprecated in PyTorch (its hook saw the last op's gradients only); here the full hook."""
        warnings.warn("register_backward_hook is deprecated (as in PyTorch); it registers "
                      "register_full_backward_hook's hook, which sees the whole module's gradients",
                      FutureWarning, stacklevel=2)
        return self.register_full_backward_hook(hook)

    @staticmethod
    def _add_hook(hooks, fn, prepend):
        entry = _Hook(fn, False)
        hooks.insert(0, entry) if prepend else hooks.append(entry)
        return RemovableHandle(hooks, entry)

    def __call__(self, *args, **kwargs):
        if not (self._forward_pre_hooks or self._forward_hooks or self._backward_hooks or self._backward_pre_hooks):
            return self.forward(*args, **kwargs)
        for h in list(self._forward_pre_hooks):
            if h.with_kwargs:
                res = h.fn(self, args, kwargs)
                if res is not None:
                    if not (isinstance(res, tuple) and len(res) == 2):
                        raise RuntimeError("forward pre-hook must return None or a tuple of (new_args, new_kwargs), "
                                           f"but got {res}.")
                    args, kwargs = res
            else:
                res = h.fn(self, args)
                if res is not None:
                    args = res if isinstance(res, tuple) else (res,)
        backward = _BackwardHooks(self) if (self._backward_hooks or self._backward_pre_hooks) else None
        if backward is not None:
            args = backward.wrap_inputs(args)
        out = self.forward(*args, **kwargs)
        for h in list(self._forward_hooks):
            res = h.fn(self, args, kwargs, out) if h.with_kwargs else h.fn(self, args, out)
            if res is not None:
                out = res
        return backward.wrap_outputs(out) if backward is not None else out

    # ------------------------------------------------------------------ printing
    def _get_name(self):
        return type(self).__name__

    def extra_repr(self):
        return ""

    def __repr__(self):
        extra_repr = self.extra_repr()
        extra_lines = extra_repr.split("\n") if extra_repr else []
        child_lines = [f"({key}): " + _addindent(repr(m), 2) for key, m in self._modules.items()]
        lines = extra_lines + child_lines
        main = self._get_name() + "("
        if lines:
            if len(extra_lines) == 1 and not child_lines:
                main += extra_lines[0]
            else:
                main += "\n  " + "\n  ".join(lines) + "\n"
        return main + ")"


class _Hook:
    __slots__ = ("fn", "with_kwargs")

    def __init__(self, fn, with_kwargs):
        self.fn = fn
        self.with_kwargs = with_kwargs


class _HookIdentity(Function):
    """Identity on a group of tensors whose backward sees all their gradients at once and may
    replace them: the inputs' group gives grad_input, the outputs' grad_output."""

    @staticmethod
    def forward(ctx, on_grads, *tensors):
        ctx.on_grads = on_grads
        # an input that needs no gradient stays so (its grad_input entry is zeros, as torch's)
        ctx.mark_non_differentiable(*(t for t in tensors if not t.requires_grad))
        return tensors

    @staticmethod
    def backward(ctx, *grads):
        return (None,) + tuple(ctx.on_grads(grads))


class _BackwardHooks:
    """One call's full backward hooks (PyTorch's BackwardHook): the module's positional tensor
    inputs and its tensor outputs pass through a `_HookIdentity` each; the outputs' backward runs
    the pre-hooks on grad_output, the inputs' backward the hooks on (grad_input, grad_output)."""

    def __init__(self, module):
        self.module = module
        self.n_inputs = 0
        self.inputs_need_grad = False
        self.grad_output = None

    def wrap_inputs(self, args):
        where = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
        self.n_inputs = len(where)
        self.inputs_need_grad = any(args[i].requires_grad for i in where)
        if not self.inputs_need_grad:
            return args
        wrapped = _HookIdentity.apply(self._on_grad_input, *(args[i] for i in where))
        args = list(args)
        for i, t in zip(where, wrapped):
            args[i] = t
        return tuple(args)

    def wrap_outputs(self, out):
        single = isinstance(out, Tensor)
        outs = (out,) if single else out
        if not isinstance(outs, (tuple, list)):
            return out
        where = [i for i, o in enumerate(outs) if isinstance(o, Tensor) and o.requires_grad]
        if not where:
            return out
        wrapped = _HookIdentity.apply(self._on_grad_output, *(outs[i] for i in where))
        new = list(outs)
        for i, t in zip(where, wrapped):
            new[i] = t
        if single:
            return new[0]
        return type(outs)(*new) if hasattr(outs, "_fields") else type(outs)(new)  # namedtuples keep their type

    def _on_grad_output(self, grads):
        grads = tuple(grads)
        for h in list(self.module._backward_pre_hooks):
            res = h.fn(self.module, grads)
            if res is not None:
                grads = _checked(res, len(grads), "backward pre-hook", "grad_output")
        self.grad_output = grads
        if not self.inputs_need_grad:  # no input gradient will come: the hooks run now
            self._run_hooks((None,) * max(self.n_inputs, 1))
        return grads

    def _on_grad_input(self, grads):
        if self.grad_output is None:  # no gradient came through the outputs' wrapper (a dict, a nested
            return grads              # output): torch runs no hook then either
        return self._run_hooks(tuple(grads))

    def _run_hooks(self, grad_input):
        for h in list(self.module._backward_hooks):
            res = h.fn(self.module, grad_input, self.grad_output)
            if res is not None:
                grad_input = _checked(res, len(grad_input), "backward hook", "grad_input")
        return grad_input


def _checked(res, n, what, name):
    res = tuple(res) if isinstance(res, (tuple, list)) else (res,)
    if len(res) != n:
        raise RuntimeError(f"{what} returned an invalid number of {name}: got {len(res)}, but expected {n}")
    return res


def _swap_storage(t, new):
    """Make tensor `t` hold `new`'s data (device/dtype conversion keeping t's identity)."""
    if new is t:
        return
    t._data = new._data
    t._device = new._device
    t._global = new._global
    t._bump_version()


def _copy_into(t, src):
    """Copy `src` into `t`'s storage (casting dtype, moving device), keeping `t`'s identity."""
    a = src._data
    if src._device != t._device:
        a = to_device(a, t._device)
    dst = t._data
    xp = xp_of(dst)
    flags = getattr(dst, "flags", None)
    if flags is not None and hasattr(flags, "writeable") and not flags.writeable:
        dst = dst.copy()
        t._data = dst
    if a is dst:
        return
    xp.copyto(dst, a, casting="unsafe")
    t._bump_version()


def _assign(module, name, t, src):
    """load_state_dict(assign=True): use the checkpoint tensor itself (kept a Parameter if t was)."""
    if isinstance(t, Parameter):
        new = Parameter(src.detach(), requires_grad=t.requires_grad)
        module._parameters[name] = new
    else:
        module._buffers[name] = src.detach()

