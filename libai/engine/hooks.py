"""Default hooks (detectron2/LiBai). DefaultTrainer registers, in this order:

    IterationTimer, LRScheduler, EvalHook, BestCheckpointer, PeriodicWriter, PeriodicCheckpointer

so each iteration's after_step: records the step time, records the lr and steps the scheduler,
evaluates, keeps the best model, writes the logs (with that iteration's evaluation results),
and last checkpoints. Checkpointing last makes a checkpoint of iteration k describe everything
iteration k did: the best value of its evaluation is in its trainer state, and metrics.json
already holds every record up to k, so a run killed at any point and resumed from its newest
checkpoint rewrites exactly the records after k (detectron2 writes logs last instead).

Hooks reach the trainer only through its public attributes (iter, start_iter, max_iter,
storage, failed, ...). A hook's own state goes through state_dict()/load_state_dict(): of
these hooks only BestCheckpointer has one (the scheduler is a checkpointable of its own).
"""
import datetime
import logging
import math
import time

from libai.evaluation import EvaluationInterrupted
from libai.evaluation.utils import flatten_results_dict
from libai.utils import distributed as dist
from libai.utils.checkpoint import PeriodicCheckpointer as _PeriodicCheckpointer
from libai.utils.events import EventWriter

from .trainer import HookBase

__all__ = ["CallbackHook", "IterationTimer", "LRScheduler", "PeriodicCheckpointer", "EvalHook", "BestCheckpointer",
           "PeriodicWriter"]


class CallbackHook(HookBase):
    """A hook from callables `f(trainer)`."""

    def __init__(self, *, before_train=None, after_train=None, before_step=None, after_step=None):
        self._before_train, self._after_train = before_train, after_train
        self._before_step, self._after_step = before_step, after_step

    def before_train(self):
        if self._before_train:
            self._before_train(self.trainer)

    def after_train(self):
        if self._after_train:
            self._after_train(self.trainer)

    def before_step(self):
        if self._before_step:
            self._before_step(self.trainer)

    def after_step(self):
        if self._after_step:
            self._after_step(self.trainer)


class IterationTimer(HookBase):
    """Puts `time` (seconds of the iteration: the other hooks' before_step + run_step) into the
    storage every iteration from `warmup_iter` on, and logs the total training time at the end.
    Register it first."""

    def __init__(self, warmup_iter=0):
        self._warmup_iter = warmup_iter
        self._step_start = None
        self._start_time = None
        self._step_time_sum = 0.0

    def before_train(self):
        self._start_time = time.perf_counter()

    def after_train(self):
        logger = logging.getLogger(__name__)
        total_time = time.perf_counter() - self._start_time
        num_iter = self.trainer.iter - self.trainer.start_iter
        if num_iter > 0:
            logger.info(
                "Overall training speed: {} iterations in {} ({:.4f} s / it)".format(
                    num_iter, str(datetime.timedelta(seconds=int(self._step_time_sum))),
                    self._step_time_sum / num_iter))
        logger.info("Total training time: {} ({} on hooks)".format(
            str(datetime.timedelta(seconds=int(total_time))),
            str(datetime.timedelta(seconds=int(max(total_time - self._step_time_sum, 0))))))

    def before_step(self):
        self._step_start = time.perf_counter()

    def after_step(self):
        sec = time.perf_counter() - self._step_start
        self._step_time_sum += sec
        iter_done = self.trainer.storage.iter - self.trainer.start_iter + 1
        if iter_done > self._warmup_iter:
            self.trainer.storage.put_scalars(time=sec)


class LRScheduler(HookBase):
    """Records the lr of this iteration (`lr`, of the param group with the most parameters)
    and steps the scheduler once per iteration. The hook has no state of its own: the
    scheduler's is checkpointed beside the optimizer's (the `lr_scheduler` checkpointable of
    DefaultTrainer), once."""

    def __init__(self, optimizer=None, scheduler=None):
        self._optimizer = optimizer
        self._scheduler = scheduler

    def before_train(self):
        self._optimizer = self._optimizer or self.trainer.optimizer
        self._scheduler = self._scheduler or self.trainer.lr_scheduler
        largest = max(len(g["params"]) for g in self._optimizer.param_groups)
        self._best_param_group_id = next(
            i for i, g in enumerate(self._optimizer.param_groups) if len(g["params"]) == largest)

    def after_step(self):
        lr = self._optimizer.param_groups[self._best_param_group_id]["lr"]
        self.trainer.storage.put_scalar("lr", lr, smoothing_hint=False)
        self._scheduler.step()


class PeriodicCheckpointer(HookBase):
    """Saves `model_{iter:07d}` every `period` iterations (keeping at most `max_to_keep`) and
    `model_final` after the last iteration. `period <= 0` saves nothing. When a run stops
    early (`stop_iter`, SIGINT/SIGTERM) a checkpoint of the last finished iteration is written
    so that `--resume` continues from there (not after an exception: the state may be broken).

    Pruning counts the periodic checkpoints already in the directory only when the run was
    resumed (start_iter > 0): they are this run's. A run that starts at iteration 0 prunes
    only what it wrote itself."""

    def __init__(self, checkpointer, period, max_to_keep=None, file_prefix="model"):
        self.checkpointer = checkpointer
        self.period = int(period)
        self.max_to_keep = max_to_keep
        self.file_prefix = file_prefix
        self._core = None

    def before_train(self):
        self._core = _PeriodicCheckpointer(self.checkpointer, self.period, max_iter=self.trainer.max_iter,
                                           max_to_keep=self.max_to_keep, file_prefix=self.file_prefix,
                                           adopt_existing=self.trainer.start_iter > 0)

    def after_step(self):
        self._core.step(self.trainer.iter)

    def after_train(self):
        last_done = self.trainer.iter - 1
        finished_early = self.trainer.iter < self.trainer.max_iter
        if (self.period > 0 and finished_early and last_done >= self.trainer.start_iter
                and self._core.last_saved_iter != last_done and not self.trainer.failed):
            self._core.save_periodic(last_done)


class EvalHook(HookBase):
    """Runs `eval_function()` every `eval_period` iterations and after the last iteration; its
    (nested) dict of results is flattened ("a/b") and put into the storage, which is asked to
    write them at once (so the writers send them to metrics.json and TensorBoard before the
    iteration's checkpoint). The names of a completed evaluation's results are recorded in the
    storage (`put_eval_names`), where BestCheckpointer checks its metric against them.

    An evaluation cut short by a stop signal (`eval_function` raises EvaluationInterrupted)
    leaves its iteration's scalars unwritten (`storage.hold_writes()`) and is remembered in the
    hook's state (`pending_iter`): the checkpoint of that iteration carries it, and the resumed
    run evaluates it first (before_train), so its record, its best model and everything after it
    are those of the uninterrupted run."""

    def __init__(self, eval_period, eval_function):
        self._period = int(eval_period)
        self._func = eval_function
        self.last_results = None
        self.pending_iter = None

    def state_dict(self):
        return {} if self.pending_iter is None else {"pending_iter": int(self.pending_iter)}

    def load_state_dict(self, state):
        self.pending_iter = int(state["pending_iter"])

    def before_train(self):
        if self.pending_iter is None:
            return
        storage = self.trainer.storage
        start = storage.iter
        storage.iter = self.pending_iter  # its results belong to the interrupted iteration
        try:
            logging.getLogger(__name__).info(f"Running the evaluation of iteration {self.pending_iter}, "
                                             "interrupted before the checkpoint this run resumes from")
            self._do_eval()
        finally:
            storage.iter = start

    def _do_eval(self):
        try:
            results = self._func()
        except EvaluationInterrupted as e:
            self.pending_iter = self.trainer.storage.iter
            self.trainer.storage.hold_writes()
            logging.getLogger(__name__).warning(
                f"{e}: the evaluation of iteration {self.pending_iter} runs again when the run is resumed")
            return
        self.pending_iter = None
        self.last_results = results
        names = []
        if results:
            if not isinstance(results, dict):
                raise TypeError(f"Eval function must return a dict. Got {results} instead.")
            flattened = flatten_results_dict(results)
            for k, v in flattened.items():
                try:
                    v = float(v)
                except Exception as e:
                    raise ValueError(
                        f"[EvalHook] eval_function should return a nested dict of float. Got '{k}: {v}' "
                        "instead.") from e
            self.trainer.storage.put_scalars(**flattened, smoothing_hint=False)
            self.trainer.storage.request_write()
            names = sorted(flattened)
        self.trainer.storage.put_eval_names(names)
        dist.synchronize()

    def after_step(self):
        next_iter = self.trainer.iter + 1
        if self._period > 0 and next_iter % self._period == 0 and next_iter != self.trainer.max_iter:
            self._do_eval()

    def after_train(self):
        # only after a finished training (not after an exception or an early stop)
        if self.trainer.iter >= self.trainer.max_iter and self.trainer.iter > self.trainer.start_iter:
            self._do_eval()


class BestCheckpointer(HookBase):
    """After each evaluation, saves `model_best` when `val_metric` improved (mode "max" or
    "min"). Register it after the EvalHook.

    `val_metric` must name one of the evaluation's (flattened) results, e.g. "PPL" (the
    validation set's metric) or "test/PPL" (DefaultTrainer.test's naming): the first evaluation
    whose results lack it raises a ValueError naming train.evaluation.eval_metric and the names
    the evaluation did compute. A better value with checkpoints disabled (train.checkpointer.period
    <= 0, as --fast-dev-run sets) becomes the best value without a `model_best`; the log says so.

    The best value and its iteration are the hook's state_dict(), saved with every checkpoint
    and restored on resume (a state saved for another metric or mode is ignored, with a
    warning). It runs before the iteration's periodic checkpoint, so a resume from that
    checkpoint compares with the same best as the uninterrupted run."""

    def __init__(self, eval_period, checkpointer, val_metric, mode="max", file_prefix="model_best"):
        if mode not in ("max", "min"):
            raise ValueError(f"BestCheckpointer mode must be 'max' or 'min', got {mode!r}")
        self._period = int(eval_period)
        self._val_metric = val_metric
        self._mode = mode
        self._checkpointer = checkpointer
        self._file_prefix = file_prefix
        self.best_metric = None
        self.best_iter = None
        self._logger = logging.getLogger(__name__)

    def state_dict(self):
        if self.best_metric is None:
            return {}
        return {"metric": self._val_metric, "mode": self._mode, "best_metric": float(self.best_metric),
                "best_iter": int(self.best_iter)}

    def load_state_dict(self, state):
        if (state.get("metric"), state.get("mode")) != (self._val_metric, self._mode):
            self._logger.warning(f"the saved best is for {state.get('metric')!r} ({state.get('mode')}), not "
                                 f"{self._val_metric!r} ({self._mode}): starting without a best value")
            return
        self.best_metric, self.best_iter = state["best_metric"], state["best_iter"]

    def _better(self, value):
        if math.isnan(value):  # never the best (e.g. a Pearson correlation of constant scores)
            logging.getLogger(__name__).warning(f"{self._val_metric} is NaN: not a candidate for {self._file_prefix}")
            return False
        if self.best_metric is None or math.isnan(self.best_metric):
            return True
        return value > self.best_metric if self._mode == "max" else value < self.best_metric

    def before_train(self):
        # a resumed run's EvalHook may just have run the evaluation its checkpoint left pending
        evaluated = self.trainer.storage.eval_names()
        if evaluated is not None:
            self._best_checking(evaluated[0])

    def _evaluated_names(self, iteration):
        """The result names of the evaluation of `iteration`, or None when none completed then
        (an evaluation cut short by a signal). Without an EvalHook (results put into the storage
        by other means): the scalars put at that iteration."""
        storage = self.trainer.storage
        evaluated = storage.eval_names()
        if evaluated is not None:
            return evaluated[1] if evaluated[0] == iteration else None
        if storage.writes_held:
            return None
        return sorted(k for k, (_, itr) in storage.latest().items() if itr == iteration)

    def _best_checking(self, iteration=None):
        """Compare the metric evaluated at `iteration` (default: the current one)."""
        storage = self.trainer.storage
        iteration = storage.iter if iteration is None else iteration
        names = self._evaluated_names(iteration)
        if names is None:
            return  # this iteration's evaluation was interrupted: it runs again on resume
        metric = storage.latest().get(self._val_metric)
        if self._val_metric not in names or metric is None or metric[1] != iteration:
            raise ValueError(
                f"train.evaluation.eval_metric={self._val_metric!r} is not among the results of the evaluation at "
                f"iteration {iteration}: {names if names else 'none (the evaluator returned no results)'}. Set "
                f"train.evaluation.eval_metric to one of them (the validation set's metrics have plain names, the "
                f"test set's are prefixed 'test/'; docs/training.md, 'Evaluation'), and train.evaluation.eval_mode "
                f"to 'max' or 'min' to match it")
        value = metric[0]
        if not self._better(value):
            return
        previous = self.best_metric
        self.best_metric, self.best_iter = value, iteration
        than = f", better than last best score {previous:0.5f}" if previous is not None else ""
        enabled = getattr(self._checkpointer, "enabled", True)
        if enabled and self._checkpointer.save_dir:
            self._checkpointer.save(self._file_prefix, tag_last=False, iteration=iteration,
                                    best_metric=value, best_metric_name=self._val_metric)
            self._logger.info(f"Saved best model as latest eval score for {self._val_metric} is {value:0.5f}"
                              f"{than} @ iteration {iteration}.")
        else:
            why = ("checkpoints are disabled (train.checkpointer.period <= 0; --fast-dev-run sets it)"
                   if not enabled else "the checkpointer has no save_dir")
            self._logger.info(f"Best eval score for {self._val_metric} is now {value:0.5f}{than} @ iteration "
                              f"{iteration}; {self._file_prefix} not saved: {why}.")

    def after_step(self):
        next_iter = self.trainer.iter + 1
        if self._period > 0 and next_iter % self._period == 0 and next_iter != self.trainer.max_iter:
            self._best_checking()

    def after_train(self):
        if self.trainer.iter >= self.trainer.max_iter and self.trainer.iter > self.trainer.start_iter:
            self._best_checking()


class PeriodicWriter(HookBase):
    """Calls every writer's write() every `period` iterations, after the last iteration, at an
    iteration whose scalars asked for it (`storage.request_write()`: evaluation results) and
    after a finished (or failed) training; then closes them. A run that stops early (stop_iter,
    a signal) writes no extra record, so that the resumed run's metrics.json is the
    uninterrupted run's. An iteration whose scalars are held (`storage.hold_writes()`) is not
    written.

    Its state (saved with each checkpoint) is the scalars not written yet; a resumed run puts
    them back, first tells each writer to drop what an abandoned attempt wrote after the
    checkpoint (`EventWriter.start_at`), and writes at once if asked to (the evaluation its
    checkpoint left pending). Register it on every rank (without writers except on rank 0), so
    that every rank takes the same hook states."""

    def __init__(self, writers, period=20):
        self._writers = list(writers)
        for w in self._writers:
            if not isinstance(w, EventWriter):
                raise TypeError(f"writers must be EventWriter instances, got {type(w).__name__}")
        self._period = max(int(period), 1)
        self._written_iter = -1
        self._unwritten = {}

    def state_dict(self):
        storage = self.trainer.storage
        if storage is None:  # outside train(): nothing put, nothing unwritten
            return {}
        hints = storage.smoothing_hints()
        unwritten = {name: [value, itr, hints[name]] for name, (value, itr) in storage.latest().items()
                     if itr > self._written_iter}
        return {"unwritten": unwritten} if unwritten else {}

    def load_state_dict(self, state):
        self._unwritten = dict(state.get("unwritten", {}))

    def before_train(self):
        storage = self.trainer.storage
        self._written_iter = self.trainer.start_iter - 1
        if self.trainer.start_iter > 0:
            for writer in self._writers:
                writer.start_at(self.trainer.start_iter)
        start = storage.iter
        for name, (value, itr, hint) in sorted(self._unwritten.items(), key=lambda kv: kv[1][1]):
            storage.iter = itr
            storage.put_scalar(name, value, smoothing_hint=hint)
        self._unwritten = {}
        if storage.write_requested:  # as of the iteration those scalars belong to
            storage.iter = max(itr for _, itr in storage.latest().values())
            self._write()
        storage.iter = start

    def after_step(self):
        storage = self.trainer.storage
        if storage.writes_held:
            storage.writes_held = False
            return
        if ((self.trainer.iter + 1) % self._period == 0 or self.trainer.iter == self.trainer.max_iter - 1
                or storage.write_requested):
            self._write()

    def _write(self):
        for writer in self._writers:
            writer.write()
        self._written_iter = self.trainer.storage.iter
        self.trainer.storage.write_requested = False

    def after_train(self):
        if self.trainer.iter >= self.trainer.max_iter or self.trainer.failed:
            self._write()
        for writer in self._writers:
            writer.close()
