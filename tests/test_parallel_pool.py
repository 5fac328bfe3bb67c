"""engine.backend.parallel.parallel_for: results in range order, errors reach the caller, and a
call that finds the pool busy (a nested call, another thread's call) runs serially, never hangs."""
import threading

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
    out = parallel.parallel_for(lambda s, e: (s, e, seen.append(threading.current_thread().name)), 10,
                                work=BIG)
    assert [(s, e) for s, e, _ in out] == [(0, 4), (4, 8), (8, 10)]
    assert len(set(seen)) == 3


def test_an_error_in_a_pool_thread_reaches_the_caller_and_the_pool_still_works(threads):
    def fn(s, e):
        if s > 0:
            raise ValueError(f"range {s}:{e} failed")
        return s

    with pytest.raises(ValueError, match="range 4:8 failed"):
        parallel.parallel_for(fn, 10, work=BIG)
    assert parallel.parallel_for(lambda s, e: e - s, 10, work=BIG) == [4, 4, 2]


def test_an_error_on_the_calling_thread_waits_for_the_others(threads):
    finished = []

    def fn(s, e):
        if s == 0:
            raise KeyError("first range")
        finished.append(s)
        return s

    with pytest.raises(KeyError):
        parallel.parallel_for(fn, 10, work=BIG)
    assert sorted(finished) == [4, 8]  # nothing still running after the call returned


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
