"""Evaluators and `inference_on_dataset` (as detectron2/LiBai)."""
import contextlib
import datetime
import logging
import time
from collections import OrderedDict, abc
from contextlib import contextmanager

import engine as flow
from libai.utils import distributed as dist

__all__ = ["DatasetEvaluator", "DatasetEvaluators", "inference_on_dataset", "inference_context",
           "EvaluationInterrupted"]


class EvaluationInterrupted(Exception):
    """`inference_on_dataset` stopped before its last batch because `should_stop()` said so."""


class DatasetEvaluator:
    """Base class: `reset()` before a pass, `process(inputs, outputs)` per batch, `evaluate()`
    at the end, returning {metric name: value} (reduced over data-parallel ranks)."""

    def reset(self):
        pass

    def process(self, inputs, outputs):
        pass

    def evaluate(self):
        pass


class DatasetEvaluators(DatasetEvaluator):
    """Several evaluators run together; their results are merged (keys must not clash)."""

    def __init__(self, evaluators):
        super().__init__()
        self._evaluators = list(evaluators)

    def reset(self):
        for e in self._evaluators:
            e.reset()

    def process(self, inputs, outputs):
        for e in self._evaluators:
            e.process(inputs, outputs)

    def evaluate(self):
        results = OrderedDict()
        for e in self._evaluators:
            result = e.evaluate()
            if dist.is_main_process() and result is not None:
                for k, v in result.items():
                    if k in results:
                        raise KeyError(f"Different evaluators produce results with the same key {k}")
                    results[k] = v
        return results


@contextmanager
def inference_context(model):
    """model.eval() inside, the previous training mode restored afterwards."""
    training_mode = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(training_mode)


def _default_get_batch(batch):
    return batch


def inference_on_dataset(model, data_loader, evaluator, eval_iter=None, get_batch=None, batch_size=None,
                         should_stop=None, forward=None, autocast=None):
    """Run `model` over `data_loader` (at most `eval_iter` batches; None or <= 0: all) in eval
    mode without autograd, feeding `evaluator`; returns `evaluator.evaluate()`.

    `get_batch(batch)` maps a loader batch to the model's keyword arguments (default: as is).
    `should_stop()`, asked before each batch after the first (on every rank: it may be a
    collective, e.g. the trainer's `stop_requested`), ends the evaluation early with
    EvaluationInterrupted. A tqdm bar shows progress on rank 0 only.

    `forward(batch) -> (inputs, outputs)` replaces `get_batch` and the model call (a pipeline:
    libai.engine.pipeline.PipelineRunner.forward_only); outputs None (a rank of a stage other
    than the last) skips the evaluator on that rank. `autocast` (a context factory, the
    trainer's mixed precision) wraps the model call."""
    logger = logging.getLogger(__name__)
    get_batch = get_batch or _default_get_batch
    if evaluator is None:
        evaluator = DatasetEvaluators([])
    if isinstance(evaluator, abc.MutableSequence):
        evaluator = DatasetEvaluators(evaluator)
    try:
        total = len(data_loader)
    except TypeError:
        total = None
    if eval_iter is not None and eval_iter > 0:
        total = eval_iter if total is None else min(total, eval_iter)
    logger.info(f"Start inference on {total if total is not None else 'all'} batches")
    evaluator.reset()
    start = time.perf_counter()
    n_done = 0
    with inference_context(model), flow.no_grad():
        from tqdm import tqdm  # imported here: ~50 ms at every process's start otherwise

        bar = tqdm(total=total, desc="eval", disable=not dist.is_main_process(), leave=False,
                   dynamic_ncols=True, mininterval=1.0)
        for idx, batch in enumerate(data_loader):
            if total is not None and idx >= total:
                break
            if idx and should_stop is not None and should_stop():
                bar.close()
                raise EvaluationInterrupted(f"evaluation stopped after {idx} of {total or 'all'} batches")
            if forward is not None:
                inputs, outputs = forward(batch)
            else:
                inputs = get_batch(batch)
                with autocast() if autocast is not None else contextlib.nullcontext():
                    outputs = model(**inputs)
            if outputs is not None:
                evaluator.process(inputs, outputs)
            n_done += 1
            bar.update(1)
        bar.close()
    elapsed = time.perf_counter() - start
    logger.info(f"Total inference time: {datetime.timedelta(seconds=int(elapsed))} "
                f"({elapsed / max(n_done, 1):.6f} s / batch, {n_done} batches)")
    results = evaluator.evaluate()
    # an evaluator may return None on non-main processes
    return {} if results is None else results
