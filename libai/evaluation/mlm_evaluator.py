"""`MLMEvaluator`: BERT pretraining metrics over masked tokens.

Per-batch means would weight a batch with few masked tokens like one with many; this evaluator
counts tokens: perplexity is exp(total masked-LM loss / masked tokens), accuracy the share of
masked tokens whose arg-max prediction is the original token. The arg-max is taken on the model's
(global, vocab-split) scores, so only [batch, seq] ids leave the tensor-parallel ranks."""
import math
from collections import OrderedDict

import numpy as np

from libai.utils import distributed as dist

from .cls_evaluator import to_numpy
from .evaluator import DatasetEvaluator

__all__ = ["MLMEvaluator"]


class MLMEvaluator(DatasetEvaluator):
    """Reads outputs["prediction_scores"] [b, s, vocab], outputs["lm_loss"] (the mean over the
    batch's masked tokens) and inputs["lm_labels"] / inputs["loss_mask"]; with a binary head
    also outputs["seq_relationship_score"] and inputs["ns_labels"]. Results: {"MLM_Acc",
    "MLM_PPL"} (+ "SOP_Acc"), accuracies in percent. The exponent is capped at 20, as
    PPLEvaluator's."""

    def reset(self):
        self._counts = np.zeros(5, dtype=np.float64)  # masked, correct, loss sum, binary seen, binary correct

    def process(self, inputs, outputs):
        mask = to_numpy(inputs["loss_mask"]).astype(bool)
        labels = to_numpy(inputs["lm_labels"])
        predicted = to_numpy(outputs["prediction_scores"].argmax(dim=-1))
        n = float(mask.sum())
        loss = float(to_numpy(outputs["lm_loss"])) if "lm_loss" in outputs else float("nan")
        self._counts[:3] += (n, float((predicted == labels)[mask].sum()), loss * n)
        if "seq_relationship_score" in outputs and "ns_labels" in inputs:
            ns = to_numpy(inputs["ns_labels"]).reshape(-1)
            guess = to_numpy(outputs["seq_relationship_score"]).argmax(-1).reshape(-1)
            self._counts[3:] += (ns.size, float((guess == ns).sum()))

    def evaluate(self):
        masked, correct, loss_sum, seen, hits = dist.all_reduce_sum_numpy(self._counts)
        results = OrderedDict()
        results["MLM_Acc"] = 100.0 * correct / masked if masked else 0.0
        results["MLM_PPL"] = math.exp(min(20.0, loss_sum / masked)) if masked else float("nan")
        if seen:
            results["SOP_Acc"] = 100.0 * hits / seen
        return results
