"""Adadelta (Zeiler 2012), with torch's lr factor on the update.

Same formulas as torch.optim.Adadelta (single-tensor path):
    g = grad (negated when maximize) + weight_decay * p
    v = rho * v + (1 - rho) * g * g                          # state "square_avg"
    delta = sqrt(u + eps) / sqrt(v + eps) * g
    u = rho * u + (1 - rho) * delta * delta                  # state "acc_delta"
    p -= lr * delta
"""
from ..backend import xp_of
from .adam import update_second_moment
from ._common import check_nonnegative, count_step, effective_grad
from .optimizer import Optimizer, check_number

__all__ = ["Adadelta"]


class Adadelta(Optimizer):
    def __init__(self, params, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0.0, foreach=None, *, capturable=False,
                 maximize=False, differentiable=False):
        defaults = dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay, maximize=maximize, capturable=capturable,
                        foreach=foreach, differentiable=differentiable)
        super().__init__(params, defaults)

    def _check_group(self, group):
        check_nonnegative(group)
        check_number("rho value", group["rho"], 0.0, 1.0, high_inclusive=True)
        check_nonnegative(group, ("eps", "epsilon value"), ("weight_decay", "weight_decay value"))

    def _update(self, group, p, grad, state):
        xp = xp_of(grad)
        w = p._data
        rho, eps = group["rho"], group["eps"]
        count_step(state, p, "square_avg", "acc_delta")
        g, _ = effective_grad(xp, grad, w, group)
        v, u = state["square_avg"]._data, state["acc_delta"]._data
        tmp = xp.empty_like(w)
        update_second_moment(xp, v, g, tmp, rho)
        xp.add(v, eps, out=tmp)
        xp.sqrt(tmp, out=tmp)                       # std
        delta = xp.add(u, eps)
        xp.sqrt(delta, out=delta)
        xp.divide(delta, tmp, out=delta)
        xp.multiply(delta, g, out=delta)
        update_second_moment(xp, u, delta, tmp, rho)
        xp.multiply(delta, -group["lr"], out=delta)
        xp.add(w, delta, out=w)
