"""Learning-rate schedules with warmup (see lr_scheduler.py for the closed forms)."""
from .build import build_lr_scheduler
from .lr_scheduler import (
    WarmupCosineAnnealingLR, WarmupCosineLR, WarmupExponentialLR, WarmupLRScheduler, WarmupMultiStepLR,
    WarmupPolynomialLR, WarmupStepLR, warmup_factor_at_iter,
)

__all__ = ["build_lr_scheduler", "WarmupLRScheduler", "WarmupCosineLR", "WarmupCosineAnnealingLR",
           "WarmupMultiStepLR", "WarmupStepLR", "WarmupExponentialLR", "WarmupPolynomialLR",
           "warmup_factor_at_iter"]
