"""engine.backend.parallel.parallel_for: results in range order, errors reach the caller, and a
call that finds the pool busy (a nested call, another thread's call) runs serially, never hangs."""
import threading
import time

import numpy as np
import pytest

from engine.backend import parallel


@pytest.fixture
def threads():
    before = parallel.get_num_threads()
    parallel.set_num_threads(3)
    yield
    parallel.set_num_threads(before)


BIG = 1 << 20  # enough work to use the threads


def test_ranges_cover_n_in_order_on_several_threads(threads):
    seen = []

    def fn(s, e):
        seen.append(threading.current_thread().name)
        time.sleep(0.05)  # long enough for every pool thread to wake and take a range
        return s, e

    out = parallel.parallel_for(fn, 10, work=BIG)
    assert out == [(0, 4), (4, 8), (8, 10)]
    assert len(set(seen)) == 3


def test_threads_take_the_next_free_range_and_sleepers_are_called_off(threads):
    """Ranges are taken one at a time: while the caller is busy with a slow range the pool
    threads run the others; quick ranges the caller finishes before any thread wakes are all
    its own, and the call neither waits for the sleeping threads nor leaves them a range."""
    runs = {}

    def fn(s, e):
        runs[s] = threading.current_thread().name
        if s == 0:
            time.sleep(0.2)
        return e - s

    assert parallel.parallel_for(fn, 12, work=BIG, per_thread=2) == [2] * 6
    assert runs[0] == threading.current_thread().name
    assert all(runs[s] != runs[0] for s in range(2, 12, 2))  # the others while range 0 slept
    runs.clear()
    for _ in range(20):
        assert parallel.parallel_for(lambda s, e: (s, e), 9, work=BIG, per_thread=3) == \
            [(s, s + 1) for s in range(9)]
    time.sleep(0.05)
    assert parallel.parallel_for(lambda s, e: e - s, 10, work=BIG) == [4, 4, 2]  # nothing left stuck


def test_an_error_in_a_pool_thread_reaches_the_caller_and_the_pool_still_works(threads):
    def fn(s, e):
        if s > 0:
            raise ValueError(f"range {s}:{e} failed")
        return s

    with pytest.raises(ValueError, match="range 4:8 failed"):
        parallel.parallel_for(fn, 10, work=BIG)
    assert parallel.parallel_for(lambda s, e: e - s, 10, work=BIG) == [4, 4, 2]


def test_an_error_on_the_calling_thread_waits_for_the_others(threads):
    started, finished = [], []

    def fn(s, e):
        started.append(s)
        if s == 0:
            time.sleep(0.02)  # the pool threads are running their ranges meanwhile
            raise KeyError("first range")
        time.sleep(0.1)
        finished.append(s)
        return s

    with pytest.raises(KeyError):
        parallel.parallel_for(fn, 10, work=BIG)
    at_return = sorted(finished)
    assert sorted(s for s in started if s != 0) == at_return  # every range that began had ended
    time.sleep(0.2)
    assert sorted(finished) == at_return  # and no range begins after the call returned


def test_nested_and_concurrent_calls_run_serially_with_the_same_ranges(threads):
    def inner(s, e):
        return parallel.parallel_for(lambda a, b: (a, b), 6, work=BIG)

    nested = parallel.parallel_for(inner, 9, work=BIG)
    assert nested == [[(0, 2), (2, 4), (4, 6)]] * 3
    results = {}

    def caller(i):
        results[i] = [parallel.parallel_for(lambda s, e: int(np.arange(s, e).sum()), 1000, work=BIG)
                      for _ in range(50)]

    ts = [threading.Thread(target=caller, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in ts)
    want = [int(np.arange(s, e).sum()) for s, e in [(0, 334), (334, 668), (668, 1000)]]
    assert all(r == [want] * 50 for r in results.values()) and len(results) == 4


def _in_child(q):
    q.put(parallel.parallel_for(lambda s, e: e - s, 10, work=BIG))


def test_a_forked_child_gets_its_own_threads(threads):
    import multiprocessing as mp

    parallel.parallel_for(lambda s, e: None, 10, work=BIG)  # the parent's threads exist
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_in_child, args=(q,))
    p.start()
    p.join(timeout=60)
    alive = p.is_alive()
    if alive:
        p.kill()
    assert not alive, "parallel_for hung in a forked child"
    assert p.exitcode == 0 and q.get(timeout=10) == [4, 4, 2]


# ------------------------------------------------------------------ copies on the threads
COPY_CASES = [
    ((16, 32, 32, 96), (0, 2, 1, 3)),  # a window partition's permute
    ((1, 1, 700, 400), (0, 1, 3, 2)),  # leading axes of 1: split along the first longer one
    ((3, 5, 7, 11), (3, 1, 0, 2)),  # small: numpy's own copy
    ((600, 500), (1, 0)),
]


@pytest.mark.parametrize("shape,perm", COPY_CASES)
def test_copy_and_reshape_of_permuted_arrays_equal_numpy(threads, shape, perm):
    a = np.random.default_rng(0).standard_normal(shape).astype(np.float32).transpose(perm)
    c = parallel.copy(a)
    assert c.flags.c_contiguous and c.dtype == a.dtype
    np.testing.assert_array_equal(c, a)
    r = parallel.reshape(a, (-1, a.shape[-1]))
    np.testing.assert_array_equal(r, np.reshape(a, (-1, a.shape[-1])))


def test_reshape_keeps_views_where_numpy_does(threads):
    base = np.zeros((64, 4096), np.float32)
    strided = base[:, ::2]  # not contiguous, but its rows split without a copy
    v = parallel.reshape(strided, (64, 2, 1024))
    assert np.shares_memory(v, base)
    assert np.shares_memory(parallel.reshape(base, (-1,)), base)


@pytest.mark.parametrize("shape,shifts,axes", [
    ((16, 32, 32, 96), (-2, -2), (1, 2)),  # Swin's shifted windows
    ((16, 32, 32, 96), (2, 2), (1, 2)),
    ((4, 300, 300), (7, -13), (1, 2)),
    ((4, 300, 300), (5, 1), (1, 1)),  # one axis twice: the shifts add up
    ((4, 300, 300), (0, 300), (1, 2)),  # whole turns
    ((300, 4, 300), (1,), (0,)),  # the split axis itself rolls: numpy's roll
])
def test_roll_equals_numpy(threads, shape, shifts, axes):
    a = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    np.testing.assert_array_equal(parallel.roll(a, shifts, axes), np.roll(a, shifts, axis=axes))
