from collections import OrderedDict

import numpy as np

from libai.utils import distributed as dist

from .evaluator import DatasetEvaluator

__all__ = ["ClsEvaluator", "accuracy"]


def accuracy(scores, labels, topk=(1,)):
    """Number of samples whose label is among the top-k scores, per k (numpy)."""
    scores = np.asarray(scores)
    labels = np.asarray(labels).reshape(-1)
    num_classes = scores.shape[-1]
    maxk = min(max(topk), num_classes)
    # stable ordering: highest score first, ties to the lower class index
    order = np.argsort(-scores, axis=-1, kind="stable")[:, :maxk]
    hit = order == labels[:, None]
    return [int(hit[:, :min(k, num_classes)].any(axis=1).sum()) for k in topk]


class ClsEvaluator(DatasetEvaluator):
    """Top-k accuracy (in percent, as LiBai) of outputs["prediction_scores"] against
    inputs["labels"]; counts are summed over data-parallel ranks. Results: {"Acc@k": ...}."""

    def __init__(self, topk=(1, 5)):
        self.topk = tuple(int(k) for k in topk)
        self.reset()

    def reset(self):
        self._correct = np.zeros(len(self.topk), dtype=np.int64)
        self._total = 0

    def process(self, inputs, outputs):
        scores = outputs["prediction_scores"]
        labels = inputs["labels"]
        scores = scores.numpy() if hasattr(scores, "numpy") else np.asarray(scores)
        labels = labels.numpy() if hasattr(labels, "numpy") else np.asarray(labels)
        self._correct += np.asarray(accuracy(scores, labels, self.topk), dtype=np.int64)
        self._total += int(labels.reshape(-1).shape[0])

    def evaluate(self):
        counts = dist.all_reduce_sum_numpy(np.concatenate([self._correct, [self._total]]).astype(np.int64))
        total = int(counts[-1])
        results = OrderedDict()
        for k, correct in zip(self.topk, counts[:-1]):
            results[f"Acc@{k}"] = 100.0 * float(correct) / total if total else 0.0
        return results
