"""Activation checkpointing (torch.utils.checkpoint): trade compute for memory.

    y = checkpoint(layer, x)            # same value and gradients as layer(x)

The forward runs once as usual, but the graph it records (and every activation saved in it)
is dropped at once; only the inputs are kept. In backward the function runs again, with the
random state it had the first time (dropout draws the same masks), and the gradients flow
through the recomputed graph up to the function's boundary and go on from there through the
outer graph: the inputs', and those of the tensors the function closed over (parameters, and
tensors made before it and used inside). So `autograd.grad` returns a closed-over parameter's
gradient (and leaves its `.grad` alone), and a tensor used both inside and outside gets both
contributions, its graph outside run once, as in PyTorch. Under `create_graph=True` the
recomputation reads the inputs themselves, so the gradients can be differentiated again. Works on global tensors (the
recomputation runs the same collectives in the same order on every rank).

Semantics are those of PyTorch's `use_reentrant=False`: an output requires grad when anything
it depends on does, a parameter used inside included (the first run is recorded to find out,
then released), and inputs need not require grad; tensors passed by keyword are inputs too; the
recomputation runs under the autocast of the first run (backward itself runs without one).
`use_reentrant` is accepted for compatibility and changes nothing. The recomputed outputs must have the shapes and dtypes of
the first run (PyTorch's default determinism check); a mismatch is an error.
"""
from ..autograd.function import Context, is_tensor
from ..autograd.grad_mode import _state, enable_grad, is_grad_enabled
from ..autograd.graph import AccumulateGrad, Node, run_backward
from ..backend.random import get_rng_state, set_rng_state

__all__ = ["checkpoint"]

# the label of the recorded call that swaps the first run's random state back in (nn.Graph
# restores the state from before a replay that raises after it)
RNG_SWAP_LABEL = "RestoreRNGState"


def _flatten(out):
    """(list of the tensors in `out` (a tensor, or tuple/list/dict of them and other values), rebuild)."""
    if is_tensor(out):
        return [out], lambda ts: ts[0]
    if isinstance(out, (tuple, list)):
        parts = [_flatten(o) for o in out]
        sizes = [len(p[0]) for p in parts]

        def rebuild(ts):
            items, i = [], 0
            for (_, rb), n in zip(parts, sizes):
                items.append(rb(ts[i:i + n]))
                i += n
            return type(out)(items)

        return [t for p in parts for t in p[0]], rebuild
    if isinstance(out, dict):
        keys = list(out)
        flat, rebuild_values = _flatten([out[k] for k in keys])
        return flat, lambda ts: type(out)(zip(keys, rebuild_values(ts)))
    return [], lambda ts: out


class _RngKeeper:
    """The random state of the first run, put back for the recomputation and taken away after.

    Inside a step that nn.Graph captures, the three moves (save at the first run, swap in and
    back around the recomputation) are also recorded as calls of the trace, at the points where
    they happen: a replay saves and restores the generator's state *of that replay*, so its
    recomputed dropout masks are the ones its forward drew, as eagerly."""

    def __init__(self, enabled):
        self.enabled = enabled
        self.first = self.now = None
        self._do("SaveRNGState", self._save)

    def _do(self, label, move):
        if not self.enabled:
            return
        move()
        tracer = _state.tracer
        if tracer is not None:
            tracer.call(move, (), None, label)

    def _save(self):
        self.first = get_rng_state()

    def _in(self):
        self.now = get_rng_state()
        set_rng_state(self.first)

    def _back(self):
        set_rng_state(self.now)
        self.now = None

    def swap_in(self):
        self._do(RNG_SWAP_LABEL, self._in)

    def swap_back(self):
        self._do("ResumeRNGState", self._back)


def _boundary(outs, start):
    """The edges out of the graph the function recorded (its nodes are those made since `start`)
    into the rest of the graph, in a fixed order: leaves it used (parameters) and tensors made
    before it (its inputs, and those it closed over)."""
    found, seen = [], set()
    stack = [o.grad_fn for o in outs if o.grad_fn is not None and o.grad_fn.seq >= start]
    visited = set()
    while stack:
        node = stack.pop()
        if id(node) in visited:
            continue
        visited.add(id(node))
        for edge in node.next_edges:
            if edge is None:
                continue
            nxt, nr = edge
            if isinstance(nxt, AccumulateGrad) or nxt.seq < start:
                key = (id(nxt), nr)
                if key not in seen:
                    seen.add(key)
                    found.append((nxt, nr))
            else:
                stack.append(nxt)
    return tuple(found)


def checkpoint(function, *args, use_reentrant=None, preserve_rng_state=True, context_fn=None,
               determinism_check="default", debug=False, **kwargs):
    """`function(*args, **kwargs)`, with its activations recomputed in backward instead of kept
    (see the module docstring). `preserve_rng_state=False` lets the recomputation draw new
    random numbers (faster to set up, different dropout masks)."""
    if context_fn is not None:
        raise NotImplementedError("checkpoint(context_fn=...): custom recomputation contexts are not implemented")
    if determinism_check not in ("default", "none"):
        raise ValueError(f"determinism_check must be 'default' or 'none', got {determinism_check!r}")
    if not is_grad_enabled():
        return function(*args, **kwargs)
    rng = _RngKeeper(preserve_rng_state)
    autocast = _state.autocast, _state.autocast_cache  # the recomputation runs under the first run's autocast
    start = Node.made
    first = function(*args, **kwargs)
    outs, rebuild = _flatten(first)
    needs = [o.requires_grad for o in outs]
    if not any(needs):
        return first
    shapes = [(tuple(o.shape), o.dtype) for o in outs]
    detached = [o.detach() for o in outs]
    # the inputs: positional arguments, then keyword arguments (a tensor passed by keyword gets
    # its gradient too, as in PyTorch's non-reentrant checkpoint)
    names = list(kwargs)
    values = list(args) + [kwargs[k] for k in names]
    tensor_args = [a if is_tensor(a) else None for a in values]
    n_pos = len(args)
    edges = tuple(t._grad_edge() if t is not None and t.requires_grad else None for t in tensor_args)
    # and what the function reached from outside: parameters and other tensors it closed over
    # (an input's own edge too: the recomputation reads the input through a detached copy, so
    # what still reaches its edge then is a closure's use of the same tensor)
    closure = _boundary(outs, start)
    del first, outs  # the recorded graph and its saved activations go here

    def backward_fn(ctx, *grads):
        # create_graph (the outer backward runs with grad mode on): the recomputation reads the
        # inputs themselves, so the gradients' own graph reaches them (double backward); their
        # gradients then come through the boundary edges, which hold the inputs' too
        create_graph = is_grad_enabled()
        rng.swap_in()
        saved_autocast = _state.autocast, _state.autocast_cache
        _state.autocast, _state.autocast_cache = autocast
        try:
            inputs = [a.detach().requires_grad_(a.requires_grad) if t is not None and not create_graph else a
                      for a, t in zip(values, tensor_args)]
            with enable_grad():
                again, _ = _flatten(function(*inputs[:n_pos], **dict(zip(names, inputs[n_pos:]))))
        finally:
            _state.autocast, _state.autocast_cache = saved_autocast
            rng.swap_back()
        if determinism_check == "default":
            got = [(tuple(o.shape), o.dtype) for o in again]
            if got != shapes:
                raise RuntimeError(f"checkpoint: the recomputed outputs {got} differ from the first run's {shapes} "
                                   "(the function must compute the same shapes and dtypes when run again)")
        pairs = [(o, g) for o, g, n in zip(again, grads, needs) if n and g is not None and o.requires_grad]
        wanted = [] if create_graph else [i for i, t in enumerate(tensor_args) if t is not None and t.requires_grad]
        result = [None] * (len(values) + len(closure))
        if pairs:
            # every gradient at the boundary is returned and goes on through the outer graph: the
            # inputs', and those of the tensors the function closed over (a parameter's reaches
            # its .grad, or autograd.grad's result, as without checkpointing); the outer graph's
            # nodes are not run here
            got = run_backward([o for o, _ in pairs], [g for _, g in pairs], create_graph, create_graph,
                               capture=[inputs[i]._grad_edge() for i in wanted] + list(closure),
                               accumulate_others=True, stop_at_capture=True)
            keep = (lambda g: g) if create_graph else (lambda g: g.detach())
            for i, g in zip(wanted, got):
                result[i] = None if g is None else inputs[i]._as_own_gradient(keep(g))
            for j, g in enumerate(got[len(wanted):]):
                result[len(values) + j] = None if g is None else keep(g)
        return tuple(result)

    node = Node("Checkpoint", backward_fn, Context(), edges + closure, len(detached))
    for i, (d, n) in enumerate(zip(detached, needs)):
        if n:
            d._requires_grad = True
            d.grad_fn = node
            d._output_nr = i
    return rebuild(detached)
