"""Pieces shared by the elementwise optimizers of rmsprop.py, adagrad.py, adadelta.py, adamax.py,
nadam.py and radam.py: the step count and state creation, the gradient an update uses, and
torch's 0-d "scalar state" rounding (NAdam's mu_product)."""
import numpy as np

from ..backend import dtypes, xp_of
from .adam import _lerp_into, check_adam_group, update_second_moment
from .optimizer import Optimizer, check_number, zeros_state
from .sgd import _effective_grad

__all__ = ["count_step", "effective_grad", "check_nonnegative", "scalar_state_mul", "AdamFamily"]


def count_step(state, p, *names):
    """Create state["step"] = 0 on a parameter's first step and a zero tensor like `p` for each
    of `names` it lacks (also later: a switch such as RMSprop's momentum turned on mid-run gets
    its buffer); count the step and return it. As Adam, the step is a Python int (torch keeps a
    0-d float tensor; a loaded tensor step became an int in `load_state_dict`)."""
    state.setdefault("step", 0)
    for name in names:
        if name not in state:
            state[name] = zeros_state(p)
    state["step"] = step = state["step"] + 1
    return step


def effective_grad(xp, grad, w, group, decoupled=False):
    """(the gradient the update uses, whether it is a temporary of ours): negated when the group
    maximizes, plus weight_decay * p -- or, with `decoupled` (AdamW-style, NAdam/RAdam's
    decoupled_weight_decay), p *= 1 - lr * weight_decay in place instead, as torch does first."""
    wd = group["weight_decay"]
    if wd != 0 and decoupled:
        xp.multiply(w, 1.0 - group["lr"] * wd, out=w)
        wd = 0
    return _effective_grad(xp, grad, w, wd, group["maximize"])


def check_nonnegative(group, *checks):
    """Validate the group's lr (made a float), then each (key, name) of `checks` as torch does:
    `ValueError(f"Invalid {name}: {value}")` when the value is negative."""
    group["lr"] = check_number("learning rate", group["lr"])
    for key, name in checks:
        check_number(name, group[key])


def scalar_state_mul(a, b):
    """`a * b` rounded as torch's 0-d scalar state tensors compute it (`mu_product *= mu`): in
    float32, or float64 when the default dtype is float64 (torch's `_get_scalar_dtype`)."""
    kind = np.float64 if dtypes.get_default_dtype() == dtypes.float64 else np.float32
    return float(kind(a) * kind(b))


class AdamFamily(Optimizer):
    """Base of Adamax, NAdam and RAdam: Adam's hyperparameter checks (lr, eps, betas,
    weight_decay, with torch's messages) and the first half of their update."""

    _second = "exp_avg_sq"      # the second moment's state entry; Adamax's is "exp_inf"

    def _check_group(self, group):
        check_adam_group(group)

    def _moments(self, group, p, grad, state, decoupled=False):
        """Count the step, form the gradient g (`effective_grad`), update m = lerp(m, g, 1 - beta1)
        and, for "exp_avg_sq", v = beta2 * v + (1 - beta2) * g * g. Returns (xp, step, g, whether
        g is a temporary of ours, a scratch array shaped like p)."""
        xp = xp_of(grad)
        step = count_step(state, p, "exp_avg", self._second)
        g, owned = effective_grad(xp, grad, p._data, group, decoupled)
        m = state["exp_avg"]._data
        tmp = xp.subtract(g, m)
        _lerp_into(xp, m, g, tmp, 1.0 - group["betas"][0])
        if self._second == "exp_avg_sq":
            update_second_moment(xp, state["exp_avg_sq"]._data, g, tmp, group["betas"][1])
        return xp, step, g, owned, tmp
