"""What runs inside a DataLoader worker process, and what crosses the process boundary.

A worker takes `(task index, sampler indices)` from its own index queue, fetches and collates the
batch, and puts `(task index, bytes)` on the shared result queue. The bytes are the batch
pickled in the worker itself, with every engine tensor reduced to its numpy array: the main
process rebuilds the tensors when it unpickles, so tensors are only ever made there, and a batch
that cannot be pickled becomes an error reported for that batch instead of a lost message (a
multiprocessing queue pickles in a background thread, where a failure would only be printed).

Workers never use MPI: a worker that is not a fork of an MPI process cannot even import mpi4py
(it would join the job as a duplicate rank), and nothing here touches engine.distributed.
Seeding is torch's: python `random` and the engine generator get `base_seed + worker_id`, numpy's
global RNG the 4-word state torch derives from (base_seed, worker_id).
"""
import io
import os
import pickle
import queue
import random
import sys
import traceback

import numpy as np

from ...backend import CPU, to_device
from ...backend.parallel import set_num_threads
from ...backend.random import manual_seed
from ...tensor import Parameter, Tensor
from .fetch import make_fetcher

__all__ = ["WorkerInfo", "get_worker_info", "ExceptionWrapper", "worker_loop", "encode", "decode",
           "IterableDatasetStopIteration", "ResumeIteration", "generate_state"]

POLL_INTERVAL = 0.5  # seconds between checks that the main process is still there

_worker_info = None


class WorkerInfo:
    """id, num_workers, seed and dataset (this worker's copy) of the current worker process."""

    __initialized = False

    def __init__(self, **kwargs):
        for k, v in kwargs.items():
            setattr(self, k, v)
        self.__keys = tuple(kwargs)
        self.__initialized = True

    def __setattr__(self, key, val):
        if self.__initialized:
            raise RuntimeError(f"Cannot assign attributes to {self.__class__.__name__} objects")
        return super().__setattr__(key, val)

    def __repr__(self):
        items = ", ".join(f"{k}={getattr(self, k)}" for k in self.__keys)
        return f"{self.__class__.__name__}({items})"


def get_worker_info():
    """The WorkerInfo of this process when it is a DataLoader worker, else None (as in torch):
    an IterableDataset uses it to take its own share of the stream."""
    return _worker_info


class KeyErrorMessage(str):
    """A KeyError shows repr() of its argument; this keeps a multi-line message readable."""

    def __repr__(self):
        return self


class ExceptionWrapper:
    """An exception caught in a worker, carried as its type and formatted traceback text."""

    def __init__(self, exc_info=None, where="in background"):
        exc_info = exc_info or sys.exc_info()
        self.exc_type = exc_info[0]
        self.exc_msg = "".join(traceback.format_exception(*exc_info))
        self.where = where

    def reraise(self):
        """Raise the same exception type in this process, its message holding the original
        traceback (RuntimeError when the type cannot be built from one message)."""
        msg = f"Caught {self.exc_type.__name__} {self.where}.\nOriginal {self.exc_msg}"
        if self.exc_type is KeyError:
            msg = KeyErrorMessage(msg)
        try:
            exc = self.exc_type(msg)
        except Exception:
            raise RuntimeError(msg) from None
        raise exc


class IterableDatasetStopIteration:
    """A worker's message that its copy of an iterable dataset is exhausted."""

    def __init__(self, worker_id):
        self.worker_id = worker_id


class ResumeIteration:
    """Sent to persistent workers at the start of each new pass over the data."""


def generate_state(base_seed, worker_id):
    """torch's `_generate_state`: numpy's seed for a worker, a SeedSequence-style hash of
    (worker_id, base_seed) into four 32-bit words."""
    mask = 0xFFFFFFFF
    entropy = [worker_id, base_seed & mask, base_seed >> 32, 0]
    hash_a = 0x43B0D7E5

    def hashed(value):
        nonlocal hash_a
        value = (value ^ hash_a) & mask
        hash_a = (hash_a * 0x931E8875) & mask
        value = (value * hash_a) & mask
        return (value ^ (value >> 16)) & mask

    def mix(x, y):
        r = ((0xCA01F9DD * x) & mask) - ((0x4973F715 * y) & mask)
        r &= mask
        return (r ^ (r >> 16)) & mask

    pool = [hashed(e) for e in entropy]
    for src in range(4):
        for dst in range(4):
            if src != dst:
                pool[dst] = mix(pool[dst], hashed(pool[src]))
    hash_b = 0x8B51F9DD
    state = []
    for value in pool:
        value = (value ^ hash_b) & mask
        hash_b = (hash_b * 0x58F38DED) & mask
        value = (value * hash_b) & mask
        state.append((value ^ (value >> 16)) & mask)
    return state


# ------------------------------------------------------------------ the wire format
def _tensor_from_wire(array, requires_grad, is_param):
    """Runs in the main process while it unpickles a batch: the engine tensor around `array`."""
    t = Tensor._make(array, CPU)
    if is_param:
        return Parameter(t, requires_grad=requires_grad)
    if requires_grad:
        t.requires_grad_(True)
    return t


class _WirePickler(pickle.Pickler):
    def reducer_override(self, obj):
        if isinstance(obj, Tensor):
            if obj.is_global:
                raise TypeError("a DataLoader worker cannot send a global tensor; make global tensors in the "
                                "main process (e.g. in the training loop) from local batches")
            array = obj._data if obj._device == CPU else to_device(obj._data, CPU)
            return _tensor_from_wire, (array, obj.requires_grad, isinstance(obj, Parameter))
        return NotImplemented


def encode(obj):
    """`obj` pickled with engine tensors as numpy arrays (see `_tensor_from_wire`)."""
    f = io.BytesIO()
    _WirePickler(f, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return f.getvalue()


def decode(payload):
    return pickle.loads(payload)


# ------------------------------------------------------------------ the worker process
def _keep_away_from_mpi():
    """Make `import mpi4py` fail in a worker that has not inherited it: MPI_Init there would
    register the worker with the job's process manager as a second copy of its parent's rank."""
    if "mpi4py" not in sys.modules:
        sys.modules["mpi4py"] = None


def _seed(base_seed, worker_id):
    seed = base_seed + worker_id
    random.seed(seed)
    manual_seed(seed)
    np.random.seed(generate_state(base_seed, worker_id))
    return seed


def _send(data_queue, idx, data, worker_id):
    try:
        payload = encode(data)
    except Exception:
        payload = encode(ExceptionWrapper(where=f"in DataLoader worker process {worker_id} "
                                                "(while pickling the batch for the main process)"))
    data_queue.put((idx, payload))


def worker_loop(iterable, dataset, index_queue, data_queue, done_event, auto_collation, collate_fn, drop_last,
                base_seed, init_fn, worker_id, num_workers):
    """The body of worker process `worker_id`; returns when told to (None) or when its parent is gone."""
    global _worker_info
    parent = os.getppid()
    try:
        _keep_away_from_mpi()
        set_num_threads(1)  # as torch: the workers share the machine with the main process
        seed = _seed(base_seed, worker_id)
        _worker_info = WorkerInfo(id=worker_id, num_workers=num_workers, seed=seed, dataset=dataset)
        init_error, fetcher = None, None
        try:
            if init_fn is not None:
                init_fn(worker_id)
            fetcher = make_fetcher(iterable, dataset, auto_collation, collate_fn, drop_last)
        except Exception:
            init_error = ExceptionWrapper(where=f"in DataLoader worker process {worker_id}")
        ended = False
        while True:
            try:
                r = index_queue.get(timeout=POLL_INTERVAL)
            except queue.Empty:
                if os.getppid() != parent:  # the main process died: nobody will ever read
                    break
                continue
            if isinstance(r, ResumeIteration):
                data_queue.put((r, None))
                ended = False
                if init_error is None:
                    fetcher = make_fetcher(iterable, dataset, auto_collation, collate_fn, drop_last)
                continue
            if r is None:
                break
            if done_event.is_set() or ended:
                continue
            idx, index = r
            if init_error is not None:
                data = init_error
            else:
                try:
                    data = fetcher.fetch(index)
                except StopIteration:
                    if not iterable:
                        data = ExceptionWrapper(where=f"in DataLoader worker process {worker_id}")
                    else:
                        data, ended = IterableDatasetStopIteration(worker_id), True
                except Exception:
                    data = ExceptionWrapper(where=f"in DataLoader worker process {worker_id}")
            _send(data_queue, idx, data, worker_id)
            del data, idx, index, r
    except KeyboardInterrupt:
        pass  # the main process sees it too, and shuts the workers down
    if done_event.is_set():
        data_queue.cancel_join_thread()  # never block on exit for results nobody will read
        data_queue.close()
