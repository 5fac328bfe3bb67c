"""engine.utils.data against torch.utils.data: sampler orders, collation, DataLoader batches with
and without worker processes, worker errors / deaths / timeouts, IterableDataset sharding, and
DistributedSampler partitions."""
import gc
import os
import random
import signal
import sys
import time
import warnings
from collections import OrderedDict, namedtuple

import numpy as np
import pytest
import torch
import torch.utils.data as tud

import engine as flow
from engine.utils import data as fud
from engine.utils.data import distributed as fdist
from engine.utils.data.worker import generate_state

Pair = namedtuple("Pair", "a b")


def _to_np(x):
    return x.detach().numpy()  # an engine or a torch tensor


def _assert_same(e, t, where="batch"):
    """An engine batch equals torch's (or another engine batch): same container types (namedtuples
    too), dtypes and values."""
    if isinstance(t, (torch.Tensor, flow.Tensor)):
        assert isinstance(e, flow.Tensor), (where, type(e))
        assert e.dtype.name == str(t.dtype).replace("torch.", "").replace("engine.", ""), (where, e.dtype, t.dtype)
        assert tuple(e.shape) == tuple(t.shape), where
        np.testing.assert_array_equal(_to_np(e), _to_np(t), err_msg=where)
    elif isinstance(t, dict):
        assert type(e) is type(t) and list(e) == list(t), where
        for k in t:
            _assert_same(e[k], t[k], f"{where}/{k}")
    elif isinstance(t, (list, tuple)):
        assert type(e) is type(t) and len(e) == len(t), (where, type(e), type(t))
        for i, (a, b) in enumerate(zip(e, t)):
            _assert_same(a, b, f"{where}/{i}")
    else:
        assert type(e) is type(t) and e == t, where


def _raises_like(fn_engine, fn_torch):
    """Both calls raise, with the same exception type."""
    with pytest.raises(Exception) as te:
        fn_torch()
    with pytest.raises(type(te.value)):
        fn_engine()


# ------------------------------------------------------------------ samplers
@pytest.mark.parametrize("n", [0, 1, 7, 10])
@pytest.mark.parametrize("batch_size", [1, 3, 4])
@pytest.mark.parametrize("drop_last", [False, True])
def test_sequential_and_batch_sampler_match_torch(n, batch_size, drop_last):
    data = list(range(n))
    assert list(fud.SequentialSampler(data)) == list(tud.SequentialSampler(data))
    keys = [5, 2, 9, 1, 0, 3, 8, 6, 4, 7][:n]  # any iterable of keys, e.g. a shuffled order
    e = fud.BatchSampler(keys, batch_size, drop_last)
    t = tud.BatchSampler(keys, batch_size, drop_last)
    assert list(e) == list(t) and len(e) == len(t)


def test_sampler_argument_errors_match_torch():
    for args in [(0, False), (-1, False), (True, False), (2.0, False), (2, None)]:
        _raises_like(lambda: fud.BatchSampler(range(4), *args), lambda: tud.BatchSampler(range(4), *args))
    for kw in [dict(replacement=1), dict(num_samples=0), dict(num_samples=-2), dict(num_samples=1.5)]:
        _raises_like(lambda: fud.RandomSampler(range(4), **kw), lambda: tud.RandomSampler(range(4), **kw))
    _raises_like(lambda: fud.RandomSampler([]), lambda: tud.RandomSampler([]))
    for args, kw in [(([1.0, 2.0], 0), {}), (([1.0, 2.0], 2), dict(replacement=0)), (([[1.0]], 1), {})]:
        _raises_like(lambda: fud.WeightedRandomSampler(*args, **kw), lambda: tud.WeightedRandomSampler(*args, **kw))
    _raises_like(lambda: list(fud.WeightedRandomSampler([1.0, 2.0], 3, replacement=False)),
                 lambda: list(tud.WeightedRandomSampler([1.0, 2.0], 3, replacement=False)))
    with pytest.raises(TypeError, match="engine.Generator"):
        fud.RandomSampler(range(3), generator=torch.Generator())


def test_random_sampler_permutations_and_reproducibility():
    n = 13
    order = list(fud.RandomSampler(range(n), generator=flow.Generator().manual_seed(3)))
    assert sorted(order) == list(range(n)) and order != list(range(n))
    assert order == list(fud.RandomSampler(range(n), generator=flow.Generator().manual_seed(3)))
    s = fud.RandomSampler(range(n), generator=flow.Generator().manual_seed(3))
    assert list(s) != list(s)  # a new permutation each pass
    # more samples than items without replacement: whole permutations, then a partial one (as torch)
    long = list(fud.RandomSampler(range(n), num_samples=2 * n + 4, generator=flow.Generator().manual_seed(0)))
    assert len(long) == 2 * n + 4 and sorted(long[:n]) == sorted(long[n:2 * n]) == list(range(n))
    assert len(set(long[2 * n:])) == 4
    rep = fud.RandomSampler(range(n), replacement=True, num_samples=70, generator=flow.Generator().manual_seed(1))
    drawn = list(rep)
    assert len(drawn) == len(rep) == 70 and all(0 <= i < n for i in drawn) and len(set(drawn)) < 70
    flow.manual_seed(5)  # without a generator: seeded from the default one
    a = list(fud.RandomSampler(range(n)))
    flow.manual_seed(5)
    assert list(fud.RandomSampler(range(n))) == a


def test_subset_and_weighted_samplers():
    idx = [10, 3, 7, 22, 5]
    s = fud.SubsetRandomSampler(idx, generator=flow.Generator().manual_seed(0))
    out = list(s)
    assert sorted(out) == sorted(idx) and len(s) == 5
    w = fud.WeightedRandomSampler([0.0, 1.0, 3.0, 0.0, 2.0], 200, generator=flow.Generator().manual_seed(0))
    drawn = list(w)
    assert len(drawn) == len(w) == 200 and set(drawn) <= {1, 2, 4}
    counts = np.bincount(drawn, minlength=5)
    assert counts[2] > counts[4] > counts[1]
    nr = list(fud.WeightedRandomSampler([1.0, 1.0, 5.0, 1.0], 4, replacement=False,
                                        generator=flow.Generator().manual_seed(0)))
    assert sorted(nr) == [0, 1, 2, 3]


@pytest.mark.parametrize("n", [0, 1, 5, 7, 10, 13])
@pytest.mark.parametrize("replicas", [1, 2, 3, 4])
@pytest.mark.parametrize("drop_last", [False, True])
def test_distributed_sampler_partitions_match_torch(n, replicas, drop_last):
    data = list(range(n))
    for rank in range(replicas):
        e = fud.DistributedSampler(data, replicas, rank, shuffle=False, drop_last=drop_last)
        t = tud.DistributedSampler(data, replicas, rank, shuffle=False, drop_last=drop_last)
        assert list(e) == list(t) and len(e) == len(t) and e.total_size == t.total_size
    shuffled = [list(fud.DistributedSampler(data, replicas, r, shuffle=True, seed=7, drop_last=drop_last))
                for r in range(replicas)]
    assert [len(p) for p in shuffled] == [len(tud.DistributedSampler(data, replicas, r, drop_last=drop_last))
                                          for r in range(replicas)]
    flat = sorted(i for p in shuffled for i in p)
    if drop_last:
        assert len(set(flat)) == len(flat)
    else:
        assert set(flat) == set(data)


def test_distributed_sampler_epochs_and_defaults(monkeypatch):
    data = list(range(40))
    a = fud.DistributedSampler(data, 2, 0, seed=1)
    b = fud.DistributedSampler(data, 2, 1, seed=1)
    first = list(a) + list(b)
    assert sorted(first) == data and list(a) == list(fud.DistributedSampler(data, 2, 0, seed=1))
    a.set_epoch(1)
    b.set_epoch(1)
    assert sorted(list(a) + list(b)) == data and list(a) + list(b) != first
    for bad in [(2, 2), (2, -1)]:
        _raises_like(lambda: fud.DistributedSampler(data, *bad), lambda: tud.DistributedSampler(data, *bad))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    if not flow.distributed.comm.is_initialized():
        s = fud.DistributedSampler(data)  # no MPI started: one replica, rank 0, and MPI still not started
        assert (s.num_replicas, s.rank) == (1, 0) and not flow.distributed.comm.is_initialized()
        monkeypatch.setenv("WORLD_SIZE", "4")
        monkeypatch.setenv("RANK", "3")
        s = fud.DistributedSampler(data)  # what engine.distributed.launch exports
        assert (s.num_replicas, s.rank) == (4, 3)
    monkeypatch.setattr(fdist, "_world_info_source", lambda: (3, 1))  # engine.distributed's hook, MPI up
    s = fud.DistributedSampler(data)
    assert (s.num_replicas, s.rank) == (3, 1)


# ------------------------------------------------------------------ datasets
def test_datasets_match_torch():
    a, b = list(range(5)), list(range(100, 103))
    e, t = fud.ConcatDataset([a, b]), tud.ConcatDataset([a, b])
    assert len(e) == len(t) and e.cumulative_sizes == t.cumulative_sizes
    assert [e[i] for i in range(-8, 8)] == [t[i] for i in range(-8, 8)]
    for i in (8, -9):
        _raises_like(lambda: e[i], lambda: t[i])
    _raises_like(lambda: fud.ConcatDataset([]), lambda: tud.ConcatDataset([]))
    sub_e, sub_t = fud.Subset(a, [4, 0, 2]), tud.Subset(a, [4, 0, 2])
    assert [sub_e[i] for i in range(3)] == [sub_t[i] for i in range(3)] and len(sub_e) == 3
    assert sub_e.__getitems__([2, 0]) == sub_t.__getitems__([2, 0])
    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    ds = fud.TensorDataset(flow.tensor(x), flow.arange(6))
    tds = tud.TensorDataset(torch.tensor(x), torch.arange(6))
    assert len(ds) == 6
    for i in range(6):
        _assert_same(ds[i], tds[i])
    _raises_like(lambda: fud.TensorDataset(flow.ones(3), flow.ones(4)),
                 lambda: tud.TensorDataset(torch.ones(3), torch.ones(4)))
    added = fud.Subset(a, [0]) + fud.Subset(b, [1])
    assert isinstance(added, fud.ConcatDataset) and [added[0], added[1]] == [0, 101]


class _Range(fud.IterableDataset):
    def __init__(self, start, end):
        self.start, self.end = start, end

    def __iter__(self):
        return iter(range(self.start, self.end))

    def __len__(self):
        return self.end - self.start


def test_chain_dataset_and_random_split():
    chained = _Range(0, 3) + _Range(10, 12)
    assert isinstance(chained, fud.ChainDataset) and list(chained) == [0, 1, 2, 10, 11] and len(chained) == 5
    for n, lengths in [(10, [3, 7]), (31, [0.3, 0.3, 0.4]), (7, [0.5, 0.5]), (5, [1.0])]:
        data = list(range(n))
        e = fud.random_split(data, lengths, generator=flow.Generator().manual_seed(0))
        t = tud.random_split(data, lengths, generator=torch.Generator().manual_seed(0))
        assert [len(s) for s in e] == [len(s) for s in t]  # the same split sizes
        got = sorted(i for s in e for i in (s[j] for j in range(len(s))))
        assert got == data
    again = fud.random_split(list(range(10)), [3, 7], generator=flow.Generator().manual_seed(0))
    assert again[0].indices == fud.random_split(list(range(10)), [3, 7],
                                                generator=flow.Generator().manual_seed(0))[0].indices
    _raises_like(lambda: fud.random_split(list(range(5)), [2, 2]), lambda: tud.random_split(list(range(5)), [2, 2]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _raises_like(lambda: fud.random_split(list(range(5)), [1.5, -0.5]),
                     lambda: tud.random_split(list(range(5)), [1.5, -0.5]))


# ------------------------------------------------------------------ collate
def _samples(rng, n=4, torch_side=False):
    T = torch.tensor if torch_side else flow.tensor
    out = []
    for i in range(n):
        out.append({
            "x": rng.standard_normal((2, 3)).astype(np.float32),
            "t": T(rng.standard_normal(3)),
            "i": i, "f": float(i) / 3, "flag": bool(i % 2), "s": f"s{i}", "by": b"b",
            "np_scalar": np.float32(i), "np_int": np.int16(i), "zero_d": np.array(i, dtype=np.int32),
            "pair": Pair(i, np.full(2, i, np.int64)), "tup": (i, f"t{i}"), "lst": [i, float(i)],
            "od": OrderedDict([("z", i), ("a", np.ones(1, np.uint8))]),
        })
    return out


def test_default_collate_matches_torch():
    e = fud.default_collate(_samples(np.random.default_rng(0)))
    t = tud.default_collate(_samples(np.random.default_rng(0), torch_side=True))
    _assert_same(e, t)
    assert e["x"].device == flow.device("cpu")
    _assert_same(fud.default_collate([1.5, 2.0]), tud.default_collate([1.5, 2.0]))
    _assert_same(fud.default_collate([(1, 2), (3, 4)]), tud.default_collate([(1, 2), (3, 4)]))
    for bad in ([object(), object()], [[1, 2], [1]], [np.array(["a"]), np.array(["b"])],
                [np.ones(2), np.ones(3)], [flow.ones(2), flow.ones(3)]):
        tbad = [torch.ones(2), torch.ones(3)] if isinstance(bad[0], flow.Tensor) else bad
        _raises_like(lambda: fud.default_collate(bad), lambda: tud.default_collate(tbad))


def test_default_convert_matches_torch():
    sample = {"a": np.arange(3), "b": (np.float64(2.5), "s", [np.ones(2, np.float32)]),
              "p": Pair(np.int32(1), 2), "strs": np.array(["x"])}
    e, t = fud.default_convert(sample), tud.default_convert(sample)
    assert e["strs"] is sample["strs"] and t["strs"] is sample["strs"]
    e.pop("strs"), t.pop("strs")
    _assert_same(e, t)


# ------------------------------------------------------------------ DataLoader
class _Dict(fud.Dataset):
    """Samples of several kinds; module level so that worker processes can use it."""

    def __init__(self, n, fail_at=None, exc=ValueError, sleep_at=None, die_at=None, kill_at=None):
        self.n, self.fail_at, self.exc, self.sleep_at, self.die_at, self.kill_at = n, fail_at, exc, sleep_at, \
            die_at, kill_at

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.fail_at:
            self._explode(i)
        if i == self.sleep_at:
            time.sleep(30)
        if i == self.die_at:
            os._exit(3)
        if i == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        rng = np.random.default_rng(i)
        return {"x": rng.standard_normal((2, 3)).astype(np.float32), "i": i, "f": i / 7, "name": f"n{i}",
                "t": flow.tensor(rng.integers(0, 9, 4))}

    def _explode(self, i):
        raise self.exc(f"boom at {i}")


class _TorchDict(tud.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        rng = np.random.default_rng(i)
        return {"x": rng.standard_normal((2, 3)).astype(np.float32), "i": i, "f": i / 7, "name": f"n{i}",
                "t": torch.tensor(rng.integers(0, 9, 4))}


@pytest.mark.parametrize("batch_size, drop_last", [(3, False), (3, True), (1, False), (None, False)])
def test_dataloader_matches_torch_without_workers(batch_size, drop_last):
    e = list(fud.DataLoader(_Dict(10), batch_size=batch_size, drop_last=drop_last))
    t = list(tud.DataLoader(_TorchDict(10), batch_size=batch_size, drop_last=drop_last))
    assert len(e) == len(t) == len(fud.DataLoader(_Dict(10), batch_size=batch_size, drop_last=drop_last))
    for a, b in zip(e, t):
        _assert_same(a, b)


def test_workers_give_the_same_batches_in_order():
    kw = dict(batch_size=3, shuffle=True)
    single = list(fud.DataLoader(_Dict(17), generator=flow.Generator().manual_seed(4), **kw))
    multi = list(fud.DataLoader(_Dict(17), num_workers=2, generator=flow.Generator().manual_seed(4), **kw))
    assert len(single) == len(multi) == 6
    for a, b in zip(single, multi):
        _assert_same(b, a)
    assert isinstance(multi[0]["x"], flow.Tensor) and multi[0]["x"].device == flow.device("cpu")
    multi[0]["x"].add_(1.0)  # batches from workers are ordinary writable tensors
    np.testing.assert_array_equal(multi[0]["x"].numpy(), single[0]["x"].numpy() + 1.0)
    # prefetch_factor, pin_memory (a no-op) and in_order=False change nothing but the order
    other = list(fud.DataLoader(_Dict(17), num_workers=3, prefetch_factor=1, pin_memory=True, in_order=False,
                                batch_size=3))
    assert sorted(int(i) for b in other for i in b["i"].tolist()) == list(range(17))


def test_persistent_workers_keep_their_processes():
    loader = fud.DataLoader(_Dict(9), batch_size=2, num_workers=2, persistent_workers=True)
    first = list(loader)
    pids = [w.pid for w in loader._iterator._workers]
    second = list(loader)
    assert [w.pid for w in loader._iterator._workers] == pids and all(w.is_alive() for w in loader._iterator._workers)
    for a, b in zip(first, second):
        _assert_same(a, b)
    it = loader._iterator
    del loader
    gc.collect()
    it._shutdown_workers()
    assert not any(w.is_alive() for w in it._workers)


def test_worker_exception_is_reraised_with_its_traceback():
    loader = fud.DataLoader(_Dict(8, fail_at=5), batch_size=2, num_workers=2)
    with pytest.raises(ValueError) as info:
        list(loader)
    msg = str(info.value)
    assert "in DataLoader worker process 0" in msg and "boom at 5" in msg
    assert "Traceback (most recent call last)" in msg and "_explode" in msg
    with pytest.raises(KeyError, match="in DataLoader worker process"):
        list(fud.DataLoader(_Dict(4, fail_at=1, exc=KeyError), batch_size=1, num_workers=2))
    with pytest.raises(ValueError, match="boom at 5"):  # the same without workers: the plain exception
        list(fud.DataLoader(_Dict(8, fail_at=5), batch_size=2))


def _unpicklable_collate(batch):
    return lambda: batch


def test_unpicklable_batch_is_an_error_not_a_hang():
    with pytest.raises(Exception, match="while pickling the batch"):
        list(fud.DataLoader(_Dict(4), batch_size=2, num_workers=1, collate_fn=_unpicklable_collate, timeout=20))


def test_timeout_is_honoured():
    loader = fud.DataLoader(_Dict(6, sleep_at=2), batch_size=1, num_workers=1, timeout=0.5)
    it = iter(loader)
    assert int(next(it)["i"]) == 0 and int(next(it)["i"]) == 1
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"timed out after 0.5 seconds"):
        next(it)
    assert time.monotonic() - start < 5
    workers = it._workers
    del it
    gc.collect()
    assert not any(w.is_alive() for w in workers)  # the sleeping worker was terminated


@pytest.mark.parametrize("kw, reason", [(dict(die_at=3), "exit code 3"), (dict(kill_at=3), "SIGKILL")])
def test_a_dying_worker_raises_instead_of_hanging(kw, reason):
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=f"exited unexpectedly.*{reason}"):
        list(fud.DataLoader(_Dict(8, **kw), batch_size=1, num_workers=2))
    assert time.monotonic() - start < 10


def test_early_break_and_garbage_collection_stop_the_workers():
    it = iter(fud.DataLoader(_Dict(100), batch_size=2, num_workers=2))
    next(it)
    workers = list(it._workers)
    assert all(w.is_alive() for w in workers)
    del it
    gc.collect()
    assert not any(w.is_alive() for w in workers)


class _ShardedRange(fud.IterableDataset):
    """torch's documented pattern: each worker takes its own contiguous slice of the range."""

    def __init__(self, start, end):
        self.start, self.end = start, end

    def _bounds(self, info):
        if info is None:
            return self.start, self.end
        per = int(np.ceil((self.end - self.start) / info.num_workers))
        lo = self.start + info.id * per
        return lo, min(lo + per, self.end)

    def __iter__(self):
        return iter(range(*self._bounds(fud.get_worker_info())))


class _TorchShardedRange(tud.IterableDataset):
    def __init__(self, start, end):
        self.start, self.end = start, end

    def __iter__(self):
        return iter(range(*_ShardedRange._bounds(self, tud.get_worker_info())))


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # torch's advice for this 2-core machine
@pytest.mark.parametrize("workers, batch_size, drop_last", [(0, 4, False), (2, 4, False), (3, 2, True),
                                                             (2, None, False)])
def test_iterable_dataset_sharding_matches_torch(workers, batch_size, drop_last):
    e = list(fud.DataLoader(_ShardedRange(3, 20), batch_size=batch_size, num_workers=workers, drop_last=drop_last))
    t = list(tud.DataLoader(_TorchShardedRange(3, 20), batch_size=batch_size, num_workers=workers,
                            drop_last=drop_last))
    assert len(e) == len(t)
    for a, b in zip(e, t):
        _assert_same(a, b)
    assert fud.get_worker_info() is None


class _WorkerReport(fud.Dataset):
    """What each worker sees: its info and its first random draws."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        info = fud.get_worker_info()
        try:
            import mpi4py  # noqa: F401
            mpi = "imported"
        except ImportError:
            mpi = "blocked"
        return {"id": info.id, "num_workers": info.num_workers, "seed": info.seed, "same_dataset": info.dataset is
                not None, "py": random.random(), "np": float(np.random.random_sample()),
                "engine": float(flow.rand(()).item()), "mpi": mpi, "init": os.environ.get("_TEST_WORKER_INIT")}


def _init_fn(worker_id):
    os.environ["_TEST_WORKER_INIT"] = f"init {worker_id}"


def test_worker_info_seeding_and_init_fn():
    """Worker k seeds random / the engine with base_seed + k and numpy with torch's generate_state."""
    loader = fud.DataLoader(_WorkerReport(), batch_size=None, num_workers=2, worker_init_fn=_init_fn,
                            generator=flow.Generator().manual_seed(11))
    first = list(loader)[:2]  # the first item of worker 0, then of worker 1
    again = list(fud.DataLoader(_WorkerReport(), batch_size=None, num_workers=2, worker_init_fn=_init_fn,
                                generator=flow.Generator().manual_seed(11)))[:2]
    assert [r["py"] for r in first] == [r["py"] for r in again]
    base = first[0]["seed"]
    for wid, r in enumerate(first):
        assert r["id"] == wid and r["num_workers"] == 2 and r["seed"] == base + wid and r["same_dataset"]
        assert r["init"] == f"init {wid}"
        assert r["py"] == random.Random(base + wid).random()
        assert r["np"] == np.random.RandomState(generate_state(base, wid)).random_sample()
        assert r["engine"] == flow.rand((), generator=flow.Generator().manual_seed(base + wid)).item()
    assert first[0]["py"] != first[1]["py"]
    for base_seed in (0, 1, 2**40 + 7, 2**63 - 5):
        for wid in (0, 3):
            assert generate_state(base_seed, wid) == torch.utils.data._utils.worker._generate_state(base_seed, wid)
    if "mpi4py" not in sys.modules:  # a worker never imports MPI
        assert {r["mpi"] for r in first} == {"blocked"}


def test_spawned_workers():
    """A fresh interpreter per worker: everything it needs is pickled, and MPI stays out of it."""
    loader = fud.DataLoader(_WorkerReport(), batch_size=2, num_workers=1, multiprocessing_context="spawn",
                            worker_init_fn=_init_fn,
                            generator=flow.Generator().manual_seed(2))
    batches = list(loader)
    assert len(batches) == 2 and batches[0]["mpi"] == ["blocked", "blocked"]
    assert batches[0]["seed"].tolist() == [batches[0]["seed"].tolist()[0]] * 2
    assert isinstance(batches[0]["py"], flow.Tensor) and batches[0]["py"].dtype is flow.float64


def test_dataloader_length_and_argument_errors_match_torch():
    for kw in [dict(batch_size=3), dict(batch_size=3, drop_last=True), dict(batch_size=None)]:
        assert len(fud.DataLoader(list(range(10)), **kw)) == len(tud.DataLoader(list(range(10)), **kw))
        assert len(fud.DataLoader(_Range(0, 10), **kw)) == len(tud.DataLoader(_Range(0, 10), **kw))
    data = list(range(4))
    cases = [dict(num_workers=-1), dict(timeout=-1), dict(prefetch_factor=2), dict(persistent_workers=True),
             dict(sampler=[0, 1], shuffle=True), dict(batch_sampler=[[0]], batch_size=2),
             dict(batch_sampler=[[0]], drop_last=True), dict(batch_size=None, drop_last=True),
             dict(num_workers=1, prefetch_factor=-1), dict(multiprocessing_context="fork")]
    with pytest.raises(ValueError, match="prefetch_factor option should be positive"):
        fud.DataLoader(data, num_workers=1, prefetch_factor=0)
    for kw in cases:
        _raises_like(lambda: fud.DataLoader(data, **kw), lambda: tud.DataLoader(data, **kw))
    _raises_like(lambda: fud.DataLoader(_Range(0, 3), shuffle=True),
                 lambda: tud.DataLoader(_TorchShardedRange(0, 3), shuffle=True))
    _raises_like(lambda: fud.DataLoader(data, num_workers=1, multiprocessing_context="nope"),
                 lambda: tud.DataLoader(data, num_workers=1, multiprocessing_context="nope"))
    loader = fud.DataLoader(data, batch_size=2)
    with pytest.raises(ValueError, match="batch_size attribute should not be set"):
        loader.batch_size = 3
    loader.num_workers = 0  # not frozen, as in torch
    batches = [b.tolist() for b in fud.DataLoader(data, batch_sampler=[[3, 1], [0]])]
    assert batches == [[3, 1], [0]]
