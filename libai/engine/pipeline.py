"""Pipeline parallelism: micro-batches through the stages, scheduled 1F1B or GPipe.

A model opts in with two methods (GPT-2, BERT, ViT and Swin have them):

    model.pipeline_steps() -> [PipelineStep(layer_idx, fn), ...]
        its training forward cut into steps, in order. `fn(carry, batch) -> carry`: `carry` is
        a dict of tensors handed from step to step ({} for the first), `batch` the model's
        keyword arguments (global tensors on the step's stage). The last step returns the
        model's output dict (the losses when training). A step runs on the stage of its
        layer_idx (`dist.get_layer_stage_id`, so 0 is the first stage and -1 the last).
    model.pipeline_tied_parameters() -> [(parameter, layer_idx), ...]   (optional)
        parameters used by a step of another stage than their own (the word embedding that
        the LM head on the last stage shares).

Each rank runs only its stage's steps (stage-local execution, engine.distributed.pipeline):
the carry leaving a stage is sent shard by shard to the next stage, where it becomes a leaf;
backward on a stage starts from the gradients the next stage sends back for it. A tied
parameter is sent to its user stage once per iteration and its gradient, summed over the
micro-batches there, is added to the owner's after the last micro-batch.

Schedules over m micro-batches on p stages (stage s):
* "1F1B" (Megatron's non-interleaved schedule): p-s-1 warm-up forwards, then one forward and
  one backward alternately, then the remaining backwards; at most p-s micro-batches of
  activations are alive on stage s.
* "GPipe": all m forwards, then all m backwards (m micro-batches of activations alive).
Both compute the same gradients; the loss of each micro-batch is divided by m, gradient
all-reduces over data parallelism are deferred to the trainer's sync after the last one.

The bubble: the fraction of the schedule's wall time a stage spends waiting, ideally
(p-1)/(m+p-1); `PipelineRunner.last_timing` holds the measured busy and total times per stage.

Graph mode (`train.graph.enabled=True`): `PipelineGraph` captures this rank's whole schedule
(`run_batches`, the same forwards, backwards and handoffs) as one nn.Graph; the handoffs are
kernel calls of its tape (engine.distributed.pipeline), so replays send and receive them again.
"""
import contextlib
import json
import time
import numpy as np

import engine as flow
import engine.distributed as edist
from engine.distributed import pipeline as handoff
from libai.models.utils.pipeline import PipelineStep
from libai.utils import distributed as dist

from .trainer import loss_of

__all__ = ["PipelineStep", "PipelineRunner", "PipelineGraph", "schedule", "SCHEDULES", "theoretical_bubble"]

SCHEDULES = ("1F1B", "GPipe")
_TAG_FORWARD, _TAG_BACKWARD, _TAG_TIED, _TAG_TIED_GRAD, _TAG_NAMES = 7101, 7102, 7103, 7104, 7105


def theoretical_bubble(stages, micro_batches):
    """(p - 1) / (m + p - 1): the idle fraction of a 1F1B or GPipe schedule with equal stages."""
    return (stages - 1) / (micro_batches + stages - 1)


def schedule(kind, stage, stages, micro_batches):
    """The order of ("F", k) forwards and ("B", k) backwards stage `stage` runs."""
    m = micro_batches
    if kind == "GPipe":
        return [("F", k) for k in range(m)] + [("B", k) for k in range(m)]
    if kind != "1F1B":
        raise ValueError(f"pipeline schedule must be one of {SCHEDULES}, got {kind!r}")
    warmup = min(stages - stage - 1, m)
    order = [("F", k) for k in range(warmup)]
    for k in range(m - warmup):
        order += [("F", warmup + k), ("B", k)]
    order += [("B", k) for k in range(m - warmup, m)]
    return order


def paired_sends(kind, stage, stages, micro_batches):
    """The positions in `schedule(...)` whose sends go in one group with the next operation's
    receives (between GPUs), as Megatron's 1F1B pairs them: in the steady phase a forward's
    activations with the next backward's incoming gradients (send_forward_recv_backward) and a
    backward's gradients with the next forward's activations (send_backward_recv_forward), but
    the last; everything else (warm-up, cool-down, GPipe) launches its sends at once, since the
    peer needs them before it can send anything back."""
    if kind != "1F1B":
        return set()
    warmup = min(stages - stage - 1, micro_batches)
    steady = micro_batches - warmup
    forwards = {warmup + 2 * k for k in range(steady)}
    backwards = {warmup + 2 * k + 1 for k in range(steady - 1)}
    return forwards | backwards


def _read_once(outputs):
    """[{name: float}] of the output dicts' one-element tensors, read from a GPU in one transfer
    (one host synchronisation per step, not one per micro-batch and value)."""
    values = [v.detach() for out in outputs for v in out.values()]
    if not values or values[0].device.type == "cpu":
        flat = [v.item() for v in values]
    else:
        flat = flow.stack([dist.ttol(v).reshape(()).to(flow.float64) for v in values])
        flat = flat.cpu().numpy().tolist()
    it = iter(flat)
    return [{key: next(it) for key in out} for out in outputs]


class PipelineRunner:
    """Runs `model`'s pipeline steps on this rank's stage (see the module docstring).

    `get_batch(data, placement)` turns a loader batch into the model's keyword arguments on
    `placement` (the trainer's get_batch)."""

    def __init__(self, model, get_batch, kind="1F1B", device_type="cpu"):
        if kind not in SCHEDULES:
            raise ValueError(f"train.dist.pipeline_schedule must be one of {SCHEDULES}, got {kind!r}")
        if not hasattr(model, "pipeline_steps"):
            raise NotImplementedError(f"{type(model).__name__} has no pipeline_steps(): it cannot run with "
                                      "train.dist.pipeline_parallel_size > 1 (see libai/engine/pipeline.py)")
        topo = dist.get_dist_util()
        self.model, self.get_batch, self.kind = model, get_batch, kind
        self.stages, self.stage = topo.pipeline_parallel_size, topo.pipeline_stage
        self.placements = [flow.placement(device_type, topo.get_stage_ranks(s)) for s in range(self.stages)]
        self.here = self.placements[self.stage]
        steps = list(model.pipeline_steps())
        stage_ids = [topo.get_layer_stage_id(st.layer_idx) for st in steps]
        if stage_ids != sorted(stage_ids) or stage_ids[0] != 0 or stage_ids[-1] != self.stages - 1:
            raise ValueError(f"{type(model).__name__}.pipeline_steps(): the steps' stages must go from 0 to "
                             f"{self.stages - 1} in order, got {stage_ids} (train.dist.pipeline_num_layers / "
                             "custom_pipeline_stage_id)")
        missing = sorted(set(range(self.stages)) - set(stage_ids))
        if missing:
            raise ValueError(f"pipeline stages {missing} get no step of {type(model).__name__}: use at most as many "
                             f"stages as the model has layers ({len(steps)} steps)")
        self.steps = [st for st, s in zip(steps, stage_ids) if s == self.stage]
        # (parameter, its stage, the stage of the step that also uses it), for those two that differ
        tied = [(p, self._stage_of(p), topo.get_layer_stage_id(p_idx))
                for p, p_idx in getattr(model, "pipeline_tied_parameters", lambda: [])()]
        self.tied = [(p, owner, user) for p, owner, user in tied if owner != user]
        self.last_timing = None
        self._wait_time = 0.0  # seconds blocked in receives during run() (not busy)
        # mixed precision (set by the trainer): the forward's autocast context and the loss scaling
        self.autocast = contextlib.nullcontext
        self.scale_loss = None

    @property
    def is_first(self):
        return self.stage == 0

    @property
    def is_last(self):
        return self.stage == self.stages - 1

    # ------------------------------------------------------------------ training
    def run(self, next_data, micro_batches):
        """Forward and backward of `micro_batches` micro-batches (`next_data()` yields each
        loader batch; every rank draws all of them). Returns the per-micro-batch output dicts
        of the last stage as floats, on every rank, and the time spent getting data."""
        self._data_time = self._wait_time = 0.0
        start = time.perf_counter()
        outputs, busy = self._schedule(lambda k: self._batch(next_data), micro_batches)
        total = time.perf_counter() - start
        self.last_timing = self.gather_timing(busy - self._wait_time, total)
        return self.share_logged(outputs), self._data_time

    def run_batches(self, batches):
        """The same schedule over `batches` (one per micro-batch, already on this stage: the
        inputs of an nn.Graph that captures the step, libai.engine.pipeline.PipelineGraph).
        Returns the last stage's output dicts as tensors (an empty list elsewhere); the timing is
        PipelineGraph's."""
        self.last_timing = None
        return self._schedule(batches.__getitem__, len(batches))[0]

    def share_logged(self, outputs):
        """The last stage's per-micro-batch output dicts (`outputs`, tensors there) as {name:
        float} dicts, on every rank."""
        logged = _read_once(outputs) if self.is_last else None
        return dist.broadcast_object(logged, src=int(np.asarray(self.placements[-1].mesh).reshape(-1)[0]))

    def _schedule(self, batch_of, m):
        """Run this stage's part of the schedule: ([the last stage's detached output dict per
        micro-batch], seconds busy)."""
        handoff.begin()
        self._pending = []
        self._inputs, self._outputs, self._losses, self._results = {}, {}, {}, []
        busy = 0.0
        stand = self._fetch_tied()
        paired = paired_sends(self.kind, self.stage, self.stages, m)
        for i, (op, k) in enumerate(schedule(self.kind, self.stage, self.stages, m)):
            t0 = time.perf_counter()
            if op == "F":
                self._forward(k, batch_of(k), m, stand, launch=i not in paired)
            else:
                self._backward(k, launch=i not in paired)
            busy += time.perf_counter() - t0
        self._return_tied_grads(stand)
        handoff.wait(self._pending)
        return self._results, busy

    def _batch(self, next_data):
        t0 = time.perf_counter()
        batch = self.get_batch(next_data(), self.here)
        self._data_time += time.perf_counter() - t0
        return batch

    def _forward(self, k, batch, m, stand, launch=True):
        carry = self._recv_carry(_TAG_FORWARD) if not self.is_first else {}
        self._inputs[k] = carry
        with handoff.stage_local(), handoff.stand_ins(stand), self.autocast():
            for step in self.steps:
                carry = step.fn(carry, batch)
        if self.is_last:
            if not isinstance(carry, dict):
                carry = {"total_loss": carry}
            loss = loss_of(carry) / m if m > 1 else loss_of(carry)
            self._losses[k] = self.scale_loss(loss) if self.scale_loss is not None else loss
            self._results.append({key: v.detach() for key, v in carry.items()})
        else:
            self._outputs[k] = self._send_carry(carry, _TAG_FORWARD, launch)

    def _backward(self, k, launch=True):
        with edist.no_grad_sync(), handoff.stage_local():
            if self.is_last:
                self._losses.pop(k).backward()
            else:
                sent = [t for t in self._outputs.pop(k) if t.requires_grad]
                grads = self._recv(self.placements[self.stage + 1], _TAG_BACKWARD, len(sent))
                if sent:
                    flow.autograd.backward(sent, grads)
        inputs = self._inputs.pop(k)
        if not self.is_first:
            prev = self.placements[self.stage - 1]
            for t in inputs.values():
                if t is not None and t.requires_grad:
                    g = t.grad if t.grad is not None else flow.zeros_like(t)
                    self._pending += handoff.send(g, prev, tag=_TAG_BACKWARD, launch=launch)

    # ------------------------------------------------------------------ handoff
    def _recv(self, src_placement, tag, n=None):
        """One tensor from `src_placement`'s stage, or with `n` a list of `n` (in one group)."""
        t0 = time.perf_counter()
        got = handoff.recv_many(src_placement, self.here, 1 if n is None else n, tag=tag)
        self._wait_time += time.perf_counter() - t0
        return got[0] if n is None else got

    def _send_carry(self, carry, tag, launch=True):
        """Send the carry's names, then its tensors, to the next stage; returns the tensors."""
        if not isinstance(carry, dict) or not all(v is None or isinstance(v, flow.Tensor) for v in carry.values()):
            raise TypeError("a pipeline step must return a dict of tensors (or None values) to the next stage, got "
                            f"{type(carry).__name__}")
        nxt = self.placements[self.stage + 1]
        dst = handoff.peer(edist.get_rank(), self.here, nxt)
        names = np.frombuffer(json.dumps([[k, v is not None] for k, v in carry.items()]).encode(), dtype=np.uint8)
        self._pending.append(edist.isend(np.array([names.size], dtype=np.int64), dst, tag=_TAG_NAMES))
        self._pending.append(edist.isend(names.copy(), dst, tag=_TAG_NAMES))
        sent = []
        for v in carry.values():
            if v is not None:
                self._pending += handoff.send(v, nxt, tag=tag, launch=launch)
                sent.append(v)
        return sent

    def _recv_carry(self, tag):
        prev = self.placements[self.stage - 1]
        src = handoff.peer(edist.get_rank(), self.here, prev)
        t0 = time.perf_counter()
        n = np.empty(1, dtype=np.int64)
        edist.recv(n, src, tag=_TAG_NAMES)
        raw = np.empty(int(n[0]), dtype=np.uint8)
        edist.recv(raw, src, tag=_TAG_NAMES)
        self._wait_time += time.perf_counter() - t0
        names = json.loads(raw.tobytes().decode())
        got = iter(self._recv(prev, tag, sum(bool(present) for _, present in names)))
        return {k: (next(got) if present else None) for k, present in names}

    # ------------------------------------------------------------------ tied parameters
    def _fetch_tied(self, requires_grad=True):
        """{parameter: its copy on this stage} for the tied parameters this stage uses."""
        stand = {}
        for p, owner, user in self.tied:
            if self.stage == owner:
                self._pending += handoff.send(p.detach(), self.placements[user], tag=_TAG_TIED)
            elif self.stage == user:
                stand[p] = self._recv(self.placements[owner], _TAG_TIED).requires_grad_(requires_grad and
                                                                                       p.requires_grad)
        return stand

    def _return_tied_grads(self, stand):
        """Send each copy's gradient (summed over the micro-batches) to the owner, which adds it
        (not for a frozen parameter: every stage sees its requires_grad)."""
        for p, owner, user in self.tied:
            if not p.requires_grad:
                continue
            if self.stage == user:
                copy = stand[p]
                g = copy.grad if copy.grad is not None else flow.zeros_like(copy)
                self._pending += handoff.send(g, self.placements[owner], tag=_TAG_TIED_GRAD)
            elif self.stage == owner:
                g = self._recv(self.placements[user], _TAG_TIED_GRAD)
                with edist.no_grad_sync():  # added as a backward adds it (recorded in a graph)
                    p.backward(g)

    def _stage_of(self, tensor):
        for s, pl in enumerate(self.placements):
            if tensor.placement == pl:
                return s
        raise ValueError(f"a tied parameter lives on {tensor.placement!r}, which is no pipeline stage")

    # ------------------------------------------------------------------ evaluation
    def forward_only(self, data):
        """One batch forward through the stages (no autograd): (the batch on this stage, the
        model's output dict on the last stage or None elsewhere)."""
        batch = self.get_batch(data, self.here)
        self._pending = []
        # the tied parameters first, as in a training step: between GPUs the transfers of two
        # stages are matched in the order they are made (NCCL has no tags), so both stages make
        # them in one order (the last stage had received the activations first: the first stage's
        # embedding then met the receive of the activations)
        stand = self._fetch_tied(requires_grad=False)
        carry = self._recv_carry(_TAG_FORWARD) if not self.is_first else {}
        with handoff.stage_local(), handoff.stand_ins(stand), self.autocast():
            for step in self.steps:
                carry = step.fn(carry, batch)
        if not self.is_last:
            self._send_carry(carry, _TAG_FORWARD)
            carry = None
        handoff.wait(self._pending)
        return batch, carry

    # ------------------------------------------------------------------ timing
    def gather_timing(self, busy, total):
        """Busy and total seconds of every stage (rows by stage; the mean over a stage's ranks)."""
        mine = np.array([self.stage, busy, total], dtype=np.float64)
        rows = edist.all_gather(flow.tensor(mine.reshape(1, 3))).numpy() if edist.get_world_size() > 1 \
            else mine.reshape(1, 3)
        out = np.zeros((self.stages, 2))
        for s in range(self.stages):
            sel = rows[rows[:, 0] == s]
            out[s] = sel[:, 1:].mean(axis=0)
        return out


class PipelineGraph(flow.nn.Graph):
    """Graph mode with pipeline parallelism (`train.graph.enabled=True` and
    `train.dist.pipeline_parallel_size > 1`): a call runs this rank's whole schedule over the
    given micro-batches (`graph(batches)`, each already on this stage: runner.get_batch),
    forwards and backwards in the schedule's order; the handoffs to the neighbouring stages are
    kernel calls of the tape (engine.distributed.pipeline), so a replay sends and receives them
    again with no Python around. Returns what `PipelineRunner.run_batches` returns. The
    optimizer step stays with the trainer (GraphTrainer's eager update), as in eager mode."""

    def __init__(self, runner):
        super().__init__()
        self.model = runner.model
        object.__setattr__(self, "runner", runner)

    def __call__(self, batches):
        """The schedule over `batches`, and `runner.last_timing` for the trainer's bubble: a
        stage's busy time is the call's wall time less the time its receives and final wait
        spent blocked (engine.distributed.pipeline.blocked_time; a replay runs no Python around
        the schedule's ops to time them one by one). Every rank calls it, as the schedule.
        A call that traced (the first, or a new signature) leaves `last_timing` None: its wall time
        is mostly the capture, so no bubble is logged for it."""
        traces, blocked, start = self.num_traces, handoff.blocked_time(), time.perf_counter()
        out = super().__call__(batches)
        total = time.perf_counter() - start
        timing = self.runner.gather_timing(total - (handoff.blocked_time() - blocked), total)  # (every rank)
        self.runner.last_timing = None if self.num_traces != traces else timing
        return out

    def build(self, batches):
        return self.runner.run_batches(batches)

    def set_grad_scaler(self, grad_scaler):
        raise NotImplementedError("PipelineGraph.set_grad_scaler: the stages' backwards start from received "
                                  "gradients, which a graph's scaler would scale again; set the runner's scale_loss "
                                  "(the trainer does: train.amp with float16) and unscale in the update")
