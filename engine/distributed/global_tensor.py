"""Global tensors: one logical tensor whose shards live on the ranks of a placement.

A global tensor is an ordinary engine Tensor whose `_data` is this rank's shard and whose
`_global` is a `GlobalMeta` (placement, nd-SBP, logical shape). Every op accepts them (see
dispatch.py); this module makes them: `to_global`, `to_local`, creation with `placement=` and
`sbp=`, and the gradient rules at the edges (leaf accumulation, local <-> global casts).
"""
import contextlib

import numpy as np

from ..autograd.grad_mode import _state
from ..autograd.graph import Node
from ..backend import as_device, xp_of
from ..tensor import Size, Tensor, set_leaf_grad_hook, tensor_method
from . import comm
from .boxing import box_across, box_local, local_shape
from .placement import placement as Placement
from .sbp import _Sbp, as_sbp_tuple, balanced_sizes, broadcast, partial_sum, split


class GlobalMeta:
    """(placement, nd-SBP tuple, logical shape). `shape` is None on ranks outside the placement
    when it could not be known there without communication."""

    __slots__ = ("placement", "sbp", "shape")

    def __init__(self, placement, sbp, shape):
        self.placement = placement
        self.sbp = sbp
        self.shape = None if shape is None else tuple(int(s) for s in shape)

    def __eq__(self, other):
        return isinstance(other, GlobalMeta) and (self.placement, self.sbp, self.shape) == \
            (other.placement, other.sbp, other.shape)

    def __hash__(self):
        return hash((self.placement, self.sbp, self.shape))

    def __repr__(self):
        sbp = self.sbp[0] if len(self.sbp) == 1 else self.sbp
        return f"placement={self.placement!r}, sbp={sbp}"

    def constant(self, shape):
        """Meta of a constant (the same value on every rank) on this placement."""
        return GlobalMeta(self.placement, (broadcast,) * self.placement.ndim, shape)

    @property
    def here(self):
        """Whether this rank holds a shard."""
        return self.placement.has_rank(comm.get_rank())

    def coords(self):
        return self.placement.coords(comm.get_rank())


def device_of_placement(p):
    if p.type == "cpu":
        return as_device("cpu")
    return as_device(f"cuda:{comm.get_local_rank()}")


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


def global_to_global(x, placement_, sbp, grad_sbp=None):
    """Box `x` to (placement, sbp); backward boxes the gradient back (through grad_sbp)."""
    meta = x._global
    if placement_ == meta.placement:
        if meta.sbp == sbp:
            return x
        arr = x._data
        if meta.here:
            arr = box_local(arr, meta.shape, placement_, meta.sbp, sbp, meta.coords())
        out = make_global(arr, GlobalMeta(placement_, sbp, meta.shape), x._device)
    else:
        arr, shape = box_across(x._data if meta.here else None, meta, placement_, sbp,
                                device_of_placement(placement_))
        new_meta = GlobalMeta(placement_, sbp, shape)
        out = make_global(arr if arr is not None else empty_shard(new_meta, x._data.dtype), new_meta)

    def backward(g):
        if grad_sbp is not None:
            g = global_to_global(g, placement_, as_sbp_tuple(grad_sbp, placement_.ndim))
        return global_to_global(g, meta.placement, meta.sbp)

    return _record(out, [x], backward, "ToGlobal")


def local_to_global(x, placement_, sbp):
    """Read each rank's local tensor as its shard of (placement, sbp)."""
    me = comm.get_rank()
    shape = list(x.shape)
    if placement_.has_rank(me):
        coords = placement_.coords(me)
        for k in reversed(range(placement_.ndim)):  # inner axes first: sizes add up level by level
            s = sbp[k]
            if s.is_split:
                a = s.axis % len(shape) if shape else 0
                if not shape or not -len(shape) <= s.axis < len(shape):
                    raise ValueError(f"to_global: sbp {s} splits axis {s.axis}, out of range for local shape {list(x.shape)}")
                group = comm.mesh_axis_groups(placement_.mesh, k)
                sizes = comm.all_gather(np.array([shape[a]], dtype=np.int64), group=group).tolist()
                total = sum(sizes)
                if sizes != balanced_sizes(total, len(sizes)):
                    raise ValueError(
                        f"to_global: rank {me}'s local shards along axis {a} have extents {sizes} over mesh axis {k}; "
                        f"sbp {s} needs the balanced split {balanced_sizes(total, len(sizes))} (first ones larger)")
                shape[a] = total
        sbp = _normalize_sbp(sbp, shape)
    meta = GlobalMeta(placement_, sbp, shape if placement_.has_rank(me) else None)
    out = make_global(x._data if placement_.has_rank(me) else empty_shard(meta, x._data.dtype), meta,
                      device_of_placement(placement_))

    def backward(g):
        return to_local(global_to_global(g, placement_, tuple(dual(s) for s in sbp)))

    return _record(out, [x], backward, "LocalToGlobal")


@tensor_method()
def to_global(self, placement=None, sbp=None, grad_sbp=None, check_meta=False):
    """This tensor as a global tensor on `placement` with `sbp` (one per mesh axis).

    A local tensor is read as this rank's shard; a global one is boxed (converted with
    collectives) to the new layout. `grad_sbp` sets the SBP the gradient is converted to in
    backward before it reaches this tensor's own layout.
    """
    placement_, sbp = _resolve(self, placement, sbp)
    if self._global is None:
        if placement_.type != ("cpu" if self._device.type == "cpu" else "cuda"):
            raise ValueError(f"to_global: a {self._device} tensor cannot be placed on a {placement_.type} placement")
        out = local_to_global(self, placement_, sbp)
        if grad_sbp is not None:
            raise ValueError("to_global: grad_sbp applies to global -> global conversions")
        return out
    if self._global.shape is not None:
        check_sbp_for_shape(self._global.shape, placement_, sbp, "to_global")
        sbp = _normalize_sbp(sbp, self._global.shape)
    return global_to_global(self, placement_, sbp, grad_sbp)


def to_local(x):
    """This rank's shard as a local tensor; backward reads the local gradient as the shard of
    the dual SBP (S -> S, B -> P, P -> B)."""
    meta = x._global
    if meta is None:
        return x
    out = Tensor._make(x._data, x._device)

    def backward(g):
        return local_to_global(g, meta.placement, tuple(dual(s) for s in meta.sbp))

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
    data gets an all-reduced gradient). While sync is deferred, partial gradients stay partial."""
    lm, gm = leaf._global, grad._global
    if lm is None or gm is None:
        if (lm is None) != (gm is None):
            raise RuntimeError("a global leaf received a local gradient (or the reverse)")
        return grad
    if gm.placement == lm.placement and gm.sbp == lm.sbp:
        return grad
    if _sync["deferred"] and gm.placement == lm.placement:
        keep = tuple(g if (g.is_partial and l.is_broadcast) else l for g, l in zip(gm.sbp, lm.sbp))
        return global_to_global(grad, lm.placement, keep)
    return global_to_global(grad, lm.placement, lm.sbp)


set_leaf_grad_hook(_box_leaf_grad)


@contextlib.contextmanager
def no_grad_sync():
    """Inside this context, gradients of broadcast (data-parallel) parameters stay partial sums:
    no all-reduce per micro-batch. Call `sync_grads(params)` after the last micro-batch."""
    _sync["deferred"] += 1
    try:
        yield
    finally:
        _sync["deferred"] -= 1


def sync_grads(parameters):
    """Box every global parameter's gradient to the parameter's own SBP (the deferred all-reduce)."""
    for p in parameters:
        if p.grad is not None and p._global is not None and p.grad._global != GlobalMeta(
                p._global.placement, p._global.sbp, p._global.shape):
            from ..autograd.grad_mode import no_grad

            with no_grad():
                p.grad = global_to_global(p.grad, p._global.placement, p._global.sbp)


# ------------------------------------------------------------------ creation
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
        coords = placement_.coords(me)
        local = box_local(full, shape, placement_, (broadcast,) * placement_.ndim, sbp, coords)
        if local is full:
            local = full.copy() if isinstance(full, np.ndarray) else full
    else:
        local = empty_shard(meta, full.dtype)
    t = make_global(local, meta, device)
    if requires_grad:
        t.requires_grad_(True)
    return t


def global_filled(shape, fill, dtype, placement_, sbp, requires_grad=False):
    """zeros/ones/full: each rank allocates only its shard (partial: rank 0 of the axis holds it)."""
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
        keep = all(c == 0 for c, s in zip(coords, sbp) if s.is_partial)
        local = xp.full(ls, fill if keep else 0, dtype=dtype.np)
    else:
        local = xp.empty((0,), dtype=dtype.np)
    t = make_global(local, meta, device)
    if requires_grad:
        t.requires_grad_(True)
    return t


def is_sbp(x):
    return isinstance(x, _Sbp)


def logical_size(t):
    return Size(t._global.shape)


def xp_of_tensor(t):
    return xp_of(t._data)


def logical_array(t):
    """The whole logical value of a global tensor on every rank of its placement."""
    meta = t._global
    if not meta.here:
        raise RuntimeError(f"rank {comm.get_rank()} is not in the placement {meta.placement!r}: it holds no data "
                           "for this tensor")
    full = box_local(t._data, meta.shape, meta.placement, meta.sbp, (broadcast,) * meta.placement.ndim,
                     meta.coords())
    return full
