"""Per-iteration scalars (`EventStorage`) and the writers that report them.

As detectron2/LiBai: the trainer opens an `EventStorage`; the step and the hooks `put_scalar`
values for the current iteration; every `log_period` iterations `PeriodicWriter` calls the
writers:

* `CommonMetricPrinter` -- one console line: ETA, iteration/max, each loss (median over a
  window of 20), time/iter, data time, lr, throughput (samples/s), memory when on CUDA.
* `JSONWriter` -- appends one JSON object per logged iteration to `metrics.json`, with the
  iteration, every scalar's latest value (raw, unsmoothed by default) and evaluation results.
* `TensorboardXWriter` -- scalar summaries in a TensorBoard event file (`libai.utils.tfevents`:
  the file format written directly, no TensorBoard or torch import).
"""
import datetime
import json
import logging
import os
import time
from collections import defaultdict
from contextlib import contextmanager

import numpy as np

from engine.serialization import atomic_write

from .tfevents import EventFileWriter

__all__ = ["HistoryBuffer", "EventStorage", "get_event_storage", "EventWriter", "JSONWriter",
           "TensorboardXWriter", "CommonMetricPrinter"]

_CURRENT_STORAGE_STACK = []


def get_event_storage():
    """The innermost `EventStorage` in use (raises when none is open)."""
    if not _CURRENT_STORAGE_STACK:
        raise RuntimeError("get_event_storage() has to be called inside a 'with EventStorage(...)' context!")
    return _CURRENT_STORAGE_STACK[-1]


class HistoryBuffer:
    """The (value, iteration) history of one scalar, bounded to `max_length` entries."""

    def __init__(self, max_length=1000000):
        self._max_length = max_length
        self._data = []
        self._count = 0
        self._global_avg = 0.0

    def update(self, value, iteration=None):
        if iteration is None:
            iteration = self._count
        if len(self._data) == self._max_length:
            self._data.pop(0)
        self._data.append((value, iteration))
        self._count += 1
        self._global_avg += (value - self._global_avg) / self._count

    def latest(self):
        return self._data[-1][0]

    def median(self, window_size):
        return float(np.median([x[0] for x in self._data[-window_size:]]))

    def avg(self, window_size):
        return float(np.mean([x[0] for x in self._data[-window_size:]]))

    def global_avg(self):
        return self._global_avg

    def values(self):
        return self._data


class EventStorage:
    """Scalars per iteration, with smoothing hints (as detectron2's EventStorage)."""

    def __init__(self, start_iter=0):
        self._history = defaultdict(HistoryBuffer)
        self._smoothing_hints = {}
        self._latest_scalars = {}
        self._iter = start_iter
        self._current_prefix = ""
        # set by request_write(): PeriodicWriter writes at this iteration, not at the next period
        self.write_requested = False
        # set by hold_writes(): PeriodicWriter does not write this iteration
        self.writes_held = False
        self._eval_names = None

    def put_scalar(self, name, value, smoothing_hint=True):
        """Record `value` (a number or a 0-d tensor) for `name` at the current iteration.

        smoothing_hint: whether writers that smooth (the console) should take the median over a
        window rather than the latest value (losses: True; lr and metrics: False)."""
        name = self._current_prefix + name
        if hasattr(value, "item"):
            value = value.item()
        value = float(value)
        self._history[name].update(value, self._iter)
        self._latest_scalars[name] = (value, self._iter)
        existing = self._smoothing_hints.get(name)
        if existing is not None:
            if existing != smoothing_hint:
                raise ValueError(f"Scalar {name} was put with a different smoothing_hint!")
        else:
            self._smoothing_hints[name] = smoothing_hint

    def put_scalars(self, *, smoothing_hint=True, **kwargs):
        for k, v in kwargs.items():
            self.put_scalar(k, v, smoothing_hint=smoothing_hint)

    def history(self, name):
        ret = self._history.get(name, None)
        if ret is None:
            raise KeyError(f"No history metric available for {name}!")
        return ret

    def histories(self):
        return self._history

    def latest(self):
        """{name: (latest value, iteration it was put at)}."""
        return self._latest_scalars

    def latest_with_smoothing_hint(self, window_size=20):
        """As `latest()`, but values with a smoothing hint are the median over `window_size`
        entries (window_size=1: the raw latest value)."""
        result = {}
        for k, (v, itr) in self._latest_scalars.items():
            if self._smoothing_hints[k] and window_size > 1:
                v = self._history[k].median(window_size)
            result[k] = (v, itr)
        return result

    def smoothing_hints(self):
        return self._smoothing_hints

    def put_eval_names(self, names):
        """Record the (flattened) result names of the evaluation that completed at the current
        iteration (EvalHook), for the hooks that look a result up (BestCheckpointer)."""
        self._eval_names = (self._iter, list(names))

    def eval_names(self):
        """(iteration, [result names]) of the last completed evaluation; None before any."""
        return self._eval_names

    def request_write(self):
        """Ask PeriodicWriter to write this iteration's scalars now rather than at the next log
        period: for values that are not put every iteration (evaluation results), so that a
        crash before the next period cannot lose them."""
        self.write_requested = True

    def hold_writes(self):
        """Tell PeriodicWriter not to write this iteration's scalars: they are incomplete (an
        evaluation was interrupted) and go into the checkpoint's state to be written, complete,
        by the resumed run."""
        self.writes_held = True

    def step(self):
        self._iter += 1

    @property
    def iter(self):
        return self._iter

    @iter.setter
    def iter(self, val):
        self._iter = int(val)

    @property
    def iteration(self):  # backward compatibility
        return self._iter

    def __enter__(self):
        _CURRENT_STORAGE_STACK.append(self)
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        assert _CURRENT_STORAGE_STACK[-1] is self
        _CURRENT_STORAGE_STACK.pop()

    @contextmanager
    def name_scope(self, name):
        old_prefix = self._current_prefix
        self._current_prefix = name.rstrip("/") + "/"
        yield
        self._current_prefix = old_prefix


class EventWriter:
    """Base class: `write()` reports the current storage; `close()` releases resources;
    `start_at(iteration)` is called when a resumed run continues at `iteration`."""

    def write(self):
        raise NotImplementedError

    def close(self):
        pass

    def start_at(self, iteration):
        """The run continues at `iteration` (a resume): what this writer wrote earlier for
        iterations >= `iteration` came from an attempt that was abandoned after its last
        checkpoint and is to be dropped (the default: nothing to drop)."""


class JSONWriter(EventWriter):
    """Appends one JSON object per logged iteration to `json_file`:
    `{"iteration": i, "total_loss": ..., "loss": ..., "lr": ..., "time": ..., ...}`.

    Only scalars put since the last write are written, grouped by the iteration they were put
    at. `window_size=1` (the default) writes raw values; larger windows write the median of
    values with a smoothing hint. The file is opened (for appending) at the first write."""

    def __init__(self, json_file, window_size=1):
        self._path = json_file
        self._file_handle = None
        self._window_size = window_size
        self._last_write = -1

    def start_at(self, iteration):
        """Rewrite the file (atomically) without the records of iterations >= `iteration`, and
        without a torn last line (a record cut short by a kill)."""
        if self._file_handle is not None:
            raise RuntimeError("JSONWriter.start_at must come before the first write")
        if not os.path.isfile(self._path):
            return
        with open(self._path, encoding="utf-8") as f:
            lines = f.readlines()
        kept, later, unreadable = [], 0, []
        for n, line in enumerate(lines, 1):
            try:
                record = json.loads(line)
            except ValueError:
                if line.strip() and n < len(lines):  # a torn last line is a kill's, expected
                    unreadable.append(n)
                continue
            if isinstance(record, dict) and record.get("iteration", -1) < iteration:
                kept.append(line if line.endswith("\n") else line + "\n")
            elif line.strip():
                later += 1
        if len(kept) != len(lines):
            atomic_write(self._path, [line.encode("utf-8") for line in kept])
            log = logging.getLogger(__name__)
            log.info(f"{self._path}: dropped {later} record(s) of iterations >= {iteration} "
                     "(written after the checkpoint this run resumes from)")
            if unreadable:
                log.warning(f"{self._path}: dropped {len(unreadable)} line(s) that are not JSON records "
                            f"(line {', '.join(map(str, unreadable[:5]))}{' ...' if len(unreadable) > 5 else ''})")

    def write(self):
        if self._file_handle is None:
            os.makedirs(os.path.dirname(os.path.abspath(self._path)) or ".", exist_ok=True)
            self._file_handle = open(self._path, "a", encoding="utf-8")
        storage = get_event_storage()
        to_save = defaultdict(dict)
        for k, (v, itr) in storage.latest_with_smoothing_hint(self._window_size).items():
            if itr <= self._last_write:
                continue
            to_save[itr][k] = v
        if to_save:
            self._last_write = max(to_save.keys())
        for itr, scalars in sorted(to_save.items()):
            scalars["iteration"] = itr
            self._file_handle.write(json.dumps(scalars, sort_keys=True) + "\n")
        self._file_handle.flush()
        try:
            os.fsync(self._file_handle.fileno())
        except (AttributeError, OSError):
            pass

    def close(self):
        if self._file_handle is not None:
            self._file_handle.close()
            self._file_handle = None


class TensorboardXWriter(EventWriter):
    """Scalars to a TensorBoard event file in `log_dir` (tag = the scalar's name, step = its
    iteration) as v1 `Summary(simple_value=...)` events, which TensorBoard and its
    `EventAccumulator` read as scalars, written by `libai.utils.tfevents` (TensorBoard itself is
    not imported). The event file is created at the first event (nothing is written into log_dir
    before the run has started); each `write()` flushes it."""

    def __init__(self, log_dir, window_size=1, flush_secs=10):
        self._window_size = window_size
        self._flush_secs = flush_secs
        self._event_file = None
        self._last_write = -1
        self.log_dir = log_dir

    @property
    def _writer(self):
        if self._event_file is None:
            self._event_file = EventFileWriter(self.log_dir, flush_secs=self._flush_secs)
        return self._event_file

    def add_scalar(self, tag, value, step, wall_time=None):
        self._writer.add_scalars({tag: float(value)}, int(step), wall_time)

    def start_at(self, iteration):
        """A `SessionLog.START` event at `iteration`: TensorBoard then discards the events of
        steps >= `iteration` written before it (by the abandoned attempt)."""
        self._writer.add_session_start(int(iteration))

    def write(self):
        storage = get_event_storage()
        by_iteration = defaultdict(dict)
        for k, (v, itr) in storage.latest_with_smoothing_hint(self._window_size).items():
            if itr > self._last_write:
                by_iteration[itr][k] = float(v)
        now = time.time()
        for itr in sorted(by_iteration):  # one event per iteration, its scalars in one Summary
            self._writer.add_scalars(by_iteration[itr], int(itr), now)
        self._last_write = max([self._last_write, *by_iteration])
        self._writer.flush()

    def close(self):
        if self._event_file is not None:
            self._event_file.close()
            self._event_file = None


class CommonMetricPrinter(EventWriter):
    """Prints one line per log period: ETA, iteration/max, losses (and training accuracies such as
    BERT's sop_acc: entries ending in "_acc"), time, data time, lr,
    throughput. `batch_size` is the number of samples one iteration consumes over all ranks."""

    def __init__(self, batch_size, max_iter, window_size=20):
        self.logger = logging.getLogger("libai." + __name__.split(".", 1)[-1])
        self._batch_size = batch_size
        self._max_iter = max_iter
        self._window_size = window_size
        self._last_write = None

    def _get_eta(self, storage):
        iteration = storage.iter
        if self._max_iter is None or iteration >= self._max_iter:
            return ""
        try:
            eta_seconds = storage.history("time").median(1000) * (self._max_iter - iteration - 1)
            storage.put_scalar("eta_seconds", eta_seconds, smoothing_hint=False)
            return str(datetime.timedelta(seconds=int(eta_seconds)))
        except KeyError:
            eta_string = ""
            if self._last_write is not None:
                estimate = (time.perf_counter() - self._last_write[1]) / (iteration - self._last_write[0] or 1)
                eta_string = str(datetime.timedelta(seconds=int(estimate * (self._max_iter - iteration - 1))))
            self._last_write = (iteration, time.perf_counter())
            return eta_string

    def write(self):
        storage = get_event_storage()
        iteration = storage.iter
        if self._max_iter is not None and iteration >= self._max_iter:
            # after training (e.g. the final evaluation): nothing new to print here
            return
        try:
            data_time = storage.history("data_time").avg(self._window_size)
        except KeyError:
            data_time = None
        try:
            iter_time = storage.history("time").global_avg()
            cur_iter_time = storage.history("time").latest()
        except KeyError:
            iter_time = cur_iter_time = None
        try:
            lr = "{:.3e}".format(storage.history("lr").latest())
        except KeyError:
            lr = "N/A"
        eta_string = self._get_eta(storage)
        losses = "  ".join(
            "{}: {:.4g}".format(k, v.median(self._window_size))
            for k, v in storage.histories().items() if "loss" in k or k.endswith("_acc"))  # + training accuracies
        throughput = ""
        if cur_iter_time:
            throughput = "  throughput: {:.2f} samples/s".format(self._batch_size / cur_iter_time)
        self.logger.info(
            " {eta}iteration: {iter}/{max_iter}  {losses}  {time}{data_time}lr: {lr}{throughput}".format(
                eta=f"eta: {eta_string}  " if eta_string else "",
                iter=iteration,
                max_iter=self._max_iter,
                losses=losses,
                time="time: {:.4f} s/iter  ".format(iter_time) if iter_time is not None else "",
                data_time="data_time: {:.4f} s/iter  ".format(data_time) if data_time is not None else "",
                lr=lr,
                throughput=throughput,
            ))
