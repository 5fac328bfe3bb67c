"""Autocast's low-precision copies of parameters, kept from one step to the next.

Under autocast each "lower" op (linear, matmul, attention) reads its float32 parameters in
float16 or bfloat16. PyTorch casts a parameter at its first use in an autocast region and drops
the copy when the region ends, so every training step casts every weight again: on a GPU, one
kernel per weight and bias (97 of GPT-2 124M's 147 forward casts, docs/cuda.md). Here a copy is
kept per parameter and dtype for as long as it is current:

- it is current while the parameter holds the same array (`t._data is copy.src()`) and its version
  counter has not moved (every in-place write through the engine bumps it: optimizer steps,
  `copy_`, `load_state_dict`, the `nn.init` functions, writes through `.data` and views);
- a stale copy is cast again at its next use, into the same buffer, so a step allocates nothing;
- the fused AdamW kernel writes the float16 copy of each parameter it updates in the same pass
  (engine/kernels/adamw.py): a CUDA training step then casts no weight at all.

Rules that keep a reader from ever seeing a wrong copy:

- only leaves that require grad (parameters) are cached, as in PyTorch, and only in eager mode or
  a CUDA graph capture: an nn.Graph trace records the cast itself, because its replays update the
  parameters without Python and so without version bumps;
- a copy that something else still holds (a backward that has not run yet saved it) is never
  written in place: the next cast goes to a new buffer, the optimizer skips it and marks it stale;
- a CUDA graph capture that reads a copy registers it, and each replay first casts again, into the
  buffers the graph reads, the copies that went stale since (engine/cuda_graphs.py).

Writes that bypass the engine (into the memory of `t.numpy()`) are not seen: as everywhere in the
engine, parameters are written through tensor operations. `autocast(cache_enabled=False)` casts at
every use instead; `engine.amp.clear_autocast_cache()` frees the copies (they cost 2 bytes per
parameter while they live).
"""
import sys
import weakref

import numpy as np

from ..autograd.grad_mode import _state
from ..backend import capture_state, device_of, xp_of

__all__ = ["current_copy", "hand_out", "writable_copy", "mark_written", "clear", "pin", "unpin", "refresh_pinned"]


class Copy:
    """One low-precision copy: `buf` holds the array `src()` cast, as of the parameter's version
    `version` (-1: stale whatever the version).

    `vc` is the version counter of the tensors autocast hands out on `buf` (and of their views):
    a write through one of them (an op whose output aliases its input, then an in-place write)
    moves it past `seen` and makes the copy stale. `pins` keeps the buffers CUDA graphs read
    alive: {id(buffer): [buffer, number of graphs]}."""

    __slots__ = ("src", "version", "buf", "vc", "seen", "pins")

    def __init__(self, src, version, buf):
        self.src = weakref.ref(src)  # not kept alive: a parameter moved to another device frees it
        self.version, self.buf, self.vc, self.seen, self.pins = version, buf, [0], 0, None

    def is_current(self, t):
        return self.src() is t._data and self.version == t._vc[0] and self.vc[0] == self.seen

    def pinned(self):
        return self.pins is not None and id(self.buf) in self.pins

    def wrote(self, t):
        """`buf` now holds `t`'s current values."""
        self.src, self.version, self.seen = weakref.ref(t._data), t._vc[0], self.vc[0]


# id(parameter) -> (weak reference to it, {numpy dtype: Copy}); the weak reference's callback drops
# the entry when the parameter dies, so ids are never confused and no copy outlives its parameter
_copies = {}


def _references(copy):
    return sys.getrefcount(copy.buf)


# references to a buffer that only its Copy holds, measured through the same expression
_ALONE = _references(Copy(np.empty(0), 0, object()))


def _held_elsewhere(copy):
    """Whether anything besides `copy` (and its pins) references its buffer (a saved tensor of a
    backward still to run, a view of it): the buffer must then not be written in place. A CUDA
    graph's pin does not count: a replay is meant to read the parameter's current values."""
    return _references(copy) > _ALONE + copy.pinned()


def _reusable(copy, src):
    """Whether `copy.buf` can take `src` cast in place: same device, shape and C layout (the fused
    optimizer walks it flat), nothing else reading it."""
    return (copy.buf.shape == src.shape and copy.buf.flags.c_contiguous
            and device_of(copy.buf) == device_of(src) and not _held_elsewhere(copy))


def _cacheable(t):
    if not t._requires_grad or t.grad_fn is not None or _state.tracer is not None:
        return False
    if not _state.autocast_cache:
        return False
    meta = t._global
    return meta is None or meta.here


def _entry(t, create):
    key = id(t)
    hit = _copies.get(key)
    if hit is None:
        if not create:
            return None
        hit = _copies[key] = (weakref.ref(t, lambda _, key=key: _copies.pop(key, None)), {})
    return hit[1]


def current_copy(t, np_dtype):
    """The Copy of parameter `t` in `np_dtype`, current now (cast again if it was stale), or None
    when `t` is not cached (see the module docstring) or a CUDA graph is capturing and the copy
    is stale: the capture then records a plain cast, which its replays run.

    Eager code never reads a buffer a CUDA graph pinned: a replay rewrites it (when its parameter
    changed), which must not reach a backward that eager code has not run yet. The copy moves to
    a buffer of its own; the next replay casts into the pinned one again and takes it back."""
    if not _cacheable(t):
        return None
    copies = _entry(t, create=True)
    copy = copies.get(np_dtype)
    graph = capture_state()
    if graph is not None:
        if copy is None or not copy.is_current(t):
            return None
        graph.reads_cast_copy(t, np_dtype, copy)
        return copy
    if copy is not None and copy.is_current(t) and not copy.pinned():
        return copy
    src = t._data
    if copy is None:
        copy = copies[np_dtype] = Copy(src, t._vc[0], src.astype(np_dtype, order="C"))
    elif not copy.pinned() and _reusable(copy, src):
        xp_of(src).copyto(copy.buf, src, casting="unsafe")
        copy.wrote(t)
    else:  # a new buffer: the old one is read elsewhere, pinned, or of another layout or device
        copy.buf = src.astype(np_dtype, order="C")
        copy.wrote(t)
    return copy


def hand_out(out, copy):
    """Autocast's cast output `out`, when it is on `copy.buf`, gets the copy's own version counter."""
    if out._data is copy.buf:
        out._vc = copy.vc
    return out


def writable_copy(t, np_dtype):
    """The buffer of `t`'s copy in `np_dtype` for an optimizer that writes it while updating `t`
    (then `mark_written`), or None: no copy, or one that something still reads, which is marked
    stale instead (the next use casts into a new buffer)."""
    copies = _entry(t, create=False)
    copy = None if copies is None else copies.get(np_dtype)
    src = t._data
    if copy is None or copy.src() is not src:
        return None
    if not _reusable(copy, src):  # (no local name for the buffer here: it would count as a holder)
        copy.version = -1
        return None
    return copy.buf


def mark_written(t, np_dtype):
    """The optimizer wrote `t`'s copy in `np_dtype` with `t`'s new values (after its version bump)."""
    _entry(t, create=False)[np_dtype].wrote(t)


def pin(copy):
    """Keep `copy`'s current buffer alive for a CUDA graph that reads it; returns its key."""
    key = id(copy.buf)
    if copy.pins is None:
        copy.pins = {}
    copy.pins.setdefault(key, [copy.buf, 0])[1] += 1
    return key


def unpin(copy, key):
    held = copy.pins.get(key) if copy.pins else None
    if held is not None:
        held[1] -= 1
        if not held[1]:
            del copy.pins[key]


def refresh_pinned(t, np_dtype, copy, key, force=False):
    """Make the pinned buffer `key` (the one a CUDA graph read as `t`'s copy) hold `t` cast now,
    unless it already does (`force`: always, for a graph that itself writes `t`); `copy` becomes
    current with that buffer again. Called before each replay."""
    buf = copy.pins[key][0]
    if not force and copy.buf is buf and copy.is_current(t):
        return
    xp_of(buf).copyto(buf, t._data, casting="unsafe")
    copy.buf = buf
    copy.wrote(t)
    _entry(t, create=True)[np_dtype] = copy


def clear():
    """Drop every copy (torch.clear_autocast_cache): their memory returns at once."""
    _copies.clear()
