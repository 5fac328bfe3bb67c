"""L-BFGS (torch.optim.LBFGS, after minFunc), with torch's optional strong-Wolfe line search.

The same algorithm, step for step, as torch 2.13's `lbfgs.py`: the parameters are handled as one
flat vector (the gradients concatenated in parameter order), the two-loop recursion keeps at most
`history_size` pairs (y, s) with ys > 1e-10, the first step is scaled by min(1, 1 / |g|_1) * lr,
and `line_search_fn="strong_wolfe"` runs torch's bracketing + zoom with cubic interpolation. All of
it works on backend arrays (`xp` ufuncs and dot products) of the parameters' dtype; scalars stay
0-d arrays of that dtype, as torch's 0-d tensors do.

As in torch, LBFGS takes a single parameter group and keeps its whole state on the first parameter
(`func_evals`, `n_iter`, `d`, `t`, `old_dirs`, `old_stps`, `ro`, `H_diag`, `prev_flat_grad`,
`prev_loss`, `al`): flat vectors are engine tensors, lists of them plain lists, so the state dict
has torch's layout.
"""
from ..autograd.grad_mode import enable_grad, no_grad
from ..backend import to_device, xp_of
from ..tensor import Tensor
from .optimizer import Optimizer

__all__ = ["LBFGS"]


def _cubic_interpolate(xp, x1, f1, g1, x2, f2, g2, bounds=None):
    """Minimiser of the cubic through (x1, f1, g1) and (x2, f2, g2), clamped to `bounds` (torch's
    port of polyinterp.lua)."""
    if bounds is not None:
        xmin_bound, xmax_bound = bounds
    else:
        xmin_bound, xmax_bound = (x1, x2) if x1 <= x2 else (x2, x1)
    d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2)
    d2_square = d1 ** 2 - g1 * g2
    if d2_square >= 0:
        d2 = xp.sqrt(d2_square)
        if x1 <= x2:
            min_pos = x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2))
        else:
            min_pos = x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2))
        return min(max(min_pos, xmin_bound), xmax_bound)
    return (xmin_bound + xmax_bound) / 2.0


def _strong_wolfe(xp, obj_func, x, t, d, f, g, gtd, c1=1e-4, c2=0.9, tolerance_change=1e-9, max_ls=25):
    """torch's `_strong_wolfe` (a port of lswolfe.lua): (f_new, g_new, t, evaluations)."""
    d_norm = xp.abs(d).max()
    g = g.copy()
    f_new, g_new = obj_func(x, t, d)
    ls_func_evals = 1
    gtd_new = xp.dot(g_new, d)

    # bracket an interval containing a point satisfying the Wolfe criteria
    t_prev, f_prev, g_prev, gtd_prev = 0, f, g, gtd
    done = False
    ls_iter = 0
    while ls_iter < max_ls:
        if f_new > (f + c1 * t * gtd) or (ls_iter > 1 and f_new >= f_prev):
            bracket, bracket_f = [t_prev, t], [f_prev, f_new]
            bracket_g, bracket_gtd = [g_prev, g_new.copy()], [gtd_prev, gtd_new]
            break
        if abs(gtd_new) <= -c2 * gtd:
            bracket, bracket_f, bracket_g = [t], [f_new], [g_new]
            done = True
            break
        if gtd_new >= 0:
            bracket, bracket_f = [t_prev, t], [f_prev, f_new]
            bracket_g, bracket_gtd = [g_prev, g_new.copy()], [gtd_prev, gtd_new]
            break
        # interpolate
        min_step = t + 0.01 * (t - t_prev)
        max_step = t * 10
        tmp = t
        t = _cubic_interpolate(xp, t_prev, f_prev, gtd_prev, t, f_new, gtd_new, bounds=(min_step, max_step))
        t_prev, f_prev, g_prev, gtd_prev = tmp, f_new, g_new.copy(), gtd_new
        f_new, g_new = obj_func(x, t, d)
        ls_func_evals += 1
        gtd_new = xp.dot(g_new, d)
        ls_iter += 1

    if ls_iter == max_ls:
        bracket, bracket_f, bracket_g = [0, t], [f, f_new], [g, g_new]

    # zoom phase: refine the bracket until a point satisfies the criteria
    insuf_progress = False
    low_pos, high_pos = (0, 1) if bracket_f[0] <= bracket_f[-1] else (1, 0)
    while not done and ls_iter < max_ls:
        if abs(bracket[1] - bracket[0]) * d_norm < tolerance_change:
            break
        t = _cubic_interpolate(xp, bracket[0], bracket_f[0], bracket_gtd[0], bracket[1], bracket_f[1],
                               bracket_gtd[1])
        # too close to a boundary twice in a row, or on it: move 0.1 * the bracket's length inside
        eps = 0.1 * (max(bracket) - min(bracket))
        if min(max(bracket) - t, t - min(bracket)) < eps:
            if insuf_progress or t >= max(bracket) or t <= min(bracket):
                if abs(t - max(bracket)) < abs(t - min(bracket)):
                    t = max(bracket) - eps
                else:
                    t = min(bracket) + eps
                insuf_progress = False
            else:
                insuf_progress = True
        else:
            insuf_progress = False

        f_new, g_new = obj_func(x, t, d)
        ls_func_evals += 1
        gtd_new = xp.dot(g_new, d)
        ls_iter += 1

        if f_new > (f + c1 * t * gtd) or f_new >= bracket_f[low_pos]:
            # Armijo condition not satisfied or not lower than the lowest point
            bracket[high_pos], bracket_f[high_pos] = t, f_new
            bracket_g[high_pos], bracket_gtd[high_pos] = g_new.copy(), gtd_new
            low_pos, high_pos = (0, 1) if bracket_f[0] <= bracket_f[1] else (1, 0)
        else:
            if abs(gtd_new) <= -c2 * gtd:
                done = True
            elif gtd_new * (bracket[high_pos] - bracket[low_pos]) >= 0:
                # the old high becomes the new low
                bracket[high_pos], bracket_f[high_pos] = bracket[low_pos], bracket_f[low_pos]
                bracket_g[high_pos], bracket_gtd[high_pos] = bracket_g[low_pos], bracket_gtd[low_pos]
            bracket[low_pos], bracket_f[low_pos] = t, f_new
            bracket_g[low_pos], bracket_gtd[low_pos] = g_new.copy(), gtd_new

    return bracket_f[low_pos], bracket_g[low_pos], bracket[low_pos], ls_func_evals


# state entries that are flat vectors, lists of them, and 0-d scalars (kept as tensors)
_VECTORS = ("d", "prev_flat_grad")
_LISTS = ("old_dirs", "old_stps", "ro", "al")
_SCALARS = ("H_diag", "t")


class LBFGS(Optimizer):
    """torch 2.13's LBFGS: one parameter group; `step(closure)` needs the closure (it re-evaluates
    the loss and its gradients, with grad mode on)."""

    def __init__(self, params, lr=1, max_iter=20, max_eval=None, tolerance_grad=1e-7, tolerance_change=1e-9,
                 history_size=100, line_search_fn=None):
        if isinstance(lr, Tensor) and lr.numel() != 1:
            raise ValueError("Tensor lr must be 1-element")
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if max_eval is None:
            max_eval = max_iter * 5 // 4
        defaults = dict(lr=lr, max_iter=max_iter, max_eval=max_eval, tolerance_grad=tolerance_grad,
                        tolerance_change=tolerance_change, history_size=history_size, line_search_fn=line_search_fn)
        super().__init__(params, defaults)
        if len(self.param_groups) != 1:
            raise ValueError("LBFGS doesn't support per-parameter options (parameter groups)")
        self._params = self.param_groups[0]["params"]

    # ------------------------------------------------------------------ flat views
    def _numel(self):
        return sum(p.numel() for p in self._params)

    def _gather_flat_grad(self):
        xp = xp_of(self._params[0]._data)
        views = [xp.zeros(p.numel(), dtype=p._data.dtype) if p.grad is None else p.grad._data.reshape(-1)
                 for p in self._params]
        return xp.concatenate(views, 0)

    def _add_grad(self, step_size, update):
        offset = 0
        for p in self._params:
            n = p.numel()
            w = p._data
            w += step_size * update[offset:offset + n].reshape(w.shape)
            p._bump_version()
            offset += n
        if offset != self._numel():
            raise AssertionError(f"Expected offset {offset} to equal {self._numel()}")

    def _clone_param(self):
        return [p._data.copy() for p in self._params]

    def _set_param(self, params_data):
        for p, data in zip(self._params, params_data, strict=True):
            p._data[...] = data
            p._bump_version()

    def _directional_evaluate(self, closure, x, t, d):
        self._add_grad(t, d)
        loss = float(self._closure(closure))
        flat_grad = self._gather_flat_grad()
        self._set_param(x)
        return loss, flat_grad

    # ------------------------------------------------------------------ the step
    def step(self, closure):
        """One optimisation step: up to `max_iter` L-BFGS iterations; returns the first loss."""
        if len(self.param_groups) != 1:
            raise AssertionError(f"Expected exactly one param_group, but got {len(self.param_groups)}")
        with no_grad():
            return self._step(closure)

    def _closure(self, closure):
        with enable_grad():
            return closure()

    def _step(self, closure):
        group = self.param_groups[0]
        lr = float(group["lr"])
        max_iter, max_eval = group["max_iter"], group["max_eval"]
        tolerance_grad, tolerance_change = group["tolerance_grad"], group["tolerance_change"]
        line_search_fn, history_size = group["line_search_fn"], group["history_size"]
        xp = xp_of(self._params[0]._data)

        state = self.state[self._params[0]]
        state.setdefault("func_evals", 0)
        state.setdefault("n_iter", 0)

        orig_loss = self._closure(closure)
        loss = float(orig_loss)
        current_evals = 1
        state["func_evals"] += 1

        flat_grad = self._gather_flat_grad()
        opt_cond = xp.abs(flat_grad).max() <= tolerance_grad
        if opt_cond:
            return orig_loss

        d, t, old_dirs, old_stps, ro, H_diag, prev_flat_grad, al = self._arrays(state)
        prev_loss = state.get("prev_loss")

        n_iter = 0
        while n_iter < max_iter:
            n_iter += 1
            state["n_iter"] += 1

            # the descent direction
            if state["n_iter"] == 1:
                d = -flat_grad
                old_dirs, old_stps, ro = [], [], []
                H_diag = 1
            else:
                y = flat_grad - prev_flat_grad
                s = d * t
                ys = xp.dot(y, s)
                if ys > 1e-10:
                    if len(old_dirs) == history_size:  # shift the history by one
                        old_dirs.pop(0)
                        old_stps.pop(0)
                        ro.pop(0)
                    old_dirs.append(y)
                    old_stps.append(s)
                    ro.append(1.0 / ys)
                    H_diag = ys / xp.dot(y, y)
                num_old = len(old_dirs)
                if al is None:
                    al = [None] * history_size
                # the two-loop recursion, collapsed into one buffer
                q = -flat_grad
                for i in range(num_old - 1, -1, -1):
                    al[i] = xp.dot(old_stps[i], q) * ro[i]
                    q += -al[i] * old_dirs[i]
                d = r = q * H_diag
                for i in range(num_old):
                    be_i = xp.dot(old_dirs[i], r) * ro[i]
                    r += (al[i] - be_i) * old_stps[i]

            if prev_flat_grad is None:
                prev_flat_grad = flat_grad.copy()
            else:
                prev_flat_grad[...] = flat_grad
            prev_loss = loss

            # the step length
            if state["n_iter"] == 1:
                t = min(1.0, 1.0 / xp.abs(flat_grad).sum()) * lr
            else:
                t = lr
            gtd = xp.dot(flat_grad, d)
            if gtd > -tolerance_change:
                break

            ls_func_evals = 0
            if line_search_fn is not None:
                if line_search_fn != "strong_wolfe":
                    raise RuntimeError("only 'strong_wolfe' is supported")
                x_init = self._clone_param()

                def obj_func(x, t, d):
                    return self._directional_evaluate(closure, x, t, d)

                loss, flat_grad, t, ls_func_evals = _strong_wolfe(xp, obj_func, x_init, t, d, loss, flat_grad, gtd,
                                                                  max_ls=max_eval - current_evals)
                self._add_grad(t, d)
                opt_cond = xp.abs(flat_grad).max() <= tolerance_grad
            else:
                self._add_grad(t, d)
                if n_iter != max_iter:
                    # re-evaluate only when another iteration follows (torch: no use otherwise)
                    loss = float(self._closure(closure))
                    flat_grad = self._gather_flat_grad()
                    opt_cond = xp.abs(flat_grad).max() <= tolerance_grad
                    ls_func_evals = 1

            current_evals += ls_func_evals
            state["func_evals"] += ls_func_evals

            if n_iter == max_iter or current_evals >= max_eval or opt_cond:
                break
            if xp.abs(d * t).max() <= tolerance_change:   # lack of progress
                break
            if abs(loss - prev_loss) < tolerance_change:
                break

        self._store(state, d=d, t=t, old_dirs=old_dirs, old_stps=old_stps, ro=ro, H_diag=H_diag,
                    prev_flat_grad=prev_flat_grad, al=al)
        state["prev_loss"] = prev_loss
        return orig_loss

    # ------------------------------------------------------------------ state as tensors
    def _arrays(self, state):
        """The state's tensors as backend arrays (copies: the state's tensors are never written)."""
        def arr(v):
            if isinstance(v, Tensor):
                return v._data.copy()
            return v

        lists = {k: None if state.get(k) is None else [arr(v) for v in state[k]] for k in _LISTS}
        return (arr(state.get("d")), arr(state.get("t")), lists["old_dirs"], lists["old_stps"], lists["ro"],
                arr(state.get("H_diag")), arr(state.get("prev_flat_grad")), lists["al"])

    def _store(self, state, **entries):
        dev = self._params[0]._device

        def wrap(v):
            if v is None or isinstance(v, int):
                return v
            if isinstance(v, float):
                return float(v)
            return Tensor._make(xp_of(v).asarray(v).copy(), dev)

        for k, v in entries.items():
            if k in _LISTS:
                state[k] = None if v is None else [wrap(x) for x in v]
            elif v is not None or k in state:
                state[k] = wrap(v)

    def load_state_dict(self, state_dict):
        """As Optimizer.load_state_dict; the flat entries (shaped by all the parameters, not the
        first one) are copied to the first parameter's device and floating dtype here."""
        saved = dict(state_dict.get("state", {})) if isinstance(state_dict, dict) else {}
        flat = {}
        for key, entry in saved.items():
            flat[key] = {k: v for k, v in entry.items() if k in _VECTORS + _LISTS + _SCALARS}
            saved[key] = {k: v for k, v in entry.items() if k not in flat[key]}
        super().load_state_dict({**state_dict, "state": saved})
        p0 = self._params[0]

        def cast(v):
            if not isinstance(v, Tensor):
                return v
            a = to_device(v._data, p0._device)
            if v.is_floating_point() and a.dtype != p0._data.dtype:
                a = a.astype(p0._data.dtype)
            return Tensor._make(a.copy(), p0._device)

        for entries in flat.values():  # LBFGS keeps its whole state on the first parameter
            self.state[p0].update({k: [cast(x) for x in v] if isinstance(v, list) else cast(v)
                                   for k, v in entries.items()})
