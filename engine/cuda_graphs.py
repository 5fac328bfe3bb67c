"""CUDA graphs: capture the kernels of a piece of eager code once, replay them with one launch.

Why: the engine's eager step is bound by the host on a GPU. GPT-2 124M (fp16, micro-batch 8) on
an H100 issues its forward and backward in about as long as the GPU takes to run them (every op
pays its Python: dispatch, autograd bookkeeping, CuPy's launch), so the GPU waits. A replayed
graph costs the host one call, whatever the number of kernels in it: the step then runs at the
GPU's speed. This is torch.cuda.CUDAGraph's interface and contract:

    g = engine.cuda.CUDAGraph()
    for _ in range(3):                       # warm up eagerly first: kernels compile, state exists
        step()
    opt.zero_grad(set_to_none=True)
    with engine.cuda.graph(g):               # capture: runs nothing, records the kernels
        loss = model(static_ids, static_labels)
        scaler.scale(loss).backward()
    for ids, labels in data:
        static_ids.copy_(ids); static_labels.copy_(labels)   # new data into the captured inputs
        g.replay()                           # forward + backward; loss and the .grad arrays refreshed
        scaler.step(opt); scaler.update()    # eagerly, outside the graph

What a replay does is exactly the captured kernels on the captured memory: inputs are read from
the tensors that were used during capture (copy new data *into* them), outputs land in the
tensors the capture made (`loss` above), and every parameter whose `.grad` the captured backward
writes gets that same gradient tensor back at each replay (a `zero_grad(set_to_none=True)`
between replays would otherwise leave the replayed gradients unreferenced). Gradients that
existed before capture are accumulated into, as in eager mode: zero them in place
(`zero_grad(set_to_none=False)`) between replays if that is not what you want.

Autocast's kept copies of the parameters (engine/ops/cast_cache.py) are read in place by the
captured kernels: a replay first casts again those whose parameter changed without its copy
being written (an optimizer other than the fused AdamW), into the buffers the graph reads.

Memory: everything allocated during capture comes from a private CuPy memory pool that the graph
keeps (the replays reuse those addresses); `CUDAGraph.pool_bytes()` says how much it holds.

Random draws on the GPU (dropout, `rand`, flash attention's and bias + dropout + add's own
draws) are graph-safe, as PyTorch's Philox is: a captured kernel reads its stream's seed and
base offset from device memory the graph owns (written by two fill kernels queued before each
replay) and adds its draw's place in the graph, and each replay moves the Generator past its
draws. So every replay draws new numbers, exactly those the eager steps it stands for would
draw from the same generator state, and a reseed between replays is followed
(`_CapturedStream`).

Refused inside a capture, with an error naming the cause (each would replay wrong or not at all):
host-to-device and device-to-host copies (`.item()`, `.numpy()`, `tensor(...)` of host data,
`.to('cuda')` of a CPU tensor: the graph would replay a copy from a host buffer that no longer
holds the data), MPI communication (engine.distributed.comm.NoMPIInCapture: NCCL's collectives
are captured, host transfers are not), and anything else CUDA itself refuses (a
synchronisation). Python control flow runs once, at capture: a replay cannot take another branch.
"""
import contextlib

import numpy as np

from . import backend
from .autograd.grad_mode import _state as _grad_state
from .ops import cast_cache

__all__ = ["CUDAGraph", "graph", "is_current_stream_capturing"]


class CUDAGraph:
    """A captured sequence of kernels (torch.cuda.CUDAGraph): `capture_begin()` ... `capture_end()`
    (or the `engine.cuda.graph` context manager), then `replay()` as often as needed."""

    def __init__(self):
        self._graph = None
        self._pool = None
        self._stream = None
        self._prev_stream = None
        self._prev_allocator = None
        self._grads = {}  # id(parameter) -> (parameter, gradient tensor the captured backward writes)
        # pin key -> [parameter, dtype, Copy, the parameter's version when the capture read it or
        # None once the capture ended having written the parameter]: autocast's copies it reads
        self._copies = {}
        self._rng = {}  # (generator, device) -> _CapturedStream: the random streams the capture drew from

    # ---------------------------------------------------------------- capture
    def capture_begin(self):
        if self._graph is not None or self._stream is not None:
            raise RuntimeError("CUDAGraph.capture_begin: this graph already holds a capture; call reset() first")
        if backend.capture_state() is not None:
            raise RuntimeError("CUDAGraph.capture_begin: another capture is in progress (captures do not nest)")
        cp = backend.cupy()
        cp.cuda.Device().synchronize()  # the capture stream starts after all earlier work
        self._pool = cp.cuda.MemoryPool()
        self._prev_allocator = cp.cuda.get_allocator()
        cp.cuda.set_allocator(self._pool.malloc)
        self._stream = cp.cuda.Stream(non_blocking=True)
        self._prev_stream = cp.cuda.get_current_stream()
        self._stream.use()
        backend.set_capture_state(self)
        _grad_state.cuda_graph = self
        try:
            self._stream.begin_capture()
        except Exception:
            self._restore()
            raise

    def capture_end(self, error=None):
        """End the capture. With `error` (the exception that interrupted the captured code) the
        capture is abandoned and the error re-raised with what CUDA graphs cannot hold."""
        stream = self._stream
        if stream is None:
            raise RuntimeError("CUDAGraph.capture_end: no capture in progress")
        try:
            if error is None:
                self._rng = {k: d for k, d in self._rng.items() if d.total}  # streams the graph draws from
            graph = stream.end_capture()
        except Exception as e:
            graph = None
            error = error or e
        finally:
            self._restore()
        if error is not None:
            for param, grad in self._grads.values():  # never computed: not left behind as gradients
                if param.grad is grad:
                    param.grad = None
            self._grads = {}
            self._rng = {}
            self._unpin_copies()
            self._pool = None
            if not isinstance(error, Exception):  # KeyboardInterrupt and the like: as they are
                raise error
            raise RuntimeError(
                "engine.cuda.graph: the captured code did something a CUDA graph cannot hold (a host read such "
                "as .item()/.numpy()/float(), a host-to-device copy, MPI communication, a synchronisation); "
                f"warm the code up eagerly first and keep such calls outside the capture. Cause: {error}") from error
        self._graph = graph
        for entry in self._copies.values():  # the captured code wrote this parameter (an optimizer step)
            if entry[0]._version != entry[3]:
                entry[3] = None

    def rng_position(self, stream, groups, what):
        """(seed, offset) of a draw of `groups` Philox blocks from `stream` (a DevicePhilox) inside
        the capture: called by DevicePhilox.reserve, which does not move the stream itself."""
        if stream.owner is None:
            raise RuntimeError(f"engine.cuda.graph: {what} draws from a device stream that belongs to no "
                               "Generator; a CUDA graph replays draws only from a Generator's streams")
        return self._captured(stream.owner, stream.device).take(groups)

    def rng_place(self, generator, device):
        """Where the capture's next draw from `generator`'s stream on `device` lies in the graph
        (Philox blocks from its start): part of Generator.get_state inside a capture."""
        return self._captured(generator, device).total

    def set_rng_place(self, generator, device, place):
        """Move that place back (or on): activation checkpointing's recomputation redraws its
        forward's numbers. The graph's replays move the stream past the place its capture ended at."""
        self._captured(generator, device).total = place

    def _captured(self, generator, device):
        key = (id(generator), device)
        drawn = self._rng.get(key)
        if drawn is None:
            drawn = self._rng[key] = _CapturedStream(generator, device)
        return drawn

    def _restore(self):
        cp = backend.cupy()
        backend.set_capture_state(None)
        _grad_state.cuda_graph = None
        cp.cuda.set_allocator(self._prev_allocator)
        self._prev_stream.use()
        self._stream = None

    def set_grad(self, param, grad):
        """Called by autograd when the captured backward writes `param`'s gradient: a new tensor, or
        one that existed before capture (accumulated into; kept alive by the graph that writes it)."""
        self._grads[id(param)] = (param, grad)

    def reads_cast_copy(self, param, dtype, copy):
        """Called by autocast when the captured code reads `param`'s kept low-precision copy
        (engine/ops/cast_cache.py) instead of casting it: the capture holds no cast kernel, so
        the graph pins that buffer and each replay first makes sure it holds the parameter's
        current values."""
        key = id(copy.buf)
        if key not in self._copies:
            self._copies[key] = [param, dtype, copy, param._version]
            cast_cache.pin(copy)

    def _unpin_copies(self):
        for key, (_, _, copy, _) in self._copies.items():
            cast_cache.unpin(copy, key)
        self._copies = {}

    # ---------------------------------------------------------------- replay
    def replay(self):
        """Cast again the autocast copies the capture reads whose parameters changed since (an
        optimizer that did not write them), launch the captured kernels on the current stream
        (after the work already queued there) and give each parameter its captured gradient
        tensor back."""
        if self._graph is None:
            raise RuntimeError("CUDAGraph.replay: nothing captured (use engine.cuda.graph(g) first)")
        for key, (param, dtype, copy, version) in self._copies.items():
            cast_cache.refresh_pinned(param, dtype, copy, key, force=version is None)
        for drawn in self._rng.values():
            drawn.before_replay()
        self._graph.launch(stream=backend.cupy().cuda.get_current_stream())
        for param, _, _, version in self._copies.values():
            if version is None:  # the replay wrote it: eager code must not take its copy as current
                param._bump_version()
        for param, grad in self._grads.values():
            if param.grad is not grad:
                param.grad = grad

    def reset(self):
        """Drop the captured graph and its memory pool."""
        self._graph = None
        self._pool = None
        self._grads = {}
        self._rng = {}
        self._unpin_copies()

    def __del__(self):
        if cast_cache is not None:  # None at interpreter shutdown
            self._unpin_copies()

    def pool_bytes(self):
        """Bytes the graph's private memory pool holds (0 before capture)."""
        return 0 if self._pool is None else int(self._pool.total_bytes())

    def pool(self):
        return self._pool


class _CapturedStream:
    """A Generator's device stream as a captured graph draws from it (PyTorch's graph-safe Philox).
    The captured kernels read the stream's seed and base offset from `state`, device memory the
    graph owns, and add their draw's place in the graph. Before each replay two fill kernels,
    queued ahead of it on the stream (no host copy), write the stream's (seed, offset) there, and
    the host moves the stream past the replay's draws, as an eager step would have: replays draw
    the numbers of the eager steps they stand for, after a reseed or eager draws in between too.
    `state` keeps that base until the next replay, so work queued after a replay that redraws a
    captured draw (an eager backward of a captured forward, a backward captured apart) finds it."""

    def __init__(self, owner, device):
        self.owner, self.device = owner, device
        cp = backend.cupy()
        self.state = cp.empty(2, np.uint64)  # no kernel: filled before each replay
        self.total = 0  # Philox blocks the captured code draws

    def take(self, groups):
        from .kernels import philox
        stream = self.owner.device_stream(self.device)
        place = philox.GraphOffset(self.total, self.state)
        self.total += groups
        return stream.seed, place

    def before_replay(self):
        stream = self.owner.device_stream(self.device)
        self.state[0:1].fill(np.uint64(stream.seed))
        self.state[1:2].fill(np.uint64(stream.offset))
        stream.offset += self.total


@contextlib.contextmanager
def graph(cuda_graph):
    """Capture the block's kernels into `cuda_graph` (torch.cuda.graph): nothing in the block
    runs on the GPU until `cuda_graph.replay()`."""
    cuda_graph.capture_begin()
    try:
        yield cuda_graph
    except BaseException as e:
        cuda_graph.capture_end(error=e)
        raise
    cuda_graph.capture_end()


def is_current_stream_capturing():
    """Whether an engine.cuda.graph capture is in progress (torch.cuda.is_current_stream_capturing)."""
    return backend.capture_state() is not None
