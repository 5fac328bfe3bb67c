from collections import OrderedDict

import numpy as np

from libai.utils import distributed as dist

from .evaluator import DatasetEvaluator

__all__ = ["ClsEvaluator", "accuracy", "f1_from_counts", "to_numpy"]


def to_numpy(x):
    """An engine tensor (on any device) or array-like as a numpy array."""
    if hasattr(x, "numpy"):
        if getattr(getattr(x, "device", None), "type", "cpu") != "cpu":
            x = x.cpu()
        return x.numpy()
    return np.asarray(x)


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


def f1_from_counts(tp, fp, fn, average):
    """F1 in percent from per-class counts: "binary" is the F1 of class 1 (the positive class);
    "macro" averages the classes that occur in the labels or the predictions (as scikit-learn,
    which leaves out classes with no sample and no prediction). An empty class has F1 0."""
    tp, fp, fn = (np.asarray(a, dtype=np.float64) for a in (tp, fp, fn))
    denom = 2 * tp + fp + fn
    f1 = np.divide(2 * tp, denom, out=np.zeros_like(tp), where=denom > 0)
    if average == "binary":
        return 100.0 * float(f1[1]) if len(f1) > 1 else 0.0
    seen = denom > 0
    return 100.0 * float(f1[seen].mean()) if seen.any() else 0.0


class ClsEvaluator(DatasetEvaluator):
    """Top-k accuracy (in percent, as LiBai) of outputs["prediction_scores"] against
    inputs["labels"]; counts are summed over data-parallel ranks. Results: {"Acc@k": ...}, and
    with `f1` ("binary": F1 of class 1, as GLUE reports for MRPC/QQP; "macro": the mean over
    classes) also {"F1": ...}, from the argmax prediction (ties to the lower class)."""

    def __init__(self, topk=(1, 5), f1=None):
        if f1 not in (None, "binary", "macro"):
            raise ValueError(f"ClsEvaluator: f1 must be None, 'binary' or 'macro', got {f1!r}")
        self.topk = tuple(int(k) for k in topk)
        self.f1 = f1
        self.reset()

    def reset(self):
        self._correct = np.zeros(len(self.topk), dtype=np.int64)
        self._total = 0
        self._counts = np.zeros((3, 0), dtype=np.int64)  # per-class tp, fp, fn; grows with the classes seen

    def process(self, inputs, outputs):
        scores = to_numpy(outputs["prediction_scores"])
        labels = to_numpy(inputs["labels"])
        self._correct += np.asarray(accuracy(scores, labels, self.topk), dtype=np.int64)
        self._total += int(labels.reshape(-1).shape[0])
        if self.f1 is not None:
            self._add_f1_counts(scores, labels.reshape(-1).astype(np.int64))

    def _add_f1_counts(self, scores, labels):
        num_classes = scores.shape[-1]
        if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
            raise ValueError(f"ClsEvaluator: labels must be in [0, {num_classes}) for F1, got "
                             f"{int(labels.min())}..{int(labels.max())}")
        pred = np.argmax(scores.reshape(-1, num_classes), axis=-1)
        hit = pred == labels
        tp = np.bincount(labels[hit], minlength=num_classes)
        fp = np.bincount(pred[~hit], minlength=num_classes)
        fn = np.bincount(labels[~hit], minlength=num_classes)
        self._counts = _pad_classes(self._counts, num_classes) + np.stack([tp, fp, fn])

    def evaluate(self):
        counts = dist.all_reduce_sum_numpy(np.concatenate([self._correct, [self._total]]).astype(np.int64))
        total = int(counts[-1])
        results = OrderedDict()
        for k, correct in zip(self.topk, counts[:-1]):
            results[f"Acc@{k}"] = 100.0 * float(correct) / total if total else 0.0
        if self.f1 is not None:
            # a rank may have seen no batch: agree on the number of classes before summing
            f1_counts = _pad_classes(self._counts, dist.max_over_ranks(self._counts.shape[1]))
            tp, fp, fn = dist.all_reduce_sum_numpy(f1_counts)
            results["F1"] = f1_from_counts(tp, fp, fn, self.f1)
        return results


def _pad_classes(counts, num_classes):
    if counts.shape[1] >= num_classes:
        return counts
    return np.pad(counts, ((0, 0), (0, num_classes - counts.shape[1])))
