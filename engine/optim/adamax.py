"""Adamax: Adam with the infinity norm (Kingma & Ba 2015, section 7.1).

Same formulas as torch.optim.Adamax (single-tensor path), t the step count:
    g = grad (negated when maximize) + weight_decay * p
    m = lerp(m, g, 1 - beta1)                                # state "exp_avg"
    u = max(beta2 * u, |g| + eps)                            # state "exp_inf"
    p -= lr / (1 - beta1**t) * m / u
"""
from ._common import AdamFamily

__all__ = ["Adamax"]


class Adamax(AdamFamily):
    _second = "exp_inf"

    def __init__(self, params, lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, foreach=None, *,
                 maximize=False, differentiable=False, capturable=False):
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, foreach=foreach,
                        maximize=maximize, differentiable=differentiable, capturable=capturable)
        super().__init__(params, defaults)

    def _update(self, group, p, grad, state):
        w = p._data
        beta1, beta2 = group["betas"]
        xp, step, g, _, tmp = self._moments(group, p, grad, state)
        m, u = state["exp_avg"]._data, state["exp_inf"]._data
        xp.multiply(u, beta2, out=u)
        xp.abs(g, out=tmp)
        xp.add(tmp, group["eps"], out=tmp)
        xp.maximum(u, tmp, out=u)
        clr = group["lr"] / (1 - beta1 ** step)
        xp.divide(m, u, out=tmp)
        xp.multiply(tmp, -clr, out=tmp)
        xp.add(w, tmp, out=w)
