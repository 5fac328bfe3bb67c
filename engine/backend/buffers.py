"""Reusing large CPU arrays: a pool that hands a kernel's output back out once nothing uses it.

Why: a fresh large numpy array is fresh memory from the operating system (glibc serves blocks
of this size with mmap, or returns a freed heap top): every 4 KiB page faults on first touch and
is zeroed by the kernel. A BERT training step allocates ~70 MB of such pages, ~17,000 faults,
which cost ~85 ms of a ~700 ms step, charged to whichever kernel first writes the array (matrix
products measured at 330 GFLOP/s inside the step against 415 alone).

How: `empty(shape, dtype)` returns a view of a pooled buffer of exactly that many bytes when one
is free, else allocates one and keeps it. "Free" is read off CPython's reference count: the
pool's own list holds one reference, and every array that uses the buffer (the view handed out,
any view of that view, a Tensor around it) holds the buffer through its `.base` chain, so a
buffer whose count is back to the pool's alone is referenced by nothing else and can be reused
without anyone seeing it change. Small arrays (under `MIN_BYTES`) go to numpy as usual: malloc
already recycles them.

Bounds: the pool keeps at most `ENGINE_BUFFER_POOL_MB` (default 2048) MiB; beyond it a new
buffer is not kept, and free buffers of other sizes are released first (least recently used),
so a change of shapes (evaluation, another batch size) does not grow it without end. Like
PyTorch's CUDA caching allocator, the process keeps its peak working set instead of returning
it between steps. `ENGINE_BUFFER_POOL_MB=0` turns the pool off.
"""
import os
import sys
import threading
from collections import OrderedDict

import numpy as np

MIN_BYTES = 1 << 20
# arrays start on a cache line: glibc's large blocks start 16 bytes into a page, and a 64-byte
# vector store that straddles two lines costs about two (exact GELU writing 3.2M floats from a
# cold cache, two threads: 2.3 -> 1.5 ms with the output aligned)
ALIGN = 64
_limit = int(float(os.environ.get("ENGINE_BUFFER_POOL_MB", "2048")) * (1 << 20))
_pool = OrderedDict()  # nbytes -> [uint8 buffers], most recently used size last
_pooled = 0
_pooled_ids = {}  # id() of the buffers in _pool -> where their aligned part starts (ctypes.data costs ~3 us)
_getrefcount = sys.getrefcount
_lock = threading.Lock()  # two threads must not both take the same free buffer


def _free_buffer(buffers):
    # one reference from the list, one from the loop variable, one for the call's argument
    for buf in buffers:
        if _getrefcount(buf) == 3:
            return buf
    return None


def _release(nbytes_needed):
    """Drop free buffers of the least recently used sizes until `nbytes_needed` fits."""
    global _pooled
    for size in list(_pool):
        if _pooled + nbytes_needed <= _limit:
            return True
        buffers = _pool[size]
        keep = []
        for buf in buffers:
            if _getrefcount(buf) == 3 and _pooled + nbytes_needed > _limit:
                _pooled -= size
                _pooled_ids.pop(id(buf), None)
            else:
                keep.append(buf)
        if keep:
            _pool[size] = keep
        else:
            del _pool[size]
    return _pooled + nbytes_needed <= _limit


def empty(shape, dtype):
    """np.empty(shape, dtype), from the pool when the array is large (see the module docstring)."""
    global _pooled
    dtype = np.dtype(dtype)
    if isinstance(shape, int):
        shape = (shape,)
    count = 1
    for d in shape:
        count *= d
    nbytes = count * dtype.itemsize
    if nbytes < MIN_BYTES or _limit <= 0 or dtype.hasobject:
        return np.empty(shape, dtype)
    with _lock:
        buffers = _pool.get(nbytes)
        buf = _free_buffer(buffers) if buffers else None
        if buf is None:
            buf = np.empty(nbytes + ALIGN, np.uint8)
            start = -buf.ctypes.data % ALIGN
            if _release(nbytes):
                _pool.setdefault(nbytes, []).append(buf)
                _pooled_ids[id(buf)] = start
                _pooled += nbytes
        else:
            start = _pooled_ids[id(buf)]
        if buffers is not None:
            _pool.move_to_end(nbytes)
        return buf[start:start + nbytes].view(dtype).reshape(shape)


def stats():
    """(pooled bytes, buffers, of which free) for diagnostics and tests."""
    total = sum(len(v) for v in _pool.values())
    free = sum(1 for v in _pool.values() for b in v if _getrefcount(b) == 3)
    return _pooled, total, free


def clear():
    """Forget every buffer (those in use stay alive through their users)."""
    global _pooled
    with _lock:
        _pool.clear()
        _pooled_ids.clear()
        _pooled = 0


def owns_memory(a):
    """Whether `a` is the only array on its memory: numpy's own (`a.base is None`) or the one
    view of a pooled buffer (held by the pool's list, `a.base`, the local `base` and the call's
    argument: 4 references). The autograd adopts such an array as a leaf's gradient without
    copying it."""
    base = a.base
    if base is None:
        return True
    return id(base) in _pooled_ids and _getrefcount(base) == 4


def set_limit_mb(mb):
    global _limit
    with _lock:
        _limit = int(float(mb) * (1 << 20))
        _release(0)
