"""NAdam: Adam with Nesterov momentum (Dozat 2016), with torch's momentum schedule.

Same formulas as torch.optim.NAdam (single-tensor path), t the step count:
    g = grad (negated when maximize)
    decoupled_weight_decay: p *= 1 - lr * weight_decay;  else g += weight_decay * p
    mu_t = beta1 * (1 - 0.5 * 0.96 ** (t * momentum_decay)),  mu_{t+1} likewise
    P = P * mu_t                                  # state "mu_product", starting at 1
    m = lerp(m, g, 1 - beta1);  v = beta2 * v + (1 - beta2) * g * g
    denom = sqrt(v / (1 - beta2**t)) + eps
    p -= lr * (1 - mu_t) / (1 - P) * g / denom
    p -= lr * mu_{t+1} / (1 - P * mu_{t+1}) * m / denom
torch keeps mu_product as a 0-d float32 tensor (float64 under a float64 default dtype); here it
is a Python float rounded the same way at each product (a loaded tensor is accepted), so the
coefficients -- and the steps -- are torch's.
"""
from ..tensor import Tensor
from ._common import AdamFamily, scalar_state_mul
from .optimizer import check_number

__all__ = ["NAdam"]


class NAdam(AdamFamily):
    def __init__(self, params, lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, momentum_decay=4e-3,
                 decoupled_weight_decay=False, *, foreach=None, maximize=False, capturable=False,
                 differentiable=False):
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        momentum_decay=momentum_decay, decoupled_weight_decay=decoupled_weight_decay,
                        maximize=maximize, foreach=foreach, capturable=capturable, differentiable=differentiable)
        super().__init__(params, defaults)

    def _check_group(self, group):
        super()._check_group(group)
        check_number("momentum_decay value", group["momentum_decay"])

    def _update(self, group, p, grad, state):
        w = p._data
        lr = group["lr"]
        beta1, beta2 = group["betas"]
        if not state:
            state["step"], state["mu_product"] = 0, 1.0
        xp, step, g, owned, tmp = self._moments(group, p, grad, state, group["decoupled_weight_decay"])
        mu = beta1 * (1.0 - 0.5 * (0.96 ** (step * group["momentum_decay"])))
        mu_next = beta1 * (1.0 - 0.5 * (0.96 ** ((step + 1) * group["momentum_decay"])))
        mu_product = state["mu_product"]
        if isinstance(mu_product, Tensor):
            mu_product = mu_product.item()
        state["mu_product"] = mu_product = scalar_state_mul(mu_product, mu)

        m, v = state["exp_avg"]._data, state["exp_avg_sq"]._data
        xp.divide(v, 1 - beta2 ** step, out=tmp)
        xp.sqrt(tmp, out=tmp)
        xp.add(tmp, group["eps"], out=tmp)          # denom
        d = xp.divide(g, tmp, out=g if owned else None)
        xp.multiply(d, -lr * (1.0 - mu) / (1.0 - mu_product), out=d)
        xp.add(w, d, out=w)
        xp.divide(m, tmp, out=tmp)
        xp.multiply(tmp, (-lr * mu_next) / (1.0 - mu_product * mu_next), out=tmp)
        xp.add(w, tmp, out=w)
