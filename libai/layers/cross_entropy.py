"""`ParallelCrossEntropyLoss`: cross-entropy of vocab-split logits without gathering them.

logits [b, s, V] with sbp [S(0), S(-1)] are viewed as [b * s, V] (still split on the class
axis) and passed to the engine's cross_entropy, whose tensor-parallel rule decomposes it into
global ops: a max and a sum of exp over the local vocab range and the target logit (looked up
only on the rank that holds it), each finished by an all-reduce of b * s numbers. Returns the
per-token loss [b, s] (LiBai's convention; ignored targets give 0) or, with reduction="mean",
the mean over the targets that are not `ignore_index`.
"""
import engine as flow
import engine.nn as nn
import engine.nn.functional as F

from .utils import settle, split_on_dp, to_placement
from libai.utils import distributed as dist

__all__ = ["ParallelCrossEntropyLoss"]

B = flow.sbp.broadcast
S = flow.sbp.split


class ParallelCrossEntropyLoss(nn.Module):
    def __init__(self, ignore_index=-100, reduction="none"):
        super().__init__()
        if reduction not in ("none", "mean", "sum"):
            raise ValueError(f"reduction must be 'none', 'mean' or 'sum', got {reduction!r}")
        self.ignore_index = ignore_index
        self.reduction = reduction

    def forward(self, logits, target):
        if logits.ndim != target.ndim + 1:
            raise ValueError(f"ParallelCrossEntropyLoss: logits {list(logits.shape)} need targets with one dim "
                             f"less, got {list(target.shape)}")
        if tuple(logits.shape[:-1]) != tuple(target.shape):
            raise ValueError(f"ParallelCrossEntropyLoss: logits {list(logits.shape)} and targets "
                             f"{list(target.shape)} disagree")
        lead = tuple(logits.shape[:-1])
        v = logits.shape[-1]
        dp_sbp = S(0) if split_on_dp(lead) else B
        target = to_placement(target, logits.placement, dist.get_nd_sbp([dp_sbp, B]))
        if target.dtype != flow.int64:
            target = target.to(flow.int64)
        n = 1
        for d in lead:
            n *= d
        per = F.cross_entropy(logits.reshape(n, v), target.reshape(n), ignore_index=self.ignore_index,
                              reduction="none")
        per = per.reshape(*lead)
        if self.reduction == "none":
            return per
        total = settle(per.sum())
        if self.reduction == "sum":
            return total
        count = settle((target != self.ignore_index).to(per.dtype).sum())
        return settle(total / count)
