from collections import OrderedDict

import numpy as np

import engine.distributed as _edist
from libai.utils import distributed as dist

from .cls_evaluator import to_numpy
from .evaluator import DatasetEvaluator

__all__ = ["RegEvaluator", "pearson", "spearman", "rankdata"]


def pearson(x, y):
    """Pearson's correlation coefficient (nan when either side is constant or n < 2)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.size < 2:
        return float("nan")
    xm, ym = x - x.mean(), y - y.mean()
    denom = np.sqrt((xm * xm).sum() * (ym * ym).sum())
    if denom == 0:
        return float("nan")
    return float(np.clip((xm * ym).sum() / denom, -1.0, 1.0))


def rankdata(x):
    """1-based ranks of `x`, tied values getting the average of their ranks."""
    x = np.asarray(x).reshape(-1)
    order = np.argsort(x, kind="stable")
    xs = x[order]
    new = np.r_[True, xs[1:] != xs[:-1]]
    starts = np.flatnonzero(new)
    ends = np.r_[starts[1:], x.size]
    ranks = np.empty(x.size, dtype=np.float64)
    ranks[order] = ((starts + ends + 1) / 2.0)[np.cumsum(new) - 1]
    return ranks


def spearman(x, y):
    """Spearman's rank correlation: Pearson's on the (tie-averaged) ranks."""
    return pearson(rankdata(x), rankdata(y))


def _all_gather(array):
    """Every rank's 1-D float64 `array`, concatenated in rank order (lengths may differ)."""
    if dist.get_world_size() == 1:
        return array
    return np.asarray(_edist.all_gather(np.ascontiguousarray(array, dtype=np.float64)))


class RegEvaluator(DatasetEvaluator):
    """Pearson and Spearman correlation (in percent, as GLUE reports STS-B) between
    outputs["prediction_scores"] ([batch] or [batch, 1]) and inputs["labels"].

    Correlations do not decompose into per-rank sums, so `evaluate` gathers every rank's
    predictions and labels. Both coefficients are unchanged when the whole set is repeated, so a
    batch that every rank holds whole (a global tensor's value) gives the same result as one
    split over the ranks. Results: {"Pearson": ..., "Spearman": ...}."""

    def __init__(self):
        self.reset()

    def reset(self):
        self._preds, self._labels = [], []

    def process(self, inputs, outputs):
        preds = to_numpy(outputs["prediction_scores"]).astype(np.float64)
        labels = to_numpy(inputs["labels"]).astype(np.float64).reshape(-1)
        if preds.ndim > 2 or (preds.ndim == 2 and preds.shape[1] != 1):
            raise ValueError(f"RegEvaluator: prediction_scores must have shape [batch] or [batch, 1], "
                             f"got {tuple(preds.shape)}")
        preds = preds.reshape(-1)
        if preds.shape != labels.shape:
            raise ValueError(f"RegEvaluator: {preds.size} predictions but {labels.size} labels")
        self._preds.append(preds)
        self._labels.append(labels)

    def evaluate(self):
        preds = _all_gather(np.concatenate(self._preds) if self._preds else np.zeros(0))
        labels = _all_gather(np.concatenate(self._labels) if self._labels else np.zeros(0))
        return OrderedDict([("Pearson", 100.0 * pearson(preds, labels)),
                            ("Spearman", 100.0 * spearman(preds, labels))])
