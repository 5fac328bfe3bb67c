"""`engine.nn.Graph`: OneFlow's static-graph mode. Write the step once in `build`; the first call
traces it, later calls replay the captured kernels.

    class TrainGraph(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(optimizer, lr_sch=scheduler)

        def build(self, x, y):
            loss = self.model(x, y)
            loss.backward()
            return loss

    graph = TrainGraph()
    loss = graph(x, y)        # first call: runs eagerly while tracing; later calls: replay

What a call does: gradients already held by the parameters are set aside, the step runs (traced
or replayed: forward, backward, and the boxing of global tensors, as one tape of kernel calls,
engine.autograd.trace), the fresh gradients are added to the ones set aside as eager
accumulation adds them, and, with an optimizer added, each optimizer clips (param groups with
`clip_grad_max_norm`), steps and zeroes its gradients and its scheduler steps (OneFlow's order).
A tape is kept per *signature*: the input tensors' shapes, dtypes, devices and SBP, the other
arguments' values, each module's train/eval flag, the grad and autocast modes and the
data-parallel gradient-sync mode. A new signature traces again (`graph.num_traces` counts).

What is frozen at trace time: Python values computed in `build` or in the modules' forwards
(they are constants of the tape), and which branches Python took. Reading a tensor computed in
the step (`.item()`, `.numpy()`, `bool(t)`) raises GraphTraceError; a kernel whose saved
Python values (a count, a shape) change at replay raises too. Random numbers are drawn anew at
every replay (dropout, rand/randn), in the order eager draws them, so a graph and an eager run
from the same generator state compute the same bits.
"""
import collections
import contextlib
import sys
import types

from ..autograd.grad_mode import _state, is_grad_enabled
from ..autograd.trace import GraphTraceError, Tracer
from ..tensor import Tensor
from .module import Module, structure_version

__all__ = ["Graph", "GraphConfig", "GraphModule", "GraphTraceError", "is_tracing"]


# what engine.distributed tells a graph (it sits above nn): this rank, and whether data-parallel
# gradient sync is deferred (no_grad_sync), which changes what a step's backward computes
_context = {"rank": lambda: 0, "deferred_grad_sync": lambda: False}


def set_distributed_context(rank, deferred_grad_sync):
    _context.update(rank=rank, deferred_grad_sync=deferred_grad_sync)


def is_tracing():
    """Whether an nn.Graph is capturing the running code (a model may then pick a path whose
    shapes do not depend on the data, as BERT's masked-LM head does)."""
    return _state.tracer is not None


class GraphConfig:
    """OneFlow's `graph.config`: the settings a graph reads when it is called."""

    def __init__(self):
        self.grad_acc_steps = 1
        self.amp_dtype = None

    def set_gradient_accumulation_steps(self, value):
        """Split each call's tensor inputs along dim 0 into `value` micro-batches; the backward of
        each is scaled by 1/value and the gradients add up before the optimizer steps. Outputs of
        the micro-batches are concatenated along dim 0 (0-dim ones stacked)."""
        value = int(value)
        if value < 1:
            raise ValueError(f"set_gradient_accumulation_steps: expected a positive number, got {value}")
        self.grad_acc_steps = value

    def enable_amp(self, mode=True, *, dtype=None):
        """Run `build` under autocast in `dtype` (OneFlow's default: float16; bfloat16 is the CPU's
        other choice) on the device of the call's inputs (else of the parameters). float16
        training also wants loss scaling: `graph.set_grad_scaler(flow.amp.GradScaler())`."""
        if not mode:
            self.amp_dtype = None
            return
        from .. import amp
        from ..backend import dtypes

        dtype = dtypes.float16 if dtype is None else dtypes.as_dtype(dtype)
        amp.autocast("cpu", dtype)  # the same checks as autocast's (float16 or bfloat16)
        self.amp_dtype = dtype

    def allow_fuse_add_to_output(self, mode=True):
        """Accepted: the engine's kernels already add residuals in place where they can."""

    def allow_fuse_model_update_ops(self, mode=True):
        """Accepted: the optimizers' updates are already one multi-tensor kernel."""


class GraphModule:
    """OneFlow's per-module graph settings, `module.to(nn.graph.GraphModule)`:

        self.block.to(flow.nn.graph.GraphModule).activation_checkpointing = True

    `activation_checkpointing`: the module's forward runs through
    `engine.utils.checkpoint.checkpoint` in training with autograd on (in a graph and eagerly:
    the same numbers either way), its activations recomputed in backward. A layer that has its
    own switch (libai's TransformerLayer, SwinBlock) gets that switch set. `set_stage(stage_id,
    placement)`: accepted where it agrees with the module's parameter placement (a pipeline is
    captured per stage, libai.engine.pipeline.PipelineGraph), refused where it would move the
    module. `to(nn.Module)` gives the module back."""

    _ATTR = "_graph_module"

    def __init__(self, module):
        object.__setattr__(self, "origin", module)

    @classmethod
    def of_module(cls, module):
        gm = module.__dict__.get(cls._ATTR)
        if gm is None:
            gm = cls(module)
            object.__setattr__(module, cls._ATTR, gm)
        return gm

    def to(self, kind):
        if isinstance(kind, type) and issubclass(kind, Module):
            return self.origin
        if kind is GraphModule:
            return self
        raise TypeError(f"GraphModule.to: expected nn.Module or nn.graph.GraphModule, got {kind!r}")

    @property
    def activation_checkpointing(self):
        m = self.origin
        if hasattr(type(m), "activation_checkpointing"):
            return bool(m.activation_checkpointing)
        return getattr(m.__dict__.get("forward"), "__func__", None) is _checkpointed_forward

    @activation_checkpointing.setter
    def activation_checkpointing(self, value):
        m = self.origin
        if hasattr(type(m), "activation_checkpointing"):  # the layer's own switch
            m.activation_checkpointing = bool(value)
        elif value and not self.activation_checkpointing:
            # a bound method in the instance: copy.deepcopy rebinds it to the copy
            object.__setattr__(m, "forward", types.MethodType(_checkpointed_forward, m))
        elif not value and self.activation_checkpointing:
            object.__delattr__(m, "forward")

    @property
    def stage_id(self):
        return self.origin.__dict__.get("_graph_stage_id")

    def set_stage(self, stage_id=None, placement=None):
        """OneFlow's pipeline stage of a module inside one graph. Here a pipeline is captured per
        stage, each rank its own (libai.engine.pipeline.PipelineGraph), and a module's stage is
        where its parameters are placed. So a stage that agrees with that placement is recorded
        (`stage_id` reads it back: LiBai models' `set_pipeline_stage_id` runs unchanged); one that
        does not is an error naming the parameter and both placements: moving modules between
        stages from inside a graph is not implemented."""
        if stage_id is not None and (isinstance(stage_id, bool) or not isinstance(stage_id, int) or stage_id < 0):
            raise ValueError(f"GraphModule.set_stage: stage_id must be a non-negative int, got {stage_id!r}")
        if placement is not None:
            for name, p in self.origin.named_parameters():
                if p.is_global and p.placement != placement:
                    raise NotImplementedError(
                        f"GraphModule.set_stage: parameter {name!r} of {type(self.origin).__name__} is placed on "
                        f"{p.placement!r}, not on the stage's {placement!r}; moving modules between pipeline "
                        "stages from inside a graph is not implemented (place the layers on their stages when "
                        "building the model: libai.utils.distributed.get_layer_placement)")
        object.__setattr__(self.origin, "_graph_stage_id", stage_id)

    def __setattr__(self, name, value):
        if not hasattr(type(self), name) or name == "stage_id":
            raise AttributeError(f"GraphModule has no setting {name!r} (activation_checkpointing; the stage is "
                                 "set by set_stage)")
        object.__setattr__(self, name, value)


def _checkpointed_forward(self, *args, **kwargs):
    """A module's forward with activation checkpointing (GraphModule.activation_checkpointing)."""
    from ..utils.checkpoint import checkpoint

    forward = type(self).forward
    if self.training and is_grad_enabled():
        return checkpoint(lambda *a, **k: forward(self, *a, **k), *args, **kwargs)
    return forward(self, *args, **kwargs)


class Graph:
    """Subclass it, assign modules (and `add_optimizer`) in `__init__`, write `build`."""

    def __init__(self):
        object.__setattr__(self, "_modules", collections.OrderedDict())
        object.__setattr__(self, "_optimizers", [])
        object.__setattr__(self, "_tapes", {})
        object.__setattr__(self, "config", GraphConfig())
        object.__setattr__(self, "_debug", None)
        object.__setattr__(self, "num_traces", 0)
        object.__setattr__(self, "last_tape", None)
        object.__setattr__(self, "_name", type(self).__name__)
        object.__setattr__(self, "_grad_scaler", None)

    def __setattr__(self, name, value):
        if isinstance(value, Module):
            self._modules[name] = value
        object.__setattr__(self, name, value)

    @property
    def name(self):
        return self._name

    @property
    def optimizers(self):
        """The (optimizer, lr scheduler) pairs given to add_optimizer."""
        return list(self._optimizers)

    def build(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} must define build(*inputs)")

    def state_dict(self, *args, **kwargs):
        raise NotImplementedError("nn.Graph.state_dict() is not implemented: a graph holds no state of its own here; "
                                  "save its modules' and optimizers' state_dict() (the same objects the graph "
                                  "updates)")

    def load_state_dict(self, *args, **kwargs):
        raise NotImplementedError("nn.Graph.load_state_dict() is not implemented: load the modules' and optimizers' "
                                  "state_dict() (replays read the loaded values)")

    def add_optimizer(self, optim, *, lr_sch=None, is_sparse=False):
        """Step `optim` (and `lr_sch`) after every call's backward, as OneFlow's graph does."""
        if is_sparse:
            raise NotImplementedError("add_optimizer(is_sparse=True): sparse updates are not implemented")
        self._optimizers.append((optim, lr_sch))

    def set_grad_scaler(self, grad_scaler):
        """OneFlow's loss scaling in a graph (`flow.amp.GradScaler` or `StaticGradScaler`):
        `loss.backward()` in `build` is seeded with the scaler's current scale (read at every
        replay, not frozen at the trace); with optimizers added, each call then unscales their
        gradients, clips, steps unless a gradient is inf/nan, and updates the scale. Without
        an optimizer the gradients are left scaled, as after `scaler.scale(loss).backward()`.
        A `gradient=` given to `backward` is scaled the same way. Do not also call `scaler.scale`
        in `build`: the loss would be scaled twice. Setting another scaler traces again."""
        object.__setattr__(self, "_grad_scaler", grad_scaler)
        self._tapes.clear()  # their backward was seeded with the previous scaler's scale tensor

    def debug(self, v_level=0, *, ranks=None, max_py_stack_depth=2, only_user_py_stack=True):
        """Print the captured graph (kernels, shapes, SBP, planned memory) of every trace from now
        on, and of the last one now if there is one. `v_level`: 0 a summary, >= 1 every kernel.
        `ranks`: the ranks that print (default 0; -1 all)."""
        object.__setattr__(self, "_debug", (int(v_level), ranks))
        if self.last_tape is not None:
            self._print_debug(self.last_tape)

    # ------------------------------------------------------------ a call
    def __call__(self, *args, **kwargs):
        n = self.config.grad_acc_steps
        params = self._parameters()
        stash = [(p, p.grad) for p in params if p.grad is not None]
        if n == 1 and is_grad_enabled():
            # an input leaf that requires grad gets its gradient as eagerly: added to what it holds
            stash += [(t, t.grad) for t in _tensors_of((args, kwargs))
                      if t.requires_grad and t.grad_fn is None and t.grad is not None
                      and all(t is not p for p, _ in stash)]
        scaler = self._grad_scaler
        outside = []  # (input computed outside the graph, the leaf traced in its place)
        with self._amp(params, args, kwargs), _loss_scaled_by(scaler):
            if n == 1:
                out = self._run_once(params, stash, args, kwargs, outside)
            else:
                out = self._run_accumulated(params, stash, n, args, kwargs, outside)
        _backward_outside(outside)
        if self._optimizers:
            for optim, lr_sch in self._optimizers:
                if scaler is not None:
                    scaler.unscale_(optim)  # true gradients for clipping; notes inf/nan
                if any(g.get("clip_grad_max_norm") is not None for g in optim.param_groups):
                    optim.clip_grad()
                if scaler is not None:
                    scaler.step(optim)  # skipped when a gradient is inf/nan
                else:
                    optim.step()
                optim.zero_grad(set_to_none=True)
                if lr_sch is not None:
                    lr_sch.step()
            if scaler is not None:
                scaler.update()
        return out

    def _amp(self, params, args, kwargs):
        """The autocast of graph.config.enable_amp on the inputs' device (else the parameters')."""
        dtype = self.config.amp_dtype
        if dtype is None:
            return contextlib.nullcontext()
        from ..amp import autocast

        on = _tensors_of((args, kwargs)) or params
        device = on[0]._device.type if on else "cpu"
        return autocast(device, dtype)

    def _run_once(self, params, stash, args, kwargs, outside):
        for p, _ in stash:
            p.grad = None
        if is_grad_enabled():
            args, kwargs = _leaves_for_outside((args, kwargs), outside)
        try:
            return self._run(args, kwargs)
        finally:
            _combine(stash)

    def _run_accumulated(self, params, stash, n, args, kwargs, outside):
        from ..ops.shape import cat, stack

        parts = [_split(a, n, f"input {i}") for i, a in enumerate(args)]
        kw_parts = {k: _split(v, n, f"input {k!r}") for k, v in kwargs.items()}
        outs = []
        prev = _state.grad_root_scale
        _state.grad_root_scale = prev / n
        try:
            for j in range(n):
                held = [(p, p.grad) for p in params if p.grad is not None] if j else stash
                outs.append(self._run_once(params, held, tuple(p[j] for p in parts),
                                           {k: v[j] for k, v in kw_parts.items()}, outside))
        finally:
            _state.grad_root_scale = prev
        return _merge(outs, cat, stack)

    def _run(self, args, kwargs):
        key = self._signature(args, kwargs)
        if self._tapes and next(iter(self._tapes))[-1] != key[-1]:
            self._tapes.clear()  # a parameter, buffer or submodule was reassigned: the tapes read the old ones
        tape = self._tapes.get(key)
        in_tensors = _tensors_of((args, kwargs))
        if tape is None:
            return self._trace(key, args, kwargs, in_tensors)
        arrays = _replay(tape, in_tensors)
        template, metas = tape.output_template
        return _unflatten(template, [_output_tensor(a, m) for a, m in zip(arrays, metas)])

    def _trace(self, key, args, kwargs, in_tensors):
        dynamic = []
        for m in self._modules.values():
            for t in list(m.parameters()) + list(m.buffers()):
                dynamic.append((t._data, _reader(t)))
        tracer = Tracer(dynamic)
        for t in in_tensors:
            tracer.add_input(t._data, t)
        with tracer:
            out = self.build(*args, **kwargs)
        template, tensors = _flatten(out)
        tape = tracer.finish([t._data for t in tensors])
        tape.output_template = (template, [(t._device, t._global) for t in tensors])
        tape.signature = key
        self._tapes[key] = tape
        object.__setattr__(self, "num_traces", self.num_traces + 1)
        object.__setattr__(self, "last_tape", tape)
        if self._debug is not None:
            self._print_debug(tape)
        return _unflatten(template, [_output_tensor(t._data, (t._device, t._global)) for t in tensors])

    def _parameters(self):
        seen, out = set(), []
        for m in self._modules.values():
            for p in m.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        for optim, _ in self._optimizers:
            for g in optim.param_groups:
                for p in g["params"]:
                    if id(p) not in seen:
                        seen.add(id(p))
                        out.append(p)
        return out

    def _signature(self, args, kwargs):
        modes = tuple(m.training for top in self._modules.values() for m in top.modules())
        return (_value_key(args), _value_key(kwargs), modes, is_grad_enabled(), _state.autocast,
                _context["deferred_grad_sync"](), _state.grad_root_scale, _state.loss_scale is not None,
                structure_version())

    # ------------------------------------------------------------ debugging
    def summary(self, tape=None, v_level=0):
        tape = tape or self.last_tape
        if tape is None:
            return f"{self.name}: not traced yet"
        counts = collections.Counter(e.label for e in tape.entries)
        lines = [f"{self.name}: {len(tape.entries)} kernel calls, {tape.n_slots} values, "
                 f"planned peak {tape.planned_peak_bytes / 2**20:.1f} MiB of intermediates "
                 f"(traced step allocated {tape.traced_bytes / 2**20:.1f} MiB), {self.num_traces} trace(s)",
                 "  kernels: " + ", ".join(f"{k} x{v}" for k, v in counts.most_common())]
        if v_level >= 1:
            lines.append(tape.describe())
        return "\n".join(lines)

    def _print_debug(self, tape):
        v_level, ranks = self._debug
        rank = _context["rank"]()
        if ranks is None:
            ranks = [0]
        elif isinstance(ranks, int):
            ranks = None if ranks == -1 else [ranks]
        if ranks is None or rank in ranks:
            print(self.summary(tape, v_level), file=sys.stdout, flush=True)

    def __repr__(self):
        mods = ", ".join(f"{k}: {type(v).__name__}" for k, v in self._modules.items())
        return f"{self.name}({mods}; {self.num_traces} trace(s))"


# ------------------------------------------------------------------ helpers
def _replay(tape, in_tensors):
    """tape.replay; a tape that swaps random states (activation checkpointing) gets the state it
    started from back if it raises between a swap and its undo."""
    swaps = tape.__dict__.get("swaps_rng")
    if swaps is None:
        from ..utils.checkpoint import RNG_SWAP_LABEL

        swaps = tape.swaps_rng = any(e.label == RNG_SWAP_LABEL for e in tape.entries)
    if not swaps:
        return tape.replay([t._data for t in in_tensors], in_tensors)
    from ..backend.random import get_rng_state, set_rng_state

    state = get_rng_state()
    try:
        return tape.replay([t._data for t in in_tensors], in_tensors)
    except BaseException:
        set_rng_state(state)
        raise


def _leaves_for_outside(x, outside):
    """`x` (args and kwargs) with each tensor that requires grad and has a grad_fn (computed
    outside the graph, or a micro-batch view of an input) replaced by a fresh leaf: the captured
    backward stops there, and `_backward_outside` carries its gradient on after the step."""
    if isinstance(x, Tensor):
        if x.requires_grad and x.grad_fn is not None:
            leaf = x.detach().requires_grad_()
            outside.append((x, leaf))
            return leaf
        return x
    if isinstance(x, (tuple, list)):
        return type(x)(_leaves_for_outside(v, outside) for v in x)
    if isinstance(x, dict):
        return type(x)((k, _leaves_for_outside(v, outside)) for k, v in x.items())
    return x


def _backward_outside(outside):
    """The gradients the step left on the stand-in leaves, backpropagated eagerly into the code
    that computed the inputs (one backward over all of them: micro-batch views share a node).
    Already scaled by a grad scaler's scale when the graph has one, so not scaled again."""
    pairs = [(t, leaf.grad) for t, leaf in outside if leaf.grad is not None]
    if pairs:
        from .. import autograd

        autograd.backward([t for t, _ in pairs], [g for _, g in pairs])


@contextlib.contextmanager
def _loss_scaled_by(scaler):
    """While a graph with a grad scaler runs: an implicit `loss.backward()` gradient is the
    scaler's scale tensor (engine.autograd reads _state.loss_scale)."""
    if scaler is None or not scaler.is_enabled():
        yield
        return
    prev = _state.loss_scale
    _state.loss_scale = scaler._scale_on
    try:
        yield
    finally:
        _state.loss_scale = prev


def _reader(t):
    return lambda: t._data


def _combine(stash):
    """Add the gradients a call produced to the ones set aside before it, as eager accumulation
    does (the same boxing of global layouts, the same in-place add)."""
    for p, old in stash:
        new = p.grad
        p.grad = old
        if new is not None:
            p._accumulate_grad(new, True)


def _value_key(x):
    if isinstance(x, Tensor):
        g = x._global
        return ("T", tuple(x._data.shape), x._data.dtype.str, str(x._device), x._requires_grad,
                None if g is None else (g.placement, g.sbp, g.shape))
    if isinstance(x, (tuple, list)):
        return (type(x).__name__,) + tuple(_value_key(v) for v in x)
    if isinstance(x, dict):
        return ("dict",) + tuple((k, _value_key(v)) for k, v in x.items())
    try:
        hash(x)
    except TypeError:
        raise TypeError(f"nn.Graph: an input of type {type(x).__name__} is neither a tensor nor a hashable "
                        "value; pass tensors, or values that say how to trace") from None
    return x


def _tensors_of(x, out=None):
    out = [] if out is None else out
    if isinstance(x, Tensor):
        out.append(x)
    elif isinstance(x, (tuple, list)):
        for v in x:
            _tensors_of(v, out)
    elif isinstance(x, dict):
        for v in x.values():
            _tensors_of(v, out)
    return out


def _flatten(x):
    """(template, tensors): the output structure with each tensor replaced by its index."""
    tensors = []

    def walk(v):
        if isinstance(v, Tensor):
            tensors.append(v)
            return ("T", len(tensors) - 1)
        if isinstance(v, (tuple, list)):
            return (type(v), [walk(e) for e in v])
        if isinstance(v, dict):
            return (type(v), [(k, walk(e)) for k, e in v.items()])
        return ("V", v)

    return walk(x), tensors


def _unflatten(template, tensors):
    kind, v = template
    if kind == "T":
        return tensors[v]
    if kind == "V":
        return v
    if issubclass(kind, dict):
        return kind((k, _unflatten(e, tensors)) for k, e in v)
    return kind(_unflatten(e, tensors) for e in v)


def _output_tensor(array, meta):
    device, g = meta
    t = Tensor._make(array, device)
    t._global = g
    return t


def _split(x, n, what):
    if isinstance(x, Tensor):
        if not x.ndim:
            raise ValueError(f"nn.Graph with {n} gradient accumulation steps: {what} is a 0-dim tensor, which has "
                             "no rows to split into micro-batches; pass it as a Python number or give it a batch dim")
        size = x.shape[0]
        if size % n:
            raise ValueError(f"nn.Graph with {n} gradient accumulation steps: {what} has {size} rows along dim 0, "
                             f"not a multiple of {n}")
        return x.chunk(n, 0)
    if isinstance(x, (tuple, list)):
        cols = [_split(v, n, what) for v in x]
        return [type(x)(c[j] for c in cols) for j in range(n)]
    if isinstance(x, dict):
        cols = {k: _split(v, n, what) for k, v in x.items()}
        return [type(x)((k, c[j]) for k, c in cols.items()) for j in range(n)]
    return [x] * n


def _merge(outs, cat, stack):
    first = outs[0]
    if isinstance(first, Tensor):
        return stack(outs) if first.ndim == 0 else cat(outs, 0)
    if isinstance(first, (tuple, list)):
        return type(first)(_merge([o[i] for o in outs], cat, stack) for i in range(len(first)))
    if isinstance(first, dict):
        return type(first)((k, _merge([o[k] for o in outs], cat, stack)) for k in first)
    return first


# ------------------------------------------------------------------ engine.compile
class _CallGraph(Graph):
    def __init__(self, fn):
        super().__init__()
        if isinstance(fn, Module):
            self.module = fn
        object.__setattr__(self, "fn", fn)
        object.__setattr__(self, "_name", f"compiled {getattr(fn, '__name__', type(fn).__name__)}")

    def build(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


def _needs_autograd(params, args, kwargs):
    return is_grad_enabled() and (any(p.requires_grad for p in params)
                                  or any(t.requires_grad for t in _tensors_of((args, kwargs))))


class Compiled:
    """What `engine.compile(fn)` returns for a function: calls that need no gradient (inference,
    evaluation, `no_grad`) run through an nn.Graph of `fn` (traced at the first call per
    signature, replayed after); a call that autograd must record (grad mode on and an input that
    requires grad) runs `fn` eagerly, since a replay records no autograd graph. For a captured
    training step, write an nn.Graph whose build calls backward."""

    def __init__(self, fn):
        self._orig_mod = fn
        self.graph = _CallGraph(fn)
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)
        self.__doc__ = getattr(fn, "__doc__", None)

    def __call__(self, *args, **kwargs):
        if _needs_autograd((), args, kwargs):
            return self._orig_mod(*args, **kwargs)
        return self.graph(*args, **kwargs)

    def __repr__(self):
        return f"Compiled({self._orig_mod!r})"


class OptimizedModule(Module):
    """What `engine.compile(module)` returns (torch's name): a Module holding the original as
    `_orig_mod` (so its state_dict keys carry torch's `_orig_mod.` prefix), whose calls run as
    Compiled's do: a graph replay when no gradient is needed, the module itself otherwise.
    Other attributes are the original module's."""

    def __init__(self, mod):
        super().__init__()
        self._orig_mod = mod
        object.__setattr__(self, "graph", _CallGraph(mod))

    def forward(self, *args, **kwargs):
        mod = self._orig_mod
        if _needs_autograd(mod.parameters(), args, kwargs):
            return mod(*args, **kwargs)
        return self.graph(*args, **kwargs)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.__dict__["_modules"]["_orig_mod"], name)
