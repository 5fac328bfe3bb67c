"""RAdam: Adam with the variance of the adaptive lr rectified (Liu et al. 2019).

Same formulas as torch.optim.RAdam (single-tensor path), t the step count:
    g = grad (negated when maximize)
    decoupled_weight_decay: p *= 1 - lr * weight_decay;  else g += weight_decay * p
    m = lerp(m, g, 1 - beta1);  v = beta2 * v + (1 - beta2) * g * g
    rho_inf = 2 / (1 - beta2) - 1;  rho_t = rho_inf - 2 t beta2**t / (1 - beta2**t)
    rho_t > 5: p -= m / (1 - beta1**t) * lr * sqrt(1 - beta2**t) / (sqrt(v) + eps) * r_t,
               r_t = sqrt((rho_t - 4) (rho_t - 2) rho_inf / ((rho_inf - 4) (rho_inf - 2) rho_t))
    else:      p -= m / (1 - beta1**t) * lr
"""
from ._common import AdamFamily

__all__ = ["RAdam"]


class RAdam(AdamFamily):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 decoupled_weight_decay=False, *, foreach=None, maximize=False, capturable=False,
                 differentiable=False):
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, maximize=maximize,
                        foreach=foreach, capturable=capturable, decoupled_weight_decay=decoupled_weight_decay,
                        differentiable=differentiable)
        super().__init__(params, defaults)

    def _update(self, group, p, grad, state):
        w = p._data
        beta1, beta2 = group["betas"]
        xp, step, _, _, tmp = self._moments(group, p, grad, state, group["decoupled_weight_decay"])
        m, v = state["exp_avg"]._data, state["exp_avg_sq"]._data

        bias_correction1 = 1 - beta1 ** step
        bias_correction2 = 1 - beta2 ** step
        xp.divide(m, bias_correction1, out=tmp)
        xp.multiply(tmp, group["lr"], out=tmp)
        rho_inf = 2 / (1 - beta2) - 1
        rho_t = rho_inf - 2 * step * (beta2 ** step) / bias_correction2
        if rho_t > 5.0:
            rect = ((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)) ** 0.5
            adaptive = xp.sqrt(v)                   # sqrt(bc2) / (sqrt(v) + eps), as torch's
            xp.add(adaptive, group["eps"], out=adaptive)    # reciprocal-times-scalar
            xp.reciprocal(adaptive, out=adaptive)
            xp.multiply(adaptive, bias_correction2 ** 0.5, out=adaptive)
            xp.multiply(tmp, adaptive, out=tmp)
            xp.multiply(tmp, rect, out=tmp)
        xp.subtract(w, tmp, out=w)
