"""Running any engine op on global tensors (registered into Op.apply by engine.distributed).

For an op called with global inputs:
  1. check them (all global, one placement);
  2. per mesh axis, take the op's SBP signatures (rules/<family>.py; the default, always valid,
     is "all broadcast") and choose the one whose boxing of the current inputs moves the fewest bytes;
  3. box the inputs to it (recorded for autograd: those conversions have their own backward);
  4. run the op's local kernel on the shards, with shape attributes translated to the shard;
  5. wrap the outputs as global tensors with the signature's output SBP.

Backward runs the op's own *local* backward on shards too, with the gradient SBPs that make it
valid (per mesh axis): an output gradient arrives S(a) for an S(a) output and B for P or B
outputs; an input gradient comes out S(a) for S(a) inputs, B for P inputs and P for B inputs —
the local gradient of a replicated input used with split or partial data is a partial sum —
and all B when the whole signature is B. The design asked for backwards made of global ops; running
the local backward under these rules is equivalent, keeps every op's backward written once, and
leaves shape bookkeeping (ctx) local. It does not support create_graph on global tensors.
"""
import numpy as np

from ..autograd.function import Context
from ..autograd.grad_mode import _state
from ..autograd.graph import Node
from ..ops.op import share_versions
from ..tensor import Tensor
from . import comm
from .global_tensor import GlobalMeta, _stage_state, global_to_global, make_global
from .rules import rule_for
from .sbp import Signature, broadcast, partial_sum


# ------------------------------------------------------------------ cost of boxing
def box_cost(src, dst, nbytes, n):
    """Bytes one conversion moves per rank (docs/global_tensor.md, "The boxing table")."""
    if src == dst or n == 1:
        return 0.0
    if src.is_broadcast:
        return 0.0 if dst.is_split else 1.0  # B -> P is local but leaves work for later
    if src.is_partial:
        return 2.0 * nbytes * (n - 1) / n if dst.is_broadcast else nbytes * (n - 1) / n + (
            2.0 * nbytes if dst.is_partial else 0.0)
    # split source
    if dst.is_broadcast:
        return nbytes * (n - 1) / n
    if dst.is_split:
        return nbytes * (n - 1) / n / n
    return 1.0  # S -> P


def _nbytes(meta, itemsize):
    n = 1
    for s in meta.shape:
        n *= s
    return n * itemsize


def _parts_after(sig, prior, n):
    """Per input, {axis: number of parts} once mesh axis k applies `sig` after the signatures
    `prior` chose for the earlier axes (a split applied over several mesh axes multiplies)."""
    out = []
    for i, s in enumerate(sig.ins):
        parts = {}
        for p, hn in prior:
            t = p.ins[i]
            if t is not None and t.is_split:
                parts[t.axis] = parts.get(t.axis, 1) * hn
        if s is not None and s.is_split:
            parts[s.axis] = parts.get(s.axis, 1) * n
        out.append(parts)
    return out


def choose(signatures, metas, itemsizes, placement, k, rule=None, shapes=None, attrs=None, prior=()):
    """The signature for mesh axis k with the least boxing of the current inputs. A rule with an
    `allows(sig, shapes, attrs, parts)` check (e.g. reshape: splits must stay block-aligned) can
    refuse signatures given how many parts each input axis is cut into."""
    n = placement.hierarchy[k]
    check = rule is not None and getattr(rule, "checks_parts", False)
    best, best_cost = None, None
    for sig in signatures:
        if not sig.all_broadcast and any(s is not None and s.is_split for s in sig.ins):
            parts = _parts_after(sig, prior, n)
            # no signature may leave a rank an empty shard (an extent smaller than its parts):
            # creation refuses such layouts too, and empty shards take other code paths per rank
            if any(m is not None and any(m.shape[a] < p for a, p in pa.items()) for m, pa in zip(metas, parts)):
                continue
            if check and not rule.allows(sig, shapes, attrs, parts):
                continue
        cost = 0.0
        for m, size, want in zip(metas, itemsizes, sig.ins):
            if m is None or want is None:
                continue
            cost += box_cost(m.sbp[k], want, _nbytes(m, size), n)
        if any(s.is_partial for s in sig.outs):
            cost += 1.0  # ties go to signatures that leave no pending reduction
        if best is None or cost < best_cost:
            best, best_cost = sig, cost
    return best


# ------------------------------------------------------------------ gradient SBPs
def grad_out_sbp(sig, j):
    s = sig.outs[j]
    return s if s.is_split and not sig.all_broadcast else broadcast


def grad_in_sbp(sig, i):
    s = sig.ins[i]
    if sig.all_broadcast:
        return broadcast
    if s.is_split:
        return s
    return broadcast if s.is_partial else partial_sum


# ------------------------------------------------------------------ logical output shapes
def _uneven(shapes, nd_sbps, placement):
    for shape, nd in zip(shapes, nd_sbps):
        if shape is None:
            continue
        parts = {}
        for k, s in enumerate(nd):
            if s.is_split:
                parts[s.axis] = parts.get(s.axis, 1) * placement.hierarchy[k]
        if any(shape[a] % p for a, p in parts.items()):
            return True
    return False


def logical_shape(local, nd, placement, uneven):
    """Logical shape of an output from its local shape: exact multiplication when every split
    is even, otherwise the extents are gathered along each mesh axis (inner axes first)."""
    shape = list(local)
    if not uneven:
        for k, s in enumerate(nd):
            if s.is_split:
                shape[s.axis] *= placement.hierarchy[k]
        return tuple(shape)
    for k in reversed(range(len(nd))):
        s = nd[k]
        if s.is_split:
            group = comm.mesh_axis_groups(placement.mesh, k)
            sizes = comm.all_gather(np.array([shape[s.axis]], dtype=np.int64), group=group)
            shape[s.axis] = int(sizes.sum())
    return tuple(shape)


# ------------------------------------------------------------------ the dispatch
def _fail_mixed(cls, inputs):
    kinds = ", ".join(f"input {i}: {'global' if t._global is not None else 'local'} {list(t.shape)}"
                      for i, t in enumerate(inputs) if t is not None)
    raise RuntimeError(f"{cls.name or cls.__name__}: cannot mix local and global tensors in one op ({kinds}); "
                       "convert the local ones with .to_global(placement, sbp) or the global ones with .to_local()")


def global_apply(op, inputs, attrs):
    """Run `op` on global `inputs` (the global dispatch that Op.apply calls): check the inputs,
    plan the call (signature per mesh axis, inputs boxed to it, attributes for this shard), run
    the kernel on the shards, wrap the outputs as global tensors, record the backward."""
    metas = _check_inputs(op, inputs)
    placement = next(m for m in metas if m is not None).placement
    rule = rule_for(op)
    composed = rule.decompose(inputs, attrs)
    if composed is not None:  # written with other global ops (e.g. vocab-parallel cross-entropy)
        return composed
    if not placement.has_rank(comm.get_rank()):
        return _outside_placement(op, rule, attrs, placement, inputs)
    if placement.size == 1:
        return _apply_on_one_rank(op, inputs, attrs, placement)
    plan = _plan(op, rule, inputs, metas, attrs, placement)
    ctx, outs, needs_grad = _run_kernel(plan)
    results = _wrap_outputs(plan, outs)
    share_versions(plan.boxed, results)
    if needs_grad:
        _attach_backward(plan, ctx, results)
    return results[0] if plan.single_output else tuple(results)


def _check_inputs(op, inputs):
    """The inputs' GlobalMetas (None for absent inputs); an error for local inputs among global
    ones or for inputs on different placements."""
    metas = []
    for t in inputs:
        if t is None:
            metas.append(None)
        elif t._global is None:
            _fail_mixed(op, inputs)
        else:
            metas.append(t._global)
    placement = next(m for m in metas if m is not None).placement
    for i, m in enumerate(metas):
        if m is not None and m.placement is not placement and m.placement != placement:
            raise RuntimeError(f"{op.name or op.__name__}: inputs live on different placements ({placement!r} and "
                               f"input {i} on {m.placement!r}); move one with .to_global(placement=...)")
    return metas


def _outside_placement(op, rule, attrs, placement, inputs):
    """On a rank outside the placement: empty outputs (no data, no logical shape here); an error
    in pipeline stage-local execution (engine.distributed.pipeline.stage_local)."""
    if _stage_state["strict"]:
        raise RuntimeError(f"{op.name or op.__name__}: rank {comm.get_rank()} runs it on tensors of {placement!r}, "
                           "which does not hold them (pipeline stage-local execution: a step of one stage used a "
                           "tensor of another stage)")
    n_out = rule.n_outputs(attrs)
    device = inputs[0]._device if inputs[0] is not None else None
    outs = tuple(make_global(np.empty((0,)), GlobalMeta(placement, (broadcast,) * placement.ndim, None), device)
                 for _ in range(n_out))
    return outs[0] if n_out == 1 else outs


class _Plan:
    """How one op call runs on this rank: the kernel, the signature per mesh axis, the inputs
    boxed to it, the op's (logical) attributes and those for this rank's shard, and the logical
    input shapes."""

    __slots__ = ("op", "rule", "placement", "chosen", "boxed", "attrs", "local_attrs", "shapes", "in_nd",
                 "single_output")

    def __init__(self, op, rule, placement, chosen, boxed, attrs, local_attrs, shapes, in_nd):
        self.op, self.rule, self.placement, self.chosen = op, rule, placement, chosen
        self.boxed, self.attrs, self.local_attrs, self.shapes, self.in_nd = boxed, attrs, local_attrs, shapes, in_nd
        self.single_output = True


# The signature chosen per mesh axis depends only on the op, its inputs' layouts, shapes and
# itemsizes, and its attributes, and a training step makes the same calls every iteration: the
# choice is made once per distinct call and looked up afterwards (on a dp=2 x tp=2 Swin step it
# was a fifth of each rank's time). Calls with an attribute that is not a plain value (an index
# array, a generator) are decided every time.
_decisions = {}
_MAX_DECISIONS = 1 << 14
_PLAIN = (bool, int, str, type(None), type(Ellipsis), np.dtype)


def _frozen(v):
    """A hashable stand-in for attribute value `v` that tells apart what == does not (1, 1.0 and
    True; 0.0 and -0.0), or None when `v` is not a plain value."""
    if isinstance(v, float):
        return ("f", v.hex())
    if isinstance(v, _PLAIN):
        return (type(v), v)
    if isinstance(v, (tuple, list)):
        items = tuple(_frozen(x) for x in v)
        return None if None in items else (type(v), items)
    if isinstance(v, slice):
        items = (_frozen(v.start), _frozen(v.stop), _frozen(v.step))
        return None if None in items else ("slice", items)
    if isinstance(v, np.generic):
        return ("np", v.dtype.str, v.tobytes())
    dtype = getattr(v, "np", None)  # an engine dtype
    if isinstance(dtype, np.dtype) and type(v).__module__.startswith("engine."):
        return ("dtype", str(v))
    return None


def _decision_key(op, metas, itemsizes, attrs):
    parts = [op, tuple(itemsizes)]
    for m in metas:
        parts.append(None if m is None else (m.placement, m.sbp, m.shape))
    for name in sorted(attrs):
        f = _frozen(attrs[name])
        if f is None:
            return None
        parts.append((name, f))
    return tuple(parts)


def _decide(rule, metas, itemsizes, shapes, attrs, placement):
    """(the signature per mesh axis, each input's SBP under it)."""
    signatures = rule.signatures(shapes, attrs)
    chosen = []
    for k in range(placement.ndim):
        chosen.append(choose(signatures, metas, itemsizes, placement, k, rule, shapes, attrs,
                             [(c, placement.hierarchy[j]) for j, c in enumerate(chosen)]))
    in_nd = tuple(None if m is None else tuple(sig.ins[i] for sig in chosen) for i, m in enumerate(metas))
    return tuple(chosen), in_nd


def _plan(op, rule, inputs, metas, attrs, placement):
    shapes = [m.shape if m is not None else None for m in metas]
    itemsizes = [t._data.dtype.itemsize if t is not None else 0 for t in inputs]
    key = _decision_key(op, metas, itemsizes, attrs)
    decided = _decisions.get(key) if key is not None else None
    if decided is None:
        decided = _decide(rule, metas, itemsizes, shapes, attrs, placement)
        if key is not None:
            if len(_decisions) >= _MAX_DECISIONS:
                _decisions.clear()
            _decisions[key] = decided
    chosen, in_nd = list(decided[0]), decided[1]
    boxed = [None if t is None else global_to_global(t, placement, in_nd[i]) for i, t in enumerate(inputs)]
    local_attrs = rule.local_attrs(attrs, shapes, in_nd, placement, placement.coords(comm.get_rank()))
    # a signature may need another local kernel (masked lookups on a vocab shard)
    return _Plan(rule.kernel(op, chosen), rule, placement, chosen, boxed, attrs, local_attrs, shapes, in_nd)


# ------------------------------------------------------------------ one rank
def _apply_on_one_rank(op, inputs, attrs, placement):
    """global_apply on a placement of one rank, the case of every LiBai model run in one process.

    There every value is whole whatever its SBP, so the all-broadcast signature needs no
    choice, no boxing, no attribute translation and no shape inference: the kernel runs on the
    inputs' arrays and the outputs are wrapped as they come. The backward takes each output
    gradient's array as it is, for the same reason. Measured: an add with its backward 96 -> 56-66
    us of Python (a local tensor's: 38-42 us); a Swin step makes about 900 such calls."""
    ctx, outs, single, needs_grad = _forward(op, inputs, attrs, lambda n_out: _all_broadcast_text(inputs, n_out,
                                                                                                placement))
    sbp = (broadcast,) * placement.ndim
    for t in inputs:
        if t is not None:
            device = t._device
            break
    results = [make_global(a, GlobalMeta.trusted(placement, sbp, a.shape), device) for a in outs]
    share_versions(inputs, results)
    if needs_grad:
        _attach_one_rank_backward(op, ctx, inputs, results, placement, sbp, device)
    return results[0] if single else tuple(results)


def _all_broadcast_text(inputs, n_out, placement):
    """The one-rank call's SBP signature for nn.Graph's debug output: all broadcast."""
    ins = ", ".join("B" for t in inputs if t is not None)
    return ", ".join([f"({ins}) -> ({', '.join(['B'] * n_out)})"] * placement.ndim)


def _attach_one_rank_backward(op, ctx, inputs, results, placement, sbp, device):
    """_attach_backward for _apply_on_one_rank: the op's local backward on the whole arrays,
    every gradient broadcast (the all-broadcast signature's rule)."""
    _save_local_views(op, ctx, inputs, results)
    shapes = [None if t is None else t._global.shape for t in inputs]

    def backward_fn(c, *grads):
        if _state.enabled:
            raise NotImplementedError(f"create_graph backward through {op.name} on global tensors is not supported")
        res = op.backward(c, *[None if g is None else Tensor._make(_whole_array(g, placement, sbp), g._device)
                               for g in grads])
        return tuple(None if g is None or shape is None else
                     make_global(g._data, GlobalMeta.trusted(placement, sbp, shape), device)
                     for g, shape in zip(res if isinstance(res, tuple) else (res,), shapes))

    _record_node(op, backward_fn, ctx, inputs, results)


def _whole_array(g, placement, sbp):
    """The array of gradient `g` for an output on one-rank `placement`: its own (whole on one
    rank, whatever its SBP), or boxed here if it arrives on another placement."""
    meta = g._global
    if meta is not None and (meta.placement is placement or meta.placement == placement):
        return g._data
    return global_to_global(g, placement, sbp)._data


def _run_kernel(plan):
    """The op's forward on the shards: (ctx, output arrays, whether a backward is recorded)."""
    ctx, outs, plan.single_output, needs_grad = _forward(plan.op, plan.boxed, plan.local_attrs,
                                                         lambda n_out: _sbp_text(plan))
    return ctx, outs, needs_grad


def _forward(op, inputs, attrs, sbp_text):
    """Run the op's local forward on the inputs' arrays (recorded when nn.Graph is capturing,
    with `sbp_text(number of outputs)` in the entry's description): (ctx, the output arrays as
    a tuple, whether the kernel returned a single array rather than a tuple, whether a backward
    is recorded)."""
    ctx = Context()
    needs_grad = False
    if op.differentiable and _state.enabled:
        for t in inputs:
            if t is not None and t._requires_grad:
                needs_grad = True
                ctx.needs_input_grad = tuple(t is not None and t._requires_grad for t in inputs)
                break
    arrays = [None if t is None else t._data for t in inputs]
    tracer = _state.tracer
    if tracer is None:
        out = op.forward(ctx, *arrays, **attrs)
    else:  # nn.Graph is capturing this step
        out = tracer.kernel(op, ctx, arrays, attrs)
        tracer.entries[-1].info += f" sbp {sbp_text(len(out) if isinstance(out, tuple) else 1)}"
    if not isinstance(out, tuple):
        return ctx, (np.asarray(out) if isinstance(out, np.generic) else out,), True, needs_grad
    return ctx, tuple(np.asarray(a) if isinstance(a, np.generic) else a for a in out), False, needs_grad


def _sbp_text(plan):
    return ", ".join("(" + ", ".join(str(s) for s in sig.ins if s is not None) + ") -> ("
                     + ", ".join(str(s) for s in sig.outs) + ")" for sig in plan.chosen)


def _wrap_outputs(plan, outs):
    """Global tensors around the output shards, with the signature's output SBP and logical
    shapes (from the rule, or from the shards' extents)."""
    placement = plan.placement
    # the default all-broadcast signature does not know how many outputs a kernel returns
    plan.chosen = [Signature(sig.ins, (broadcast,) * len(outs)) if len(sig.outs) != len(outs) and sig.all_broadcast
                   else sig for sig in plan.chosen]
    out_nd = [tuple(sig.outs[j] for sig in plan.chosen) for j in range(len(outs))]
    shapes = plan.rule.out_shapes(plan.shapes, plan.attrs)
    if shapes is None:
        uneven = _uneven(plan.shapes, plan.in_nd, placement)
        shapes = [logical_shape(a.shape, nd, placement, uneven) for a, nd in zip(outs, out_nd)]
    device = next(b._device for b in plan.boxed if b is not None)
    return [make_global(a, GlobalMeta(placement, nd, shape), device) for a, nd, shape in zip(outs, out_nd, shapes)]


def _attach_backward(plan, ctx, results):
    """Record a Node whose backward runs the op's local backward on shards (see the module
    docstring for the gradient SBPs that make it valid)."""
    op, boxed, chosen, placement = plan.op, plan.boxed, plan.chosen, plan.placement
    _save_local_views(op, ctx, boxed, results)
    device = results[0]._device

    def backward_fn(c, *grads):
        if _state.enabled:
            raise NotImplementedError(f"create_graph backward through {op.name} on global tensors is not supported")
        local_grads = []
        for j, g in enumerate(grads):
            if g is not None:
                g = global_to_global(g, placement, tuple(grad_out_sbp(sig, j) for sig in chosen))
                g = Tensor._make(g._data, g._device)
            local_grads.append(g)
        res = op.backward(c, *local_grads)
        res = res if isinstance(res, tuple) else (res,)
        return tuple(None if g is None or boxed[i] is None else
                     make_global(g._data, GlobalMeta(placement, tuple(grad_in_sbp(sig, i) for sig in chosen),
                                                     plan.shapes[i]), device)
                     for i, g in enumerate(res))

    _record_node(op, backward_fn, ctx, boxed, results)


def _save_local_views(op, ctx, inputs, results):
    """Save what the op's local backward reads: local views of the inputs and outputs it names."""
    ctx.save_for_backward(*[None if inputs[i] is None else _local_view(inputs[i])
                            for i in op.saved_input_indices(ctx)],
                          *[_local_view(results[j]) for j in op.save_outputs])


def _record_node(op, backward_fn, ctx, inputs, results):
    """The autograd Node of one global op call, set as the grad_fn of its floating outputs."""
    node = Node(op.name or op.__name__, backward_fn, ctx,
                tuple(None if t is None else t._grad_edge() for t in inputs), len(results))
    for j, r in enumerate(results):
        if r.is_floating_point():
            r._requires_grad = True
            r.grad_fn = node
            r._output_nr = j


def _local_view(t):
    v = Tensor._make(t._data, t._device)
    v._requires_grad = t._requires_grad
    return v

