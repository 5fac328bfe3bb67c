"""Learning-rate schedulers, following torch.optim.lr_scheduler step for step.

Each scheduler writes `group["lr"]` of its optimizer's param groups on every `step()`. The update
rules are torch's *recursive* forms (each lr computed from the previous one), so the printed lr
sequences agree with torch to the last bit; `step(epoch)` uses the closed forms, as torch does.
`state_dict()` is every attribute except the optimizer (and, for LambdaLR, the functions).
"""
import math
import types
import warnings
from bisect import bisect_right
from collections import Counter

from .optimizer import Optimizer

__all__ = ["LRScheduler", "LambdaLR", "MultiplicativeLR", "StepLR", "MultiStepLR", "ConstantLR",
           "LinearLR", "ExponentialLR", "SequentialLR", "PolynomialLR", "CosineAnnealingLR",
           "OneCycleLR"]


def _group_lrs(optimizer):
    return [group["lr"] for group in optimizer.param_groups]


class LRScheduler:
    """Base class: subclasses implement `get_lr()` (and optionally `_get_closed_form_lr()`)."""

    _is_initial = False

    def __init__(self, optimizer, last_epoch=-1):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
        self.optimizer = optimizer
        if last_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
        else:
            for i, group in enumerate(optimizer.param_groups):
                if "initial_lr" not in group:
                    raise KeyError(
                        f"param 'initial_lr' is not specified in param_groups[{i}] when resuming a "
                        "scheduler with last_epoch >= 0 (load the optimizer's state dict first)"
                    )
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._initial_step()

    def _initial_step(self):
        self._step_count = 0
        self._is_initial = True
        try:
            self.step()
        finally:
            self._is_initial = False

    def get_lr(self):
        raise NotImplementedError

    def get_last_lr(self):
        """The lrs set by the latest `step()`, one per param group."""
        return self._last_lr

    def step(self, epoch=None):
        self._step_count += 1
        if epoch is not None:
            warnings.warn("passing an epoch to scheduler.step() is deprecated (as in torch)", UserWarning,
                          stacklevel=2)
        self._update_lr(epoch)

    def _update_lr(self, epoch=None):
        if epoch is None:
            self.last_epoch += 1
            values = self.get_lr()
        else:
            self.last_epoch = epoch
            closed = getattr(self, "_get_closed_form_lr", None)
            values = closed() if closed is not None else self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, values):
            group["lr"] = lr
        self._last_lr = _group_lrs(self.optimizer)

    def state_dict(self):
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state_dict):
        self.__dict__.update(state_dict)


# ---------------------------------------------------------------------- lambda-based
class _LambdaBase(LRScheduler):
    def __init__(self, optimizer, lr_lambda, last_epoch=-1):
        self.optimizer = optimizer
        n = len(optimizer.param_groups)
        if isinstance(lr_lambda, (list, tuple)):
            if len(lr_lambda) != n:
                raise ValueError(f"Expected {n} lr_lambdas, but got {len(lr_lambda)}")
            self.lr_lambdas = list(lr_lambda)
        else:
            self.lr_lambdas = [lr_lambda] * n
        for fn in self.lr_lambdas:
            if not callable(fn):
                raise TypeError(f"lr_lambda should be a function, but got {type(fn).__name__}")
        super().__init__(optimizer, last_epoch)

    def state_dict(self):
        """Functions are not saved; callable objects save their `__dict__`."""
        sd = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "lr_lambdas")}
        sd["lr_lambdas"] = [None if isinstance(fn, types.FunctionType) else dict(fn.__dict__)
                            for fn in self.lr_lambdas]
        return sd

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        lambdas = state_dict.pop("lr_lambdas")
        self.__dict__.update(state_dict)
        for fn, saved in zip(self.lr_lambdas, lambdas):
            if saved is not None:
                fn.__dict__.update(saved)


class LambdaLR(_LambdaBase):
    """lr = base_lr * lr_lambda(epoch)."""

    def get_lr(self):
        return [base * fn(self.last_epoch) for fn, base in zip(self.lr_lambdas, self.base_lrs)]


class MultiplicativeLR(_LambdaBase):
    """lr = previous lr * lr_lambda(epoch) (from the first step on)."""

    def get_lr(self):
        if self._is_initial:
            return _group_lrs(self.optimizer)
        return [g["lr"] * fn(self.last_epoch) for fn, g in zip(self.lr_lambdas, self.optimizer.param_groups)]


# ---------------------------------------------------------------------- step decays
class StepLR(LRScheduler):
    """Multiply lr by gamma every `step_size` epochs."""

    def __init__(self, optimizer, step_size, gamma=0.1, last_epoch=-1):
        if int(step_size) != step_size or step_size <= 0:
            raise ValueError(f"StepLR: step_size must be a positive integer, got {step_size}")
        self.step_size = int(step_size)
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return _group_lrs(self.optimizer)
        return [g["lr"] * self.gamma for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self):
        return [base * self.gamma ** (self.last_epoch // self.step_size) for base in self.base_lrs]


class MultiStepLR(LRScheduler):
    """Multiply lr by gamma at each milestone (by gamma**k for a milestone listed k times)."""

    def __init__(self, optimizer, milestones, gamma=0.1, last_epoch=-1):
        self.milestones = Counter(milestones)
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self.last_epoch not in self.milestones:
            return _group_lrs(self.optimizer)
        k = self.milestones[self.last_epoch]
        return [g["lr"] * self.gamma ** k for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self):
        milestones = sorted(self.milestones.elements())
        return [base * self.gamma ** bisect_right(milestones, self.last_epoch) for base in self.base_lrs]

    def state_dict(self):
        sd = super().state_dict()
        sd["milestones"] = dict(self.milestones)  # a plain dict saves anywhere
        return sd

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        self.milestones = Counter({int(k): v for k, v in dict(self.milestones).items()})


class ConstantLR(LRScheduler):
    """lr = base_lr * factor until `total_iters`, then base_lr."""

    def __init__(self, optimizer, factor=1.0 / 3, total_iters=5, last_epoch=-1):
        if factor > 1.0 or factor < 0:
            raise ValueError("Constant multiplicative factor expected to be between 0 and 1.")
        self.factor = factor
        self.total_iters = total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self.last_epoch == 0:
            return [g["lr"] * self.factor for g in self.optimizer.param_groups]
        if self.last_epoch != self.total_iters:
            return _group_lrs(self.optimizer)
        return [g["lr"] * (1.0 / self.factor) for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self):
        return [base * (self.factor + (self.last_epoch >= self.total_iters) * (1 - self.factor))
                for base in self.base_lrs]


class LinearLR(LRScheduler):
    """lr goes linearly from base_lr * start_factor to base_lr * end_factor over `total_iters`."""

    def __init__(self, optimizer, start_factor=1.0 / 3, end_factor=1.0, total_iters=5, last_epoch=-1):
        if start_factor > 1.0 or start_factor <= 0:
            raise ValueError("Starting multiplicative factor expected to be greater than 0 and less or equal to 1.")
        if end_factor > 1.0 or end_factor < 0:
            raise ValueError("Ending multiplicative factor expected to be between 0 and 1.")
        self.start_factor = start_factor
        self.end_factor = end_factor
        self.total_iters = total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self.last_epoch == 0:
            return [g["lr"] * self.start_factor for g in self.optimizer.param_groups]
        if self._is_initial or self.last_epoch > self.total_iters:
            return _group_lrs(self.optimizer)
        delta = self.end_factor - self.start_factor
        ratio = 1.0 + delta / (self.total_iters * self.start_factor + (self.last_epoch - 1) * delta)
        return [g["lr"] * ratio for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self):
        return [base * (self.start_factor + (self.end_factor - self.start_factor)
                        * min(self.total_iters, self.last_epoch) / self.total_iters)
                for base in self.base_lrs]


class ExponentialLR(LRScheduler):
    """Multiply lr by gamma every epoch."""

    def __init__(self, optimizer, gamma, last_epoch=-1):
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self._is_initial:
            return _group_lrs(self.optimizer)
        return [g["lr"] * self.gamma for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self):
        return [base * self.gamma ** self.last_epoch for base in self.base_lrs]


class PolynomialLR(LRScheduler):
    """lr = base_lr * (1 - epoch / total_iters) ** power, then constant."""

    def __init__(self, optimizer, total_iters=5, power=1.0, last_epoch=-1):
        self.total_iters = total_iters
        self.power = power
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self._is_initial or self.last_epoch > self.total_iters:
            return _group_lrs(self.optimizer)
        factor = ((1.0 - self.last_epoch / self.total_iters)
                  / (1.0 - (self.last_epoch - 1) / self.total_iters)) ** self.power
        return [g["lr"] * factor for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self):
        return [base * (1.0 - min(self.total_iters, self.last_epoch) / self.total_iters) ** self.power
                for base in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    """Cosine annealing from base_lr to eta_min over T_max epochs (torch's recursive form).

    lr_{t} = eta_min + (lr_{t-1} - eta_min) * (1 + cos(pi t / T_max)) / (1 + cos(pi (t-1) / T_max)),
    which equals eta_min + (base_lr - eta_min) * (1 + cos(pi t / T_max)) / 2 while nothing else
    changes the lr; past T_max it rises again (torch's behaviour, no restart).
    """

    def __init__(self, optimizer, T_max, eta_min=0.0, last_epoch=-1):
        self.T_max = T_max
        self.eta_min = eta_min
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        groups = self.optimizer.param_groups
        t, T, lo = self.last_epoch, self.T_max, self.eta_min
        if self._is_initial:
            return _group_lrs(self.optimizer)
        if self._step_count == 1 and t > 0:
            return [lo + (base - lo) * (1 + math.cos(t * math.pi / T)) / 2 for base in self.base_lrs]
        if (t - 1 - T) % (2 * T) == 0:
            return [g["lr"] + (base - lo) * (1 - math.cos(math.pi / T)) / 2
                    for base, g in zip(self.base_lrs, groups)]
        return [(1 + math.cos(math.pi * t / T)) / (1 + math.cos(math.pi * (t - 1) / T)) * (g["lr"] - lo) + lo
                for g in groups]

    def _get_closed_form_lr(self):
        return [self.eta_min + (base - self.eta_min) * (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
                for base in self.base_lrs]


# ---------------------------------------------------------------------- composition
class SequentialLR(LRScheduler):
    """Run `schedulers[i]` between milestones[i-1] and milestones[i]."""

    def __init__(self, optimizer, schedulers, milestones, last_epoch=-1):
        name = type(self).__name__
        if len(schedulers) < 1:
            raise ValueError(f"{name} expects at least one scheduler, but got no scheduler.")
        for i, s in enumerate(schedulers):
            if not hasattr(s, "optimizer"):
                raise TypeError(f"{name} at index {i} should have `optimizer` as its attribute.")
            if s.optimizer is not optimizer:
                raise ValueError(
                    f"{name} expects all schedulers to belong to the same optimizer, but got scheduler "
                    f"{type(s).__name__} at index {i} with a different optimizer"
                )
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(
                "Sequential Schedulers expects number of schedulers provided to be one more than the "
                f"number of milestone points, but got number of schedulers {len(schedulers)} and the "
                f"number of milestones to be equal to {len(milestones)}"
            )
        self._schedulers = list(schedulers)
        self._milestones = list(milestones)
        self.last_epoch = last_epoch + 1
        self.optimizer = optimizer
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"]
        self._undo_steps(self)
        idx = bisect_right(self._milestones, 0)
        self._schedulers[idx]._initial_step()
        self._last_lr = self._schedulers[idx].get_last_lr()

    def _undo_steps(self, sched):
        """Undo the initial step each child scheduler took when it was built."""
        if hasattr(sched, "_schedulers"):
            for s in sched._schedulers:
                self._undo_steps(s)
        elif hasattr(sched, "last_epoch"):
            sched.last_epoch -= 1

    def step(self):
        self.last_epoch += 1
        idx = bisect_right(self._milestones, self.last_epoch)
        scheduler = self._schedulers[idx]
        if idx > 0 and self._milestones[idx - 1] == self.last_epoch:
            scheduler._update_lr(0)
        else:
            scheduler.step()
        self._last_lr = scheduler.get_last_lr()

    def state_dict(self):
        sd = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "_schedulers")}
        sd["_schedulers"] = [s.state_dict() for s in self._schedulers]
        return sd

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        children = state_dict.pop("_schedulers")
        self.__dict__.update(state_dict)
        for s, sd in zip(self._schedulers, children):
            s.load_state_dict(sd)


class OneCycleLR(LRScheduler):
    """The 1cycle policy (Smith & Topin): warm up to max_lr, then anneal to a tiny lr.

    With `cycle_momentum`, momentum (or Adam's beta1) cycles inversely between max_momentum and
    base_momentum.
    """

    def __init__(self, optimizer, max_lr, total_steps=None, epochs=None, steps_per_epoch=None,
                 pct_start=0.3, anneal_strategy="cos", cycle_momentum=True, base_momentum=0.85,
                 max_momentum=0.95, div_factor=25.0, final_div_factor=1e4, three_phase=False,
                 last_epoch=-1):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
        self.optimizer = optimizer
        self.total_steps = self._total_steps(total_steps, epochs, steps_per_epoch)
        if not isinstance(pct_start, float) or not 0 <= pct_start <= 1:
            raise ValueError(f"Expected float between 0 and 1 pct_start, but got {pct_start}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"anneal_strategy must be one of 'cos' or 'linear', instead got {anneal_strategy}")
        self._anneal_func_type = anneal_strategy
        n = self.total_steps
        if three_phase:
            self._schedule_phases = [
                dict(end_step=float(pct_start * n) - 1, start_lr="initial_lr", end_lr="max_lr",
                     start_momentum="max_momentum", end_momentum="base_momentum"),
                dict(end_step=float(2 * pct_start * n) - 2, start_lr="max_lr", end_lr="initial_lr",
                     start_momentum="base_momentum", end_momentum="max_momentum"),
                dict(end_step=n - 1, start_lr="initial_lr", end_lr="min_lr",
                     start_momentum="max_momentum", end_momentum="max_momentum"),
            ]
        else:
            self._schedule_phases = [
                dict(end_step=float(pct_start * n) - 1, start_lr="initial_lr", end_lr="max_lr",
                     start_momentum="max_momentum", end_momentum="base_momentum"),
                dict(end_step=n - 1, start_lr="max_lr", end_lr="min_lr",
                     start_momentum="base_momentum", end_momentum="max_momentum"),
            ]
        max_lrs = self._per_group("max_lr", max_lr)
        if last_epoch == -1:
            for group, mx in zip(optimizer.param_groups, max_lrs):
                group["initial_lr"] = mx / div_factor
                group["max_lr"] = mx
                group["min_lr"] = group["initial_lr"] / final_div_factor
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
                raise ValueError("optimizer must support momentum or beta1 with `cycle_momentum` option enabled")
            self.use_beta1 = "betas" in optimizer.defaults
            max_ms = self._per_group("max_momentum", max_momentum)
            base_ms = self._per_group("base_momentum", base_momentum)
            if last_epoch == -1:
                for mx, bs, group in zip(max_ms, base_ms, optimizer.param_groups):
                    self._set_momentum(group, mx)
                    group["max_momentum"] = mx
                    group["base_momentum"] = bs
        super().__init__(optimizer, last_epoch)

    @staticmethod
    def _total_steps(total_steps, epochs, steps_per_epoch):
        if total_steps is not None:
            if not isinstance(total_steps, int) or total_steps <= 0:
                raise ValueError(f"Expected positive integer total_steps, but got {total_steps}")
            return total_steps
        if epochs is not None and steps_per_epoch is not None:
            if not isinstance(epochs, int) or epochs <= 0:
                raise ValueError(f"Expected positive integer epochs, but got {epochs}")
            if not isinstance(steps_per_epoch, int) or steps_per_epoch <= 0:
                raise ValueError(f"Expected positive integer steps_per_epoch, but got {steps_per_epoch}")
            return epochs * steps_per_epoch
        raise ValueError("You must define either total_steps OR (epochs AND steps_per_epoch)")

    def _per_group(self, name, value):
        n = len(self.optimizer.param_groups)
        if isinstance(value, (list, tuple)):
            if len(value) != n:
                raise ValueError(f"expected {n} values for {name}, got {len(value)}")
            return list(value)
        return [value] * n

    def _set_momentum(self, group, value):
        if self.use_beta1:
            group["betas"] = (value, *group["betas"][1:])
        else:
            group["momentum"] = value

    def _anneal(self, start, end, pct):
        if self._anneal_func_type == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def get_lr(self):
        step = self.last_epoch
        if step > self.total_steps:
            raise ValueError(f"Tried to step {step} times. The specified number of total steps is {self.total_steps}")
        lrs = []
        for group in self.optimizer.param_groups:
            start = 0.0
            for i, phase in enumerate(self._schedule_phases):
                end = phase["end_step"]
                if step <= end or i == len(self._schedule_phases) - 1:
                    pct = (step - start) / (end - start)
                    lr = self._anneal(group[phase["start_lr"]], group[phase["end_lr"]], pct)
                    if self.cycle_momentum:
                        mom = self._anneal(group[phase["start_momentum"]], group[phase["end_momentum"]], pct)
                    break
                start = phase["end_step"]
            lrs.append(lr)
            if self.cycle_momentum:
                self._set_momentum(group, mom)
        return lrs


# torch's old name
_LRScheduler = LRScheduler
