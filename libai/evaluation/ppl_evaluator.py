import math
from collections import OrderedDict

import numpy as np

from libai.utils import distributed as dist

from .evaluator import DatasetEvaluator

__all__ = ["PPLEvaluator"]


class PPLEvaluator(DatasetEvaluator):
    """Perplexity exp(mean loss) from the model's loss output(s).

    `process` reads the scalar loss `outputs[key]` for each key in `loss_keys` (default: every
    key containing "loss"); per-batch losses are weighted by the batch size: the leading
    dimension of inputs[weight_key], or without a weight_key of the first input tensor (the
    whole batch's, for global tensors). So the result is the mean over samples whatever the
    batches are, and the same for every data-parallel size (whose last batches are smaller;
    an equal weight per batch made the PPL depend on it). Results: {"PPL": ...} for a single loss
    key, {"<key>_PPL": ...} for several. The exponent is capped at 20 (as LiBai) to stay finite."""

    def __init__(self, loss_keys=None, weight_key=None):
        self.loss_keys = list(loss_keys) if loss_keys else None
        self.weight_key = weight_key
        self.reset()

    def reset(self):
        self._sums = {}
        self._weight = 0.0

    def process(self, inputs, outputs):
        keys = self.loss_keys or [k for k in outputs if "loss" in k]
        if not keys:
            raise KeyError(f"PPLEvaluator: no loss in the model's outputs (keys {sorted(outputs)})")
        weight = 1.0
        if self.weight_key is not None and self.weight_key in inputs:
            weight = float(inputs[self.weight_key].shape[0])
        elif self.weight_key is None:
            batch = next((v for v in inputs.values() if getattr(v, "ndim", 0) >= 1), None)
            if batch is not None:
                weight = float(batch.shape[0])
        for k in keys:
            v = outputs[k]
            v = float(v.item() if hasattr(v, "item") else v)
            self._sums[k] = self._sums.get(k, 0.0) + v * weight
        self._weight += weight

    def evaluate(self):
        # ranks that saw no batch (the stages before the last in a pipeline) know no loss names
        keys = sorted(set().union(*dist.all_gather_object(sorted(self._sums))))
        sums = [self._sums.get(k, 0.0) for k in keys]
        vec = dist.all_reduce_sum_numpy(np.asarray(sums + [self._weight], dtype=np.float64))
        weight = vec[-1]
        results = OrderedDict()
        for k, s in zip(keys, vec[:-1]):
            mean = s / weight if weight else float("nan")
            name = "PPL" if len(keys) == 1 else f"{k}_PPL"
            results[name] = math.exp(min(20.0, mean))
        return results
