"""Global tensors: one logical tensor whose shards live on the ranks of a placement.

A global tensor is an ordinary engine Tensor whose `_data` is this rank's shard and whose
`_global` is a `GlobalMeta` (placement, nd-SBP, logical shape). Every op accepts them (see
dispatch.py); this module makes them: `to_global`, `to_local`, creation with `placement=` and
`sbp=`, and the gradient rules at the edges (leaf accumulation, local <-> global casts).
"""
import contextlib
import functools
import hashlib

import numpy as np

from ..autograd.grad_mode import _state, no_grad
from ..autograd.graph import Node
from ..backend import as_device, local_cuda_index
from ..tensor import Tensor, tensor_method
from . import comm
from .boxing import box_across, box_local, local_shape
from .placement import placement as Placement
from .sbp import as_sbp_tuple, broadcast, partial_sum, split


class GlobalMeta:
    """(placement, nd-SBP tuple, logical shape). `shape` is None on ranks outside the placement
    when it could not be known there without communication."""

    __slots__ = ("placement", "sbp", "shape")

    def __init__(self, placement, sbp, shape):
        self.placement = placement
        self.sbp = sbp
        self.shape = None if shape is None else tuple(int(s) for s in shape)

    @classmethod
    def trusted(cls, placement, sbp, shape):
        """A meta from values already in canonical form (an SBP tuple, a tuple of ints for the
        shape, as an array's .shape is), without the constructor's conversion: the per-op path."""
        meta = object.__new__(cls)
        meta.placement, meta.sbp, meta.shape = placement, sbp, shape
        return meta

    def __eq__(self, other):
        return isinstance(other, GlobalMeta) and (self.placement, self.sbp, self.shape) == \
            (other.placement, other.sbp, other.shape)

    def __hash__(self):
        return hash((self.placement, self.sbp, self.shape))

    def __repr__(self):
        sbp = self.sbp[0] if len(self.sbp) == 1 else self.sbp
        return f"placement={self.placement!r}, sbp={sbp}"

    # ---- what the layers below engine.distributed ask of a global tensor (they never import
    #      this module: a global tensor carries its meta, and they call these methods)
    def constant(self, shape):
        """Meta of a constant (the same value on every rank) on this placement."""
        return GlobalMeta(self.placement, (broadcast,) * self.placement.ndim, shape)

    def with_shape(self, shape):
        """The same placement and SBP for a tensor of logical `shape` (e.g. a constant computed
        elementwise from a shard)."""
        return GlobalMeta(self.placement, self.sbp, shape)

    def without_partial(self):
        """This layout with partial mesh axes read as broadcast: the layout of a fresh value
        (a fill, a random draw) made like this tensor, which is not a sum of shards."""
        if not any(s.is_partial for s in self.sbp):
            return self
        return GlobalMeta(self.placement, tuple(broadcast if s.is_partial else s for s in self.sbp), self.shape)

    def replicated(self):
        """This placement with every mesh axis broadcast: the layout of a new value of any shape
        made "like" this tensor (`Tensor.new_zeros`, ...)."""
        return GlobalMeta(self.placement, (broadcast,) * len(self.sbp), self.shape)

    def logical_value(self, local):
        """The whole logical value, from this rank's shard `local` (a collective: every rank of
        the placement must call it)."""
        if not self.here:
            raise RuntimeError(f"rank {comm.get_rank()} is not in the placement {self.placement!r}: it holds "
                               "no data for this tensor")
        return box_local(local, self.shape, self.placement, self.sbp, (broadcast,) * self.placement.ndim,
                         self.coords())

    def on_device_type(self, device_type):
        """(this layout on a placement of `device_type` with the same mesh of ranks and SBP, the
        device a rank's shard then lives on): what `.to(device)` / `.cpu()` / `.cuda()` of a global
        tensor gives (OneFlow's), each rank moving its own shard, with no communication (a
        rank's GPU is its own, from its local rank)."""
        meta = GlobalMeta(type(self.placement)(device_type, self.placement.ranks), self.sbp, self.shape)
        return meta, device_of_placement(meta.placement)

    def leaf_gradient(self, leaf, grad):
        """`grad` boxed to this leaf's own layout before it accumulates into `leaf.grad` (a
        broadcast parameter used on split data gets an all-reduced gradient); see _box_leaf_grad."""
        return _box_leaf_grad(leaf, grad)

    def reduce_over_splits(self, arr, op="sum"):
        """Combine a per-shard quantity (e.g. a sum of squares) over the mesh axes that split this
        tensor, in place on `arr`; broadcast axes hold the same value already. Used for norms of
        sharded parameters and gradients (LAMB's trust ratio, clip_grad_norm_)."""
        if any(s.is_partial for s in self.sbp):
            raise RuntimeError(f"a norm of a partial global tensor ({self}) needs its pending reduction first "
                               "(after no_grad_sync, call flow.distributed.sync_grads(params))")
        for k, s in enumerate(self.sbp):
            if s.is_split and self.placement.hierarchy[k] > 1:
                comm.all_reduce(arr, op=op, group=comm.mesh_axis_groups(self.placement.mesh, k))
        return arr

    @property
    def here(self):
        """Whether this rank holds a shard."""
        return self.placement.has_rank(comm.get_rank())

    def coords(self):
        return self.placement.coords(comm.get_rank())


def device_of_placement(p):
    if p.type == "cpu":
        return as_device("cpu")
    return as_device(f"cuda:{local_cuda_index()}")


def make_global(array, meta, device=None):
    t = Tensor._make(array, device or device_of_placement(meta.placement))
    t._global = meta
    return t


def empty_shard(meta, dtype):
    return np.empty((0,), dtype=dtype)


# ------------------------------------------------------------------ checks
def check_sbp_for_shape(shape, placement, sbp, what="tensor"):
    """Clear errors for a split axis out of range or an extent smaller than the ranks."""
    for k, s in enumerate(sbp):
        if s.is_split:
            if not -len(shape) <= s.axis < len(shape):
                raise ValueError(f"{what}: sbp {s} splits axis {s.axis}, out of range for shape {list(shape)}")
    for k, s in enumerate(sbp):
        if s.is_split:
            a = s.axis % len(shape)
            parts = np.prod([placement.hierarchy[j] for j, t in enumerate(sbp)
                             if t.is_split and t.axis % len(shape) == a])
            if shape[a] < parts:
                raise ValueError(f"{what}: axis {a} of shape {list(shape)} has extent {shape[a]}, smaller than "
                                 f"the {parts} ranks that sbp {tuple(sbp)} splits it over")


def _normalize_sbp(sbp, shape):
    """Negative split axes become positive."""
    return tuple(split(s.axis % len(shape)) if s.is_split and s.axis < 0 and len(shape) else s for s in sbp)


_MAX_DIMS = 16


def _h64(*parts):
    """A hash of `parts` that is the same in every process (Python's str hash is salted)."""
    return _h64_of_repr(repr(parts))


@functools.lru_cache(maxsize=1024)
def _h64_of_repr(text):
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def _placement_group(p):
    """The process group of the ranks of placement `p`, sorted (so that placements with the same
    ranks in another order or mesh shape share it and can be told apart by the check; cached)."""
    return comm.new_group(sorted(p.mesh.reshape(-1).tolist()))


def _allgather_rows(group, row):
    """Every member's int64 `row` (one small Allgather; not counted in comm.stats, which
    measures data movement). Returns an array of shape (group size, len(row)). Rows are
    metadata (shapes, hashes of arguments), the same at every replay of a CUDA graph: allowed
    inside a capture."""
    row = np.ascontiguousarray(row, dtype=np.int64)
    if group is None or group.size == 1:
        return row[None]
    out = np.empty((group.size, row.size), dtype=np.int64)
    with comm.metadata_exchange():
        group.comm.Allgather([row, comm.MPI.INT64_T], [out, comm.MPI.INT64_T])
    return out


def _agree(group, what, fields):
    """Raise on every member of `group` when its members disagree on any of `fields`
    (name -> value, compared through a 64-bit hash each). Costs one Allgather of a few
    int64; only on a mismatch are the values themselves gathered, to name them."""
    if group is None or group.size == 1:
        return
    names = list(fields)
    rows = _allgather_rows(group, [_h64(n, fields[n]) for n in names])
    if (rows == rows[0]).all():
        return
    bad = [i for i, n in enumerate(names) if (rows[:, i] != rows[0, i]).any()]
    with comm.metadata_exchange():
        values = group.comm.allgather({names[i]: repr(fields[names[i]]) for i in bad})
    lines = []
    for i in bad:
        n = names[i]
        seen = {}
        for r, v in zip(group.ranks, values):
            seen.setdefault(v[n], []).append(r)
        lines.append(f"{n}: " + "; ".join(f"ranks {rs} passed {v}" for v, rs in seen.items()))
    raise RuntimeError(f"{what}: the ranks of {group.ranks} called it with different arguments "
                       f"(every rank must make the same call): " + " | ".join(lines))


def _resolve(tensor, placement_, sbp):
    if placement_ is None:
        if tensor._global is None:
            raise ValueError("to_global on a local tensor needs placement=")
        placement_ = tensor._global.placement
    if not isinstance(placement_, Placement):
        raise TypeError(f"placement must be flow.placement(...), got {type(placement_).__name__}")
    if sbp is None:
        if tensor._global is None:
            raise ValueError("to_global on a local tensor needs sbp=")
        sbp = tensor._global.sbp if placement_ == tensor._global.placement else (broadcast,) * placement_.ndim
    return placement_, as_sbp_tuple(sbp, placement_.ndim)


# ------------------------------------------------------------------ autograd edges
def _record(out, inputs, backward_fn, name):
    """Attach a Node to `out` when grad mode is on and an input requires grad."""
    if not (_state.enabled and any(t is not None and t.requires_grad for t in inputs)):
        return out
    if not out.is_floating_point():
        return out
    node = Node(name, lambda ctx, g: backward_fn(g), None, tuple(t._grad_edge() for t in inputs), 1)
    out._requires_grad = True
    out.grad_fn = node
    return out


def dual(s):
    """SBP of a gradient in a local <-> global cast: S <-> S, B -> P, P -> B."""
    if s.is_broadcast:
        return partial_sum
    if s.is_partial:
        return broadcast
    return s


# Pipeline stage-local execution (engine.distributed.pipeline): stand-ins for tensors of another
# stage ({id(tensor): copy on this stage}, used by to_global) and the depth of `stage_local()`.
_stage_state = {"stand_ins": {}, "strict": 0}


def global_to_global(x, placement_, sbp, grad_sbp=None):
    """Box `x` to (placement, sbp); backward boxes the gradient back (through grad_sbp)."""
    meta = x._global
    if placement_ == meta.placement:
        if meta.sbp == sbp and grad_sbp is None:
            return x
        arr = x._data
        if meta.here and meta.sbp != sbp:
            args = (arr, meta.shape, placement_, meta.sbp, sbp, meta.coords())
            arr = box_local(*args)
            if _state.tracer is not None:  # nn.Graph is capturing this step: the boxing is a kernel call
                _state.tracer.call(box_local, args, arr, "Boxing",
                                   f"{list(args[0].shape)} {_sbp_str(meta.sbp)} -> {_sbp_str(sbp)}")
        out = make_global(arr, GlobalMeta(placement_, sbp, meta.shape), x._device)
    else:
        if _state.tracer is not None:
            from ..autograd.trace import GraphTraceError
            raise GraphTraceError(f"nn.Graph: moving a tensor from {meta.placement!r} to {placement_!r} (pipeline "
                                  "stages) is not captured by graph mode; run pipeline-parallel jobs eagerly")
        arr, shape = box_across(x._data if meta.here else None, meta, placement_, sbp,
                                device_of_placement(placement_))
        new_meta = GlobalMeta(placement_, sbp, shape)
        out = make_global(arr if arr is not None else empty_shard(new_meta, x._data.dtype), new_meta)

    def backward(g):
        if grad_sbp is not None:
            g = global_to_global(g, placement_, as_sbp_tuple(grad_sbp, placement_.ndim))
        target = meta.sbp
        if g._global.placement == meta.placement:
            # the gradient of a partial value is the same for every shard: a broadcast gradient
            # already says that, and keeping it B saves the all-reduce its consumer (e.g. a
            # row-parallel linear, whose partial output wants a B gradient) would need
            target = tuple(gs if (s.is_partial and gs.is_broadcast) else s for s, gs in zip(meta.sbp, g._global.sbp))
        return global_to_global(g, meta.placement, target)

    return _record(out, [x], backward, "ToGlobal")


def _sbp_str(sbp):
    return "(" + ", ".join(str(s) for s in sbp) + ")"


def _logical_from_locals(shapes, placement_, sbp, what):
    """The logical shape whose balanced split `sbp` gives each rank (mesh order) its local
    shape in `shapes`, or a ValueError that names the ranks whose shards do not fit."""
    ranks = placement_.mesh.reshape(-1).tolist()
    coords = [placement_.coords(r) for r in ranks]
    ndims = {len(sh) for sh in shapes}
    if len(ndims) != 1:
        raise ValueError(f"{what}: the local tensors have different numbers of dims: " +
                         ", ".join(f"rank {r}: {list(sh)}" for r, sh in zip(ranks, shapes)))
    ndim = ndims.pop()
    for s in sbp:
        if s.is_split and not -ndim <= s.axis < max(ndim, 0):
            raise ValueError(f"{what}: sbp {s} splits axis {s.axis}, out of range for local shape {list(shapes[0])}")
    sbp = _normalize_sbp(sbp, [0] * ndim)
    logical = []
    for a in range(ndim):
        axes = [k for k, s in enumerate(sbp) if s.is_split and s.axis == a]
        # ranks at coordinate 0 on every other mesh axis tile dim a exactly once
        logical.append(sum(sh[a] for sh, c in zip(shapes, coords)
                           if all(c[k] == 0 for k in range(placement_.ndim) if k not in axes)))
    wrong = []
    for r, sh, c in zip(ranks, shapes, coords):
        want = local_shape(logical, placement_, sbp, c)
        if tuple(sh) != tuple(want):
            wrong.append(f"rank {r} has {list(sh)}, the split needs {list(want)}")
    if wrong:
        raise ValueError(f"{what}: the local shards are not the balanced split {tuple(sbp)} of a logical tensor "
                         f"of shape {logical} on {placement_!r} (the first `extent % ranks` shards one larger): "
                         + "; ".join(wrong))
    return tuple(logical), sbp


def local_to_global(x, placement_, sbp, check_meta=True, shape=None):
    """Read each rank's local tensor as its shard of (placement, sbp). With a split, or with
    `check_meta`, the ranks of the placement exchange their local shapes (one small
    Allgather): the logical shape is derived from them and checked to be the balanced split,
    and all ranks must pass the same placement, sbp and dtype. A known logical `shape` (the
    backward of to_local) skips all of that."""
    me = comm.get_rank()
    what = "to_global"
    if shape is not None:
        shape = tuple(shape)
    elif placement_.has_rank(me):
        local = tuple(x.shape)
        if len(local) > _MAX_DIMS:
            raise ValueError(f"{what}: at most {_MAX_DIMS} dims are supported, got {list(local)}")
        if any(s.is_split for s in sbp) or check_meta:
            group = _placement_group(placement_)
            if check_meta:
                _agree(group, what, {"placement": placement_, "sbp": tuple(sbp), "dtype": str(x.dtype)})
            row = [len(local)] + list(local) + [0] * (_MAX_DIMS - len(local))
            rows = _allgather_rows(group, row)
            shapes = [tuple(int(v) for v in r[1:1 + int(r[0])]) for r in rows]
            shape, sbp = _logical_from_locals(shapes, placement_, sbp, what)
        else:
            shape = local
        check_sbp_for_shape(shape, placement_, sbp, what)
    meta = GlobalMeta(placement_, sbp, shape)
    out = make_global(x._data if placement_.has_rank(me) else empty_shard(meta, x._data.dtype), meta,
                      device_of_placement(placement_))

    def backward(g):
        return to_local(global_to_global(g, placement_, tuple(dual(s) for s in sbp)))

    return _record(out, [x], backward, "LocalToGlobal")


def _check_global_call(x, placement_, sbp, grad_sbp):
    """All ranks taking part in a global -> global conversion must ask for the same one."""
    meta = x._global
    fields = {"placement": placement_, "sbp": tuple(sbp), "grad_sbp": grad_sbp,
              "source placement": meta.placement}
    if placement_ == meta.placement:
        if not meta.here:
            return
        group = _placement_group(placement_)
        fields.update({"source sbp": meta.sbp, "shape": meta.shape, "dtype": str(x.dtype)})
    else:
        union = sorted(set(meta.placement.mesh.reshape(-1).tolist()) | set(placement_.mesh.reshape(-1).tolist()))
        if comm.get_rank() not in union:
            return
        group = comm.new_group(union)
    _agree(group, "to_global", fields)


@tensor_method()
def to_global(self, placement=None, sbp=None, grad_sbp=None, check_meta=True):
    """This tensor as a global tensor on `placement` with `sbp` (one per mesh axis).

    A local tensor is read as this rank's shard (copied to the placement's device type first,
    e.g. from the CPU onto a cuda placement); a global one is boxed (converted with
    collectives) to the new layout. `grad_sbp` sets the SBP the gradient is converted to in
    backward before it reaches this tensor's own layout. Collective: every rank of the
    placement(s) must call it. With `check_meta` (default) the ranks first compare their
    arguments (one Allgather of a few int64) and all raise the same error on a mismatch
    instead of hanging in a collective.
    """
    if _stage_state["stand_ins"] and self._global is not None and not self._global.here:
        stand_in = _stage_state["stand_ins"].get(id(self))
        if stand_in is not None:  # a tied parameter of another pipeline stage: its copy on this one
            return stand_in.to_global(placement, sbp, grad_sbp, check_meta)
    placement_, sbp = _resolve(self, placement, sbp)
    if self._global is None:
        if grad_sbp is not None:
            raise ValueError("to_global: grad_sbp applies to global -> global conversions")
        if placement_.type != self._device.type:  # e.g. host data onto a cuda placement: copied over first
            return local_to_global(self.to(device_of_placement(placement_)), placement_, sbp, check_meta)
        return local_to_global(self, placement_, sbp, check_meta)
    if grad_sbp is not None:
        grad_sbp = as_sbp_tuple(grad_sbp, placement_.ndim)
    if self._global.shape is not None:
        check_sbp_for_shape(self._global.shape, placement_, sbp, "to_global")
        sbp = _normalize_sbp(sbp, self._global.shape)
        if grad_sbp is not None:
            check_sbp_for_shape(self._global.shape, placement_, grad_sbp, "to_global (grad_sbp)")
            grad_sbp = _normalize_sbp(grad_sbp, self._global.shape)
    if check_meta:
        _check_global_call(self, placement_, sbp, grad_sbp)
    return global_to_global(self, placement_, sbp, grad_sbp)


def to_local(x):
    """This rank's shard as a local tensor; backward reads the local gradient as the shard of
    the dual SBP (S -> S, B -> P, P -> B)."""
    meta = x._global
    if meta is None:
        raise RuntimeError("to_local: this tensor is already local (it has no placement); to_local applies to "
                           "global tensors, made with .to_global(placement, sbp) or a factory with placement=")
    out = Tensor._make(x._data, x._device)

    def backward(g):
        return local_to_global(g, meta.placement, tuple(dual(s) for s in meta.sbp), check_meta=False,
                               shape=meta.shape)

    return _record(out, [x], backward, "ToLocal")


tensor_method("to_local")(to_local)


def _prop(name):
    def get(self):
        g = self._global
        if g is None:
            raise RuntimeError(f"a local tensor has no {name}; make it global with .to_global(placement, sbp)")
        return getattr(g, name)

    return property(get)


Tensor.placement = _prop("placement")
Tensor.sbp = _prop("sbp")


# ------------------------------------------------------------------ leaf gradients
_sync = {"deferred": 0}


def _box_leaf_grad(leaf, grad):
    """A global leaf's gradient takes the leaf's own SBP (so a broadcast parameter used on split
    data gets an all-reduced gradient). While sync is deferred, partial gradients stay partial.

    The gradient already accumulated in `leaf.grad` is brought to the same layout first, since
    accumulation adds the shards: a partial sum from deferred micro-batches meeting a reduced
    gradient (or the other way round) must not add a replicated value to every partial shard."""
    lm, gm = leaf._global, grad._global
    if gm is None:
        raise RuntimeError(f"a global leaf ({lm}) received a local gradient")
    existing = leaf.grad._global if leaf.grad is not None else None
    if existing is not None and existing.placement != lm.placement:
        existing = None
    target = lm.sbp
    if _sync["deferred"] and gm.placement == lm.placement:
        prior = existing.sbp if existing is not None else (None,) * len(lm.sbp)
        target = tuple(_deferred_sbp(own, new, old) for own, new, old in zip(lm.sbp, gm.sbp, prior))
    if existing is not None and existing.sbp != target:
        with no_grad():
            leaf.grad = global_to_global(leaf.grad, lm.placement, target)
    if gm.placement == lm.placement and gm.sbp == target:
        return grad
    return global_to_global(grad, lm.placement, target)


def _deferred_sbp(own, new, prior):
    """A deferred gradient's SBP on one mesh axis: partial where the leaf is broadcast and the
    new or the accumulated gradient is partial, else the leaf's own."""
    if own.is_broadcast:
        for s in (new, prior):
            if s is not None and s.is_partial:
                return s
    return own


@contextlib.contextmanager
def no_grad_sync():
    """Inside this context, gradients of broadcast (data-parallel) parameters stay partial sums:
    no all-reduce per micro-batch. Call `sync_grads(params)` after the last micro-batch."""
    _sync["deferred"] += 1
    try:
        yield
    finally:
        _sync["deferred"] -= 1


# the most gradient bytes one bucketed all-reduce of sync_grads carries (PyTorch DDP's default)
GRAD_BUCKET_BYTES = 25 << 20


def sync_grads(parameters):
    """Box every global parameter's gradient to the parameter's own SBP (the deferred all-reduce).

    Gradients that only wait for a sum over mesh axes where their parameter is broadcast (the
    data-parallel reduction, and the tensor-parallel one of a replicated parameter) are reduced
    in buckets, as PyTorch's DDP does: those of one placement, mesh axes and dtype are packed
    into one flat buffer of at most GRAD_BUCKET_BYTES, all-reduced once per mesh axis, and
    unpacked. A step then makes a few all-reduces instead of one or two per parameter; each
    costs every rank of the group a meeting (on 4 ranks sharing 2 cores, a wait for the others
    to be scheduled). Any other pending conversion is boxed on its own."""
    buckets, rest = {}, []
    for p in parameters:
        if p.grad is None or p._global is None:
            continue
        own, got = p._global, p.grad._global
        if got == own:
            continue
        axes = _summed_axes(own, got)
        if axes is None or not own.here or p.grad._data.size == 0:
            rest.append(p)
            continue
        key = (own.placement, axes, p.grad._data.dtype, p.grad._device)
        buckets.setdefault(key, []).append(p)
    with no_grad():
        for (placement_, axes, _, _), params in buckets.items():
            for chunk in _chunks(params, GRAD_BUCKET_BYTES):
                _all_reduce_together(chunk, placement_, axes)
        for p in rest:
            p.grad = global_to_global(p.grad, p._global.placement, p._global.sbp)


def _summed_axes(own, got):
    """The mesh axes on which gradient layout `got` is a pending sum of parameter layout `own`'s
    broadcast, when that is all that separates them (same placement, every other axis equal);
    else None."""
    if got.placement != own.placement or got.shape != own.shape:
        return None
    axes = []
    for k, (s, g) in enumerate(zip(own.sbp, got.sbp)):
        if g == s:
            continue
        if not (s.is_broadcast and g.is_partial and g.op == "sum"):
            return None
        axes.append(k)
    return tuple(axes)


def _chunks(params, limit):
    chunk, size = [], 0
    for p in params:
        if chunk and size + p.grad._data.nbytes > limit:
            yield chunk
            chunk, size = [], 0
        chunk.append(p)
        size += p.grad._data.nbytes
    if chunk:
        yield chunk


def _all_reduce_together(params, placement_, axes):
    """All-reduce the gradients of `params` (one placement and dtype) over mesh `axes` as one
    flat buffer; each parameter's `.grad` becomes its slice of the result, in its own layout."""
    from ..backend import xp_of

    grads = [p.grad._data for p in params]
    xp = xp_of(grads[0])
    flat = xp.concatenate([g.reshape(-1) for g in grads])
    for k in axes:
        comm.all_reduce(flat, op="sum", group=comm.mesh_axis_groups(placement_.mesh, k))
    start = 0
    for p, g in zip(params, grads):
        p.grad = make_global(flat[start:start + g.size].reshape(g.shape), p._global, p.grad._device)
        start += g.size


# ------------------------------------------------------------------ creation
def create_global(factory, fill_args, args, kwargs, placement_, sbp):
    """A factory call with `placement=` and `sbp=` (flow.zeros(4, placement=p, sbp=B), ...):
    registered into engine.ops.creation by engine.distributed. The logical value is what the
    local factory makes; constant fills (`fill_args` given) allocate only each rank's shard."""
    if not isinstance(placement_, Placement):
        raise TypeError(f"{factory.__name__}: placement must be flow.placement(...), got {type(placement_).__name__}")
    requires_grad = kwargs.pop("requires_grad", False)
    kwargs["device"] = device_of_placement(placement_)
    if fill_args is not None:
        shape, value, dtype = fill_args(*args, **kwargs)
        return global_filled(shape, value, dtype, placement_, sbp, requires_grad)
    logical = factory(*args, **kwargs)
    return global_from_logical(lambda: logical._data, tuple(logical.shape), logical.dtype, placement_, sbp,
                               requires_grad=requires_grad)


def global_from_logical(make_logical, shape, dtype, placement_, sbp, device=None, requires_grad=False):
    """A global tensor whose logical value is `make_logical()` (called on every rank, so random
    draws stay in lockstep and the logical tensor does not depend on the layout)."""
    sbp = as_sbp_tuple(sbp, placement_.ndim)
    check_sbp_for_shape(shape, placement_, sbp, "creation")
    sbp = _normalize_sbp(sbp, shape)
    full = make_logical()
    me = comm.get_rank()
    meta = GlobalMeta(placement_, sbp, shape)
    if placement_.has_rank(me):
        args = (full, shape, placement_, sbp, placement_.coords(me))
        local = _shard_of_logical(*args)
        if _state.tracer is not None:  # nn.Graph is capturing this step (a random draw is replayed)
            _state.tracer.call(_shard_of_logical, args, local, "ShardOfLogical")
    else:
        local = empty_shard(meta, full.dtype)
    t = make_global(local, meta, device)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _shard_of_logical(full, shape, placement_, sbp, coords):
    local = box_local(full, shape, placement_, (broadcast,) * placement_.ndim, sbp, coords)
    if local is full:
        local = full.copy() if isinstance(full, np.ndarray) else full
    return local


def global_filled(shape, fill, dtype, placement_, sbp, requires_grad=False):
    """zeros/ones/full: each rank allocates only its shard (partial sum: rank 0 of the axis holds
    the value, the others zeros; partial max: every rank holds it)."""
    sbp = as_sbp_tuple(sbp, placement_.ndim)
    check_sbp_for_shape(shape, placement_, sbp, "creation")
    sbp = _normalize_sbp(sbp, shape)
    me = comm.get_rank()
    meta = GlobalMeta(placement_, sbp, shape)
    device = device_of_placement(placement_)
    from ..backend import xp_for

    xp = xp_for(device)
    if placement_.has_rank(me):
        coords = placement_.coords(me)
        ls = local_shape(shape, placement_, sbp, coords)
        keep = all(c == 0 for c, s in zip(coords, sbp) if s.is_partial and s.op == "sum")
        local = xp.full(ls, fill if keep else 0, dtype=dtype.np)
    else:
        local = xp.empty((0,), dtype=dtype.np)
    if _state.tracer is not None:  # created inside a captured step: a fresh array per replay
        _state.tracer.constant(local)
    t = make_global(local, meta, device)
    if requires_grad:
        t.requires_grad_(True)
    return t


