"""ClsEvaluator (accuracy + F1) and RegEvaluator on one fixed data set, split over the ranks
unevenly (the last rank may get no batch at all); rank 0 prints each result as a JSON line.
Run it in one process and under mpiexec: the results must agree."""
import json

import numpy as np

from libai.evaluation import ClsEvaluator, RegEvaluator
from libai.utils import distributed as dist

rng = np.random.default_rng(0)
N, C = 23, 4
scores = rng.normal(size=(N, C)).astype(np.float32)
labels = rng.integers(0, C, size=N)
labels[:5] = np.argmax(scores[:5], axis=1)  # some hits
bin_scores, bin_labels = rng.normal(size=(N, 2)).astype(np.float32), rng.integers(0, 2, size=N)
preds = np.round(rng.normal(size=N), 1)  # rounded: ties for Spearman
gold = np.round(preds + rng.normal(scale=0.8, size=N), 0)


def rank_rows(empty_last):
    """This rank's rows: all in one process; on 2 ranks 15 + 8, or 23 + 0 with `empty_last`."""
    world, rank = dist.get_world_size(), dist.get_rank()
    assert world in (1, 2), world
    cut = N if (empty_last or world == 1) else 15
    return np.arange(N)[:cut] if rank == 0 else np.arange(N)[cut:]


def run(evaluator, inputs_of, empty_last):
    evaluator.reset()
    rows = rank_rows(empty_last)
    for batch in (rows[:5], rows[5:]):  # two uneven batches (either may be empty)
        if batch.size:
            evaluator.process(*inputs_of(batch))
    return evaluator.evaluate()


for empty_last in (False, True):
    results = {
        "macro": run(ClsEvaluator(topk=(1, 2, 9), f1="macro"),
                     lambda b: ({"labels": labels[b]}, {"prediction_scores": scores[b]}), empty_last),
        "binary": run(ClsEvaluator(topk=(1,), f1="binary"),
                      lambda b: ({"labels": bin_labels[b]}, {"prediction_scores": bin_scores[b]}), empty_last),
        "reg": run(RegEvaluator(), lambda b: ({"labels": gold[b]}, {"prediction_scores": preds[b][:, None]}),
                   empty_last),
    }
    if dist.is_main_process():
        print("RESULT", json.dumps({"empty_last": empty_last, "world": dist.get_world_size(), **results}), flush=True)
