"""`Optimizer`: parameter groups, per-parameter state and torch-format state dicts.

Subclasses implement `_update(group, p, grad, state)` as an in-place update of the parameter's
*backend arrays* (`p._data`, `p.grad._data`, state tensors' `_data`) with `xp` ufuncs and `out=`.
Working on arrays instead of engine ops means a step records nothing, allocates at most a
temporary or two per parameter, never changes dtypes, and touches only the local storage of each
tensor (so the same elementwise code updates the local shard of a distributed global tensor).

The state dict has torch's layout -- `{"state": {index: {...}}, "param_groups": [{..., "params":
[indices]}]}` -- and holds only dicts, lists, tuples, numbers, strings, None and tensors, so
`engine.save` can store it. The step count is kept as a Python int (torch keeps a 0-d tensor; a
tensor step is accepted on load).
"""
import numbers
import warnings
from collections import defaultdict

from ..autograd.grad_mode import enable_grad, no_grad
from ..backend import to_device, xp_of
from ..nn.utils.clip_grad import clip_grad_norm_
from ..tensor import Tensor

__all__ = ["Optimizer", "required"]


class _RequiredParameter:
    """Marks a hyperparameter with no default (e.g. SGD's lr in old torch)."""

    def __repr__(self):
        return "<required parameter>"


required = _RequiredParameter()


class Optimizer:
    """Base class: holds `param_groups` and `state`; subclasses define `_update`."""

    def __init__(self, params, defaults):
        self.defaults = defaults
        self.state = defaultdict(dict)
        self.param_groups = []
        if isinstance(params, Tensor):
            raise TypeError(
                "params argument given to the optimizer should be an iterable of Tensors or dicts, "
                f"but got {type(params).__name__}"
            )
        if isinstance(params, (set, frozenset)):
            raise TypeError("optimizer params must be an ordered collection (list, generator), not a set")
        param_groups = list(params)
        if len(param_groups) == 0:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(param_groups[0], dict):
            param_groups = [{"params": param_groups}]
        for group in param_groups:
            self.add_param_group(group)

    # ------------------------------------------------------------------ groups
    def add_param_group(self, param_group):
        """Add a group (a dict with "params" and optional per-group hyperparameters)."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(param_group).__name__}")
        params = param_group.get("params")
        if params is None:
            raise ValueError("param_group must have a 'params' entry")
        if isinstance(params, Tensor):
            params = [params]
        elif isinstance(params, (set, frozenset)):
            raise TypeError("optimizer params must be an ordered collection (list, generator), not a set")
        else:
            params = list(params)
        for p in params:
            if not isinstance(p, Tensor):
                raise TypeError(f"optimizer can only optimize Tensors, but one of the params is {type(p).__name__}")
            if not p.is_leaf:
                raise ValueError("can't optimize a non-leaf Tensor")
        if len({id(p) for p in params}) != len(params):
            raise ValueError("a parameter appears more than once in the same parameter group")

        group = dict(param_group)
        group["params"] = params
        for name, default in self.defaults.items():
            if default is required and name not in group:
                raise ValueError(f"parameter group didn't specify a value of required optimization parameter {name}")
            group.setdefault(name, default)
        check_torch_flags(type(self).__name__, group)
        self._check_group(group)

        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in seen for p in params):
            raise ValueError("some parameters appear in more than one parameter group")
        self.param_groups.append(group)

    def _check_group(self, group):
        """Validate a group's hyperparameters (subclasses raise ValueError with torch's wording)."""

    # ------------------------------------------------------------------ stepping
    def zero_grad(self, set_to_none=True):
        """Reset gradients: drop them (default) or fill them with zeros in place."""
        for group in self.param_groups:
            for p in group["params"]:
                g = p.grad
                if g is None:
                    continue
                if set_to_none:
                    p.grad = None
                    continue
                if g.grad_fn is not None:
                    g = p.grad = g.detach()
                else:
                    g._requires_grad = False
                g._data[...] = 0
                g._bump_version()

    def clip_grad(self, error_if_nonfinite=False):
        """OneFlow's `optimizer.clip_grad()` (LiBai's trainer calls it before `step`): each group
        with a `clip_grad_max_norm` entry has its gradients clipped to that joint norm (of type
        `clip_grad_norm_type`, default 2.0) by nn.utils.clip_grad_norm_; other groups are left
        alone, and when no group has the entry a warning says so, as OneFlow."""
        clipped = False
        for group in self.param_groups:
            max_norm = group.get("clip_grad_max_norm")
            if max_norm is None:
                continue
            clipped = True
            clip_grad_norm_(group["params"], max_norm, group.get("clip_grad_norm_type", 2.0), error_if_nonfinite)
        if not clipped:
            warnings.warn("clip_grad: no parameter group has clip_grad_max_norm (and clip_grad_norm_type); give them "
                          "to the parameter groups to enable clipping", stacklevel=2)

    # optimizers that take the GradScaler's device flag (`self.found_inf`, set around `step`)
    # and skip on it without reading it set this (Adam, AdamW on CUDA), as torch's fused ones
    _step_supports_amp_scaling = False

    def _taken_on_flag(self, flag, stepped):
        """`stepped` ((parameter, state) pairs) counted a step whose kernel skips on the device
        flag `flag` (engine.amp.DeviceFlag): their step counts stay provisional until the flag is
        known (`_settle_skipped`)."""
        if stepped:
            self.__dict__.setdefault("_provisional", []).append((flag, stepped))

    def _settle_skipped(self):
        """Take back the step counts of the steps the GPU skipped (their flag was set): waits only
        for flags queued in earlier steps. As torch, a skipped first step leaves no state."""
        pending = self.__dict__.pop("_provisional", None)
        for flag, stepped in pending or ():
            if flag.value():
                for p, state in stepped:
                    state["step"] -= 1
                    if state["step"] == 0:
                        self.state.pop(p, None)

    def step(self, closure=None):
        """Update every parameter that has a gradient; `closure()` recomputes the loss first."""
        self._settle_skipped()
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        with no_grad():
            for group in self.param_groups:
                self._step_group(group)
        return loss

    def _step_group(self, group):
        for p, g in self._with_grads(group):
            self._update(group, p, g, self.state[p])
            p._bump_version()

    def _with_grads(self, group):
        """(parameter, gradient array) of the group's parameters that have a gradient."""
        for p in group["params"]:
            if p.grad is None:
                continue
            g = p.grad._data
            if g.shape != p._data.shape:
                raise RuntimeError(
                    f"{type(self).__name__}.step: gradient of shape {tuple(g.shape)} does not match "
                    f"parameter of shape {tuple(p._data.shape)}"
                )
            yield p, g

    def _update(self, group, p, grad, state):
        raise NotImplementedError

    # ------------------------------------------------------------------ state dicts
    def state_dict(self):
        """torch's format: state keyed by parameter index, groups listing their indices."""
        self._settle_skipped()
        index = {}
        groups = []
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            ids = []
            for p in group["params"]:
                index.setdefault(id(p), len(index))
                ids.append(index[id(p)])
            packed["params"] = ids
            groups.append(packed)
        state = {}
        for group in self.param_groups:
            for p in group["params"]:
                if p in self.state and self.state[p]:
                    state[index[id(p)]] = dict(self.state[p])
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict):
        """Load a `state_dict()` (ours or torch's layout); tensors are copied to each param's device.
        Parameter groups without a numeric hyperparameter of this class (an Adam state into SGD,
        which has no momentum) are refused here, not at the first step."""
        if not isinstance(state_dict, dict) or "state" not in state_dict or "param_groups" not in state_dict:
            raise ValueError("optimizer state dict must be a dict with 'state' and 'param_groups' entries")
        self._settle_skipped()  # before the state it would correct is replaced
        saved_groups = state_dict["param_groups"]
        groups = self.param_groups
        if len(saved_groups) != len(groups):
            raise ValueError(
                f"loaded state dict has a different number of parameter groups: it has "
                f"{len(saved_groups)}, this optimizer has {len(groups)}"
            )
        for i, (g, sg) in enumerate(zip(groups, saved_groups)):
            if len(g["params"]) != len(sg["params"]):
                raise ValueError(
                    f"loaded state dict contains a parameter group that doesn't match the size of "
                    f"optimizer's group: group {i} has {len(sg['params'])} params in the state dict "
                    f"and {len(g['params'])} in the optimizer"
                )
        for i, sg in enumerate(saved_groups):
            # a missing switch (an older torch's state) takes its default below; a missing number
            # (SGD's momentum in an Adam state) means the state is another optimizer's
            missing = sorted(k for k, v in self.defaults.items()
                             if k not in sg and v is not None and not isinstance(v, bool))
            if missing:
                raise ValueError(f"loaded state dict's parameter group {i} has no {missing}, hyperparameters of "
                                 f"{type(self).__name__} (it has {sorted(k for k in sg if k != 'params')}): the "
                                 "state of another optimizer class?")
        id_map = {}
        for g, sg in zip(groups, saved_groups):
            for saved_id, p in zip(sg["params"], g["params"]):
                id_map[_int_key(saved_id)] = p

        state = defaultdict(dict)
        for key, value in state_dict["state"].items():
            key = _int_key(key)
            if key not in id_map:
                continue  # torch ignores state for unknown indices too
            p = id_map[key]
            for k, v in value.items():
                if isinstance(v, Tensor) and v.ndim > 0 and tuple(v.shape) != tuple(p.shape):
                    raise ValueError(
                        f"loaded state dict entry state[{key}][{k!r}] has shape {tuple(v.shape)} but the "
                        f"parameter it belongs to has shape {tuple(p.shape)}"
                    )
            state[p] = {k: _cast_state(p, k, v) for k, v in value.items()}

        new_groups = []
        for g, sg in zip(groups, saved_groups):
            # a key the state lacks (an older torch's) takes the default, as torch's __setstate__
            ng = {**{k: v for k, v in self.defaults.items() if k not in sg},
                  **{k: _plain_value(k, v) for k, v in sg.items() if k != "params"}}
            ng["params"] = g["params"]
            new_groups.append(ng)
        self.state = state
        self.param_groups = new_groups

    def __repr__(self):
        lines = [type(self).__name__ + " ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            for key in sorted(group):
                if key != "params":
                    lines.append(f"    {key}: {group[key]}")
        lines.append(")")
        return "\n".join(lines)


def _int_key(k):
    """State dict keys may come back as strings after a JSON-based save."""
    return int(k) if isinstance(k, str) and k.lstrip("-").isdigit() else k


def _plain_value(key, value):
    if key == "betas" and isinstance(value, list):
        return tuple(value)
    return value


def _cast_state(p, key, value):
    """A copy of a saved state entry on `p`'s device; floating tensors take `p`'s dtype, but a 0-d
    one (a scalar such as NAdam's mu_product in torch's layout) keeps its own, never rounded to a
    half-precision parameter's."""
    if key == "step":
        return int(value.item()) if isinstance(value, Tensor) else int(value)
    if not isinstance(value, Tensor):
        return value
    src = value._data
    arr = to_device(src, p._device)
    if p.is_floating_point() and value.is_floating_point() and arr.dtype != p._data.dtype and arr.ndim > 0:
        arr = arr.astype(p._data.dtype)
    elif arr is src:
        arr = arr.copy()
    t = Tensor._make(arr, p._device)
    t._global = p._global if arr.ndim > 0 else None
    return t


# ---------------------------------------------------------------------- helpers for subclasses
def check_number(name, value, low=0.0, high=None, high_inclusive=False):
    """Raise torch's `ValueError(f"Invalid {name}: {value}")` when value is out of range."""
    if isinstance(value, Tensor):
        value = value.item()
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    ok = value >= low
    if high is not None:
        ok = ok and (value <= high if high_inclusive else value < high)
    if not ok:
        raise ValueError(f"Invalid {name}: {value}")
    return value


def check_torch_flags(name, group):
    """torch's implementation switches, where the optimizer has them: `foreach` and `fused` (None
    or a bool) and `capturable` (a bool) choose how torch runs the same math, so they are kept in
    the group, as torch keeps them, and change nothing here (on CUDA Adam/AdamW always use the
    engine's multi-tensor kernel; the step count is a host int, so a capturable step is what a
    captured step does anyway). `differentiable=True` (a step autograd records) is refused."""
    for key in ("foreach", "fused"):
        if group.get(key) is not None and not isinstance(group[key], bool):
            raise TypeError(f"{name}: {key} must be None or a bool, got {group[key]!r}")
    for key in ("capturable", "differentiable"):
        if key in group and not isinstance(group[key], bool):
            raise TypeError(f"{name}: {key} must be a bool, got {group[key]!r}")
    if group.get("differentiable"):
        raise NotImplementedError(f"{name}(differentiable=True) is not supported: the engine's optimizer steps update "
                                  "the parameters' arrays in place and autograd records nothing through them")
    if group.get("fused") and group.get("foreach"):
        raise RuntimeError("`fused` and `foreach` cannot be `True` together.")


def zeros_state(p):
    """A zero tensor shaped, typed and placed like `p` (optimizer state such as exp_avg)."""
    t = Tensor._make(xp_of(p._data).zeros_like(p._data), p._device)
    t._global = p._global
    return t


def copy_state(p, array):
    """A new state tensor holding a copy of `array` (laid out like `p`)."""
    t = Tensor._make(array.copy(), p._device)
    t._global = p._global
    return t
