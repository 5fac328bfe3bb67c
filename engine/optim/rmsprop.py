"""RMSprop (Hinton's lecture 6e), with torch's momentum, centered and weight-decay variants.

Same formulas as torch.optim.RMSprop (single-tensor path):
    g = grad (negated when maximize) + weight_decay * p
    v = alpha * v + (1 - alpha) * g * g                     # state "square_avg"
    centered: a = lerp(a, g, 1 - alpha); avg = sqrt(v - a * a) + eps    # "grad_avg"
    else:     avg = sqrt(v) + eps
    momentum > 0: buf = momentum * buf + g / avg; p -= lr * buf        # "momentum_buffer"
    else:         p -= lr * g / avg
The momentum buffer starts at zero (unlike SGD's, which starts at the first gradient).
"""
from ..backend import xp_of
from .adam import _lerp_into, update_second_moment
from ._common import check_nonnegative, count_step, effective_grad
from .optimizer import Optimizer

__all__ = ["RMSprop"]


class RMSprop(Optimizer):
    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False,
                 capturable=False, foreach=None, maximize=False, differentiable=False):
        defaults = dict(lr=lr, momentum=momentum, alpha=alpha, eps=eps, centered=centered,
                        weight_decay=weight_decay, capturable=capturable, foreach=foreach, maximize=maximize,
                        differentiable=differentiable)
        super().__init__(params, defaults)

    def _check_group(self, group):
        check_nonnegative(group, ("eps", "epsilon value"), ("momentum", "momentum value"),
                          ("weight_decay", "weight_decay value"), ("alpha", "alpha value"))

    def _update(self, group, p, grad, state):
        xp = xp_of(grad)
        w = p._data
        lr, alpha, momentum = group["lr"], group["alpha"], group["momentum"]
        count_step(state, p, "square_avg", *(("momentum_buffer",) if momentum > 0 else ()),
                   *(("grad_avg",) if group["centered"] else ()))
        g, _ = effective_grad(xp, grad, w, group)
        v = state["square_avg"]._data
        tmp = xp.empty_like(w)
        update_second_moment(xp, v, g, tmp, alpha)
        if group["centered"]:
            a = state["grad_avg"]._data
            xp.subtract(g, a, out=tmp)
            _lerp_into(xp, a, g, tmp, 1.0 - alpha)
            xp.multiply(a, a, out=tmp)
            xp.subtract(v, tmp, out=tmp)
            xp.sqrt(tmp, out=tmp)
        else:
            xp.sqrt(v, out=tmp)
        xp.add(tmp, group["eps"], out=tmp)
        xp.divide(g, tmp, out=tmp)                  # g / avg
        if momentum > 0:
            buf = state["momentum_buffer"]._data
            xp.multiply(buf, momentum, out=buf)
            xp.add(buf, tmp, out=buf)
            xp.multiply(buf, -lr, out=tmp)
        else:
            xp.multiply(tmp, -lr, out=tmp)
        xp.add(w, tmp, out=w)
