"""LAMB: Adam's update rescaled per parameter tensor by a layer-wise trust ratio.

You et al. 2019, "Large Batch Optimization for Deep Learning: Training BERT in 76 minutes"
(arXiv:1904.00962), in the form used by NVIDIA apex's FusedLAMB and OneFlow/LiBai's LAMB. Per
parameter tensor p with gradient g, step t:

    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    m_hat = m / (1 - beta1**t),  v_hat = v / (1 - beta2**t)     (bias_correction=True)
    m_hat = m,                   v_hat = v                      (bias_correction=False)
    r = m_hat / (sqrt(v_hat) + eps) + weight_decay * p
    trust = ||p|| / ||r||, or 1 when either norm is 0
    p -= lr * trust * r

With `adam_w_mode=False` weight decay is instead added to the gradient (g += weight_decay * p)
before the moments, and r has no decay term (apex's "L2 mode"). The norms are Euclidean norms of
the whole tensor, accumulated in float32 (float64 for float64 params); they stay device scalars,
so a step never waits for the GPU.
"""
from ..backend import dtypes, xp_of
from .adam import advance_moments, check_adam_group, update_second_moment
from .optimizer import Optimizer

__all__ = ["LAMB"]


class LAMB(Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0,
                 bias_correction=True, adam_w_mode=True):
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        bias_correction=bias_correction, adam_w_mode=adam_w_mode)
        super().__init__(params, defaults)

    def _check_group(self, group):
        check_adam_group(group)

    def _update(self, group, p, grad, state):
        xp = xp_of(grad)
        w = p._data
        lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
        beta1, beta2 = group["betas"]
        step = advance_moments(state, p)
        m, v = state["exp_avg"]._data, state["exp_avg_sq"]._data

        if wd != 0 and not group["adam_w_mode"]:
            g = xp.multiply(w, wd)
            xp.add(g, grad, out=g)
        else:
            g = grad

        tmp = xp.multiply(g, 1.0 - beta1)           # the temporary: moments, then r
        xp.multiply(m, beta1, out=m)
        xp.add(m, tmp, out=m)
        update_second_moment(xp, v, g, tmp, beta2)

        if group["bias_correction"]:
            bc1, bc2 = 1.0 - beta1 ** step, 1.0 - beta2 ** step
        else:
            bc1 = bc2 = 1.0
        xp.divide(v, bc2, out=tmp)                  # r = (m / bc1) / (sqrt(v / bc2) + eps)
        xp.sqrt(tmp, out=tmp)
        xp.add(tmp, eps, out=tmp)
        xp.multiply(tmp, bc1, out=tmp)              # m / bc1 / d == m / (d * bc1)
        xp.divide(m, tmp, out=tmp)
        r = tmp
        if wd != 0 and group["adam_w_mode"]:
            xp.add(r, xp.multiply(w, wd), out=r)

        if p._global is None:
            trust = _trust_ratio(xp, _norm(xp, w), _norm(xp, r))
        else:  # a sharded parameter: the norms are over the whole logical tensor
            trust = _trust_ratio(xp, *_global_norms(xp, p._global, w, r))
        xp.multiply(r, -lr * trust, out=r)
        xp.add(w, r, out=w)


def _norm(xp, a):
    """Euclidean norm of a whole array as a device scalar, accumulated in float32 or better."""
    if a.dtype != dtypes.float64.np and a.dtype != dtypes.float32.np:
        a = a.astype(dtypes.float32.np)
    flat = a.reshape(-1)
    return xp.sqrt(xp.dot(flat, flat))


def _global_norms(xp, meta, w, r):
    sq = xp.stack([_norm(xp, w), _norm(xp, r)]) ** 2
    meta.reduce_over_splits(sq)
    return xp.sqrt(sq[0]), xp.sqrt(sq[1])


def _trust_ratio(xp, w_norm, r_norm):
    ok = (w_norm > 0) & (r_norm > 0)
    return xp.where(ok, w_norm / xp.where(ok, r_norm, 1), 1).astype(w_norm.dtype)
