"""What pipeline parallelism needs from the engine: stage-local execution.

Ranks outside a tensor's placement skip its ops (empty outputs, no logical shape, no autograd),
so a model can not simply run everywhere and leave the right ops to the right ranks. A pipeline
instead runs each stage's part of the model only on the stage's ranks (docs/global_tensor.md,
"Pipelines"), and what crosses a stage boundary is handed over here, point to point:

* `send(tensor, placement)` / `recv(src_placement, placement)`: the rank at mesh coordinates c
  of the source placement sends its *shard* to the rank at coordinates c of the destination
  (both placements have the same mesh shape, as LiBai's stages do), with a small header (dtype,
  shapes, SBP), so the tensor arrives with its SBP and nothing is gathered. `send` does not
  block (the request is returned); `recv` does. The received tensor is a new leaf: the
  schedule keeps it, runs backward on its stage and sends its gradient back the same way.
* `stand_ins({param: copy})`: while open, moving `param` (a tensor of another stage) to a
  placement with `.to_global(placement=...)` yields `copy` instead (a tied word embedding used
  by the head on the last stage: the schedule fetches it once per step and returns its gradient).
* `stage_local()`: while open, an op on a tensor whose placement does not hold this rank is an
  error naming the op and the placement, instead of a silent empty result (a model's pipeline
  steps that touch another stage's tensor fail at once).
* `begin()` / `wait(requests)`: around a schedule's handoffs (the wait: for its sends).

In an nn.Graph (engine.autograd.trace) a send, a receive and the final wait are kernel calls of
the tape: a replay sends this step's shard again, receives into a fresh array (checking that the
header is the traced one: a peer that sent another dtype or shape is an error, not a silent
misread) and waits for its own sends; a replay that failed between its sends and its wait makes
the next `begin` an error instead of a step on stale messages. Every rank must trace and replay
the same schedule.
"""
import contextlib
import time

import numpy as np

from ..autograd.grad_mode import _state
from . import comm, nccl
from .boxing import _dtype_table
from .global_tensor import GlobalMeta, _stage_state, device_of_placement, make_global
from .sbp import broadcast, partial_max, partial_sum, split

__all__ = ["send", "recv", "recv_many", "begin", "wait", "peer", "stand_ins", "stage_local", "blocked_time"]

_HEADER = 48  # int64 slots: dtype, requires_grad, ndim, mesh ndim, sbp codes, local shape, logical shape
_CODES = {broadcast: -1, partial_sum: -2, partial_max: -3}
_SBPS = {v: k for k, v in _CODES.items()}


def peer(rank, src_placement, dst_placement):
    """The rank of `dst_placement` at `rank`'s mesh coordinates in `src_placement`."""
    if tuple(src_placement.hierarchy) != tuple(dst_placement.hierarchy):
        raise ValueError(f"pipeline handoff between placements of different mesh shapes: {src_placement!r} -> "
                         f"{dst_placement!r} (every stage must have the same [dp, tp] mesh)")
    return int(dst_placement.mesh[src_placement.coords(rank)])


def _encode(arr, meta, requires_grad):
    codes = [_CODES[s] if not s.is_split else s.axis for s in meta.sbp]
    head = [_dtype_table().index(arr.dtype), int(requires_grad), arr.ndim, len(codes), *codes,
            *arr.shape, *meta.shape]
    if len(head) > _HEADER:
        raise ValueError(f"pipeline handoff: a {arr.ndim}-d tensor on a {len(codes)}-d mesh does not fit the header")
    out = np.zeros(_HEADER, dtype=np.int64)
    out[:len(head)] = head
    return out


def _decode(head):
    dtype = _dtype_table()[int(head[0])]
    requires_grad, ndim, mesh_ndim = bool(head[1]), int(head[2]), int(head[3])
    i = 4
    sbp = tuple(_SBPS[int(c)] if c < 0 else split(int(c)) for c in head[i:i + mesh_ndim])
    i += mesh_ndim
    local = tuple(int(s) for s in head[i:i + ndim])
    logical = tuple(int(s) for s in head[i + ndim:i + 2 * ndim])
    return dtype, requires_grad, sbp, local, logical


def send(tensor, placement, tag=0, launch=True):
    """Send this rank's shard of global `tensor` to its peer in `placement` (non-blocking).
    Returns the requests; their buffers stay alive until waited on.

    Between GPUs (NCCL) `launch=False` keeps the transfer queued, to be launched in one group
    with this rank's next receive (Megatron's send_forward_recv_backward: two stages whose
    activations and gradients cross must each send and receive in one group, or each waits in
    its send for a receive queued behind the other's send); `launch=True` launches it now, for
    a peer that needs it before it can send anything back.

    Between GPUs two ranks' shards are matched in the order the transfers are made, whatever
    their tags (NCCL has none; the headers, over MPI, are matched by tag): both ranks must make
    their handoffs to each other in one order."""
    meta = tensor._global
    if meta is None:
        raise TypeError("pipeline send: the tensor must be global (made with .to_global or on a placement)")
    me = comm.get_rank()
    op = _Send(peer(me, meta.placement, placement), tag, _encode(tensor._data, meta, tensor.requires_grad),
               on_gpus=_on_gpus(meta.placement, placement), launch=launch)
    requests = op.post(tensor._data)
    if _state.tracer is not None:  # nn.Graph: a replay sends the replayed shard
        _state.tracer.call(op, (tensor._data,), None, "PipelineSend", f"{list(tensor._data.shape)} -> rank {op.dst}")
    return requests


def recv(src_placement, placement, tag=0, device=None):
    """The global tensor on `placement` whose shards the peers in `src_placement` sent with
    `send` (blocking), on `device` (default: the placement's device on this rank, so a cuda
    stage gets its activations on its GPU). It is a leaf, requiring grad when the sent tensor
    did."""
    return recv_many(src_placement, placement, 1, tag, device)[0]


def recv_many(src_placement, placement, n, tag=0, device=None):
    """`n` tensors `recv` would receive one after another, their transfers between GPUs launched
    in one NCCL group (with the sends this rank queued): a peer sending several tensors in one
    group could otherwise wait for the later ones while this rank waits for the first."""
    me = comm.get_rank()
    device = device_of_placement(placement) if device is None else device
    src, on_gpus = peer(me, placement, src_placement), _on_gpus(src_placement, placement)
    out = []
    for i in range(n):
        op = _Recv(src, tag, device, on_gpus=on_gpus, launch=i == n - 1)
        head = op.header()
        dtype, requires_grad, sbp, local, logical = _decode(head)
        arr = op.payload(dtype, local)
        if _state.tracer is not None:  # nn.Graph: a replay receives again, expecting this very header
            op.expected = head
            _state.tracer.call(op, (), arr, "PipelineRecv", f"rank {op.src} -> {list(local)}")
        t = make_global(arr, GlobalMeta(placement, sbp, logical), device)
        if requires_grad:
            t.requires_grad_(True)
        out.append(t)
    if n == 0:  # nothing to receive: the sends queued to go with it go now
        nccl.launch_queued()
        if _state.tracer is not None:
            _state.tracer.call(nccl.launch_queued, (), None, "PipelineLaunch")
    return out


def begin():
    """Start a schedule's handoffs. In an nn.Graph replay: refuse to go on after a replay that
    failed between its sends and its wait (the peers' message streams are then out of step,
    and a receive could take the failed step's tensors)."""
    _check_no_stale_sends()
    if _state.tracer is not None:
        _state.tracer.call(_check_no_stale_sends, (), None, "PipelineBegin")


def wait(requests):
    """Wait for `requests` (what `send` returned); in an nn.Graph, also what a replay's sends
    posted."""
    with _blocking():
        for r in requests:
            r.wait()
    if _state.tracer is not None:
        _state.tracer.call(_wait_replayed_sends, (), None, "PipelineWait")


def blocked_time():
    """Seconds this process has spent blocked in receives and in `wait`, eagerly or replayed,
    since it started (a running total: take differences). A replayed schedule runs no Python to
    time its stages, so its idle time is measured here (libai's pipeline bubble in graph mode)."""
    return _blocked[0]


# ------------------------------------------------------------------ the transfers (also replayed)
_replayed_sends = []  # requests posted by replayed sends, until the replay's wait
_blocked = [0.0]


@contextlib.contextmanager
def _blocking():
    start = time.perf_counter()
    try:
        yield
    finally:
        _blocked[0] += time.perf_counter() - start


def _check_no_stale_sends():
    if _replayed_sends:
        n = len(_replayed_sends) // 2
        _replayed_sends.clear()
        from ..autograd.trace import GraphTraceError

        raise GraphTraceError(f"pipeline handoff: a previous nn.Graph replay failed after posting {n} send(s) it never "
                              "waited for; the stages' message streams are out of step, so this job cannot go on "
                              "(restart it, e.g. from its last checkpoint)")


def _wait_replayed_sends():
    with _blocking():
        while _replayed_sends:
            _replayed_sends.pop().wait()


def _pair(peer_rank):
    """The group of this rank and `peer_rank`, whose NCCL communicator carries their handoffs
    between GPUs (made by the two at their first transfer, as PyTorch's point-to-point: one of
    all the ranks is made by all of them at once, and a pipeline's middle stage never joins a
    transfer between its neighbours, so the first such transfer would wait for it for ever)."""
    return comm.new_group(sorted({comm.get_rank(), int(peer_rank)}))


def _on_gpus(src_placement, dst_placement):
    """Whether a handoff goes GPU to GPU over NCCL (both stages on CUDA), without the host: the
    header (dtype, shapes, SBP: host values) still travels over MPI. Otherwise the shard's bytes
    go through host memory over MPI."""
    return src_placement.type == "cuda" and dst_placement.type == "cuda"


class _Send:
    """One handoff's send: a header, then the shard's bytes."""

    # a replay's send keeps its array until the schedule's wait: nn.Graph's planned peak counts it
    # live until then (engine.autograd.trace.Tape._held_until)
    holds_inputs_until = "PipelineWait"

    def __init__(self, dst, tag, head, on_gpus=False, launch=True):
        self.dst, self.tag, self.head, self.on_gpus, self.launch = dst, tag, head, on_gpus, launch

    def post(self, arr):
        head = comm.isend(self.head, self.dst, tag=self.tag)
        if self.on_gpus:  # queued; launched now, or with this rank's next receive (see `send`)
            requests = [head, comm.isend(arr, self.dst, tag=self.tag, group=_pair(self.dst))]
            if self.launch:
                nccl.launch_queued()
            return requests
        host = comm.host_contiguous(arr)
        return [head, comm.isend(host.reshape(-1).view(np.uint8), self.dst, tag=self.tag)]

    def __call__(self, arr):  # a replay
        _replayed_sends.extend(self.post(arr))


class _Recv:
    """One handoff's receive: the header, then the shard into a fresh array."""

    def __init__(self, src, tag, device, on_gpus=False, launch=True):
        self.src, self.tag, self.device, self.on_gpus, self.launch = src, tag, device, on_gpus, launch
        self.expected = None

    def header(self):
        head = np.empty(_HEADER, dtype=np.int64)
        with _blocking():
            comm.recv(head, self.src, tag=self.tag)
        return head

    def payload(self, dtype, local):
        if self.on_gpus:
            from ..backend import cupy, to_device

            arr = cupy().empty(local, dtype=dtype)  # on this rank's GPU
            comm.irecv(arr, self.src, tag=self.tag, group=_pair(self.src))  # queued: a group's last receive launches
            if self.launch:
                with _blocking():
                    nccl.launch_queued()
            return to_device(arr, self.device)
        raw = np.empty(int(np.prod(local, dtype=np.int64)) * np.dtype(dtype).itemsize, dtype=np.uint8)
        with _blocking():
            comm.recv(raw, self.src, tag=self.tag)
        arr = raw.view(dtype).reshape(local)
        if self.device.type != "cpu":
            from ..backend import to_device

            arr = to_device(arr, self.device)
        return arr

    def __call__(self):  # a replay
        head = self.header()
        if not np.array_equal(head, self.expected):
            from ..autograd.trace import GraphTraceError

            raise GraphTraceError(f"nn.Graph replay: rank {self.src} sent (tag {self.tag}) "
                                  f"{_differences(head, self.expected)}; every rank must replay the schedule it traced")
        dtype, _, _, local, _ = _decode(head)
        return self.payload(dtype, local)


# the fields of a decoded header, each with how an error message shows it
_FIELDS = (("dtype", lambda v: np.dtype(v).name), ("requires_grad", str),
           ("sbp", lambda v: "(" + ", ".join(map(str, v)) + ")"), ("local shape", list), ("logical shape", list))


def _differences(got, want):
    """What a received header has where the traced one had something else, field by field."""
    try:
        got = _decode(got)
    except (IndexError, KeyError, ValueError, TypeError):
        return "a header that is no tensor's (a message of another kind, or from another step)"
    diffs = [f"{name} {show(g)} where the trace received {show(w)}"
             for (name, show), g, w in zip(_FIELDS, got, _decode(want)) if g != w]
    return "; ".join(diffs) or "a header that differs from the traced one"


# ------------------------------------------------------------------ stand-ins and strictness
# (the state lives in global_tensor, which global_to_global and the dispatch consult)


@contextlib.contextmanager
def stand_ins(mapping):
    """While open, `.to_global(placement=...)` of a key of `mapping` (a tensor of another stage)
    starts from its value (a copy on this rank's stage) instead."""
    table = _stage_state["stand_ins"]
    saved = dict(table)
    table.update({id(k): v for k, v in mapping.items()})
    try:
        yield
    finally:
        table.clear()
        table.update(saved)


@contextlib.contextmanager
def stage_local():
    """While open, an op on a tensor of a placement without this rank raises (see the module
    docstring)."""
    _stage_state["strict"] += 1
    try:
        yield
    finally:
        _stage_state["strict"] -= 1
