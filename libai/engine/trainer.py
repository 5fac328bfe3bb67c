"""The training loop with hooks (detectron2's train_loop, LiBai's trainer).

    hook.before_train()                  # every hook, in registration order
    for iter in range(start_iter, max_iter):
        storage.iter = iter
        hook.before_step()               # every hook, in order
        trainer.run_step()
        hook.after_step()                # every hook, in order
        if SIGINT or SIGTERM arrived (on any rank): break
    iter += 1
    storage.iter = iter
    hook.after_train()                   # every hook, in order (also after an exception)

Signals: during train() the first SIGINT (Ctrl-C) or SIGTERM (`kill`, `timeout`, a scheduler)
only asks the loop to stop after the step in progress; the ranks agree on that iteration (an
all-reduce after every step), so after_train sees a finished iteration and the checkpointer
writes a checkpoint whose model, optimizer, scheduler, RNG and data position all describe it.
A second signal abandons the step at once (KeyboardInterrupt): no checkpoint is written then.
`trainer.interrupted` holds the signal number (tools/train_net.py exits with 128 + it).
"""
import contextlib
import logging
import os
import signal
import threading
import time
import weakref

import numpy as np

import engine as flow
import engine.distributed as _edist
from libai.utils import distributed as dist
from libai.utils.events import EventStorage, get_event_storage

__all__ = ["HookBase", "TrainerBase", "EagerTrainer", "SimpleTrainer", "GraphTrainer", "StopSignals",
           "StopSignalAbort"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignalAbort(KeyboardInterrupt):
    """A second stop signal: the step in progress is abandoned. `signum` lets an entry point exit
    with 128 + that signal's number (143 for SIGTERM) rather than KeyboardInterrupt's 130."""

    def __init__(self, signum, message):
        super().__init__(message)
        self.signum = int(signum)


class StopSignals:
    """While open (in the main thread): the first SIGINT/SIGTERM is recorded in `signum`, a
    second raises KeyboardInterrupt. The previous handlers are restored on exit."""

    def __init__(self):
        self.signum = 0
        self._previous = {}

    def __enter__(self):
        self.signum = 0
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in STOP_SIGNALS}
        return self

    def __exit__(self, *exc):
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def _handle(self, signum, frame):
        name = signal.Signals(signum).name
        if self.signum:
            raise StopSignalAbort(signum, f"second stop signal ({name}): the step in progress is abandoned, "
                                          "no checkpoint is written")
        self.signum = signum
        if dist.is_main_process():
            # os.write, not logging: a signal handler may interrupt a logging call in this thread
            os.write(2, f"\n{name} received: stopping after the current iteration (send it again to abort "
                        f"at once, without a checkpoint)\n".encode())


class HookBase:
    """A hook implements any of before_train / before_step / after_step / after_train.

    `self.trainer` (a weak proxy) is set when the hook is registered. Hooks run in the order
    they were registered; work that takes time belongs in after_step (so the iteration timer,
    the first hook, measures the step itself).

    A hook whose state must survive a resume returns it from `state_dict()` (plain values,
    lists and dicts) and takes it back in `load_state_dict(state)`: the trainer's state_dict
    collects it and the checkpointer saves it with the model (detectron2's contract). Only the
    writing rank calls state_dict(), so it must not communicate."""

    trainer = None

    def before_train(self):
        """Called before the first iteration."""

    def after_train(self):
        """Called after the last iteration (also when training stops on an exception)."""

    def before_step(self):
        """Called before each iteration."""

    def after_step(self):
        """Called after each iteration."""

    def state_dict(self):
        """The hook's state to checkpoint; {} (the default) means it has none."""
        return {}

    def load_state_dict(self, state):
        """Restore the state returned by `state_dict()` (on resume, before training starts)."""


class TrainerBase:
    """An iterative trainer with hooks. Attributes: iter (current iteration), start_iter,
    max_iter, storage (the EventStorage open during train()), failed (read-only).

    `state_dict()` is {"iteration": iter, "hooks": {hook key: hook.state_dict()}} for the hooks
    with a non-empty state; a hook's key is its class's __qualname__ (`BestCheckpointer`), with
    "#1", "#2", ... appended for the second, third, ... registered hook of the same class."""

    def __init__(self):
        self._hooks = []
        self.iter = 0
        self.start_iter = 0
        self.max_iter = 0
        self.storage = None
        self._failed = False
        self.interrupted = 0
        self._stop = None

    def stop_requested(self):
        """The signal number of a SIGINT/SIGTERM received on any rank during train() (0: none);
        it is recorded in `interrupted`. A collective when distributed: every rank must ask at
        the same point (the loop after each iteration; EvalHook between evaluation batches)."""
        signum = dist.max_over_ranks(self._stop.signum if self._stop is not None else 0)
        if signum:
            self.interrupted = signum
        return signum

    @property
    def failed(self):
        """True once train() has stopped on an exception (hooks read it in after_train, which
        also runs then, e.g. not to checkpoint a broken state)."""
        return self._failed

    def register_hooks(self, hooks):
        hooks = [h for h in hooks if h is not None]
        for h in hooks:
            if not isinstance(h, HookBase):
                raise TypeError(f"hooks must be HookBase instances, got {type(h).__name__}")
            # a weak reference: hooks and trainer must not own each other
            h.trainer = weakref.proxy(self)
        self._hooks.extend(hooks)

    def train(self, start_iter, max_iter, stop_iter=None):
        """Run iterations start_iter .. max_iter-1. `stop_iter` (< max_iter) ends this run early
        after iteration stop_iter-1, as if the job were interrupted there (the schedule and
        `max_iter` are unchanged, so a resumed run continues the same training). A SIGINT or
        SIGTERM ends it after the current iteration (see the module docstring)."""
        logger = logging.getLogger(__name__)
        logger.info(f"Starting training from iteration {start_iter}")
        self.iter = self.start_iter = start_iter
        self.max_iter = max_iter
        self._failed = False
        self.interrupted = 0
        end = max_iter if stop_iter is None else min(max_iter, stop_iter)
        with EventStorage(start_iter) as self.storage, StopSignals() as self._stop:
            try:
                self.before_train()
                if self.stop_requested():  # during before_train (a resumed evaluation): no iteration
                    end = start_iter
                # with no iteration to run (stop_iter <= start_iter too) iter ends at start_iter:
                # no iteration is counted, checkpointed or logged that never ran
                self.iter = start_iter - 1
                for self.iter in range(start_iter, end):
                    self.before_step()
                    self.run_step()
                    self.after_step()
                    # every rank stops after the same iteration (a collective when distributed)
                    if self.stop_requested():
                        logger.warning(f"{signal.Signals(self.interrupted).name}: stopping after iteration "
                                       f"{self.iter}")
                        break
                # iter == max_iter tells after_train that training finished (not an exception)
                self.iter += 1
            except BaseException:  # KeyboardInterrupt too: an abandoned step is not checkpointed
                self._failed = True
                logger.exception("Exception during training:")
                raise
            finally:
                self.after_train()

    # ------------------------------------------------------------------ state
    def _keyed_hooks(self):
        seen = {}
        for h in self._hooks:
            name = type(h).__qualname__
            n = seen[name] = seen.get(name, -1) + 1
            yield (f"{name}#{n}" if n else name), h

    def state_dict(self):
        hooks = {}
        for key, h in self._keyed_hooks():
            state = h.state_dict()
            if state:
                hooks[key] = state
        return {"iteration": self.iter, "hooks": hooks}

    def load_state_dict(self, state):
        """Restore `iteration` and each hook's state (a state for a hook that is not registered
        is skipped with a warning). Raises ValueError on a malformed state."""
        if not isinstance(state, dict) or not isinstance(state.get("iteration"), int):
            raise ValueError(f"trainer state must be a dict with an int 'iteration', got {state!r}")
        hook_states = state.get("hooks", {})
        if not isinstance(hook_states, dict) or not all(isinstance(v, dict) for v in hook_states.values()):
            raise ValueError(f"trainer state 'hooks' must map hook names to dicts, got {hook_states!r}")
        self.iter = state["iteration"]
        hooks = dict(self._keyed_hooks())
        for key, hook_state in hook_states.items():
            if key in hooks:
                hooks[key].load_state_dict(hook_state)
            else:
                logging.getLogger(__name__).warning(f"no registered hook {key!r}: its saved state is ignored")

    # ------------------------------------------------------------------ the loop
    def before_train(self):
        for h in self._hooks:
            h.before_train()

    def after_train(self):
        self.storage.iter = self.iter
        for h in self._hooks:
            h.after_train()

    def before_step(self):
        self.storage.iter = self.iter
        for h in self._hooks:
            h.before_step()

    def after_step(self):
        for h in self._hooks:
            h.after_step()

    def run_step(self):
        raise NotImplementedError

    @staticmethod
    def write_metrics(loss_dict, data_time, prefix=""):
        """Put `data_time`, each entry and `total_loss` into the event storage: `total_loss` is
        the sum of the entries that make up the loss (`loss_keys`: "total_loss" when the model
        returns it, else the entries named "...loss...", else all)."""
        metrics = {k: (v.item() if hasattr(v, "item") else float(v)) for k, v in loss_dict.items()}
        if not dist.is_main_process():
            return
        storage = get_event_storage()
        storage.put_scalar("data_time", data_time)
        total = sum(metrics[k] for k in loss_keys(metrics))
        if not all(map(_finite, metrics.values())):
            raise FloatingPointError(f"Loss became infinite or NaN at iteration={storage.iter}!\nloss_dict = {metrics}")
        storage.put_scalar(f"{prefix}total_loss", total)
        if len(metrics) > 1 or next(iter(metrics)) != "total_loss":
            storage.put_scalars(**{f"{prefix}{k}": v for k, v in metrics.items()})


def loss_keys(loss_dict):
    """The entries of a model's output dict that make up its loss: "total_loss" when it has one
    (the other entries are then only logged: the components of the total, or metrics such as an
    accuracy); else those whose name contains "loss" (LiBai's rule: {"loss": l, "acc": a} trains
    on l); else all of them."""
    if "total_loss" in loss_dict:
        return ["total_loss"]
    named = [k for k in loss_dict if "loss" in k]
    return named or list(loss_dict)


def loss_of(loss_dict):
    """The value to backpropagate from a model's output dict: the sum of its `loss_keys`."""
    return sum(loss_dict[k] for k in loss_keys(loss_dict))


def _finite(x):
    return x == x and abs(x) != float("inf")


class EagerTrainer(TrainerBase):
    """One optimizer step per iteration over `grad_acc_steps` micro-batches:

        for each of the m micro-batches:
            batch = get_batch(next(loader))          # data_time measured
            losses = loss_of(model(**batch))        # "total_loss", else the "...loss..." entries
            (losses / m).backward()                  # gradients accumulate
        clip each param group with its clip_grad_max_norm / clip_grad_norm_type
        optimizer.step(); optimizer.zero_grad()

    The logged losses are the means over the m micro-batches, so micro-batch b x m steps
    matches micro-batch (b*m) x 1 step.

    Mixed precision: `autocast` (a context factory, e.g. engine.autocast("cpu", dtype=...))
    wraps each forward; with a `grad_scaler` (engine.amp.GradScaler, float16) the loss is
    scaled before backward, the gradients unscaled before clipping, and a step whose gradients
    hold inf/nan (on any rank) is skipped while the scale backs off.

    With `zero` (an engine.distributed.zero.ZeroRedundancy) the optimizer updates shards: the
    gradients are reduced into them (stage 2: reduce-scattered, every micro-batch's backward
    leaving them partial) and the parameters gathered back after the step.

    With a `pipeline` (a libai.engine.pipeline.PipelineRunner, pipeline_parallel_size > 1) the
    m micro-batches run through the stages on its schedule instead; gradient sync, clipping
    (the global norm over every stage) and the optimizer step follow as above. The schedule's
    bubble (the stages' mean idle fraction of the schedule's time), the schedule's time and
    each stage's busy time are logged."""

    def __init__(self, model, data_loader, optimizer, grad_acc_steps=1, get_batch=None, pipeline=None, zero=None,
                 autocast=None, grad_scaler=None):
        super().__init__()
        model.train()
        self.model = model
        self.data_loader = data_loader
        self._data_loader_iter_obj = None
        self.optimizer = optimizer
        self.grad_acc_steps = int(grad_acc_steps or 1)
        self.get_batch = get_batch
        self.pipeline = pipeline
        self.zero = zero
        self.autocast = autocast or contextlib.nullcontext
        self.grad_scaler = grad_scaler
        if pipeline is not None:
            pipeline.autocast = self.autocast
            pipeline.scale_loss = grad_scaler.scale if grad_scaler is not None else None
        self._stage_group = None

    @property
    def _data_loader_iter(self):
        # created lazily: the loader's position can be restored (resume) before the first step
        if self._data_loader_iter_obj is None:
            self._data_loader_iter_obj = iter(self.data_loader)
        return self._data_loader_iter_obj

    def sync_grads(self):
        """Finish data-parallel gradient reduction: global parameters get their deferred
        all-reduce (engine.distributed.sync_grads); local parameters of a pure data-parallel
        job (several ranks, tp = pp = 1) are averaged over the ranks."""
        if self.zero is not None:
            self.zero.reduce_gradients()  # into the shards the optimizer holds
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        _edist.sync_grads(params)
        topo = dist.get_dist_util()
        if topo.world_size > 1 and topo.data_parallel_size == topo.world_size:
            for p in params:
                if p.grad is not None and not p.grad.is_global:
                    _edist.all_reduce(p.grad, op="sum")
                    with flow.no_grad():
                        p.grad.div_(topo.data_parallel_size)

    def clip_grads(self):
        for group in self.optimizer.param_groups:
            max_norm = group.get("clip_grad_max_norm")
            if max_norm is not None and max_norm > 0:
                norm_type = group.get("clip_grad_norm_type", 2.0)
                if self.pipeline is None:
                    flow.nn.utils.clip_grad_norm_(group["params"], max_norm, norm_type)
                else:
                    total = self._norm_over_stages(group["params"], float(norm_type))
                    flow.nn.utils.clip_grads_with_norm_(group["params"], max_norm, total)

    def _norm_over_stages(self, params, norm_type):
        """The gradient norm over every pipeline stage: this stage's total (its ranks hold only
        their stage's gradients), combined with the other stages' over the ranks that share this
        rank's (dp, tp) coordinates."""
        grads = [p.grad for p in params if p.grad is not None]
        topo = dist.get_dist_util()
        if self._stage_group is None:
            ranks = topo.ranks[:, topo.data_parallel_rank, topo.tensor_parallel_rank].tolist()
            self._stage_group = _edist.new_group(ranks)
        if topo.device_type == "cuda":  # on the GPUs (NCCL), the norm never read back to the host
            local = (flow.nn.utils.get_total_norm(grads, norm_type).to(flow.float32) if grads
                     else flow.zeros((), dtype=flow.float32, device="cuda"))  # one dtype on every stage
            stage_norms = _edist.all_gather(local.reshape(1), group=self._stage_group)
            return flow.nn.utils.get_total_norm([stage_norms], norm_type)  # the norm of the norms
        local = float(flow.nn.utils.get_total_norm(grads, norm_type).item()) if grads else 0.0
        stage_norms = _edist.all_gather(flow.tensor([local], dtype=flow.float64), group=self._stage_group)
        return float(flow.nn.utils.get_total_norm([stage_norms], norm_type).item())  # the norm of the norms

    def zero_grad(self):
        self.optimizer.zero_grad()
        if self.zero is not None:
            self.zero.zero_grad()

    def update(self):
        """After the micro-batches' backwards: gradient sync, clipping, the optimizer step (and
        ZeRO's parameter gather), gradients cleared."""
        self.sync_grads()
        scaler = self.grad_scaler
        if scaler is not None:
            scaler.unscale_(self.optimizer)  # true gradients for clipping; inf/nan agreed over ranks
        self.clip_grads()
        if scaler is not None:
            scaler.step(self.optimizer)
            if dist.is_main_process():  # the scale this step used (known: the flags before it are)
                get_event_storage().put_scalar("loss_scale", scaler.get_scale(), smoothing_hint=False)
            scaler.update()
        else:
            self.optimizer.step()
        if self.zero is not None:  # also after a skipped step: its shards are unchanged, and knowing
            self.zero.gather_parameters()  # that would mean waiting for the GPU's inf/nan flag
        self.zero_grad()

    def _run_pipeline(self):
        m = self.grad_acc_steps
        self.zero_grad()
        logged, data_time = self.pipeline_forward_backward(m)
        self.update()
        means = {k: sum(d[k] for d in logged) / m for k in logged[0]}
        self.write_metrics(means, data_time)
        timing = self.pipeline.last_timing
        if timing is not None and dist.is_main_process():
            busy, total = timing[:, 0], timing[:, 1]
            storage = get_event_storage()
            storage.put_scalar("pipeline_bubble", float(np.mean(1.0 - busy / total)), smoothing_hint=False)
            storage.put_scalar("pipeline_time", float(total.max()), smoothing_hint=False)
            for s, b in enumerate(busy):
                storage.put_scalar(f"pipeline_stage{s}_busy_time", float(b), smoothing_hint=False)

    def pipeline_forward_backward(self, m):
        """The pipeline schedule over `m` micro-batches: (the last stage's per-micro-batch loss
        dicts as floats, on every rank; seconds spent getting data)."""
        return self.pipeline.run(lambda: next(self._data_loader_iter), m)

    def run_step(self, get_batch=None, input_placement_device="cpu"):
        """One iteration (see the class docstring). LiBai's call `run_step(get_batch,
        input_placement_device)` turns each loader batch into the model's inputs with
        `get_batch(data, input_placement_device, mixup_func)` (mixup_func: the loader's
        `mixup_func` attribute or None), as LiBai's EagerTrainer; without `get_batch` the one given
        to the constructor is used (it takes the batch only)."""
        assert self.model.training, "[EagerTrainer] model was changed to eval mode!"
        if self.pipeline is not None:
            return self._run_pipeline()
        if get_batch is None:
            fetch = self.get_batch
        else:
            mixup_func = getattr(self.data_loader, "mixup_func", None)

            def fetch(data):
                return get_batch(data, input_placement_device, mixup_func)
        m = self.grad_acc_steps
        data_time = 0.0
        loss_sums = {}
        self.zero_grad()
        for i in range(m):
            start = time.perf_counter()
            data = next(self._data_loader_iter)
            if fetch is not None:
                data = fetch(data)
            data_time += time.perf_counter() - start
            # every micro-batch's data-parallel gradients stay partial sums: update() reduces them
            # once per step, in buckets (engine.distributed.sync_grads), not per parameter
            with _edist.no_grad_sync():
                loss_dict = self.forward_backward(data)
            for k, v in loss_dict.items():
                loss_sums[k] = loss_sums.get(k, 0.0) + v.detach().item()
        self.update()
        self.write_metrics({k: v / m for k, v in loss_sums.items()}, data_time)


    def forward_backward(self, data):
        """One micro-batch: forward (under autocast), the loss over the m micro-batches (scaled for
        float16), backward. Returns the model's loss dict."""
        return micro_batch_step(self.model, data, self.grad_acc_steps, self.autocast, self.grad_scaler)


def micro_batch_step(model, data, m, autocast, grad_scaler):
    with autocast():
        loss_dict = model(**data)
    if not isinstance(loss_dict, dict):
        loss_dict = {"total_loss": loss_dict}
    losses = loss_of(loss_dict)
    losses = losses / m if m > 1 else losses
    if grad_scaler is not None:
        losses = grad_scaler.scale(losses)
    losses.backward()
    return loss_dict


SimpleTrainer = EagerTrainer


class CUDAGraphTrainer(EagerTrainer):
    """`train.cuda_graph.enabled=True`: after `warmup_iters` eager iterations, the micro-batch's
    forward and (scaled) backward are captured once as a CUDA graph (engine.cuda.graph) and
    replayed at every later iteration; gradient sync, clipping, the GradScaler's step and update
    and the optimizer stay eager (docs/cuda.md). Each batch is copied into the tensors the
    capture read; a batch of other shapes or dtypes (or other non-tensor arguments) is captured
    anew. Dropout draws new numbers at every replay, those the eager steps draw
    (engine/cuda_graphs.py). Under data and tensor parallelism each rank captures its NCCL
    collectives too.

    With `grad_acc_steps` > 1 there are two captures: the first micro-batch of an iteration
    writes the gradients (they are None after the last update), the others add to those same
    tensors. A GPU runs nothing while it captures and the CuPy double runs what it records, so
    the gradients are copied aside before the second capture and put back after it: either way
    the replay then adds its micro-batch once."""

    def __init__(self, model, data_loader, optimizer, autocast=None, grad_scaler=None, warmup_iters=3,
                 grad_acc_steps=1):
        super().__init__(model, data_loader, optimizer, grad_acc_steps, autocast=autocast, grad_scaler=grad_scaler)
        self.warmup_iters = int(warmup_iters)
        self._calls = 0
        self._graphs = {}  # "first" / "later" micro-batches -> _Capture

    @property
    def graph(self):
        """The first micro-batch's captured graph (None before the capture)."""
        first = self._graphs.get("first")
        return None if first is None else first.graph

    @staticmethod
    def _signature_of(data):
        return tuple(sorted((k, (tuple(v.shape), v.dtype, v.is_global) if isinstance(v, flow.Tensor) else ("value", v))
                            for k, v in data.items()))

    def forward_backward(self, data):
        m = self.grad_acc_steps
        self._calls += 1
        if self._calls <= self.warmup_iters * m:
            return super().forward_backward(data)
        kind = "first" if (self._calls - 1) % m == 0 else "later"
        signature = self._signature_of(data)
        cap = self._graphs.get(kind)
        if cap is None or cap.signature != signature:
            if kind == "first":
                self._graphs.pop("later", None)  # it adds to the gradients this capture makes
            with flow.no_grad():  # what the double's capture adds is taken back (a GPU's adds nothing)
                saved = {id(p): (p, p.grad.clone()) for p in self.model.parameters() if p.grad is not None}
            graph = flow.cuda.CUDAGraph()
            with flow.cuda.graph(graph):
                loss_dict = micro_batch_step(self.model, data, m, self.autocast, self.grad_scaler)
            made = [p for p, _ in graph._grads.values() if id(p) not in saved]
            if kind == "later" and made:
                raise NotImplementedError(
                    f"train.cuda_graph.enabled=True with gradient accumulation: {len(made)} parameter(s) got no "
                    "gradient from an iteration's first micro-batch but do from a later one (shape "
                    f"{list(made[0].shape)} first); a captured micro-batch can only add to existing gradients")
            with flow.no_grad():
                for p, grad in saved.values():
                    p.grad.copy_(grad)
            cap = self._graphs[kind] = _Capture(graph, signature, data, loss_dict)
        else:
            with flow.no_grad():
                for k, v in data.items():
                    if isinstance(v, flow.Tensor):
                        cap.static[k].copy_(v)
        cap.graph.replay()
        return cap.loss_dict


class _Capture:
    def __init__(self, graph, signature, static, loss_dict):
        self.graph, self.signature, self.static, self.loss_dict = graph, signature, static, loss_dict


class GraphTrainer(EagerTrainer):
    """LiBai's trainer for graph mode (`train.graph.enabled=True`): each micro-batch's forward and
    backward run through an nn.Graph (libai.models.utils.GraphBase), traced at the first
    iteration and replayed after (a second trace for the micro-batches whose data-parallel
    gradient sync is deferred, when there are several). Everything around it is EagerTrainer's:
    the same gradient sync, clipping, optimizer step and logging, so a graph run computes the
    eager run's numbers.

    LiBai's own use, `GraphTrainer(graph, data_loader, grad_acc_steps)` with a graph that was
    given the optimizer (GraphBase(model, optimizer, ...)), is kept: then the graph steps the
    optimizer itself, and each loader batch holds all `grad_acc_steps` micro-batches, which the
    graph splits.

    With a `pipeline` (pipeline_parallel_size > 1) the graph is a
    libai.engine.pipeline.PipelineGraph: one call runs this stage's whole schedule over the
    `grad_acc_steps` micro-batches (their handoffs to the other stages are kernel calls of the
    tape), the same eager update follows. The bubble is logged from PipelineGraph's timing (wall
    time less the time blocked on the other stages)."""

    def __init__(self, graph, data_loader, grad_acc_steps=1, optimizer=None, get_batch=None, grad_scaler=None,
                 zero=None, pipeline=None, autocast=None):
        own = [opt for opt, _ in graph.optimizers]
        if own and zero is not None:
            raise NotImplementedError("GraphTrainer: ZeRO with a graph that steps its own optimizer is not implemented; "
                                      "give the optimizer to the trainer (GraphBase without one)")
        # float16: the graph scales the backward; the eager update unscales, skips and updates.
        # ZeRO: the graph's backward leaves the gradients (partial under stage 2 and 3), the eager
        # update reduces them into the shards, steps and gathers
        scaler = None if own else (grad_scaler or getattr(graph, "grad_scaler", None))
        if pipeline is not None and own:
            raise NotImplementedError("GraphTrainer: a pipeline with a graph that steps its own optimizer is not "
                                      "implemented; give the optimizer to the trainer (PipelineGraph)")
        super().__init__(graph.model, data_loader, optimizer or (own[0] if own else None), grad_acc_steps,
                         get_batch=get_batch, grad_scaler=scaler, zero=zero, pipeline=pipeline, autocast=autocast)
        self.graph = graph
        self.graph_steps = bool(own)

    def forward_backward(self, data):
        return self.graph(**data)

    def pipeline_forward_backward(self, m):
        start = time.perf_counter()
        runner = self.pipeline
        batches = [runner.get_batch(next(self._data_loader_iter), runner.here) for _ in range(m)]
        data_time = time.perf_counter() - start
        return runner.share_logged(self.graph(batches)), data_time

    def run_step(self, get_batch=None, input_placement_device="cpu"):
        if not self.graph_steps:
            return super().run_step(get_batch, input_placement_device)
        assert self.model.training, "[GraphTrainer] model was changed to eval mode!"
        start = time.perf_counter()
        data = next(self._data_loader_iter)
        if get_batch is not None:
            data = get_batch(data, input_placement_device, getattr(self.data_loader, "mixup_func", None))
        elif self.get_batch is not None:
            data = self.get_batch(data)
        data_time = time.perf_counter() - start
        loss_dict = self.graph(**data)
        self.write_metrics({k: v.detach().mean().item() for k, v in loss_dict.items()}, data_time)
