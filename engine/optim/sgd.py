"""Stochastic gradient descent with momentum, dampening, Nesterov and weight decay.

Same formulas as torch.optim.SGD (single-tensor path):
    g = grad (negated when maximize) + weight_decay * p
    buf = g on the first step, else momentum * buf + (1 - dampening) * g
    d = g + momentum * buf if nesterov else buf      (d = g without momentum)
    p -= lr * d
"""
from .optimizer import Optimizer, check_number, copy_state

__all__ = ["SGD"]


class SGD(Optimizer):
    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov=False, *, maximize=False):
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                        nesterov=nesterov, maximize=maximize)
        super().__init__(params, defaults)

    def _check_group(self, group):
        check_number("learning rate", group["lr"])
        check_number("momentum value", group["momentum"])
        check_number("weight_decay value", group["weight_decay"])
        if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")

    def _update(self, group, p, grad, state):
        from ..backend import xp_of

        xp = xp_of(grad)
        w = p._data
        lr, momentum, wd = group["lr"], group["momentum"], group["weight_decay"]

        # g: the effective gradient; a temporary we own only when it differs from grad
        owned = False
        if wd != 0:
            g = xp.multiply(w, wd)
            if group["maximize"]:
                xp.subtract(g, grad, out=g)
            else:
                xp.add(g, grad, out=g)
            owned = True
        elif group["maximize"]:
            g = xp.negative(grad)
            owned = True
        else:
            g = grad

        if momentum != 0:
            buf_t = state.get("momentum_buffer")
            if buf_t is None:
                buf_t = state["momentum_buffer"] = copy_state(p, g)
                buf = buf_t._data
            else:
                buf = buf_t._data
                xp.multiply(buf, momentum, out=buf)
                scale = 1.0 - group["dampening"]
                if scale == 1.0:
                    xp.add(buf, g, out=buf)
                elif owned:
                    xp.multiply(g, scale, out=g)
                    xp.add(buf, g, out=buf)
                else:
                    xp.add(buf, xp.multiply(g, scale), out=buf)
            if group["nesterov"]:  # dampening is 0 here, so g was not rescaled
                d = xp.multiply(buf, momentum)
                xp.add(d, g, out=d)
            else:
                d = xp.multiply(buf, -lr)
                xp.add(w, d, out=w)
                return
        else:
            d = g if owned else None
            if d is None:
                d = xp.multiply(g, -lr)
                xp.add(w, d, out=w)
                return
        xp.multiply(d, -lr, out=d)
        xp.add(w, d, out=w)
