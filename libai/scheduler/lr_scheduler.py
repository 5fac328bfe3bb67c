"""Learning-rate schedules with warmup, as LiBai's `libai.scheduler` (OneFlow's WarmupLR).

Every schedule is an `engine.optim.lr_scheduler.LRScheduler` whose lr at step t (t = 0, 1, ...:
the number of `step()` calls after construction; LiBai's LRScheduler hook steps once per
iteration, so iteration t trains with lr(t)) is a closed form of t:

    t <  warmup_iter:  lr = base_lr * w(t)
                       w(t) = warmup_factor + (1 - warmup_factor) * t / warmup_iter  (linear)
                       w(t) = warmup_factor                                          (constant)
    t >= warmup_iter:  lr = the decay schedule at step t (not shifted by the warmup)

with the decay schedules

    WarmupCosineLR       base * ((1 - alpha) * (1 + cos(pi * min(t, max_iter) / max_iter)) / 2 + alpha)
    WarmupCosineAnnealingLR  eta_min + (base - eta_min) * (1 + cos(pi * min(t, max_iter) / max_iter)) / 2
    WarmupMultiStepLR    base * gamma ** bisect_right(milestones, t)
    WarmupStepLR         base * gamma ** floor(t / step_size)
    WarmupExponentialLR  base * gamma ** t
    WarmupPolynomialLR   (base - end) * (1 - min(t, max_iter) / max_iter) ** power + end
                         (cycle=True: max_iter is rounded up to a multiple covering t)

`warmup_iter` is set by the trainer to int(train.warmup_ratio * train.train_iter) and `max_iter`
to train.train_iter. With warmup_iter = 0 the decay schedule applies from the start. Being
closed forms of `last_epoch`, the schedules resume exactly from their state_dict.
"""
import logging
import math
from bisect import bisect_right

from engine.optim.lr_scheduler import LRScheduler

__all__ = ["WarmupLRScheduler", "WarmupCosineLR", "WarmupCosineAnnealingLR", "WarmupMultiStepLR",
           "WarmupStepLR", "WarmupExponentialLR", "WarmupPolynomialLR", "warmup_factor_at_iter"]

logger = logging.getLogger(__name__)


def warmup_factor_at_iter(method, t, warmup_iter, warmup_factor):
    """The warmup multiplier w(t) for t < warmup_iter (1.0 afterwards)."""
    if t >= warmup_iter:
        return 1.0
    if method == "constant":
        return warmup_factor
    if method == "linear":
        alpha = t / warmup_iter
        return warmup_factor * (1.0 - alpha) + alpha
    raise ValueError(f"Unknown warmup method: {method!r} (use 'linear' or 'constant')")


class WarmupLRScheduler(LRScheduler):
    """Base: warmup then `decay_lr(base_lr, t)`; subclasses implement `decay_lr`."""

    def __init__(self, optimizer, max_iter, warmup_factor=0.001, warmup_iter=0, warmup_method="linear",
                 last_epoch=-1):
        if warmup_method not in ("linear", "constant"):
            raise ValueError(f"Unknown warmup method: {warmup_method!r} (use 'linear' or 'constant')")
        self.max_iter = int(max_iter)
        self.warmup_factor = float(warmup_factor)
        self.warmup_iter = int(warmup_iter)
        self.warmup_method = warmup_method
        if self.warmup_iter < 0:
            raise ValueError(f"warmup_iter must be >= 0, got {warmup_iter}")
        if self.warmup_iter == 0:
            logger.debug(f"{type(self).__name__}: warmup iters equals to zero, no warmup")
        elif self.max_iter and self.warmup_iter > self.max_iter:
            logger.warning(f"{type(self).__name__}: warmup iters ({self.warmup_iter}) is larger than "
                           f"the total training iters ({self.max_iter})")
        super().__init__(optimizer, last_epoch)

    def decay_lr(self, base_lr, t):
        raise NotImplementedError

    def lr_at(self, base_lr, t):
        if t < self.warmup_iter:
            return base_lr * warmup_factor_at_iter(self.warmup_method, t, self.warmup_iter, self.warmup_factor)
        return self.decay_lr(base_lr, t)

    def get_lr(self):
        return [self.lr_at(base, self.last_epoch) for base in self.base_lrs]

    _get_closed_form_lr = get_lr


class WarmupCosineLR(WarmupLRScheduler):
    def __init__(self, optimizer, max_iter, warmup_factor=0.001, warmup_iter=0, alpha=0.0,
                 warmup_method="linear", last_epoch=-1):
        self.alpha = float(alpha)
        super().__init__(optimizer, max_iter, warmup_factor, warmup_iter, warmup_method, last_epoch)

    def decay_lr(self, base_lr, t):
        if self.max_iter <= 0:
            return base_lr
        t = min(t, self.max_iter)
        cosine = 0.5 * (1.0 + math.cos(math.pi * t / self.max_iter))
        return base_lr * ((1.0 - self.alpha) * cosine + self.alpha)


class WarmupCosineAnnealingLR(WarmupLRScheduler):
    def __init__(self, optimizer, max_iter, warmup_factor=0.001, warmup_iter=0, eta_min=0.0,
                 warmup_method="linear", last_epoch=-1):
        self.eta_min = float(eta_min)
        super().__init__(optimizer, max_iter, warmup_factor, warmup_iter, warmup_method, last_epoch)

    def decay_lr(self, base_lr, t):
        if self.max_iter <= 0:
            return base_lr
        t = min(t, self.max_iter)
        return self.eta_min + (base_lr - self.eta_min) * 0.5 * (1.0 + math.cos(math.pi * t / self.max_iter))


class WarmupMultiStepLR(WarmupLRScheduler):
    def __init__(self, optimizer, max_iter, milestones, warmup_factor=0.001, warmup_iter=0, gamma=0.1,
                 warmup_method="linear", last_epoch=-1):
        milestones = [int(m) for m in milestones]
        if milestones != sorted(milestones):
            raise ValueError(f"milestones should be a list of increasing integers, got {milestones}")
        self.milestones = milestones
        self.gamma = float(gamma)
        super().__init__(optimizer, max_iter, warmup_factor, warmup_iter, warmup_method, last_epoch)

    def decay_lr(self, base_lr, t):
        return base_lr * self.gamma ** bisect_right(self.milestones, t)


class WarmupStepLR(WarmupLRScheduler):
    """Step decay every `step_size` iterations. As LiBai, `train_epoch` (when given, > 0) means
    `step_size` counts epochs: it is rescaled to step_size / train_epoch * max_iter iterations."""

    def __init__(self, optimizer, max_iter, step_size, warmup_factor=0.001, warmup_iter=0, gamma=0.1,
                 warmup_method="linear", train_epoch=None, last_epoch=-1):
        if train_epoch:
            step_size = step_size / train_epoch * max_iter
        if step_size <= 0:
            raise ValueError(f"step_size must be positive, got {step_size}")
        self.step_size = step_size
        self.gamma = float(gamma)
        super().__init__(optimizer, max_iter, warmup_factor, warmup_iter, warmup_method, last_epoch)

    def decay_lr(self, base_lr, t):
        return base_lr * self.gamma ** math.floor(t / self.step_size)


class WarmupExponentialLR(WarmupLRScheduler):
    def __init__(self, optimizer, max_iter, gamma, warmup_factor=0.001, warmup_iter=0,
                 warmup_method="linear", last_epoch=-1):
        self.gamma = float(gamma)
        super().__init__(optimizer, max_iter, warmup_factor, warmup_iter, warmup_method, last_epoch)

    def decay_lr(self, base_lr, t):
        return base_lr * self.gamma ** t


class WarmupPolynomialLR(WarmupLRScheduler):
    def __init__(self, optimizer, max_iter, warmup_factor=0.001, warmup_iter=0, end_learning_rate=0.0001,
                 power=1.0, cycle=False, warmup_method="linear", last_epoch=-1):
        self.end_learning_rate = float(end_learning_rate)
        self.power = float(power)
        self.cycle = bool(cycle)
        super().__init__(optimizer, max_iter, warmup_factor, warmup_iter, warmup_method, last_epoch)

    def decay_lr(self, base_lr, t):
        if self.max_iter <= 0:
            return base_lr
        decay_steps = self.max_iter
        if self.cycle:
            decay_steps = self.max_iter * max(1, math.ceil(t / self.max_iter))
        else:
            t = min(t, self.max_iter)
        return (base_lr - self.end_learning_rate) * (1.0 - t / decay_steps) ** self.power + self.end_learning_rate
