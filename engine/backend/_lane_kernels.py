"""The compiled half of the pool's native lane (engine.backend.parallel): the pool threads'
polling loop and the elementwise kernels they run without the GIL.

Needs numba to import; engine.backend.parallel imports it only where numba is available.

Each pool thread owns one row of a shared int64 array `ctrl` (16 slots, 128 bytes, so two
threads never write the same cache line). Slot STATE is the thread's state, read and written
with atomic operations; the other slots describe a native job. The transitions:

    SPIN -> NATIVE        a caller posts a job (CAS); the thread runs it and stores NATIVE_DONE,
    NATIVE_DONE -> SPIN   the caller, once it has seen the job done;
    SPIN -> PYTHON        a Python call is posted (CAS); the thread claims it, PYTHON -> RUNNING
                          (CAS), and leaves the loop to run it with the GIL, then RUNNING -> SPIN;
    PYTHON -> WAKING      the caller takes the call back before it was claimed (CAS);
    SPIN -> SLEEP         the thread, after polling SPIN_CYCLES with nothing to do (CAS); it then
                          blocks on a lock in Python;
    SLEEP -> PYTHON / WAKING   a Python call, or a caller's wake-up for the next native job;
                          both release the thread's lock; WAKING -> SPIN by the thread.

A caller only posts while holding the pool's lock, and takes every job back or waits for it
before releasing it, so a thread never has two jobs at once.
"""
import numpy as np

from .jit import import_numba

numba = import_numba()
from llvmlite import ir  # noqa: E402 (numba, imported above, brings llvmlite)
from numba.core import cgutils, types  # noqa: E402
from numba.extending import intrinsic  # noqa: E402

SLEEP, SPIN, NATIVE, NATIVE_DONE, PYTHON, RUNNING, WAKING = range(7)
STATE, OP, KIND, SHAPE, A, B, OUT, START, STOP = range(9)
ROW = 16  # int64 slots per thread: 128 bytes
ADD, SUB, MUL, DIV = range(4)
F32, F64 = range(2)
# operand shapes: both arrays, or the second one a scalar (a one-element array)
ARRAYS, SCALAR_B = range(2)
# which operand the output is (an in-place update), if any
OUT_FRESH, OUT_IS_A, OUT_IS_B = 0, 1 << 2, 2 << 2

_jit = numba.njit(nogil=True, cache=True, error_model="numpy")
_inline = numba.njit(inline="always", error_model="numpy")


# ------------------------------------------------------------------ atomics
def _slot(context, builder, arr_type, arr, index):
    ary = context.make_array(arr_type)(context, builder, arr)
    return builder.gep(ary.data, [index])


@intrinsic
def load_acquire(typingctx, arr, index):
    """arr[index], an atomic load with acquire ordering (never hoisted out of a polling loop)."""
    def codegen(context, builder, sig, args):
        return builder.load_atomic(_slot(context, builder, sig.args[0], args[0], args[1]), "acquire", 8)

    return types.int64(arr, index), codegen


@intrinsic
def store_release(typingctx, arr, index, value):
    """arr[index] = value, an atomic store with release ordering (the job's slots written before
    it are seen by whoever reads it with acquire)."""
    def codegen(context, builder, sig, args):
        value = context.cast(builder, args[2], sig.args[2], types.int64)
        builder.store_atomic(value, _slot(context, builder, sig.args[0], args[0], args[1]), "release", 8)
        return context.get_dummy_value()

    return types.void(arr, index, value), codegen


@intrinsic
def compare_exchange(typingctx, arr, index, expected, new):
    """Atomically: if arr[index] == expected, set it to new; whether it did."""
    def codegen(context, builder, sig, args):
        expected = context.cast(builder, args[2], sig.args[2], types.int64)
        new = context.cast(builder, args[3], sig.args[3], types.int64)
        pair = builder.cmpxchg(_slot(context, builder, sig.args[0], args[0], args[1]), expected, new,
                               "acq_rel", "acquire")
        return builder.extract_value(pair, 1)

    return types.boolean(arr, index, expected, new), codegen


@intrinsic
def spin_pause(typingctx):
    """The x86 `pause` hint: a polling loop neither floods the memory system nor starves a
    sibling hyperthread (on other machines, nothing)."""
    def codegen(context, builder, sig, args):
        if "x86" in builder.module.triple or "i686" in builder.module.triple:
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                "llvm.x86.sse2.pause")
            builder.call(fn, [])
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic
def cycle_counter(typingctx):
    """The CPU's cycle counter (rdtsc on x86): a polling budget in time, whatever `pause` costs."""
    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(64), []),
                                            "llvm.readcyclecounter")
        return builder.call(fn, [])

    return types.int64(), codegen


@intrinsic
def _f32_at(typingctx, address):
    ptr = types.CPointer(types.float32)

    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], context.get_value_type(ptr))

    return ptr(address), codegen


@intrinsic
def _f64_at(typingctx, address):
    ptr = types.CPointer(types.float64)

    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], context.get_value_type(ptr))

    return ptr(address), codegen


# ------------------------------------------------------------------ the elementwise kernels
# One loop per (op, operand shapes, aliasing): LLVM vectorises `o[i] = a[i] + b[i]` after a
# run-time check that o does not overlap a or b, and an in-place update (o is a) fails that
# check and runs the scalar loop, ~5x slower. So an in-place update is compiled with the one
# array in both places, where LLVM sees the same pointer and needs no check.
@_inline
def _arrays(op, a, b, o):
    n = o.size
    if op == ADD:
        for i in range(n):
            o[i] = a[i] + b[i]
    elif op == SUB:
        for i in range(n):
            o[i] = a[i] - b[i]
    elif op == MUL:
        for i in range(n):
            o[i] = a[i] * b[i]
    else:
        for i in range(n):
            o[i] = a[i] / b[i]


@_inline
def _array_scalar(op, a, s, o):
    n = o.size
    if op == ADD:
        for i in range(n):
            o[i] = a[i] + s
    elif op == SUB:
        for i in range(n):
            o[i] = a[i] - s
    elif op == MUL:
        for i in range(n):
            o[i] = a[i] * s
    else:
        for i in range(n):
            o[i] = a[i] / s


@_inline
def _run_typed(op, shape, a, b, o):
    """`shape` = operand shapes | aliasing; a and b already offset to the range (b a one-element
    view when it is a scalar)."""
    alias = shape & 12
    if shape & 3 == SCALAR_B:
        s = b[0]
        if alias == OUT_IS_A:
            _array_scalar(op, o, s, o)
        else:
            _array_scalar(op, a, s, o)
    elif alias == OUT_IS_A:
        _arrays(op, o, b, o)
    elif alias == OUT_IS_B:
        _arrays(op, a, o, o)
    else:
        _arrays(op, a, b, o)


# one explicit signature: the callers pass row slots (int64), addresses (uint64 from
# ctypes.data) and constants (literal types), and each distinct set of argument types would
# compile this function again, its 40 vectorised loops taking ~4-9 s each time on a fresh machine
@numba.njit(types.void(*[types.int64] * 8), nogil=True, cache=True, error_model="numpy")
def run_range(op, kind, shape, pa, pb, po, start, stop):
    """out[start:stop] = a[start:stop] <op> b[start:stop] on the arrays at addresses pa, pb, po."""
    n = stop - start
    if n <= 0:
        return
    scalar_b = shape & 3 == SCALAR_B
    if kind == F32:
        o = numba.carray(_f32_at(po + 4 * start), n)
        a = numba.carray(_f32_at(pa + 4 * start), n)
        b = numba.carray(_f32_at(pb), 1) if scalar_b else numba.carray(_f32_at(pb + 4 * start), n)
        _run_typed(op, shape, a, b, o)
    else:
        o = numba.carray(_f64_at(po + 8 * start), n)
        a = numba.carray(_f64_at(pa + 8 * start), n)
        b = numba.carray(_f64_at(pb), 1) if scalar_b else numba.carray(_f64_at(pb + 8 * start), n)
        _run_typed(op, shape, a, b, o)


# ------------------------------------------------------------------ the two sides
@_jit
def serve(row, budget):
    """A pool thread's loop: run the native jobs posted to `row` until a Python call is posted
    (claimed: returns RUNNING) or `budget` cycles pass with nothing to do (returns SLEEP)."""
    last = cycle_counter()
    while True:
        state = load_acquire(row, STATE)
        if state == NATIVE:
            run_range(row[OP], row[KIND], row[SHAPE], row[A], row[B], row[OUT], row[START], row[STOP])
            store_release(row, STATE, NATIVE_DONE)
            last = cycle_counter()
        elif state == PYTHON:
            if compare_exchange(row, STATE, PYTHON, RUNNING):
                return RUNNING
        elif state == WAKING:
            compare_exchange(row, STATE, WAKING, SPIN)
            last = cycle_counter()
        elif state == SPIN and cycle_counter() - last > budget:
            if compare_exchange(row, STATE, SPIN, SLEEP):
                return SLEEP
        else:
            spin_pause()


@_jit
def run_parallel(ctrl, workers, op, kind, operands, a, b, o):
    """o = a <op> b on 1-D contiguous arrays (b of o's size, or one element with operands
    SCALAR_B), split in equal ranges between the caller and the first `workers` rows of `ctrl`.
    A thread that is not polling when the caller gets to its range (after its own) gets none:
    the caller runs it.

    o may be exactly a or b (an in-place update); any other overlap with them declines the call
    before anything runs (returns -1: ranges run side by side, and a shifted overlap would read
    what another range already wrote). Otherwise returns a bit mask of the threads that ran a
    range. The addresses are taken here rather than in Python, where `ndarray.ctypes.data`
    costs ~3 us each."""
    n = o.size
    size = o.itemsize
    pa, pb, po = np.int64(a.ctypes.data), np.int64(b.ctypes.data), np.int64(o.ctypes.data)
    for px, nx in ((pa, a.size), (pb, b.size)):
        if px != po and px < po + n * size and po < px + nx * size:
            return -1
    shape = operands | (OUT_IS_A if po == pa else OUT_IS_B if po == pb else OUT_FRESH)
    parts = workers + 1
    step = (n + parts - 1) // parts
    step = (step + 15) // 16 * 16  # ranges start on 64-byte boundaries of an aligned array
    posted = 0
    for w in range(workers):
        start = (w + 1) * step
        if start >= n:
            break
        row = ctrl[w]
        row[OP] = op
        row[KIND] = kind
        row[SHAPE] = shape
        row[A] = pa
        row[B] = pb
        row[OUT] = po
        row[START] = start
        row[STOP] = min(start + step, n)
        if compare_exchange(row, STATE, SPIN, NATIVE):
            posted |= 1 << w
    run_range(op, kind, shape, pa, pb, po, 0, min(step, n))
    for w in range(workers):
        start = (w + 1) * step
        if start < n and not posted & (1 << w):
            # a thread that was waking up at the start may be polling by now
            if compare_exchange(ctrl[w], STATE, SPIN, NATIVE):
                posted |= 1 << w
            else:
                run_range(op, kind, shape, pa, pb, po, start, min(start + step, n))
    for w in range(workers):
        if posted & (1 << w):
            row = ctrl[w]
            while load_acquire(row, STATE) != NATIVE_DONE:
                spin_pause()
            store_release(row, STATE, SPIN)
    return posted


# the Python side's state changes keep the GIL: a call that released it would have to take it
# back, and a pool thread leaving its lock can wait a whole switch interval (5 ms) for that
@numba.njit(cache=True)
def swap_state(row, expected, new):
    """compare_exchange on a thread's STATE, for the Python side."""
    return compare_exchange(row, STATE, expected, new)


@numba.njit(cache=True)
def set_state(row, new):
    store_release(row, STATE, new)


def new_ctrl(threads):
    """Rows for `threads` pool threads, 128-byte aligned, every thread SLEEP."""
    raw = np.zeros((threads + 1) * ROW, np.int64)
    skip = (-raw.ctypes.data % 128) // 8
    return raw[skip:skip + threads * ROW].reshape(threads, ROW)


def warm_up():
    """Compile (or load from numba's cache) everything the pool threads and callers call, on the
    calling thread: a thread must never compile in its loop (numba's compiler takes the import
    lock, which the thread that imports the engine may hold)."""
    ctrl = new_ctrl(1)
    row = ctrl[0]
    swap_state(row, SLEEP, SLEEP)
    set_state(row, SLEEP)
    for dtype, kind in ((np.float32, F32), (np.float64, F64)):
        x = np.ones(4, dtype)
        run_parallel(ctrl, 1, ADD, kind, ARRAYS, x, x, x)
    set_state(row, PYTHON)
    serve(row, 0)
