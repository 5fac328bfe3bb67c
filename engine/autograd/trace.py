"""Trace a step's kernel calls once, replay them without the Python around them (nn.Graph's core).

Why at the kernel level: every computation of the engine, forward or backward, local or global,
reaches a kernel through one of a few doors: `Op.forward(ctx, *arrays, **attrs)` (Op.apply, the
global dispatch, and every backward, which is written in ops), the boxing of a global tensor
(`box_local`, collectives included), and a handful of raw array writes (in-place ops outside
autograd, a gradient added into a region, a leaf's `.grad` being set). While a `Tracer` is
active each door reports its call; the tracer turns the call into an `_Entry` whose array
arguments are *slots* (the output of an earlier entry, an input of the step, or a parameter read
when the entry runs) instead of the arrays themselves. A `Tape` replays the entries in order:
the kernels run on fresh arrays, with no Tensor, Node, SBP inference or dispatch in between.

What a kernel leaves in its Context (a dropout mask, softmax's output, a layer_norm's
statistics) is read back after the replayed call and bound to the slots the backward entries
read. Plain values a forward stores there (shapes, counts) are checked at replay against the
traced ones, so a kernel whose Python-visible results depend on the data (and would make the
recorded backward wrong) is caught instead of replayed silently.

Memory: each slot is dropped from the replay table right after its last reader, so an array is
freed (and its buffer returned to the engine's pool, engine.backend.buffers) exactly when no
later kernel needs it; `Tape.planned_peak_bytes` is the largest total of live owning arrays over
the step under that plan.
"""
import weakref

import numpy as np

from .grad_mode import _state

__all__ = ["Tracer", "Tape", "GraphTraceError"]


class GraphTraceError(RuntimeError):
    """A step that cannot be captured as a static graph (data-dependent Python, an untraced
    array write), or a replay whose kernels no longer match the trace."""


_LITERAL, _SLOT, _CTX, _CTXVAL, _NESTED, _DYN = range(6)
_PLAIN = (int, float, bool, str, type(None), np.generic, np.dtype)


def _is_array(x):
    t = type(x)
    return t is np.ndarray or (t.__module__.startswith("cupy") and hasattr(x, "__cuda_array_interface__"))


def _is_static(v):
    if isinstance(v, _PLAIN):
        return True
    if isinstance(v, tuple):
        return all(isinstance(x, _PLAIN) for x in v)
    return False


class _Entry:
    """One recorded kernel call. `kind`: "op" (an Op's forward with a fresh Context), "call" (a
    plain function of arrays), "grad" (a leaf's .grad set to a slot)."""

    __slots__ = ("kind", "fn", "label", "args", "arg_patch", "kwargs", "kw_patch", "outs", "single",
                 "ctx_pre", "ctx_index", "ctx_bind", "ctx_static", "frees", "ctx_frees", "keep_ctx", "info", "leaf",
                 "meta", "device", "input_index", "replace")

    def __init__(self, kind, fn, label):
        self.kind, self.fn, self.label = kind, fn, label
        self.args, self.arg_patch, self.kwargs, self.kw_patch = [], (), {}, ()
        self.outs, self.single = (), True
        self.ctx_pre = self.ctx_index = None
        self.ctx_bind, self.ctx_static = (), None
        self.frees, self.ctx_frees, self.keep_ctx, self.info = (), (), False, ""
        self.leaf = self.meta = self.device = self.input_index = None
        self.replace = False


class Tracer:
    """Collects the entries of one traced step. Activate it with `with tracer:`; the engine's
    kernel doors call `kernel`, `call` and `set_grad` while it is active."""

    def __init__(self, dynamic_arrays=()):
        self.entries = []
        self.slot_of = {}      # id(array) -> slot
        self.refs = []         # slot -> weakref to the traced array (the trace keeps none alive)
        self.sizes = []        # slot -> (nbytes, owns its memory) for the memory plan
        self.ctx_count = 0
        self.ctxval_of = {}    # id(tuple or list kept in a Context) -> (ctx index, attr name)
        self.keep = []         # small objects whose ids are mapped (kept alive while tracing)
        self.dynamic = {}      # id(array) -> getter: arrays read when an entry runs (parameters)
        for arr, getter in dynamic_arrays:
            self.dynamic[id(arr)] = getter
            self.keep.append(arr)  # parameters and buffers: alive anyway
        self.used_ctxvals = set()
        self.inputs = []       # (slot) per traced input array
        self.input_leaves = {}  # id(input tensor) -> its index: a replay gives its gradient to that call's tensor
        self.depth = 0         # > 0 while a recorded kernel runs: what it does inside is its own
        self._prev = None

    # ------------------------------------------------------------ activation
    def __enter__(self):
        self._prev = _state.tracer
        _state.tracer = self
        return self

    def __exit__(self, *exc):
        _state.tracer = self._prev
        return False

    # ------------------------------------------------------------ slots
    def new_slot(self, arr):
        s = len(self.refs)
        key = id(arr)
        slot_of = self.slot_of

        def forget(_, s=s, key=key):  # the array died: its id may be reused by a new one
            if slot_of.get(key) == s:
                del slot_of[key]

        self.refs.append(weakref.ref(arr, forget))
        base = getattr(arr, "base", None)  # a view of another value of the step adds no memory
        self.sizes.append((arr.nbytes, base is None or self._traced_base(base) is None))
        slot_of[key] = s
        return s

    def _slot(self, arr):
        s = self.slot_of.get(id(arr))
        return s if s is not None and self.refs[s]() is arr else None

    def add_input(self, arr, tensor=None):
        s = self.new_slot(arr)
        if tensor is not None:
            self.input_leaves[id(tensor)] = len(self.inputs)
            self.keep.append(tensor)
        self.inputs.append(s)
        return s

    def is_traced(self, arr):
        """Whether `arr` was computed in this step (a slot, or a view of one)."""
        return self._traced_base(arr) is not None

    def _traced_base(self, arr):
        a = arr
        while a is not None:
            if self._slot(a) is not None:
                return a
            a = getattr(a, "base", None)
        return None

    def _spec(self, x, where):
        """How an argument is found at replay: (code, value)."""
        if _is_array(x):
            s = self._slot(x)
            if s is not None:
                return _SLOT, s
            getter = self.dynamic.get(id(x))
            if getter is not None:
                return _DYN, getter
            if self._traced_base(x) is not None:
                raise GraphTraceError(
                    f"{where}: an input array of shape {tuple(x.shape)} is a view of a value computed in this step "
                    "but was made outside the engine's kernels, so a replay could not recompute it; run this "
                    "step eagerly or report the engine function that made it")
            self.keep.append(x)
            return _LITERAL, x
        cv = self.ctxval_of.get(id(x))
        if cv is not None and cv[2] is x:
            self.used_ctxvals.add(cv[:2])
            return _CTXVAL, cv[:2]
        t = type(x)
        if t is tuple or t is list:
            specs = [self._spec(v, where) for v in x]
            if any(c != _LITERAL for c, _ in specs):
                return _NESTED, (t, specs)
            return _LITERAL, x
        if type(x).__name__ == "Context":
            c = x.__dict__.get("_trace_index")
            if c is not None and c[0] is self:
                return _CTX, c[1]
        return _LITERAL, x

    def _fill(self, entry, args, kwargs, where):
        entry.args = list(args)
        patch = []
        for i, a in enumerate(args):
            code, v = self._spec(a, where)
            if code == _LITERAL:
                entry.args[i] = v
            else:
                entry.args[i] = None
                patch.append((i, code, v))
        entry.arg_patch = tuple(patch)
        entry.kwargs = dict(kwargs)
        kp = []
        for k, a in kwargs.items():
            code, v = self._spec(a, where)
            if code != _LITERAL:
                entry.kwargs[k] = None
                kp.append((k, code, v))
        entry.kw_patch = tuple(kp)

    def _outputs(self, entry, out):
        entry.single = not isinstance(out, tuple)
        outs = (out,) if entry.single else out
        entry.outs = tuple(self.new_slot(a) if _is_array(a) else None for a in outs)

    # ------------------------------------------------------------ the doors
    def kernel(self, op, ctx, arrays, attrs, forward=None):
        """Run `op`'s forward on `arrays` (as Op.apply would) and record the call."""
        fn = forward or op.forward
        if self.depth:  # an op applied inside another kernel: replaying that kernel redoes it
            return _arrays_out(fn(ctx, *arrays, **attrs))
        entry = _Entry("op", fn, op.name or op.__name__)
        self._fill(entry, arrays, attrs, entry.label)
        entry.ctx_pre = (getattr(ctx, "needs_input_grad", None), dict(ctx.__dict__))
        self.depth += 1
        try:
            out = _arrays_out(fn(ctx, *arrays, **attrs))
        finally:
            self.depth -= 1
        self._outputs(entry, out)
        entry.ctx_index = self.ctx_count
        self.ctx_count += 1
        bind, static = [], {}
        for k, v in list(ctx.__dict__.items()):
            if _is_array(v):
                bind.append((k, None, self.new_slot(v)))
            elif type(v) is tuple or type(v) is list:
                has_arrays = False
                for j, a in enumerate(v):
                    if _is_array(a):
                        bind.append((k, j, self.new_slot(a)))
                        has_arrays = True
                if not has_arrays:  # a later kernel given this very tuple reads it from the new ctx
                    self.ctxval_of[id(v)] = (entry.ctx_index, k, v)
                    self.keep.append(v)
                if _is_static(v):
                    static[k] = v
            elif hasattr(v, "_data") and _is_array(getattr(v, "_data", None)):
                bind.append((k, "_data", self.new_slot(v._data)))
            elif _is_static(v):
                static[k] = v
            elif not any(v is a for a in attrs.values()):
                # an object the kernel made (a layout, a tiling with its seed): a later kernel given
                # this very object reads the replay's from the new Context
                self.ctxval_of[id(v)] = (entry.ctx_index, k, v)
                self.keep.append(v)
        ctx.__dict__["_trace_index"] = (self, entry.ctx_index)  # how later kernels given ctx find it
        entry.ctx_bind = tuple(bind)
        entry.ctx_static = static or None
        entry.info = _shapes(arrays, out)
        self.entries.append(entry)
        return out

    def call(self, fn, args, out, label, info=""):
        """Record `out = fn(*args)`, a raw array computation already done by the caller."""
        if self.depth:
            return out
        entry = _Entry("call", fn, label)
        self._fill(entry, args, {}, label)
        self._outputs(entry, out)
        entry.info = info or _shapes(args, out)
        self.entries.append(entry)
        return out

    def set_grad(self, leaf, grad, replace=False):
        """Record `leaf.grad = grad`: a gradient adopted by a leaf that had none, or (`replace`)
        the sum that takes the place of the gradient it got earlier in the step."""
        if self.depth:
            raise GraphTraceError("nn.Graph: a kernel set a parameter's gradient inside itself")
        entry = _Entry("grad", None, "AccumulateGrad")
        self._fill(entry, (grad._data,), {}, "AccumulateGrad")
        entry.replace = replace
        entry.input_index = self.input_leaves.get(id(leaf))
        # an input: the replayed call's own tensor gets it; a leaf made inside the step (a
        # pipeline stage's received activations): no one outside sees it, the replay sets none
        if entry.input_index is None and not self.is_traced(leaf._data):
            entry.leaf = leaf
        entry.meta, entry.device = (type(grad), grad._global), grad._device
        entry.info = f"{list(leaf.shape)}"
        self.entries.append(entry)

    def constant(self, arr):
        """An array a creation function made inside the step (zeros, full, tensor(...)): each replay
        gets a fresh copy, as each eager call makes a fresh array (the step may write into it)."""
        if self.depth or self._slot(arr) is not None:
            return
        self.call(_copy_of, (arr.copy(),), arr, "Constant")

    def host_read(self, tensor, what):
        """A Python read of a tensor's values while tracing (`.item()`, `.numpy()`, `bool(t)`)."""
        if self.is_traced(tensor._data):
            raise GraphTraceError(
                f"{what} on a tensor of shape {list(tensor.shape)} computed inside the graph: its value would be "
                "frozen at trace time (data-dependent Python control flow cannot be captured). Return the "
                "tensor from build() and read it outside, or run this step eagerly")

    # ------------------------------------------------------------ the result
    def finish(self, output_arrays):
        """The Tape of the recorded entries; `output_arrays` are read back after each replay."""
        out_specs = [self._spec(a, "graph output") for a in output_arrays]
        for e in self.entries:  # plain ctx values later read by identity are bound, not checked
            if e.ctx_static:
                for k in list(e.ctx_static):
                    if (e.ctx_index, k) in self.used_ctxvals:
                        del e.ctx_static[k]
                        if not e.ctx_static:
                            e.ctx_static = None
        tape = Tape(self.entries, len(self.refs), list(self.inputs), out_specs, self.ctx_count)
        tape.plan_memory(self.sizes)
        self.refs = self.keep = self.sizes = None
        self.slot_of = self.ctxval_of = None
        return tape


def _copy_of(a):
    return a.copy()


def _arrays_out(out):
    """numpy turns 0-d results into numpy scalars; the engine holds them as 0-d arrays (as
    Op.apply's wrapping does), converted here so that the traced array is the one consumers see."""
    if isinstance(out, tuple):
        if any(isinstance(a, np.generic) for a in out):
            return tuple(np.asarray(a) if isinstance(a, np.generic) else a for a in out)
        return out
    return np.asarray(out) if isinstance(out, np.generic) else out


def _shapes(args, out):
    ins = [list(a.shape) for a in args if _is_array(a)]
    outs = [list(a.shape) for a in (out if isinstance(out, tuple) else (out,)) if _is_array(a)]
    return f"{ins} -> {outs}"


class Tape:
    """The replayable step: entries in trace order over a table of slots."""

    def __init__(self, entries, n_slots, inputs, out_specs, n_ctx):
        self.entries = entries
        self.n_slots = n_slots
        self.inputs = inputs
        self.out_specs = out_specs
        self.n_ctx = n_ctx
        self.planned_peak_bytes = 0
        self.traced_bytes = 0

    def plan_memory(self, sizes):
        """Free every slot after its last reader; the planned peak of live owning arrays."""
        last, ctx_last = {}, {}  # slot / ctx index -> the last entry that reads it
        for i, e in enumerate(self.entries):
            for _, code, v in e.arg_patch + e.kw_patch:
                for c, x in _leaves(code, v):
                    if c == _SLOT:
                        last[x] = i
                    elif c == _CTX or c == _CTXVAL:
                        ctx_last[x if c == _CTX else x[0]] = i
        kept = {x for code, v in self.out_specs for c, x in _leaves(code, v) if c == _SLOT}
        frees = {}
        for s, i in last.items():
            if s not in kept:
                frees.setdefault(i, []).append(s)
        produced_at = {}
        for i, e in enumerate(self.entries):
            for s in e.outs:
                if s is not None:
                    produced_at[s] = i
            for _, _, s in e.ctx_bind:
                produced_at[s] = i
        for i, e in enumerate(self.entries):
            e.frees = tuple(frees.get(i, ()))
        # a replayed Context lives until the last entry that reads it (or not at all): it holds
        # what its kernel saved, and keeping every one to the end would keep every activation
        for e in self.entries:
            if e.ctx_index in ctx_last:
                e.keep_ctx = True
        ctx_frees = {}
        for c, i in ctx_last.items():
            ctx_frees.setdefault(i, []).append(c)
        for i, e in enumerate(self.entries):
            e.ctx_frees = tuple(ctx_frees.get(i, ()))
        # planned peak: owning arrays (not views) live from their producer to their last reader,
        # or longer where a kernel keeps its inputs past its call (see _held_until)
        held = self._held_until()
        live = peak = 0
        events = {}
        for s, i in produced_at.items():
            nbytes, owns = sizes[s]
            if not owns:
                continue
            end = last.get(s, len(self.entries)) if s not in kept else len(self.entries)
            end = max(end, held.get(s, end))
            events.setdefault(i, []).append(nbytes)
            events.setdefault(end + 0.5, []).append(-nbytes)
        for t in sorted(events):
            live += sum(x for x in events[t] if x > 0)
            peak = max(peak, live)
            live += sum(x for x in events[t] if x < 0)
        self.planned_peak_bytes = peak
        self.traced_bytes = sum(sizes[s][0] for s in produced_at if sizes[s][1])

    def _held_until(self):
        """slot -> the entry until which a kernel keeps it alive after its own call: a recorded
        function with `holds_inputs_until = label` (a pipeline send, whose buffers stay with MPI
        until the schedule's wait) holds its array inputs up to the next entry with that label
        (the end of the step if none), which the planned peak counts."""
        held = {}
        for i, e in enumerate(self.entries):
            label = getattr(e.fn, "holds_inputs_until", None)
            if label is None:
                continue
            until = next((j for j in range(i + 1, len(self.entries)) if self.entries[j].label == label),
                         len(self.entries))
            for _, code, v in e.arg_patch + e.kw_patch:
                for c, x in _leaves(code, v):
                    if c == _SLOT:
                        held[x] = max(held.get(x, until), until)
        return held

    def replay(self, input_arrays, input_tensors=None):
        """Run the entries on `input_arrays` (the data of `input_tensors`, which get the
        gradients of inputs that require one); returns the output arrays."""
        from .function import Context

        table = [None] * self.n_slots
        for s, a in zip(self.inputs, input_arrays):
            table[s] = a
        ctxs = [None] * self.n_ctx
        for e in self.entries:
            args = e.args
            if e.arg_patch:
                args = list(args)
                for i, code, v in e.arg_patch:
                    args[i] = _resolve(code, v, table, ctxs)
            kind = e.kind
            if kind == "op":
                kwargs = e.kwargs
                if e.kw_patch:
                    kwargs = dict(kwargs)
                    for k, code, v in e.kw_patch:
                        kwargs[k] = _resolve(code, v, table, ctxs)
                ctx = Context()
                nig, pre = e.ctx_pre
                if nig is not None:
                    ctx.needs_input_grad = nig
                if pre:
                    ctx.__dict__.update(pre)
                out = _arrays_out(e.fn(ctx, *args, **kwargs))
                if e.keep_ctx:
                    ctxs[e.ctx_index] = ctx
                d = ctx.__dict__
                for k, j, s in e.ctx_bind:
                    v = d[k]
                    table[s] = v if j is None else (v._data if j == "_data" else v[j])
                if e.ctx_static is not None:
                    _check_static(e, d)
            elif kind == "call":
                out = e.fn(*args)
            else:
                _set_grad(e, args[0], input_tensors)
                out = None
            if e.outs:
                if e.single:
                    if e.outs[0] is not None:
                        table[e.outs[0]] = out
                else:
                    for s, a in zip(e.outs, out):
                        if s is not None:
                            table[s] = a
            for s in e.frees:
                table[s] = None
            for c in e.ctx_frees:
                ctxs[c] = None
        return [_resolve(code, v, table, ctxs) for code, v in self.out_specs]

    def describe(self, limit=None):
        lines = []
        for i, e in enumerate(self.entries[:limit]):
            lines.append(f"  {i:5d} {e.kind:4s} {e.label:28s} {e.info}")
        if limit is not None and len(self.entries) > limit:
            lines.append(f"  ... {len(self.entries) - limit} more")
        return "\n".join(lines)


def _leaves(code, v):
    """The (code, value) specs inside a spec, nested containers opened."""
    if code == _NESTED:
        for c, x in v[1]:
            yield from _leaves(c, x)
    else:
        yield code, v


def _resolve(code, v, table, ctxs):
    if code == _SLOT:
        return table[v]
    if code == _DYN:
        return v()
    if code == _CTX:
        return ctxs[v]
    if code == _CTXVAL:
        return ctxs[v[0]].__dict__[v[1]]
    if code == _NESTED:
        typ, specs = v
        return typ(_resolve(c, x, table, ctxs) for c, x in specs)
    return v


def _check_static(e, d):
    for k, v in e.ctx_static.items():
        now = d.get(k)
        if now is not v and not _same(now, v):
            raise GraphTraceError(
                f"graph replay: kernel {e.label} ({e.info}) computed {k}={now!r} where the trace saw {v!r}: a value "
                "its backward reads depends on the data, so this graph cannot replay it; run this step eagerly")


def _same(a, b):
    try:
        return bool(a == b) and type(a) is type(b)
    except (TypeError, ValueError):
        return False


def _set_grad(e, arr, input_tensors=None):
    leaf = e.leaf if e.input_index is None else input_tensors[e.input_index]
    if leaf is None:  # a leaf made inside the step: only later kernels read its gradient (a slot)
        return
    if leaf.grad is not None and not e.replace:
        raise GraphTraceError(f"graph replay: the parameter of shape {list(leaf.shape)} already has a gradient "
                              "(the graph adopts fresh gradients; its caller stashes older ones)")
    cls, meta = e.meta
    g = cls._make(arr, e.device)
    g._global = meta
    leaf.grad = g
