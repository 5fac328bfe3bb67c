"""Splitting large CPU kernels over threads: the engine owns its CPU parallelism.

numpy runs each ufunc on one thread, while PyTorch spreads elementwise work over all cores. numpy
releases the GIL inside its loops, so a kernel applied to disjoint row ranges from a small thread
pool runs in parallel. `parallel_for` is the one place that does this; kernels decide what a
"row" is. CuPy arrays never come here (the GPU is already parallel).

Matrix products are split the same way (`matmul`), each piece one sequential MKL product where
MKL is in use (engine.backend.mkl) and otherwise numpy's, with numpy's OpenBLAS held to one thread.
Two thread pools on the same cores fight: OpenBLAS workers spin for a while after each product,
and measured in a GPT-2 block that slowed the elementwise kernels between products by a third.
One pool, ours, for everything avoids it at no cost to the products themselves.

Threads: `ENGINE_NUM_THREADS` if set, else the CPUs this process may use, capped at 8. The
launcher (engine.distributed.launch) sets it per rank so ranks don't oversubscribe cores.

Determinism: the ranges depend only on the sizes and the thread count, never on timing, and
`parallel_for` hands back the results in range order. A kernel that reduces over ranges (or over
the blocks of engine.ops._kernels.blocked) returns its partial results and combines them in that
order; a shared accumulator or a list appended to from the threads would follow whichever
thread finishes first, and the same run would round differently from one time to the next.
"""
import os
import threading

import numpy as np

from . import buffers, mkl


def _default_threads():
    env = os.environ.get("ENGINE_NUM_THREADS")
    if env:
        return max(1, int(env))
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        n = os.cpu_count() or 1
    return max(1, min(8, n))


_threads = _default_threads()


def _hold_numpy_blas_to_one_thread():
    """Limit only numpy's own OpenBLAS (not, e.g., a BLAS that another library loaded)."""
    if os.environ.get("OPENBLAS_NUM_THREADS") == "1":
        return  # OpenBLAS read it when numpy loaded it; skips threadpoolctl's ~10 ms scan of the libraries
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # pragma: no cover - a dependency; without it BLAS keeps its threads
        return
    for lib in ThreadpoolController().lib_controllers:
        if lib.internal_api == "openblas" and "numpy" in (lib.filepath or ""):
            lib.set_num_threads(1)


_hold_numpy_blas_to_one_thread()

# below this many elements a kernel runs on the calling thread: a thread hand-off costs ~50 us
MIN_PARALLEL_ELEMENTS = 1 << 17
# ufuncs that cost about one memory pass per element: split only when the operands outgrow the
# cache. Measured on the 2-core machine (float32, [8, 256, 384] = 786k elements): np.add 0.16 ms
# on one thread, 0.32 ms split over two (the hand-off and the second core's cold cache); at 2M
# elements 0.75 vs 0.58 ms. A costly ufunc (tanh, power, fmod) gains from 64k elements on.
MIN_PARALLEL_CHEAP = 1 << 20
CHEAP_UFUNCS = frozenset((np.add, np.subtract, np.multiply, np.true_divide, np.negative, np.maximum, np.minimum,
                          np.equal, np.not_equal, np.less, np.less_equal, np.greater, np.greater_equal,
                          np.logical_and, np.logical_or, np.logical_xor, np.logical_not, np.absolute, np.square))


def get_num_threads():
    return _threads


def set_num_threads(n):
    """Threads used by the engine's CPU kernels (like torch.set_num_threads)."""
    global _threads
    _threads = max(1, int(n))  # (pool threads beyond it stay parked on their locks)


class _Worker:
    """One pool thread with a lock-pair hand-off: `start` gives it a call, `join` waits for it,
    `cancel` takes back a call it has not picked up yet.

    Lighter than concurrent.futures (no Future, Condition or queue per call: ~30 us less per
    parallel call, measured ~190 calls per BERT training step)."""

    def __init__(self, name):
        self._go = threading.Lock()
        self._done = threading.Lock()
        self._go.acquire()
        self._done.acquire()
        self._call = None
        self._result = self._error = None
        threading.Thread(target=self._loop, name=name, daemon=True).start()

    def _loop(self):
        while True:
            self._go.acquire()
            self._run_call()
            self._done.release()

    def _run_call(self):
        fn, args = self._call
        try:
            self._result, self._error = fn(*args), None
        except BaseException as e:  # handed to the caller in join()
            self._result, self._error = None, e
        # drop the call: its closure holds the kernel's arrays, and a reference kept here
        # would make them look shared (no buffer reuse, no gradient adoption)
        self._call = fn = args = None

    def start(self, fn, *args):
        self._call = (fn, args)
        self._go.release()

    def cancel(self):
        """Take back the call if the thread has not woken up for it yet: True, and nothing to
        join; False when it is running (or ran) it, and `join` must follow."""
        if self._go.acquire(blocking=False):
            self._call = None
            return True
        return False

    def join(self):
        self._done.acquire()
        result, error = self._result, self._error
        self._result = self._error = None
        if error is not None:
            raise error
        return result


class _PollingWorker(_Worker):
    """A pool thread that, between calls, polls its row of the native lane's control array
    for SPIN_CYCLES without the GIL (engine.backend._lane_kernels has the states): it runs the
    lane's elementwise jobs there, in native code, and picks up a Python call from the same
    loop. After SPIN_CYCLES idle it sleeps on `_go` as a plain `_Worker` does, and a caller
    wakes it (`wake`) for the next job.

    Why poll: a thread asleep in a futex takes 10-80 us to run again on this VM (its vCPU has
    halted), which a 100 us elementwise kernel cannot repay; PyTorch's OpenMP threads poll the
    same way after each parallel region. A polling thread takes a native job within a
    microsecond. A Python call still needs the GIL, which the caller holds until its own
    range starts, so it gains nothing there."""

    def __init__(self, name, lane, row):
        self._lane, self._row = lane, row
        super().__init__(name)

    def _loop(self):
        lane, row = self._lane, self._row
        while True:  # the row says SLEEP here (a new thread's starts so)
            self._go.acquire()  # start() or wake() released it
            claimed = lane.swap_state(row, lane.PYTHON, lane.RUNNING)
            if not claimed:
                lane.swap_state(row, lane.WAKING, lane.SPIN)  # woken, or its call taken back
            while claimed or lane.serve(row, SPIN_CYCLES) == lane.RUNNING:
                claimed = False
                self._run_call()
                lane.set_state(row, lane.SPIN)
                self._done.release()

    def start(self, fn, *args):
        self._call = (fn, args)
        lane, row = self._lane, self._row
        while True:  # the thread moves only between SPIN, SLEEP and WAKING meanwhile
            if lane.swap_state(row, lane.SPIN, lane.PYTHON) or lane.swap_state(row, lane.WAKING, lane.PYTHON):
                return
            if lane.swap_state(row, lane.SLEEP, lane.PYTHON):
                self._go.release()
                return

    def cancel(self):
        if self._lane.swap_state(self._row, self._lane.PYTHON, self._lane.WAKING):
            self._call = None
            return True
        return False

    def wake(self):
        """Have a sleeping thread poll again (for the next native job)."""
        if self._lane.swap_state(self._row, self._lane.SLEEP, self._lane.WAKING):
            self._go.release()


_workers = []
_pool_lock = threading.Lock()  # one caller at a time uses the workers; others run serially


def _get_workers(count):
    lane = _native_lane()
    while len(_workers) < count:
        i = len(_workers)
        name = f"engine-cpu_{i}"
        _workers.append(_PollingWorker(name, lane, _ctrl[i]) if lane is not None and i < len(_ctrl)
                        else _Worker(name))
    return _workers[:count]


def _forget_workers_after_fork():
    global _pool_lock
    _workers.clear()  # the threads do not exist in the child
    _pool_lock = threading.Lock()
    if _ctrl is not None:
        _ctrl[:] = 0  # every row SLEEP: no thread polls it


# ------------------------------------------------------------------ the native lane
# Pool threads poll for this many cycles (rdtsc: ~7 ms at 2.5 GHz) after their last job before
# they sleep, as OpenMP's threads do. Shorter windows cost more than they save: a GPT-2 step
# makes ~164 Python calls and 25 lane calls on the pool, and with ~0.4 ms (2^20) 113 of the
# Python calls found the thread asleep, ~1.7 ms 14-27, ~7 ms none; a thread that polled and then
# slept also wakes slowly on this VM (a Python call after 3 ms idle started 390 us late, against
# 75 us for a thread that never polled and 96-116 us after a 1k-cycle window).
# ENGINE_POOL_SPIN=0 turns polling and the lane off.
SPIN_CYCLES = 1 << 24
# below this many elements an elementwise kernel runs on the calling thread: a native hand-off
# costs ~1-2 us of polling and the call into the lane ~3 us (numba's argument checks)
MIN_LANE_ELEMENTS = 1 << 16
_lane = None  # engine.backend._lane_kernels once loaded; False where the lane is off
_ctrl = None  # its control rows, one per pool thread


def _native_lane():
    """engine.backend._lane_kernels (compiled, or loaded from numba's cache, on first use), or
    None without numba, with ENGINE_JIT=0 or ENGINE_POOL_SPIN=0, and off x86-64: the polling
    budget reads the time-stamp counter, which LLVM's `readcyclecounter` gives as 0 on some
    other CPUs (the threads would then never stop polling)."""
    global _lane, _ctrl
    if _lane is None:
        import platform

        from . import jit
        from ._native import switched_off

        _lane = False
        if jit.available() and not switched_off("ENGINE_POOL_SPIN") and \
                platform.machine().lower() in ("x86_64", "amd64"):
            from . import _lane_kernels as lane

            lane.warm_up()
            _ctrl = lane.new_ctrl(64)
            _lane = lane
    return _lane or None


_LANE_OPS = {np.add: 0, np.subtract: 1, np.multiply: 2, np.true_divide: 3}  # _lane_kernels.ADD..DIV
_LANE_KINDS = {np.dtype(np.float32): 0, np.dtype(np.float64): 1}  # _lane_kernels.F32, F64


def _lane_binary(ufunc, a, b, out, shape, size):
    """`ufunc(a, b, out=out)` through the native lane when it takes the call: add, subtract,
    multiply or divide of float32/float64 arrays of one dtype, `a` C-contiguous of the output's
    shape, `b` the same or a single element, `out` fresh or exactly `a` or `b` (an in-place
    update). Returns the output, or None for the caller's other paths.

    The results are numpy's bits: one IEEE operation per element, no reassociation."""
    op = _LANE_OPS.get(ufunc)
    # plain ndarrays only: a subclass's ravel() may not be a 1-D ndarray (np.matrix) or one
    # numba takes (a masked array)
    if op is None or _lane is False or _threads < 2 or size < MIN_LANE_ELEMENTS or type(a) is not np.ndarray:
        return None
    if isinstance(b, np.generic):
        b = np.asarray(b)
    elif type(b) is not np.ndarray:
        return None
    kind = _LANE_KINDS.get(a.dtype)
    if kind is None or b.dtype != a.dtype or a.shape != shape or not a.flags.c_contiguous:
        return None
    lane = _native_lane()
    if lane is None:
        return None
    if b.size == 1:
        operands = lane.SCALAR_B
        b = b.copy()  # read once per range: an in-place update of the array it views must not change it
    elif b.shape == shape and b.flags.c_contiguous:
        operands = lane.ARRAYS
    else:
        return None
    # the kernels are compiled for writeable aligned arrays only (another array type would
    # compile a new specialisation in the middle of a step)
    fa, fb = a.flags, b.flags
    if not (fa.writeable and fb.writeable and fa.aligned and fb.aligned):
        return None
    if out is None:
        out = buffers.empty(shape, a.dtype)
    elif type(out) is not np.ndarray or out.dtype != a.dtype or out.shape != shape or \
            not (out.flags.c_contiguous and out.flags.writeable and out.flags.aligned):
        return None
    workers = min(_threads - 1, len(_ctrl))
    if not _pool_lock.acquire(blocking=False):
        return None  # the pool is busy (a nested call): numpy on this thread
    try:
        pool = _get_workers(workers)
        for i in range(workers):
            if _ctrl[i, 0] == lane.SLEEP:
                # it runs no range of this call (it needs the GIL to leave its lock, and gets it
                # while this call runs without it), and polls for the next ones
                pool[i].wake()
        # 1-D views (C-contiguous arrays: no copies)
        shared = lane.run_parallel(_ctrl, workers, op, kind, operands, a.ravel(), b.ravel(), out.ravel())
    finally:
        _pool_lock.release()
    if shared < 0:
        return None  # out overlaps an operand without being it: numpy's loop buffers that
    _lane_counts[0] += 1
    _lane_counts[1] += shared != 0
    return out


_lane_counts = [0, 0]  # lane calls, and of those the ones a pool thread took part in


def lane_stats():
    """{"enabled", "calls", "shared"}: whether the native lane is in use (numba, more than one
    thread, polling on), the elementwise calls it ran, and how many of them a pool thread shared
    (the others found every thread asleep: the caller ran them alone and woke the threads)."""
    return {"enabled": _native_lane() is not None, "calls": _lane_counts[0], "shared": _lane_counts[1]}


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_workers_after_fork)


def parallel_for(fn, n, work=None, grain=1, per_thread=1):
    """Call `fn(start, stop)` over [0, n) split into contiguous ranges and return the results of
    `fn` in range order.

    The ranges: `per_thread` per thread (fewer if n is small), multiples of `grain`, and they
    depend on n, grain, per_thread and the thread count only. Combine partial results in the
    returned order, never in shared state from `fn`. `work` is the number of elements touched
    (defaults to n) and decides whether threads are worth it.

    Scheduling: the calling thread and the pool threads take ranges one at a time from a shared
    counter, so whoever is free runs the next range. A pool thread on this 2-vCPU VM takes
    ~60-80 us to wake when parallel calls follow each other (the vCPU has gone idle); with
    fixed shares the caller then waited that long at the end of every call. Now the caller
    starts at once, a late thread takes what is left, and a thread that has not woken by the
    time every range is taken is called off instead of waited for. Which thread ran a range
    never changes what the range computes, so results stay bit-identical from run to run.
    A call made while another thread (or `fn` itself) is using the pool runs its ranges one
    after the other on the calling thread: same ranges, same results.
    """
    work = n if work is None else work
    parts = min(_threads * max(1, per_thread), max(1, n // max(grain, 1)))
    if _threads <= 1 or parts <= 1 or work < MIN_PARALLEL_ELEMENTS:
        return [fn(0, n)]
    step = -(-n // parts)
    step = -(-step // grain) * grain
    bounds = [(s, min(s + step, n)) for s in range(0, n, step)]
    if not _pool_lock.acquire(blocking=False):
        return [fn(s, e) for s, e in bounds]
    try:
        return _run_shared(fn, bounds)
    finally:
        _pool_lock.release()


def parallel_map(fn, count, work):
    """[fn(0), fn(1), ..., fn(count - 1)], each item a range of its own for `parallel_for`'s
    threads to take (blocks of a blocked kernel: a late thread still finds some left)."""
    parts = parallel_for(lambda s, e: [fn(i) for i in range(s, e)], count, work=work, per_thread=count)
    return [r for part in parts for r in part]


def _run_shared(fn, bounds):
    """Run fn over `bounds` on the calling thread and the pool, each taking the next range."""
    results = [None] * len(bounds)
    claim = iter(range(len(bounds))).__next__  # one call is atomic under the GIL
    failed = []

    def take_ranges():
        try:
            for i in iter(claim, None):  # (ends when claim raises StopIteration)
                if failed:
                    return
                results[i] = fn(*bounds[i])
        except BaseException:
            failed.append(True)  # the others stop taking ranges
            raise

    workers = _get_workers(min(_threads, len(bounds)) - 1)
    for w in workers:
        w.start(take_ranges)
    error = None
    try:
        take_ranges()
    except BaseException as e:
        error = e
    for w in workers:  # every range is taken: call off threads still asleep, wait for the rest
        if w.cancel():
            continue
        try:
            w.join()
        except BaseException as e:
            error = error or e
    if error is not None:
        raise error
    return results


# copies of at least this many elements run on the engine's threads: a hand-off costs up to
# ~80 us when parallel calls follow each other, a copy of 2^18 float32 (1 MiB) ~150 us
MIN_PARALLEL_COPY = 1 << 18


def _copy_axis(a, rolled=()):
    """The axis a large copy of `a` is split along on the threads: the first of length >= 2,
    unless it is among `rolled`; None for one thread, a small array or no such axis."""
    axis = next((k for k, d in enumerate(a.shape) if d >= 2), None)
    if _threads == 1 or a.size < MIN_PARALLEL_COPY or axis in rolled:
        return None
    return axis


def _copy_by_ranges(a, axis, fn):
    """A new array `out` with fn(out part, a part) over ranges of `axis` on the threads."""
    out = buffers.empty(a.shape, a.dtype)
    lead = (slice(None),) * axis
    parallel_for(lambda s, e: fn(out[lead + (slice(s, e),)], a[lead + (slice(s, e),)]), a.shape[axis],
                 work=a.size)
    return out


def copy(a):
    """A C-contiguous copy of the numpy array `a` (any strides), on the engine's threads when
    large: reshapes of permuted arrays (window partitions, head splits) are single-threaded numpy
    copies otherwise."""
    axis = _copy_axis(a)
    if axis is None:
        out = buffers.empty(a.shape, a.dtype)
        np.copyto(out, a)
        return out
    return _copy_by_ranges(a, axis, np.copyto)


def reshape(a, shape):
    """`a.reshape(shape)`: a view when numpy can make one, else a copy (parallel when large)."""
    if not isinstance(a, np.ndarray) or a.flags.c_contiguous or a.size < MIN_PARALLEL_COPY:
        return a.reshape(shape)
    try:
        return np.reshape(a, shape, copy=False)
    except ValueError:  # needs a copy
        return copy(a).reshape(shape)
    except TypeError:  # numpy < 2.1: no copy= keyword
        return a.reshape(shape)


def _roll_into(out, a, shifts, axes):
    """out[...] = np.roll(a, shifts, axes) as 2^len(axes) block copies, without a temporary."""
    pieces = [((), ())]
    for axis in range(a.ndim):
        n = a.shape[axis]
        k = sum(sh for sh, ax in zip(shifts, axes) if ax == axis) % n if axis in axes and n else 0
        segments = [(slice(k, n), slice(0, n - k)), (slice(0, k), slice(n - k, n))] if k else [(slice(None),) * 2]
        pieces = [(dst + (sd,), src + (ss,)) for dst, src in pieces for sd, ss in segments]
    for dst, src in pieces:
        out[dst] = a[src]


def roll(a, shifts, axes):
    """np.roll(a, shifts, axes) of a numpy array (axes non-negative), on the engine's threads
    when large and the split axis is not rolled (Swin's shifted windows roll axes 1 and 2 of
    [images, H, W, C])."""
    axis = _copy_axis(a, rolled=axes)
    if axis is None:
        return np.roll(a, shifts, axis=axes)
    return _copy_by_ranges(a, axis, lambda out, part: _roll_into(out, part, shifts, axes))


def rows_view(a):
    """`a` as a 2-D (rows, last) array without copying when possible."""
    return a.reshape(-1, a.shape[-1]) if a.ndim != 2 else a


def is_cpu(a):
    return isinstance(a, np.ndarray)


def _leading_slicer(arr, out_shape):
    """How to take rows [s:e] of the broadcast output from `arr`: slice it along axis 0 when it
    spans that axis, else use it whole (it broadcasts along that axis, or is a scalar)."""
    if isinstance(arr, np.ndarray) and arr.ndim == len(out_shape) and arr.shape[0] == out_shape[0]:
        return lambda s, e: arr[s:e]
    return lambda s, e: arr


def parallel_ufunc(ufunc, *inputs, out=None, dtype=None):
    """`ufunc(*inputs)` with numpy broadcasting, split along the output's first axis.

    Falls back to one plain call for small outputs, 0-d/1-row outputs or non-numpy inputs."""
    first = inputs[0]
    if len(inputs) == 2 and type(first) is np.ndarray and type(inputs[1]) is np.ndarray \
            and first.shape == inputs[1].shape:
        shape = first.shape  # the common case, without broadcast_shapes' ~5 us
    else:
        shape = np.broadcast_shapes(*(np.shape(a) for a in inputs))
    size = 1
    for s in shape:
        size *= s
    if len(shape) == 0 or shape[0] < 2 or size < MIN_PARALLEL_ELEMENTS:
        return ufunc(*inputs, out=out) if out is not None else ufunc(*inputs)
    if len(inputs) == 2 and dtype is None:
        done = _lane_binary(ufunc, inputs[0], inputs[1], out, shape, size)
        if done is not None:
            return done
    if out is None:  # a large result comes from the buffer pool (no fresh pages to fault in)
        res_dtype = dtype or np.result_type(*inputs)
        out = buffers.empty(shape, res_dtype)
    elif _overlaps_partially(out, inputs):
        return ufunc(*inputs, out=out)  # numpy's own loop buffers the overlap
    if _threads == 1 or (size < MIN_PARALLEL_CHEAP and ufunc in CHEAP_UFUNCS):
        return ufunc(*inputs, out=out)
    slicers = [_leading_slicer(a, shape) for a in inputs]

    def run(s, e):
        ufunc(*(f(s, e) for f in slicers), out=out[s:e])

    parallel_for(run, shape[0], work=size)
    return out


def same_view(a, b):
    """Whether two numpy arrays are the same view of memory: same address, shape and strides
    (an in-place update's operand and output, even as two array objects)."""
    return a.shape == b.shape and a.strides == b.strides and \
        a.__array_interface__["data"][0] == b.__array_interface__["data"][0]


def _overlaps_partially(out, inputs):
    """Whether an input shares memory with `out` without being the same view of it. Ranges run
    side by side, so such an input would be read where another range has already written
    (`np.maximum(x[1:], x[1:], out=x[:-1])`, or a row of `out` broadcast as an operand)."""
    return any(isinstance(x, np.ndarray) and x is not out and np.may_share_memory(x, out) and not same_view(x, out)
               for x in inputs)


# below this many multiply-adds a product runs on the calling thread
MIN_PARALLEL_FLOPS = 1 << 22


_BLAS_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _product_into(a, b, out):
    """out[...] = a @ b: MKL's gemm when it can take the operands (engine.backend.mkl), else numpy."""
    if not mkl.use_for(a, b):
        np.matmul(a, b, out=out)
    elif out.ndim == 2 and a.ndim == 2 and b.ndim == 2:
        if not mkl.gemm(a, b, out):
            np.matmul(a, b, out=out)
    elif not mkl.gemm_batched(a, b, out):
        np.matmul(a, b, out=out)


# Thin products (a short inner dimension, a narrow result, many rows) run in blocks of
# THIN_ROWS rows, one BLAS call each: on Swin's first stage (K = 96, N = 96-384, 16384 rows) one
# call over all rows ran at 35-40 GFLOP/s per thread in OpenBLAS (24-30 in MKL) on the 2-vCPU AMD
# VM, blocks of 512 rows at 51-54 (MKL 43-53), the same arithmetic per element. Wider or deeper
# products ran as fast or faster in one call, so the rule stops there (docs/benchmarks.md).
THIN_K = 128
THIN_N = 512
THIN_ROWS = 512


def _thin_rows(m, k, n):
    """Rows per BLAS call for an m x k @ k x n product that is thin (see THIN_ROWS), else None."""
    return THIN_ROWS if k <= THIN_K and n <= THIN_N and m >= 2 * THIN_ROWS else None


def matmul(a, b, bias=None):
    """`np.matmul(a, b)` (+ `bias`, a vector over the last axis) with the work split over the
    engine's threads: by rows of the result (or columns, when there are more of them), or by
    batch for stacked products. Each piece is one MKL product where MKL is in use
    (engine.backend.mkl), else one numpy (OpenBLAS) one; the bias is added to each piece right
    after its product, while that piece is still in cache, on the piece's own thread."""
    if a.ndim < 2 or b.ndim < 2:
        out = np.matmul(a, b)
        return out + bias if bias is not None else out
    m, k = a.shape[-2:]
    n = b.shape[-1]
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    nb = 1
    for d in batch:
        nb *= d
    if nb * m * n * k < mkl.SMALL_PRODUCT and a.dtype == b.dtype and a.dtype in _BLAS_DTYPES:
        # a small product (mkl.SMALL_PRODUCT): numpy's call costs ~3 us where MKL's ctypes call and
        # the pool cost 15-25 ([8,32] @ [32,96]: 4.6 us against 27; [64,64] @ [64,64]: 8 against 30)
        out = np.matmul(a, b)
        if bias is not None:
            out += bias
        return out
    out = buffers.empty(batch + (m, n), np.result_type(a, b))

    def piece(x, y, o, cols=slice(None)):
        _product_into(x, y, o)
        if bias is not None:
            o += bias[cols]

    rows = None if batch else _thin_rows(m, k, n)
    if rows is not None:  # a block per range, taken by whichever thread is free
        parallel_map(lambda j: piece(a[j * rows:(j + 1) * rows], b, out[j * rows:(j + 1) * rows]), -(-m // rows),
                     out.size * k)
    elif _threads == 1 or nb * m * n * k < MIN_PARALLEL_FLOPS:
        piece(a, b, out)
    elif batch and batch[0] >= _threads and a.shape[:-2] == b.shape[:-2]:
        parallel_for(lambda s, e: piece(a[s:e], b[s:e], out[s:e]), batch[0], work=out.size * k)
    elif m >= n:
        parallel_for(lambda s, e: piece(a[..., s:e, :], b, out[..., s:e, :]), m, work=out.size * k)
    else:
        parallel_for(lambda s, e: piece(a, b[..., s:e], out[..., s:e], slice(s, e)), n, work=out.size * k)
    return out
