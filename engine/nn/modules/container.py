"""Containers: `Sequential`, `ModuleList`, `ModuleDict`, `ParameterList`, `ParameterDict`.

Children are registered under their index ("0", "1", ...) or key, so state_dict keys match
torch's (`layers.0.weight`)."""
import operator
from collections import OrderedDict
from itertools import islice

from ...tensor import Parameter, Tensor
from ..module import Module, _addindent

__all__ = ["Sequential", "ModuleList", "ModuleDict", "ParameterList", "ParameterDict"]


def _norm_index(idx, n, kind):
    idx = operator.index(idx)
    if not -n <= idx < n:
        raise IndexError(f"index {idx} is out of range for {kind} of length {n}")
    return idx + n if idx < 0 else idx


class Sequential(Module):
    """Modules applied in order: `Sequential(a, b, c)(x) == c(b(a(x)))`, or from an OrderedDict."""

    def __init__(self, *args):
        super().__init__()
        if len(args) == 1 and isinstance(args[0], OrderedDict):
            for key, module in args[0].items():
                self.add_module(key, module)
        else:
            for idx, module in enumerate(args):
                self.add_module(str(idx), module)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return type(self)(OrderedDict(list(self._modules.items())[idx]))
        i = _norm_index(idx, len(self), "Sequential")
        return next(islice(iter(self._modules.values()), i, None))

    def __setitem__(self, idx, module):
        key = list(self._modules)[_norm_index(idx, len(self), "Sequential")]
        setattr(self, key, module)

    def __delitem__(self, idx):
        keys = list(self._modules)
        if isinstance(idx, slice):
            for key in keys[idx]:
                delattr(self, key)
        else:
            delattr(self, keys[_norm_index(idx, len(self), "Sequential")])
        # renumber, as torch does, so indices stay contiguous
        self._modules = OrderedDict((str(i), m) for i, m in enumerate(self._modules.values()))

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def __add__(self, other):
        if not isinstance(other, Sequential):
            raise ValueError(f"add operator supports only objects of Sequential class, but {type(other)} is given.")
        return Sequential(*self, *other)

    def append(self, module):
        self.add_module(str(len(self)), module)
        return self

    def extend(self, sequential):
        for m in sequential:
            self.append(m)
        return self

    def insert(self, index, module):
        n = len(self._modules)
        if not -n <= index <= n:
            raise IndexError(f"Index out of range: {index}")
        if index < 0:
            index += n
        mods = list(self._modules.values())
        mods.insert(index, module)
        self._modules = OrderedDict((str(i), m) for i, m in enumerate(mods))
        return self

    def pop(self, key):
        v = self[key]
        del self[key]
        return v

    def forward(self, input):
        for module in self:
            input = module(input)
        return input


class ModuleList(Module):
    """A list of modules, registered as children "0", "1", ... (no forward of its own)."""

    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return type(self)(list(self._modules.values())[idx])
        return self._modules[str(_norm_index(idx, len(self), "ModuleList"))]

    def __setitem__(self, idx, module):
        setattr(self, str(_norm_index(idx, len(self), "ModuleList")), module)

    def __delitem__(self, idx):
        if isinstance(idx, slice):
            for k in list(self._modules)[idx]:
                delattr(self, k)
        else:
            delattr(self, str(_norm_index(idx, len(self), "ModuleList")))
        self._modules = OrderedDict((str(i), m) for i, m in enumerate(self._modules.values()))

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def __iadd__(self, modules):
        return self.extend(modules)

    def __add__(self, other):
        return ModuleList(list(self) + list(other))

    def insert(self, index, module):
        mods = list(self._modules.values())
        mods.insert(index, module)
        self._modules = OrderedDict()
        for i, m in enumerate(mods):
            self.add_module(str(i), m)

    def append(self, module):
        self.add_module(str(len(self)), module)
        return self

    def pop(self, key):
        v = self[key]
        del self[key]
        return v

    def extend(self, modules):
        if isinstance(modules, (Tensor, str)) or not hasattr(modules, "__iter__"):
            raise TypeError("ModuleList.extend should be called with an iterable, but got " + type(modules).__name__)
        offset = len(self)
        for i, module in enumerate(modules):
            self.add_module(str(offset + i), module)
        return self

    def __repr__(self):
        """Like torch: consecutive identical children print once as `(0-2): 3 x Layer(...)`."""
        reprs = [repr(m) for m in self]
        if not reprs:
            return self._get_name() + "()"
        blocks = [[0, 0, reprs[0]]]
        for i, r in enumerate(reprs[1:], 1):
            if r == blocks[-1][2]:
                blocks[-1][1] = i
            else:
                blocks.append([i, i, r])
        lines = []
        for start, end, r in blocks:
            line = f"({start}): {r}" if start == end else f"({start}-{end}): {end - start + 1} x {r}"
            lines.append(_addindent(line, 2))
        return self._get_name() + "(\n  " + "\n  ".join(lines) + "\n)"

    def forward(self, *args, **kwargs):
        raise NotImplementedError("ModuleList has no forward(): iterate over it and call its modules")


class ModuleDict(Module):
    """An ordered dict of modules, registered as children under their keys."""

    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key):
        return self._modules[key]

    def __setitem__(self, key, module):
        self.add_module(key, module)

    def __delitem__(self, key):
        del self._modules[key]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules)

    def __contains__(self, key):
        return key in self._modules

    def clear(self):
        self._modules.clear()

    def pop(self, key):
        v = self[key]
        del self[key]
        return v

    def keys(self):
        return self._modules.keys()

    def items(self):
        return self._modules.items()

    def values(self):
        return self._modules.values()

    def update(self, modules):
        items = modules.items() if hasattr(modules, "items") else modules
        for j, kv in enumerate(items):
            if not isinstance(kv, (tuple, list)) or len(kv) != 2:
                if hasattr(modules, "items"):
                    raise TypeError("ModuleDict.update expects a mapping or an iterable of (key, module) pairs")
                raise ValueError(f"ModuleDict update sequence element #{j} should be a (key, module) pair")
            self[kv[0]] = kv[1]

    def forward(self, *args, **kwargs):
        raise NotImplementedError("ModuleDict has no forward(): index it and call its modules")


def _param_repr(p):
    size = "x".join(str(s) for s in p.shape)
    dev = "" if p.device.type == "cpu" else f" ({p.device})"
    return f"Parameter containing: [engine.{p.dtype.name} of size {size}{dev}]"


class ParameterList(Module):
    """A list of Parameters registered as "0", "1", ... (tensors are wrapped into Parameters)."""

    def __init__(self, values=None):
        super().__init__()
        self._size = 0
        if values is not None:
            self.extend(values)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return ParameterList([self[i] for i in range(len(self))[idx]])
        return getattr(self, str(_norm_index(idx, len(self), "ParameterList")))

    def __setitem__(self, idx, param):
        idx = _norm_index(idx, len(self), "ParameterList")
        if isinstance(param, Tensor) and not isinstance(param, Parameter):
            param = Parameter(param)
        setattr(self, str(idx), param)

    def __len__(self):
        return self._size

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __iadd__(self, params):
        return self.extend(params)

    def append(self, value):
        new_idx = len(self)
        self._size += 1
        if isinstance(value, Tensor) and not isinstance(value, Parameter):
            value = Parameter(value)
        setattr(self, str(new_idx), value)
        return self

    def extend(self, values):
        if isinstance(values, Tensor) or not hasattr(values, "__iter__"):
            raise TypeError("ParameterList.extend should be called with an iterable, but got " + type(values).__name__)
        for v in values:
            self.append(v)
        return self

    def extra_repr(self):
        lines = []
        for i, p in enumerate(self):
            lines.append(f"  ({i}): " + (_param_repr(p) if isinstance(p, Tensor) else type(p).__name__))
        return "\n".join(lines)

    def forward(self, *args, **kwargs):
        raise NotImplementedError("ParameterList has no forward()")


class ParameterDict(Module):
    """An ordered dict of Parameters registered under their keys."""

    def __init__(self, parameters=None):
        super().__init__()
        self._keys = {}
        if parameters is not None:
            self.update(parameters)

    def __getitem__(self, key):
        return getattr(self, key)

    def __setitem__(self, key, value):
        self._keys[key] = None
        if isinstance(value, Tensor) and not isinstance(value, Parameter):
            value = Parameter(value)
        setattr(self, key, value)

    def __delitem__(self, key):
        del self._keys[key]
        delattr(self, key)

    def __len__(self):
        return len(self._keys)

    def __iter__(self):
        return iter(self._keys)

    def __contains__(self, key):
        return key in self._keys

    def keys(self):
        return self._keys.keys()

    def items(self):
        return ((k, self[k]) for k in self._keys)

    def values(self):
        return (self[k] for k in self._keys)

    def pop(self, key):
        v = self[key]
        del self[key]
        return v

    def update(self, parameters):
        items = parameters.items() if hasattr(parameters, "items") else parameters
        for k, v in items:
            self[k] = v

    def extra_repr(self):
        return "\n".join(f"  ({k}): " + (_param_repr(p) if isinstance(p, Tensor) else type(p).__name__)
                         for k, p in self.items())

    def forward(self, *args, **kwargs):
        raise NotImplementedError("ParameterDict has no forward()")
