"""Adagrad (Duchi et al. 2011) with torch's lr decay.

Same formulas as torch.optim.Adagrad (single-tensor path, dense gradients), t the step count:
    g = grad (negated when maximize) + weight_decay * p
    clr = lr / (1 + (t - 1) * lr_decay)
    s += g * g                                   # state "sum", starting at initial_accumulator_value
    p -= clr * g / (sqrt(s) + eps)
As torch, the state of the constructor's parameters is created at construction (step 0 and the
filled sum), so a state dict taken before the first step already holds it. Unlike torch, which
always fills with the constructor's value, a group's own initial_accumulator_value is used.
"""
from ..backend import xp_of
from ._common import check_nonnegative, effective_grad
from .optimizer import Optimizer, zeros_state

__all__ = ["Adagrad"]


class Adagrad(Optimizer):
    def __init__(self, params, lr=1e-2, lr_decay=0.0, weight_decay=0.0, initial_accumulator_value=0.0,
                 eps=1e-10, foreach=None, *, maximize=False, differentiable=False, fused=None):
        defaults = dict(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay,
                        initial_accumulator_value=initial_accumulator_value, foreach=foreach, maximize=maximize,
                        differentiable=differentiable, fused=fused)
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                _init_state(self.state[p], p, group)

    def _check_group(self, group):
        check_nonnegative(group, ("lr_decay", "lr_decay value"), ("weight_decay", "weight_decay value"),
                          ("initial_accumulator_value", "initial_accumulator_value value"),
                          ("eps", "epsilon value"))

    def _update(self, group, p, grad, state):
        xp = xp_of(grad)
        w = p._data
        _init_state(state, p, group)
        state["step"] = step = state["step"] + 1
        g, _ = effective_grad(xp, grad, w, group)
        clr = group["lr"] / (1 + (step - 1) * group["lr_decay"])
        s = state["sum"]._data
        tmp = xp.multiply(g, g)
        xp.add(s, tmp, out=s)
        xp.sqrt(s, out=tmp)
        xp.add(tmp, group["eps"], out=tmp)
        xp.divide(g, tmp, out=tmp)
        xp.multiply(tmp, -clr, out=tmp)
        xp.add(w, tmp, out=w)


def _init_state(state, p, group):
    if not state:
        state["step"] = 0
        state["sum"] = s = zeros_state(p)
        if group["initial_accumulator_value"] != 0:
            s._data.fill(group["initial_accumulator_value"])

