"""Stochastic gradient descent with momentum, dampening, Nesterov and weight decay.

Same formulas as torch.optim.SGD (single-tensor path):
    g = grad (negated when maximize) + weight_decay * p
    buf = g on the first step, else momentum * buf + (1 - dampening) * g
    d = g + momentum * buf if nesterov else buf      (d = g without momentum)
    p -= lr * d
"""
from ..backend import xp_of
from .optimizer import Optimizer, check_number, copy_state

__all__ = ["SGD"]


class SGD(Optimizer):
    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov=False, *, maximize=False, foreach=None, differentiable=False, fused=None):
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                        nesterov=nesterov, maximize=maximize, foreach=foreach, differentiable=differentiable,
                        fused=fused)
        super().__init__(params, defaults)

    def _check_group(self, group):
        group["lr"] = check_number("learning rate", group["lr"])
        check_number("momentum value", group["momentum"])
        check_number("weight_decay value", group["weight_decay"])
        if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")

    def _update(self, group, p, grad, state):
        xp = xp_of(grad)
        w = p._data
        lr, momentum = group["lr"], group["momentum"]
        g, owned = _effective_grad(xp, grad, w, group["weight_decay"], group["maximize"])
        d = g
        if momentum != 0:
            buf = _momentum_buffer(xp, p, g, owned, state, momentum, group["dampening"])
            if group["nesterov"]:                     # dampening is 0 here, so g is unscaled
                d = xp.multiply(buf, momentum)
                xp.add(d, g, out=d)
                owned = True
            else:
                d, owned = buf, False
        # p.add_(d, alpha=-lr), scaling in place when d is a temporary of ours
        d = xp.multiply(d, -lr, out=d if owned else None)
        xp.add(w, d, out=w)


def _effective_grad(xp, grad, w, weight_decay, maximize):
    """(grad negated when maximizing, plus weight_decay * w; whether it is a temporary we own)."""
    if weight_decay != 0:
        g = xp.multiply(w, weight_decay)
        (xp.subtract if maximize else xp.add)(g, grad, out=g)
        return g, True
    if maximize:
        return xp.negative(grad), True
    return grad, False


def _momentum_buffer(xp, p, g, owned, state, momentum, dampening):
    """buf = g on the first step, else momentum * buf + (1 - dampening) * g (in place)."""
    buf_t = state.get("momentum_buffer")
    if buf_t is None:
        state["momentum_buffer"] = copy_state(p, g)
        return state["momentum_buffer"]._data
    buf = buf_t._data
    xp.multiply(buf, momentum, out=buf)
    scale = 1.0 - dampening
    if scale != 1.0:
        g = xp.multiply(g, scale, out=g if owned else None)
    xp.add(buf, g, out=buf)
    return buf
