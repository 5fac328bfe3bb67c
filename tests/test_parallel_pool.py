"""engine.backend.parallel.parallel_for: results in range order, errors reach the caller, and a
call that finds the pool busy (a nested call, another thread's call) runs serially, never hangs."""
import os
import subprocess
import sys
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


def _run_in_forked_child(target, what):
    """target(queue) in a forked child; what it put in the queue (the child must end in 60 s)."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=target, args=(q,))
    p.start()
    p.join(timeout=60)
    alive = p.is_alive()
    if alive:
        p.kill()
    assert not alive, f"{what} hung in a forked child"
    assert p.exitcode == 0
    return q.get(timeout=10)


def test_a_forked_child_gets_its_own_threads(threads):
    parallel.parallel_for(lambda s, e: None, 10, work=BIG)  # the parent's threads exist
    assert _run_in_forked_child(_in_child, "parallel_for") == [4, 4, 2]


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


# ------------------------------------------------------------------ the native lane
LANE_OPS = [np.add, np.subtract, np.multiply, np.true_divide]
LANE_N = (1 << 17) + 37  # above MIN_LANE_ELEMENTS, not a multiple of the ranges' alignment


@pytest.fixture
def polling(threads, monkeypatch):
    """The pool threads poll for ~0.4 s after each job, so that every lane call is shared."""
    if not parallel.lane_stats()["enabled"]:
        pytest.skip("the native lane needs numba (engine.backend.jit)")
    monkeypatch.setattr(parallel, "SPIN_CYCLES", 1 << 30)
    _wait_until_polling()
    yield


def _wait_until_polling(timeout=10.0):
    """Wake the pool threads (a lane call does) and wait until each polls its row."""
    x = np.ones(LANE_N, np.float32)
    parallel.parallel_ufunc(np.add, x, x)
    workers = parallel.get_num_threads() - 1
    end = time.monotonic() + timeout
    while not all(parallel._ctrl[i, 0] == 1 for i in range(workers)):  # _lane_kernels.SPIN
        assert time.monotonic() < end, f"pool threads never polled: {parallel._ctrl[:workers, 0]}"
        parallel.parallel_ufunc(np.add, x, x)  # wakes any that went back to sleep
        time.sleep(0.001)


def _operands(dtype, case, rng):
    a = rng.standard_normal((LANE_N // 37, 37)).astype(dtype)  # odd rows: ranges cut rows
    b = rng.standard_normal(a.shape).astype(dtype)
    b.flat[::97] = 0  # x / 0 and 0 / 0 as numpy gives them (inf, nan)
    a.flat[::193] = 0
    if case == "scalar":
        b = np.asarray(dtype(-1.75))
    elif case == "one element":
        b = b[:1, :1]
    return a, b


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("ufunc", LANE_OPS)
@pytest.mark.parametrize("case", ["arrays", "scalar", "one element", "same array", "into a", "into b"])
def test_lane_results_are_numpys_bits(polling, ufunc, dtype, case):
    rng = np.random.default_rng(LANE_OPS.index(ufunc))
    a, b = _operands(dtype, "arrays" if case in ("into b", "same array") else case, rng)
    if case == "same array":
        b = a
    with np.errstate(all="ignore"):
        want = ufunc(a, b)
    before = parallel.lane_stats()
    if case == "into a":
        out = parallel.parallel_ufunc(ufunc, a, b, out=a)
        assert out is a
    elif case == "into b":
        out = parallel.parallel_ufunc(ufunc, a, b, out=b)
        assert out is b
    else:
        out = parallel.parallel_ufunc(ufunc, a, b)
    after = parallel.lane_stats()
    assert after["calls"] == before["calls"] + 1 and after["shared"] == before["shared"] + 1
    assert out.dtype == want.dtype and out.shape == want.shape
    np.testing.assert_array_equal(out.view(np.uint8), want.view(np.uint8))  # the bits, nan included


_COUNT_COMPILES = """
import collections, numpy as np
from numba.core import event
compiled = collections.Counter()

class Count(event.Listener):
    def on_start(self, ev):
        compiled[ev.data["dispatcher"].py_func.__name__] += 1

    def on_end(self, ev):
        pass

event.register("numba:compile", Count())
from engine.backend import parallel
assert parallel.lane_stats()["enabled"]
for dtype in (np.float32, np.float64):
    a = np.ones(1 << 17, dtype)
    parallel.parallel_ufunc(np.multiply, a, a)
    parallel.parallel_ufunc(np.add, a, dtype(2), out=a)
    parallel.parallel_ufunc(np.subtract, a, a[:1].copy())
assert parallel.lane_stats()["calls"] == 6, parallel.lane_stats()
print(dict(compiled))
"""


def test_lane_kernels_compile_once_on_a_fresh_machine(tmp_path):
    """With an empty numba cache, every lane kernel compiles once: run_range (40 vectorised
    loops, seconds each time) once for all callers, run_parallel once per dtype. Callers that
    passed other argument types (uint64 addresses, literal constants) compiled run_range three
    times, and the first step of a fresh machine took 23 s instead of 11."""
    if not parallel.lane_stats()["enabled"]:
        pytest.skip("the native lane needs numba (engine.backend.jit)")
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), ENGINE_NUM_THREADS="2", ENGINE_JIT="1")
    proc = subprocess.run([sys.executable, "-c", _COUNT_COMPILES], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    compiled = eval(proc.stdout.strip().splitlines()[-1])
    assert compiled.get("run_range") == 1, compiled
    assert compiled.get("run_parallel") == 2 and compiled.get("serve") == 1, compiled


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_lane_declines_what_it_does_not_take(polling):
    """Broadcasts other than a scalar, mixed dtypes, strided operands and partial overlaps go
    to numpy's own loops, with numpy's results."""
    rng = np.random.default_rng(5)
    a = rng.standard_normal((512, 384)).astype(np.float32)
    row = rng.standard_normal(384).astype(np.float32)
    cases = [(a, row, None), (a, row.astype(np.float64), None), (a[:, ::2], a[:, 1::2], None),
             (a.astype(np.int32), a.astype(np.int32), None)]
    before = parallel.lane_stats()["calls"]
    for x, y, _ in cases:
        np.testing.assert_array_equal(parallel.parallel_ufunc(np.add, x, y), np.add(x, y))
    flat = a.reshape(-1).copy()
    want = flat[1:] + flat[:-1]
    parallel.parallel_ufunc(np.add, flat[1:], flat[:-1], out=flat[:-1])  # out overlaps a, shifted
    np.testing.assert_array_equal(flat[:-1], want)
    flat = a.reshape(-1).copy()
    want = flat[:-1] * flat[1:]
    parallel.parallel_ufunc(np.multiply, flat[:-1], flat[1:], out=flat[1:])  # out is b, a overlaps it shifted
    np.testing.assert_array_equal(flat[1:], want)
    flat = a.reshape(-1).copy()
    want = flat[1:] - flat[:-1]
    parallel.parallel_ufunc(np.subtract, flat[1:], flat[:-1], out=flat[1:])  # out is a, b overlaps it shifted
    np.testing.assert_array_equal(flat[1:], want)
    m = np.asmatrix(a)  # subclasses: numpy's loop (a matrix ravels to 2-D, a masked array not at all)
    np.testing.assert_array_equal(np.asarray(parallel.parallel_ufunc(np.add, m, m)), a + a)
    masked = np.ma.masked_array(a, mask=a > 1)
    got = parallel.parallel_ufunc(np.multiply, masked, masked)
    np.testing.assert_array_equal(np.ma.getdata(got)[a <= 1], (a * a)[a <= 1])
    frozen = a.copy()
    frozen.flags.writeable = False  # a read-only operand: numpy's loop, same result
    np.testing.assert_array_equal(parallel.parallel_ufunc(np.subtract, frozen, a), np.zeros_like(a))
    with pytest.raises(ValueError, match="read-only"):  # a read-only output: numpy's own error
        parallel.parallel_ufunc(np.add, a, a, out=frozen)
    assert parallel.lane_stats()["calls"] == before


@pytest.mark.parametrize("shift", ["out behind", "out ahead", "row of out"])
def test_partially_overlapping_output_gets_numpys_result_on_every_path(threads, shift):
    """Above the lane's and the cheap ufuncs' thresholds the call is split in ranges that run side
    by side; an input that overlaps the output without being it would be read where another
    range already wrote. Such calls take numpy's own loop, which buffers the overlap."""
    rng = np.random.default_rng(11)
    flat = rng.standard_normal((1 << 21) + 3).astype(np.float32)
    grid = flat[:(1 << 21)].reshape(2048, 1024)
    ref = flat.copy()
    ref_grid = ref[:(1 << 21)].reshape(2048, 1024)
    for arr, g in ((ref, ref_grid), (flat, grid)):
        call = parallel.parallel_ufunc if arr is flat else (lambda f, *xs, out: f(*xs, out=out))
        if shift == "out behind":
            call(np.maximum, arr[1:], arr[1:], out=arr[:-1])
        elif shift == "out ahead":
            call(np.maximum, arr[:-1], arr[:-1], out=arr[1:])
        else:
            call(np.add, g, g[1], out=g)  # a row of the output, broadcast as an operand
    np.testing.assert_array_equal(flat, ref)


def test_lane_and_python_calls_interleave_and_run_from_several_threads(polling):
    """Native jobs and Python calls on the same polling threads, from the main thread and from
    four others at once (one caller at a time gets the pool; the rest run alone): every result
    right, nothing hangs."""
    x = np.random.default_rng(2).standard_normal((1024, 200)).astype(np.float32)
    want_sum = [float(x[s:e].sum()) for s, e in [(0, 342), (342, 684), (684, 1024)]]

    def mixed(i):
        for k in range(30):
            np.testing.assert_array_equal(parallel.parallel_ufunc(np.multiply, x, x), x * x)
            assert parallel.parallel_for(lambda s, e: float(x[s:e].sum()), 1024, work=BIG) == want_sum
            if k % 7 == i % 7:
                time.sleep(0.002)  # let the threads go back to sleep now and then

    mixed(0)
    errors = []

    def guarded(i):
        try:
            mixed(i)
        except BaseException as e:  # reported below
            errors.append(e)

    ts = [threading.Thread(target=guarded, args=(i,)) for i in range(1, 5)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in ts), "a lane or pool call hung"
    assert not errors, errors


def test_lane_threads_sleep_when_idle_and_wake_for_the_next_call(threads, monkeypatch):
    if not parallel.lane_stats()["enabled"]:
        pytest.skip("the native lane needs numba (engine.backend.jit)")
    x = np.ones(LANE_N, np.float32)
    parallel.parallel_ufunc(np.add, x, x)
    workers = parallel.get_num_threads() - 1
    end = time.monotonic() + 10
    while not all(parallel._ctrl[i, 0] == 0 for i in range(workers)):  # all SLEEP: no CPU burnt
        assert time.monotonic() < end, f"pool threads still polling: {parallel._ctrl[:workers, 0]}"
        time.sleep(0.01)
    before = parallel.lane_stats()
    np.testing.assert_array_equal(parallel.parallel_ufunc(np.add, x, x), x + x)  # the caller alone
    assert parallel.lane_stats()["calls"] == before["calls"] + 1
    monkeypatch.setattr(parallel, "SPIN_CYCLES", 1 << 30)  # (so that they stay awake to be seen)
    _wait_until_polling()  # and the call woke them


def _lane_in_child(q):
    x = np.arange(LANE_N, dtype=np.float32)
    q.put(bool(np.array_equal(parallel.parallel_ufunc(np.subtract, x, x), np.zeros_like(x))))


def test_a_forked_child_uses_the_lane_with_its_own_threads(polling):
    assert _run_in_forked_child(_lane_in_child, "a lane call") is True


def test_engine_pool_spin_0_turns_the_lane_off():
    import subprocess
    import sys

    code = ("import numpy as np; from engine.backend import parallel as p; p.set_num_threads(2); "
            "p.parallel_for(lambda s, e: None, 10, work=1 << 20); "
            "x = np.ones((1 << 18,), np.float32); assert np.array_equal(p.parallel_ufunc(np.add, x, x), x + x); "
            "s = p.lane_stats(); assert not s['enabled'] and s['calls'] == 0, s; "
            "assert p._workers and all(type(w) is p._Worker for w in p._workers), p._workers; print('ok')")
    env = dict(__import__("os").environ, ENGINE_POOL_SPIN="0", ENGINE_JIT="1")  # the lane off by this switch alone
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


@pytest.mark.parametrize("variable", [None, "1"], ids=["unset", "OPENBLAS_NUM_THREADS=1"])
def test_numpy_blas_runs_one_thread_after_import_engine(variable):
    """The engine's own pool splits the work, so numpy's OpenBLAS is held to one thread: by
    threadpoolctl, or (without importing it) by OPENBLAS_NUM_THREADS=1, which OpenBLAS read."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    if variable is not None:
        env["OPENBLAS_NUM_THREADS"] = variable
    code = ("import sys, engine\n"
            "print('threadpoolctl' in sys.modules)\n"
            "from threadpoolctl import threadpool_info\n"
            "print([i['num_threads'] for i in threadpool_info() if i['internal_api'] == 'openblas' "
            "and 'numpy' in i['filepath']])\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         check=True).stdout.split("\n")
    assert out[0] == str(variable is None)  # threadpoolctl imported only when it has work to do
    assert out[1] == "[1]"
