"""The autograd graph and the backward engine.

A `Node` is recorded for every differentiable op call: it holds the op's backward, its saved
context and one edge per input (the producer node and which of its outputs). Leaves that require
grad get an `AccumulateGrad` node. `run_backward` walks the graph in dependency order (Kahn's
algorithm over the nodes reachable from the roots), sums gradients per output, runs tensor hooks
and accumulates into `.grad`. Gradients are engine Tensors, and backward functions are written in
engine ops, so the same engine serves local and global tensors and supports `create_graph`.
"""
import sys

from ..backend.buffers import owns_memory
from . import anomaly
from .grad_mode import _state, set_grad_enabled


class RemovableHandle:
    """Returned by every `register_*hook`; `remove()` unregisters the hook."""

    def __init__(self, hooks, hook):
        self._hooks = hooks
        self._hook = hook

    def remove(self):
        for i, h in enumerate(self._hooks):
            if h is self._hook:
                del self._hooks[i]
                return


class Node:
    """One recorded op call. `next_edges[i]` is `(node, output_nr)` for input i, or None."""

    __slots__ = ("name", "backward_fn", "ctx", "next_edges", "num_outputs", "pre_hooks",
                 "retained", "freed", "seq", "trace", "__weakref__")
    made = 0  # nodes made so far: a node's `seq` says which were made after a point (checkpoint)

    def __init__(self, name, backward_fn, ctx, next_edges, num_outputs=1):
        self.seq = Node.made
        Node.made += 1
        self.name = name
        self.backward_fn = backward_fn
        self.ctx = ctx
        self.next_edges = next_edges
        self.num_outputs = num_outputs
        self.pre_hooks = None  # {output_nr: [hook]} from Tensor.register_hook on outputs
        self.retained = None  # {output_nr: weakref(Tensor)} from Tensor.retain_grad
        self.freed = False
        self.trace = anomaly.forward_trace() if anomaly.mode.enabled else None  # the forward's stack under detect_anomaly, else None

    def __repr__(self):
        return f"<{self.name}Backward>"

    def name_(self):
        return f"{self.name}Backward"

    @property
    def next_functions(self):
        return tuple((e[0], e[1]) if e is not None else (None, 0) for e in self.next_edges)

    def apply(self, grads, create_graph):
        if self.freed:
            raise RuntimeError(
                f"Trying to backward through the graph a second time (through {self.name}Backward), "
                "or to use saved tensors after they were freed. Saved intermediate values of the "
                "graph are freed when you call .backward() or autograd.grad(). Specify "
                "retain_graph=True if you need to backward through the graph a second time."
            )
        try:
            with set_grad_enabled(create_graph):
                out = self.backward_fn(self.ctx, *grads)
            if not isinstance(out, tuple):
                out = (out,)
            if anomaly.mode.enabled:
                anomaly.check_outputs(self.name_(), out)
        except Exception:
            if anomaly.mode.enabled:
                anomaly.report(self.name_(), self.trace)
            raise
        if len(out) != len(self.next_edges):
            raise RuntimeError(
                f"{self.name}Backward returned {len(out)} gradients, expected {len(self.next_edges)}"
            )
        return out

    def release(self):
        self.ctx = None
        self.freed = True


class AccumulateGrad(Node):
    """Sink of a leaf tensor: runs the leaf's hooks and adds the gradient into `.grad`."""

    __slots__ = ("variable",)

    def __init__(self, variable):
        super().__init__("AccumulateGrad", None, None, (), 1)
        self.variable = variable

    def __repr__(self):
        return "<AccumulateGrad>"

    def accumulate(self, grad, adoptable=False):
        var = self.variable
        if grad.shape != var.shape:
            raise RuntimeError(
                f"gradient of shape {tuple(grad.shape)} does not match leaf tensor of shape {tuple(var.shape)}"
            )
        var._accumulate_grad(grad, adoptable)


def _add_region(a, b, region):
    a[region] += b[region]


def _add_grads(a, b):
    if a is None:
        return b
    if b is None:
        return a
    if a.grad_fn is None and b.grad_fn is None and a._data.dtype == b._data.dtype:
        # Gradients of basic indexing are zeros outside one region (q, k, v = qkv[0], qkv[1],
        # qkv[2] gives three); adding such a one into a buffer that only this pass holds
        # touches just that region instead of reading and writing two whole arrays.
        # `a` qualifies when it owns its array and the buffer holds the only reference (3
        # counted: the buffer slot, this frame, getrefcount's argument).
        region = b.__dict__.get("_zero_outside")
        if region is not None and owns_memory(a._data) and sys.getrefcount(a) <= 3 \
                and a._data.shape == b._data.shape:
            _add_region(a._data, b._data, region)
            a.__dict__.pop("_zero_outside", None)
            if _state.tracer is not None:  # nn.Graph is capturing this step
                _state.tracer.call(_add_region, (a._data, b._data, region), None, "AddGradRegion")
            return a
    return a + b


# A gradient that nothing outside the backward pass holds can become a leaf's .grad without a
# copy (the common case, and a large saving for embedding tables). When it is unshared, the
# Tensor is referred to by the `grads` list, run_backward's local, the call and _sole_owner's
# frame (5 counted by getrefcount); its array by that Tensor, the detached Tensor handed to the
# leaf, the local `a` and the call (4). Any other holder (a user's gradient, a hook that kept it,
# a second leaf fed the same Tensor, a view) raises a count and forces a copy.
# tests/test_autograd.py::test_leaf_gradients_never_alias_and_fresh_ones_are_adopted pins both.
_UNSHARED_TENSOR_REFS = 5
_UNSHARED_ARRAY_REFS = 4


def _sole_owner(g):
    a = g._data
    return (owns_memory(a) and sys.getrefcount(g) <= _UNSHARED_TENSOR_REFS
            and sys.getrefcount(a) <= _UNSHARED_ARRAY_REFS)


def run_backward(roots, grad_roots, retain_graph, create_graph, capture=None, accumulate_others=False,
                 stop_at_capture=False):
    """Backpropagate from `roots` (tensors) seeded with `grad_roots`.

    With `capture` (a list of edges) the gradients flowing into those edges are returned instead
    of being accumulated into leaves, which is what `autograd.grad` needs; with
    `accumulate_others` the other leaves still accumulate theirs; with `stop_at_capture` the
    nodes of the captured edges are not run (activation checkpointing's recomputation: the
    gradients at its boundary go on through the outer graph, which runs those nodes itself).
    Autocast is off while it runs: each backward computes in the dtypes its forward saw.
    """
    saved_autocast, _state.autocast = _state.autocast, None
    try:
        return _run_backward(roots, grad_roots, retain_graph, create_graph, capture, accumulate_others,
                             stop_at_capture)
    finally:
        _state.autocast = saved_autocast


def _run_backward(roots, grad_roots, retain_graph, create_graph, capture, accumulate_others=False,
                  stop_at_capture=False):
    root_edges = []
    for t, g in zip(roots, grad_roots):
        edge = t._grad_edge()
        if edge is None:
            raise RuntimeError("element 0 of tensors does not require grad and does not have a grad_fn")
        root_edges.append((edge, g))
    captured = _Capture(capture) if capture is not None else None
    if captured is None:
        stop = ()
    elif stop_at_capture:
        stop = captured.nodes()
    elif not accumulate_others:  # autograd.grad: run only the nodes above a captured edge (PyTorch's)
        stop = _not_needed(dict.fromkeys(e[0][0] for e in root_edges), captured.nodes())
    else:
        stop = ()
    deps = _count_dependencies(dict.fromkeys(e[0][0] for e in root_edges), stop)  # two roots may share a node
    buffers = {}  # node -> its output gradients summed so far
    for (node, nr), g in root_edges:
        _add_to_buffer(buffers, node, nr, g)

    ready = [n for n in buffers if deps.get(n, 0) == 0]
    while ready:
        node = ready.pop()
        grads = buffers.pop(node, None) or [None] * node.num_outputs
        if stop_at_capture and id(node) in stop:  # the outer pass runs this node's hooks with all of it
            captured.collect(node, grads)
            continue
        _run_pre_hooks(node, grads)
        if node.retained:
            _retain_grads(node, grads, create_graph)
        if captured is not None:
            captured.collect(node, grads)
            if id(node) in stop:
                continue
        if isinstance(node, AccumulateGrad):
            g = grads[0]
            if g is not None and (capture is None or (accumulate_others and not captured.holds(node))):
                if create_graph:
                    node.accumulate(g)
                else:
                    node.accumulate(g.detach(), _sole_owner(g))
            continue
        if all(g is None for g in grads):
            in_grads = (None,) * len(node.next_edges)
            if node.freed:
                node.apply(grads, create_graph)  # raises the "second time" error
        else:
            in_grads = node.apply(grads, create_graph)
        if not retain_graph:
            node.release()
        for edge, g in zip(node.next_edges, in_grads):
            if edge is None:
                continue
            nxt, nr = edge
            if g is not None:
                _add_to_buffer(buffers, nxt, nr, g)
            deps[nxt] -= 1
            if deps[nxt] == 0:
                ready.append(nxt)
    return captured.grads if captured is not None else None


def _not_needed(roots, targets):
    """The ids of the nodes reachable from `roots` that need not run for the gradients at the
    `targets` (node ids): those with no target below them. autograd.grad leaves them as they are
    (not run, not freed), so another backward can still go through them."""
    order, seen, stack = [], set(), [(r, False) for r in roots]
    while stack:  # post-order without recursion (graphs can be thousands of nodes deep)
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        stack.extend((e[0], False) for e in node.next_edges if e is not None and id(e[0]) not in seen)
    leads = set()  # ids of nodes with a target at or below them
    for node in order:  # children before parents
        if id(node) in targets or any(e is not None and id(e[0]) in leads for e in node.next_edges):
            leads.add(id(node))
    return {id(n) for n in order
            if not any(e is not None and id(e[0]) in leads for e in n.next_edges)}


def _count_dependencies(roots, stop=()):
    """{node: number of edges into it} over the graph reachable from `roots` (an ordered dict of
    distinct root nodes), not past the nodes whose ids are in `stop`."""
    deps = {}
    seen = set(roots)
    stack = [r for r in roots if id(r) not in stop]
    while stack:
        for edge in stack.pop().next_edges:
            if edge is None:
                continue
            nxt = edge[0]
            deps[nxt] = deps.get(nxt, 0) + 1
            if nxt not in seen:
                seen.add(nxt)
                if id(nxt) not in stop:
                    stack.append(nxt)
    return deps


def _add_to_buffer(buffers, node, nr, g):
    buf = buffers.get(node)
    if buf is None:
        buf = buffers[node] = [None] * node.num_outputs
    buf[nr] = _add_grads(buf[nr], g)


def _run_pre_hooks(node, grads):
    """Tensor.register_hook hooks on the node's outputs, once each output's gradient is complete;
    a hook's return value replaces the gradient."""
    if not node.pre_hooks:
        return
    for nr, hooks in node.pre_hooks.items():
        if grads[nr] is None:
            continue
        for hook in list(hooks):
            res = hook(grads[nr])
            if res is not None:
                grads[nr] = res


def _retain_grads(node, grads, create_graph):
    """`.grad` of outputs that called retain_grad(): accumulated over backward calls, as PyTorch's."""
    for nr, ref in node.retained.items():
        t = ref()
        if t is not None and grads[nr] is not None:
            g = grads[nr] if create_graph else grads[nr].detach()
            t.grad = g if t.grad is None else t.grad + g


class _Capture:
    """autograd.grad: the gradients flowing into the given edges, in their order."""

    def __init__(self, edges):
        self.where = {}
        for i, edge in enumerate(edges):
            self.where.setdefault((id(edge[0]), edge[1]), []).append(i)
        self.grads = [None] * len(edges)

    def holds(self, node):
        return any((id(node), nr) in self.where for nr in range(node.num_outputs))

    def nodes(self):
        """The ids of the captured edges' nodes."""
        return {key[0] for key in self.where}

    def collect(self, node, grads):
        for nr in range(node.num_outputs):
            for i in self.where.get((id(node), nr), ()):
                self.grads[i] = grads[nr]
