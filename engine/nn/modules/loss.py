"""Loss modules: hold the options (class weights as buffers, like torch) and call the functional loss."""
from .. import functional as F
from ..module import Module

__all__ = ["CrossEntropyLoss", "NLLLoss", "MSELoss", "L1Loss", "BCEWithLogitsLoss"]

_REDUCTIONS = ("none", "mean", "sum")


class _Loss(Module):
    def __init__(self, reduction="mean"):
        super().__init__()
        if reduction not in _REDUCTIONS:
            raise ValueError(f"{reduction} is not a valid value for reduction")
        self.reduction = reduction


class _WeightedLoss(_Loss):
    def __init__(self, weight=None, reduction="mean"):
        super().__init__(reduction)
        self.register_buffer("weight", weight)


class CrossEntropyLoss(_WeightedLoss):
    """Cross entropy between logits (N, C, ...) and class indices (N, ...) or class probabilities."""

    def __init__(self, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
        super().__init__(weight, reduction)
        self.ignore_index = ignore_index
        self.label_smoothing = label_smoothing

    def forward(self, input, target):
        return F.cross_entropy(input, target, weight=self.weight, ignore_index=self.ignore_index,
                               reduction=self.reduction, label_smoothing=self.label_smoothing)


class NLLLoss(_WeightedLoss):
    """Negative log likelihood of log-probabilities (N, C, ...) at class indices (N, ...)."""

    def __init__(self, weight=None, ignore_index=-100, reduction="mean"):
        super().__init__(weight, reduction)
        self.ignore_index = ignore_index

    def forward(self, input, target):
        return F.nll_loss(input, target, weight=self.weight, ignore_index=self.ignore_index,
                          reduction=self.reduction)


class MSELoss(_Loss):
    def forward(self, input, target):
        return F.mse_loss(input, target, reduction=self.reduction)


class L1Loss(_Loss):
    def forward(self, input, target):
        return F.l1_loss(input, target, reduction=self.reduction)


class BCEWithLogitsLoss(_Loss):
    """Binary cross entropy on logits (numerically stable sigmoid + BCE)."""

    def __init__(self, weight=None, reduction="mean", pos_weight=None):
        super().__init__(reduction)
        self.register_buffer("weight", weight)
        self.register_buffer("pos_weight", pos_weight)

    def forward(self, input, target):
        return F.binary_cross_entropy_with_logits(input, target, weight=self.weight, reduction=self.reduction,
                                                  pos_weight=self.pos_weight)
