"""DataLoader: batches from a dataset, in the main process or in worker processes, as in torch.

With `num_workers=0` batches are fetched in the calling process. With `num_workers > 0` each
worker is a real process (multiprocessing, the platform's default start method unless
`multiprocessing_context` says otherwise) with its own index queue; tasks go round-robin to the
workers, at most `prefetch_factor * num_workers` ahead, and batches come back in sampler order
(`in_order=False`: as they arrive). Batches travel as pickled numpy arrays and become engine
tensors in the main process (see worker.py).

Failure handling: an exception in a worker is re-raised here with its type, the worker's id and
the original traceback text; a worker that dies (killed, crashed, exited) makes the next wait
raise RuntimeError naming its pid and exit code instead of hanging; `timeout > 0` bounds the
wait for each batch. Workers stop when the pass ends (unless `persistent_workers`), when the
iterator is garbage-collected (an early `break`), and on their own when the main process dies.

`pin_memory` (and `pin_memory_device`) are accepted and do nothing: the engine's CPU batches
live in ordinary memory and CuPy copies to the GPU from pageable memory. As in torch, `timeout`
concerns worker processes only (with num_workers=0 a slow dataset simply takes its time).
"""
import atexit
import itertools
import math
import queue
import signal
import time
import warnings

from ...backend.random import Generator
from .collate import default_collate, default_convert
from .dataset import IterableDataset
from .fetch import InfiniteConstantSampler, make_fetcher
from .sampler import BatchSampler, RandomSampler, SequentialSampler, draw_seed
from .worker import ExceptionWrapper, IterableDatasetStopIteration, ResumeIteration, decode, worker_loop

__all__ = ["DataLoader"]

_POLL = 0.2  # seconds between liveness checks of the workers while waiting for a batch
_SHUTDOWN_GRACE = 2.0  # seconds workers get to exit before they are terminated
_exiting = False  # set at interpreter exit: multiprocessing then terminates the (daemon) workers itself


def _at_exit():
    global _exiting
    _exiting = True


atexit.register(_at_exit)


class DataLoader:
    """Iterate over `dataset` in batches (torch.utils.data.DataLoader's arguments and rules)."""

    _FROZEN = ("batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers")
    _initialized = False

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None, num_workers=0,
                 collate_fn=None, pin_memory=False, drop_last=False, timeout=0, worker_init_fn=None,
                 multiprocessing_context=None, generator=None, *, prefetch_factor=None, persistent_workers=False,
                 pin_memory_device="", in_order=True):
        if num_workers < 0:
            raise ValueError("num_workers option should be non-negative; use num_workers=0 to disable multiprocessing.")
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError("prefetch_factor option could only be specified in multiprocessing. let num_workers > 0 "
                             "to enable multiprocessing, otherwise set prefetch_factor to None.")
        if num_workers > 0 and prefetch_factor is None:
            prefetch_factor = 2
        elif prefetch_factor is not None and prefetch_factor < 0:
            raise ValueError("prefetch_factor option should be non-negative")
        elif num_workers > 0 and prefetch_factor == 0:  # (torch fails an assertion when iterating)
            raise ValueError("prefetch_factor option should be positive with num_workers > 0: each worker needs "
                             "at least one batch in flight")
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
        if generator is not None and not isinstance(generator, Generator):
            raise TypeError(f"generator must be an engine.Generator or None, got {type(generator).__name__}")

        self.dataset = dataset
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory  # no-op, see the module docstring
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.in_order = in_order

        if isinstance(dataset, IterableDataset):
            self._iterable = True
            if shuffle not in (False, None):
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified shuffle option, but got "
                                 f"shuffle={shuffle}")
            if sampler is not None:
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified sampler option, but got "
                                 f"sampler={sampler}")
            if batch_sampler is not None:
                raise ValueError("DataLoader with IterableDataset: expected unspecified batch_sampler option, but "
                                 f"got batch_sampler={batch_sampler}")
        else:
            shuffle = bool(shuffle)
            self._iterable = False
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError("batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, "
                                 "and drop_last")
            batch_size, drop_last = None, False
        elif batch_size is None and drop_last:
            raise ValueError("batch_size=None option disables auto-batching and is mutually exclusive with drop_last")
        if sampler is None:
            if self._iterable:
                sampler = InfiniteConstantSampler()
            else:
                sampler = RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
        if batch_size is not None and batch_sampler is None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)

        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.generator = generator
        if collate_fn is None:
            collate_fn = default_collate if self._auto_collation else default_convert
        self.collate_fn = collate_fn
        self.persistent_workers = persistent_workers
        self._IterableDataset_len_called = None
        self._iterator = None
        self._initialized = True

    # ------------------------------------------------------------------ attributes
    def __setattr__(self, attr, val):
        if self._initialized and attr in self._FROZEN:
            raise ValueError(f"{attr} attribute should not be set after {self.__class__.__name__} is initialized")
        super().__setattr__(attr, val)

    @property
    def multiprocessing_context(self):
        return self.__mp_context

    @multiprocessing_context.setter
    def multiprocessing_context(self, ctx):
        if ctx is not None:
            import multiprocessing  # here, not at the top: ~15 ms that loading without workers never needs

            if self.num_workers == 0:
                raise ValueError("multiprocessing_context can only be used with multi-process loading "
                                 f"(num_workers > 0), but got num_workers={self.num_workers}")
            if isinstance(ctx, str):
                valid = multiprocessing.get_all_start_methods()
                if ctx not in valid:
                    raise ValueError("multiprocessing_context option should specify a valid start method in "
                                     f"{valid!r}, but got multiprocessing_context={ctx!r}")
                ctx = multiprocessing.get_context(ctx)
            elif not isinstance(ctx, multiprocessing.context.BaseContext):
                raise TypeError("multiprocessing_context option should be a valid context object or a string "
                                f"specifying the start method, but got multiprocessing_context={ctx}")
        self.__mp_context = ctx

    @property
    def _auto_collation(self):
        return self.batch_sampler is not None

    @property
    def _index_sampler(self):
        return self.batch_sampler if self._auto_collation else self.sampler

    # ------------------------------------------------------------------ iteration
    def _get_iterator(self):
        if self.num_workers == 0:
            return _SingleProcessIter(self)
        return _MultiProcessIter(self)

    def __iter__(self):
        if self.persistent_workers and self.num_workers > 0:
            if self._iterator is None:
                self._iterator = self._get_iterator()
            else:
                self._iterator._reset(self)
            return self._iterator
        return self._get_iterator()

    def __len__(self):
        if self._iterable:
            length = self._IterableDataset_len_called = len(self.dataset)
            if self.batch_size is not None:
                length = length // self.batch_size if self.drop_last else math.ceil(length / self.batch_size)
            return length
        return len(self._index_sampler)


class _BaseIter:
    def __init__(self, loader):
        self._dataset = loader.dataset
        self._iterable = loader._iterable
        self._auto_collation = loader._auto_collation
        self._drop_last = loader.drop_last
        self._index_sampler = loader._index_sampler
        self._num_workers = loader.num_workers
        self._timeout = loader.timeout
        self._collate_fn = loader.collate_fn
        self._persistent_workers = loader.persistent_workers
        self._base_seed = draw_seed(loader.generator)
        self._reset(loader)

    def _reset(self, loader):
        self._sampler_iter = iter(self._index_sampler)
        self._num_yielded = 0
        self._len_reported = loader._IterableDataset_len_called

    def __iter__(self):
        return self

    def _next_index(self):
        return next(self._sampler_iter)

    def __next__(self):
        data = self._next_data()
        self._num_yielded += 1
        if self._iterable and self._len_reported is not None and self._num_yielded > self._len_reported:
            msg = (f"Length of IterableDataset {self._dataset} was reported to be {self._len_reported} (when "
                   f"accessing len(dataloader)), but {self._num_yielded} samples have been fetched. ")
            if self._num_workers > 0:
                msg += ("For multiprocessing data-loading, this could be caused by not properly configuring the "
                        "IterableDataset replica at each worker (see get_worker_info()).")
            warnings.warn(msg, stacklevel=2)
        return data

    def __len__(self):
        return len(self._index_sampler)

    def __getstate__(self):
        raise NotImplementedError(f"{self.__class__.__name__} cannot be pickled")


class _SingleProcessIter(_BaseIter):
    def __init__(self, loader):
        super().__init__(loader)
        self._fetcher = make_fetcher(self._iterable, self._dataset, self._auto_collation, self._collate_fn,
                                     self._drop_last)

    def _next_data(self):
        return self._fetcher.fetch(self._next_index())  # StopIteration ends the pass


class _MultiProcessIter(_BaseIter):
    """Workers, their queues, and the bookkeeping that puts batches back in order.

    `_task_info[i]` is (worker,) while task i is out and (worker, data) once it arrived early;
    `_rcvd_idx` is the next task to hand out, `_send_idx` the next to dispatch."""

    def __init__(self, loader):
        import multiprocessing

        self._shutdown = True  # until the workers exist, __del__ has nothing to do
        super().__init__(loader)
        ctx = loader.multiprocessing_context or multiprocessing.get_context()
        self._in_order = loader.in_order
        self._prefetch = loader.prefetch_factor * self._num_workers
        self._result_queue = ctx.Queue()
        self._done_event = ctx.Event()
        self._index_queues, self._workers = [], []
        self._workers_status = [True] * self._num_workers
        self._shutdown = False
        try:
            for worker_id in range(self._num_workers):
                index_queue = ctx.Queue()
                index_queue.cancel_join_thread()  # the main process must never block on exit for it
                w = ctx.Process(target=worker_loop, daemon=True, args=(
                    self._iterable, self._dataset, index_queue, self._result_queue, self._done_event,
                    self._auto_collation, self._collate_fn, self._drop_last, self._base_seed,
                    loader.worker_init_fn, worker_id, self._num_workers))
                w.start()
                self._index_queues.append(index_queue)
                self._workers.append(w)
        except BaseException:
            self._shutdown_workers()
            raise
        self._start_pass(first=True)

    def _reset(self, loader):
        super()._reset(loader)
        if hasattr(self, "_workers"):  # a new pass of persistent workers
            self._start_pass(first=False)

    def _start_pass(self, first):
        self._send_idx = 0
        self._rcvd_idx = 0
        self._task_info = {}
        self._workers_status = [True] * self._num_workers
        self._worker_cycle = itertools.cycle(range(self._num_workers))
        if not first:  # persistent workers: drop what is left of the last pass, restart the fetchers
            for q in self._index_queues:
                q.put(ResumeIteration())
            acks = self._num_workers
            while acks > 0:
                idx, _ = self._get_data()
                if isinstance(idx, ResumeIteration):
                    acks -= 1
        for _ in range(self._prefetch):
            self._try_put_index()

    def _try_put_index(self):
        try:
            index = self._next_index()
        except StopIteration:
            return
        for _ in range(self._num_workers):
            worker_id = next(self._worker_cycle)
            if self._workers_status[worker_id]:
                break
        else:
            return  # every worker's iterable is exhausted
        self._index_queues[worker_id].put((self._send_idx, index))
        self._task_info[self._send_idx] = (worker_id,)
        self._send_idx += 1

    def _get_data(self):
        """The next (task index, data) from any worker, watching the workers and the timeout."""
        if self._shutdown:
            raise RuntimeError("this DataLoader iterator has shut its workers down after an error; "
                               "start a new pass with iter(loader)")
        deadline = time.monotonic() + self._timeout if self._timeout > 0 else None
        while True:
            wait = _POLL if deadline is None else max(0.0, min(_POLL, deadline - time.monotonic()))
            try:
                idx, payload = self._result_queue.get(timeout=wait)
            except queue.Empty:
                self._check_workers()
                if deadline is not None and time.monotonic() >= deadline:
                    raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds") from None
                continue
            return idx, (None if payload is None else decode(payload))

    def _check_workers(self):
        dead = [(i, w) for i, w in enumerate(self._workers) if self._workers_status[i] and not w.is_alive()]
        if dead:
            self._shutdown_workers()
            what = ", ".join(f"worker {i} (pid {w.pid}, {_exit_reason(w.exitcode)})" for i, w in dead)
            raise RuntimeError(f"DataLoader worker process exited unexpectedly: {what}. A worker killed by the "
                               "operating system is often out of memory.")

    def _next_data(self):
        while True:
            while self._rcvd_idx < self._send_idx:  # skip tasks of workers whose iterable ended
                info = self._task_info.get(self._rcvd_idx)
                if info:
                    if len(info) == 2 or self._workers_status[info[0]]:
                        break
                    del self._task_info[self._rcvd_idx]
                self._rcvd_idx += 1
            else:
                if not self._persistent_workers:
                    self._shutdown_workers()
                raise StopIteration
            if len(self._task_info[self._rcvd_idx]) == 2:  # it arrived earlier
                data = self._task_info.pop(self._rcvd_idx)[1]
                self._rcvd_idx += 1
                return self._process_data(data)
            idx, data = self._get_data()
            if self._iterable and isinstance(data, IterableDatasetStopIteration):
                self._mark_ended(data.worker_id)
                self._try_put_index()
                continue
            if idx != self._rcvd_idx:
                if self._in_order:
                    self._task_info[idx] += (data,)
                    continue
                del self._task_info[idx]
                return self._process_data(data)
            del self._task_info[idx]
            self._rcvd_idx += 1
            return self._process_data(data)

    def _process_data(self, data):
        self._try_put_index()
        if isinstance(data, ExceptionWrapper):
            data.reraise()
        return data

    def _mark_ended(self, worker_id):
        """Worker `worker_id` has no more data this pass; a non-persistent one is told to exit."""
        self._workers_status[worker_id] = False
        if not self._persistent_workers:
            self._index_queues[worker_id].put(None)

    def _shutdown_workers(self):
        if self._shutdown:
            return
        self._shutdown = True
        try:
            self._done_event.set()
            for worker_id, q in enumerate(self._index_queues):
                if self._persistent_workers or self._workers_status[worker_id]:
                    q.put(None)
            deadline = time.monotonic() + _SHUTDOWN_GRACE
            for w in self._workers:
                w.join(timeout=max(0.0, deadline - time.monotonic()))
            for q in self._index_queues:
                q.close()
            self._result_queue.cancel_join_thread()
            self._result_queue.close()
        finally:
            for w in self._workers:
                if w.is_alive():  # stuck in user code: do not wait for it
                    w.terminate()
                    w.join(timeout=_SHUTDOWN_GRACE)

    def __del__(self):
        if not _exiting:
            self._shutdown_workers()


def _exit_reason(code):
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
