"""Autocast's low-precision copies of parameters, kept from one step to the next.

Under autocast each "lower" op (linear, matmul, attention) reads its float32 parameters in
float16 or bfloat16. PyTorch casts a parameter at its first use in an autocast region and drops
the copy when the region ends, so every training step casts every weight again: on a GPU, one
kernel per weight and bias (97 of GPT-2 124M's 147 forward casts, docs/cuda.md). Here a copy is
kept per parameter and dtype for as long as it is current:

- it is current while the parameter holds the same array (`t._data is copy.src`) and its version
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

from ..autograd.grad_mode import _state
from ..backend import capture_state, xp_of

__all__ = ["current_copy", "writable_copy", "mark_written", "clear", "pin", "unpin", "refresh_pinned"]


class Copy:
    """One low-precision copy: `buf` holds `src` cast, as of the owner's version `version`
    (-1: stale whatever the version). `pins` keeps the buffers CUDA graphs read alive:
    {id(buffer): [buffer, number of graphs]}."""

    __slots__ = ("src", "version", "buf", "pins")

    def __init__(self, src, version, buf):
        self.src, self.version, self.buf, self.pins = src, version, buf, None

    def is_current(self, t):
        return self.src is t._data and self.version == t._vc[0]


# id(parameter) -> (weak reference to it, {numpy dtype: Copy}); the weak reference's callback drops
# the entry when the parameter dies, so ids are never confused and no copy outlives its parameter
_copies = {}


def _references(copy):
    return sys.getrefcount(copy.buf)


# references to a buffer that only its Copy holds, measured through the same expression
_ALONE = _references(Copy(None, 0, object()))


def _held_elsewhere(copy):
    """Whether anything besides `copy` (and its pins) references its buffer (a saved tensor of a
    backward still to run, a view of it): the buffer must then not be written in place. A CUDA
    graph's pin does not count: a replay is meant to read the parameter's current values."""
    pinned = copy.pins is not None and id(copy.buf) in copy.pins
    return _references(copy) > _ALONE + pinned


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
    is stale: the capture then records a plain cast, which its replays run."""
    if not _cacheable(t):
        return None
    copies = _entry(t, create=True)
    copy = copies.get(np_dtype)
    graph = capture_state()
    if copy is not None and copy.is_current(t):
        if graph is not None:
            graph.reads_cast_copy(t, np_dtype, copy)
        return copy
    if graph is not None:
        return None
    src = t._data
    if copy is not None and copy.buf.shape == src.shape and not _held_elsewhere(copy):
        xp_of(src).copyto(copy.buf, src, casting="unsafe")
        copy.src, copy.version = src, t._vc[0]
    else:
        copy = copies[np_dtype] = Copy(src, t._vc[0], src.astype(np_dtype))
    return copy


def writable_copy(t, np_dtype):
    """The buffer of `t`'s copy in `np_dtype` for an optimizer that writes it while updating `t`
    (then `mark_written`), or None: no copy, or one that something still reads, which is marked
    stale instead (the next use casts into a new buffer)."""
    copies = _entry(t, create=False)
    copy = None if copies is None else copies.get(np_dtype)
    if copy is None or copy.src is not t._data or copy.buf.shape != t._data.shape:
        return None
    if _held_elsewhere(copy):
        copy.version = -1
        return None
    return copy.buf


def mark_written(t, np_dtype):
    """The optimizer wrote `t`'s copy in `np_dtype` with `t`'s new values (after its version bump)."""
    copies = _entry(t, create=False)
    copies[np_dtype].version = t._vc[0]


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


def refresh_pinned(t, np_dtype, copy, key):
    """Make the pinned buffer `key` (the one a CUDA graph read as `t`'s copy) hold `t` cast now,
    unless it already does; `copy` becomes current with that buffer again. Called before each
    replay."""
    buf = copy.pins[key][0]
    if copy.buf is buf and copy.is_current(t):
        return
    src = t._data
    xp_of(src).copyto(buf, src, casting="unsafe")
    copy.src, copy.version, copy.buf = src, t._vc[0], buf
    _entry(t, create=True)[np_dtype] = copy


def clear():
    """Drop every copy (torch.clear_autocast_cache): their memory returns at once."""
    _copies.clear()
