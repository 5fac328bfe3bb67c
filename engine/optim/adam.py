"""Adam (L2 weight decay folded into the gradient) and AdamW (decoupled weight decay).

Same formulas as torch.optim.Adam / AdamW (single-tensor path), with t the step count:
    AdamW only: p *= 1 - lr * weight_decay
    g = grad (negated when maximize); Adam only: g += weight_decay * p
    m += (1 - beta1) * (g - m)                  # torch's exp_avg.lerp_(g, 1 - beta1)
    v = beta2 * v + (1 - beta2) * g * g
    amsgrad: v_max = max(v_max, v), used instead of v below
    denom = sqrt(v) / sqrt(1 - beta2**t) + eps
    p -= (lr / (1 - beta1**t)) * m / denom

OneFlow's `do_bias_correction=False` (LiBai's AdamW configs name it) drops both corrections:
denom = sqrt(v) + eps and p -= lr * m / denom. A parameter group without the key (e.g. a loaded
torch state) corrects, as torch always does.

On CUDA the parameters of a group are updated by the multi-tensor kernel of engine/kernels/adamw.py:
one launch per (dtype, step count) bucket instead of a dozen per parameter, which also writes
autocast's float16 copy of each float32 parameter that has one (engine/ops/cast_cache.py), so
that the next forward under autocast casts no weight. Parameters it cannot
take (a gradient of another dtype, non-contiguous parameter or state) and every CPU parameter go
through `_update` one by one.
"""
import numpy as np

from ..backend import jit, xp_of
from ..backend.parallel import parallel_for
from ..kernels.adamw import AdamHyper, adam_update
from ..ops import cast_cache
from .optimizer import Optimizer, check_number, zeros_state

__all__ = ["Adam", "AdamW"]

_F16 = np.dtype(np.float16)


class Adam(Optimizer):
    """torch 2.13's Adam; `decoupled_weight_decay=True` makes it AdamW (kept per group, as torch)."""

    _step_supports_amp_scaling = True  # the CUDA kernel skips on the GradScaler's device flag

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 amsgrad=False, do_bias_correction=True, *, foreach=None, maximize=False, capturable=False,
                 differentiable=False, fused=None, decoupled_weight_decay=False):
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                        maximize=maximize, foreach=foreach, capturable=capturable, differentiable=differentiable,
                        fused=fused, decoupled_weight_decay=decoupled_weight_decay,
                        do_bias_correction=do_bias_correction)
        super().__init__(params, defaults)

    def _check_group(self, group):
        check_adam_group(group)

    def _step_group(self, group):
        for p, g in self._step_fused(group):
            self._update(group, p, g, self.state[p])
            p._bump_version()

    def _step_fused(self, group):
        """Update the group's CUDA parameters with the multi-tensor kernel, one launch per bucket
        of (device, dtype, step); return the (parameter, gradient) pairs left to `_update`.

        Under a GradScaler whose flag stayed on the GPU (`self.found_inf`, engine.amp.DeviceFlag)
        the kernel reads the flag and skips; the step counts are provisional until the flag is
        known (Optimizer._settle_skipped). A group with parameters the kernel cannot take reads
        the flag instead (a host read)."""
        rest, fused = [], []
        for p, g in self._with_grads(group):
            w = p._data
            (rest if xp_of(w) is np or not _fusable(w, g, self.state[p]) else fused).append((p, g))
        flag = getattr(self, "found_inf", None)
        if flag is not None and (rest or any(p._data.device.id != flag.found.device.id for p, _ in fused)):
            if flag.value():  # parameters the kernel cannot take: the flag is read, and skips them all
                return []
            flag = None
        buckets = {}
        for p, g in fused:
            w = p._data
            state = self.state[p]
            step = advance_moments(state, p)
            if group["amsgrad"] and "max_exp_avg_sq" not in state:
                state["max_exp_avg_sq"] = zeros_state(p)
            buckets.setdefault((w.device.id, w.dtype, step), []).append((p, g, state))
        beta1, beta2 = group["betas"]
        for (device, dtype, step), items in buckets.items():
            hyper = AdamHyper(group["lr"], beta1, beta2, group["eps"], group["weight_decay"], step,
                              group["decoupled_weight_decay"],
                              group.get("do_bias_correction", True), group["maximize"])
            vmax = [s["max_exp_avg_sq"]._data for _, _, s in items] if group["amsgrad"] else None
            # autocast's float16 copies of these parameters, written by the same pass (cast_cache)
            halves = [cast_cache.writable_copy(p, _F16) for p, _, _ in items] if dtype == np.float32 else None
            if flag is not None:
                self._taken_on_flag(flag, [(p, s) for p, _, s in items])
            with xp_of(items[0][0]._data).cuda.Device(device):
                adam_update([p._data for p, _, _ in items], [xp_of(g).ascontiguousarray(g) for _, g, _ in items],
                            [s["exp_avg"]._data for _, _, s in items], [s["exp_avg_sq"]._data for _, _, s in items],
                            vmax, hyper, halves, None if flag is None else flag.found)
            for i, (p, _, _) in enumerate(items):
                p._bump_version()
                if halves is not None and halves[i] is not None:
                    cast_cache.mark_written(p, _F16)
        return rest

    def _update(self, group, p, grad, state):
        xp = xp_of(grad)
        w = p._data
        lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
        beta1, beta2 = group["betas"]
        step = advance_moments(state, p)
        if group["amsgrad"] and "max_exp_avg_sq" not in state:
            state["max_exp_avg_sq"] = zeros_state(p)
        m, v = state["exp_avg"]._data, state["exp_avg_sq"]._data
        correct = group.get("do_bias_correction", True)
        decoupled = group["decoupled_weight_decay"]
        if not group["amsgrad"] and not group["maximize"] and _blocked_ok(w, grad, m, v):
            _adam_blocked(w, grad, m, v, lr, wd, eps, beta1, beta2, step, decoupled, correct)
            return

        if wd != 0 and decoupled:
            xp.multiply(w, 1.0 - lr * wd, out=w)
        if wd != 0 and not decoupled:
            g = xp.multiply(w, wd)
            if group["maximize"]:
                xp.subtract(g, grad, out=g)
            else:
                xp.add(g, grad, out=g)
        elif group["maximize"]:
            g = xp.negative(grad)
        else:
            g = grad

        tmp = xp.subtract(g, m)                     # the one temporary: lerp, then g*g, then the update
        _lerp_into(xp, m, g, tmp, 1.0 - beta1)
        update_second_moment(xp, v, g, tmp, beta2)

        if group["amsgrad"]:
            vmax = state["max_exp_avg_sq"]._data
            xp.maximum(vmax, v, out=vmax)
            v = vmax
        bias_correction1, bias_correction2_sqrt = bias_corrections(beta1, beta2, step, correct)
        step_size = lr / bias_correction1
        xp.sqrt(v, out=tmp)
        xp.divide(tmp, bias_correction2_sqrt, out=tmp)
        xp.add(tmp, eps, out=tmp)
        xp.divide(m, tmp, out=tmp)
        xp.multiply(tmp, -step_size, out=tmp)
        xp.add(w, tmp, out=w)


def check_adam_group(group):
    """Validate an Adam-family group's lr, eps, betas and weight_decay (torch's messages); betas
    become a tuple of floats."""
    group["lr"] = check_number("learning rate", group["lr"])
    check_number("epsilon value", group["eps"])
    betas = group["betas"]
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"betas must be a pair (beta1, beta2), got {betas!r}")
    check_number("beta parameter at index 0", betas[0], 0.0, 1.0)
    check_number("beta parameter at index 1", betas[1], 0.0, 1.0)
    check_number("weight_decay value", group["weight_decay"])
    group["betas"] = tuple(float(b) for b in betas)
    if not isinstance(group.get("do_bias_correction", True), bool):
        raise TypeError(f"do_bias_correction must be a bool, got {group['do_bias_correction']!r}")


def bias_corrections(beta1, beta2, step, correct=True):
    """(1 - beta1**t, sqrt(1 - beta2**t)), or (1, 1) without bias correction (OneFlow's
    do_bias_correction=False)."""
    if not correct:
        return 1.0, 1.0
    return 1.0 - beta1 ** step, (1.0 - beta2 ** step) ** 0.5


def advance_moments(state, p):
    """Create step / exp_avg / exp_avg_sq on a parameter's first step, count the step, return it."""
    if not state:
        state["step"] = 0
        state["exp_avg"] = zeros_state(p)
        state["exp_avg_sq"] = zeros_state(p)
    state["step"] = step = state["step"] + 1
    return step


def update_second_moment(xp, v, g, tmp, beta2):
    """v = beta2 * v + (1 - beta2) * g * g in place; torch's addcmul rounding, (value * g) * g.
    `tmp` is clobbered."""
    xp.multiply(g, 1.0 - beta2, out=tmp)
    xp.multiply(tmp, g, out=tmp)
    xp.multiply(v, beta2, out=v)
    xp.add(v, tmp, out=v)


def _lerp_into(xp, m, g, diff, weight):
    """m = lerp(m, g, weight) with torch's two-branch formula; `diff` holds g - m (clobbered)."""
    if abs(weight) < 0.5:
        xp.multiply(diff, weight, out=diff)
        xp.add(m, diff, out=m)
    else:
        xp.multiply(diff, 1.0 - weight, out=diff)
        xp.subtract(g, diff, out=m)


def _fusable(w, g, state):
    """Whether the multi-tensor kernel takes this parameter: a float16/32/64 C-contiguous
    parameter with a gradient of its dtype (which may be strided: the kernel gets a copy) and
    C-contiguous state of its dtype (always, unless a loaded state dict made it otherwise)."""
    if w.dtype.kind != "f" or g.dtype != w.dtype or not w.flags.c_contiguous:
        return False
    arrays = [state[k]._data for k in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") if k in state]
    return all(a.dtype == w.dtype and a.flags.c_contiguous for a in arrays)


# elements per block of the blocked CPU update: 64 Ki float32 (256 KiB per array), so the block's
# temporary and the four arrays it walks stay in L2 between the dozen passes of the update
_BLOCK = 1 << 16


def _blocked_ok(*arrays):
    return all(isinstance(a, np.ndarray) and a.flags.c_contiguous for a in arrays) \
        and len({a.dtype for a in arrays}) == 1 and arrays[0].dtype.kind == "f"


def _adam_loop(w, g, m, v, decay, wd, lerp_w, lerp_small, beta2, one_minus_beta2, bc2_sqrt, eps, neg_step,
               decoupled, has_wd):
    """The compiled update: `_adam_blocked`'s numpy operations, in the same order and the same
    dtype, on one element at a time, so that every bit agrees (no fastmath here: no fused
    multiply-adds, no reassociation) while the parameter, its gradient and both moments are
    read once and written once instead of a dozen passes."""
    for i in range(w.shape[0]):
        wi = w[i]
        gi = g[i]
        if has_wd:
            if decoupled:
                wi = wi * decay
            else:
                gi = wi * wd + gi
        mi = m[i]
        d = gi - mi
        if lerp_small:
            mi = mi + d * lerp_w
        else:
            mi = gi - d * lerp_w
        t = gi * one_minus_beta2
        t = t * gi
        vi = v[i] * beta2 + t
        den = np.sqrt(vi) / bc2_sqrt + eps
        w[i] = wi + (mi / den) * neg_step
        m[i] = mi
        v[i] = vi


_adam_jit = jit.kernel(_adam_loop, fastmath=False)


def _adam_blocked(w, grad, m, v, lr, wd, eps, beta1, beta2, step, decoupled, correct=True):
    """The update of `Adam._update` (no amsgrad / maximize) on numpy arrays, block by block over
    the engine's threads: the same operations in the same order on every element (so the same
    results), but each block's passes stay in the cache instead of streaming the whole
    parameter, its gradient and both moments through memory a dozen times on one thread. With
    numba (engine.backend.jit) the whole update is one compiled pass per thread range with the
    same bits (AdamW on 4M float32 parameters, two threads: 8.5 -> 5.5 ms)."""
    w1, g1, m1, v1 = w.reshape(-1), grad.reshape(-1), m.reshape(-1), v.reshape(-1)
    n = w1.size
    bias_correction1, bias_correction2_sqrt = bias_corrections(beta1, beta2, step, correct)
    step_size = lr / bias_correction1
    lerp_weight = 1.0 - beta1
    if _adam_jit is not None and w1.dtype in (np.float32, np.float64):
        f = w1.dtype.type
        small = abs(lerp_weight) < 0.5
        consts = (f(1.0 - lr * wd), f(wd), f(lerp_weight if small else 1.0 - lerp_weight), small, f(beta2),
                  f(1.0 - beta2), f(bias_correction2_sqrt), f(eps), f(-step_size), bool(decoupled), wd != 0)
        parallel_for(lambda s, e: _adam_jit(w1[s:e], g1[s:e], m1[s:e], v1[s:e], *consts), n, work=n,
                     grain=_BLOCK, per_thread=4)
        return
    nblocks = -(-n // _BLOCK)

    def run(b0, b1):
        for s in range(b0 * _BLOCK, min(b1 * _BLOCK, n), _BLOCK):
            e = min(s + _BLOCK, n)
            wb, gb, mb, vb = w1[s:e], g1[s:e], m1[s:e], v1[s:e]
            if wd != 0 and decoupled:
                np.multiply(wb, 1.0 - lr * wd, out=wb)
            if wd != 0 and not decoupled:
                gb = np.multiply(wb, wd)
                np.add(gb, g1[s:e], out=gb)
            tmp = np.subtract(gb, mb)
            _lerp_into(np, mb, gb, tmp, lerp_weight)
            update_second_moment(np, vb, gb, tmp, beta2)
            np.sqrt(vb, out=tmp)
            np.divide(tmp, bias_correction2_sqrt, out=tmp)
            np.add(tmp, eps, out=tmp)
            np.divide(mb, tmp, out=tmp)
            np.multiply(tmp, -step_size, out=tmp)
            np.add(wb, tmp, out=wb)

    parallel_for(run, nblocks, work=n, per_thread=4)


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter): p *= 1 - lr * weight_decay; as
    torch 2.13's, an Adam whose groups hold decoupled_weight_decay=True."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, do_bias_correction=True, *, maximize=False, foreach=None, capturable=False,
                 differentiable=False, fused=None):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         do_bias_correction=do_bias_correction, foreach=foreach, maximize=maximize,
                         capturable=capturable, differentiable=differentiable, fused=fused,
                         decoupled_weight_decay=True)
