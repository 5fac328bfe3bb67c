"""ZeRO (DeepSpeed's Zero Redundancy Optimizer) on global tensors, over one mesh axis.

Data parallelism replicates every parameter over the data-parallel mesh axis (SBP B there),
and with it the gradients and the optimizer state. ZeRO splits them over that axis instead:
on the axis, the SBP B becomes S(k) for a tensor axis k, chosen per parameter (the first axis
whose extent, after any other split, the axis divides; a parameter with none stays replicated).

* stage 1: the optimizer holds a *shard* of each parameter (a leaf with the S(k) layout), so
  its state (Adam's exp_avg, exp_avg_sq) is created as shards: 1/n of the bytes per rank. After
  the usual gradient all-reduce, each rank takes its slice of the gradient (no communication),
  updates its shard, and the parameter is all-gathered back (S -> B).
* stage 2: also the gradients: they stay partial sums over the axis through every micro-batch
  and are reduce-scattered (P -> S) straight into the shards: half the traffic of an
  all-reduce, and no full reduced gradient is ever held.
* stage 3: also the parameters: each parameter itself is stored S(k) on the axis. An op that
  uses it gets it boxed to B (all-gathered) by the SBP dispatch just before the op; that copy is
  freed as soon as nothing refers to it (after the op without autograd; in training, after the
  op's backward, which keeps it; with activation checkpointing a layer's gathered weights are
  dropped after its forward and gathered again in its backward). Gradients arrive
  reduce-scattered into the parameter's own layout, and the optimizer updates the shard.

The optimizer, its state dict and checkpoints keep working unchanged: checkpoints store logical
tensors (the shards are gathered on save, laid out like the shard on load), so a run saved
with one stage and data-parallel size resumes under any other, or without ZeRO.
"""
from ..autograd.grad_mode import no_grad
from .global_tensor import GlobalMeta, global_to_global, sync_grads
from .sbp import split

__all__ = ["ZeroRedundancy", "zero_sbp"]


def zero_sbp(meta, axis):
    """The SBP of `meta` with B on mesh `axis` replaced by S(k) (None when nothing splits)."""
    if axis >= len(meta.sbp) or not meta.sbp[axis].is_broadcast or meta.shape is None:
        return None
    n = meta.placement.hierarchy[axis]
    if n == 1:
        return None
    for k, extent in enumerate(meta.shape):
        for j, s in enumerate(meta.sbp):  # a split on another mesh axis already cuts this extent
            if s.is_split and s.axis == k:
                extent //= meta.placement.hierarchy[j]
        if extent >= n and extent % n == 0:
            return tuple(split(k) if j == axis else s for j, s in enumerate(meta.sbp))
    return None


class ZeroRedundancy:
    """Applies ZeRO `stage` (1, 2 or 3) over mesh `axis` to `optimizer`'s global parameters
    (see the module docstring); the optimizer is changed in place (its groups hold the shards).

    A training step then runs:  backward (stage >= 2: inside engine.distributed.no_grad_sync
    for every micro-batch) -> `reduce_gradients()` -> clipping and `optimizer.step()` on the
    shards -> `gather_parameters()`; `zero_grad()` clears the gradients of both."""

    def __init__(self, optimizer, stage, axis):
        if stage not in (1, 2, 3):
            raise ValueError(f"ZeRO stage must be 1, 2 or 3, got {stage!r}")
        self.optimizer, self.stage, self.axis = optimizer, int(stage), int(axis)
        self.pairs = []  # (parameter, its shard in the optimizer) for stages 1 and 2
        self._in_step = []  # per pair: (the parameter's array, its version) when its shard last matched it
        self.sharded = []  # parameters stored sharded (stage 3)
        for group in optimizer.param_groups:
            if any(optimizer.state.get(p) for p in group["params"]):
                raise RuntimeError("ZeRO must be applied before the optimizer's first step (its state exists)")
            group["params"] = [self._shard(p) for p in group["params"]]

    @property
    def defers_grad_sync(self):
        """Whether every micro-batch's backward must leave data-parallel gradients partial."""
        return self.stage >= 2

    def _shard(self, p):
        meta = p._global
        target = zero_sbp(meta, self.axis) if meta is not None else None
        if target is None:
            return p
        with no_grad():
            shard = global_to_global(p.detach(), meta.placement, target)
        if self.stage == 3:  # the parameter itself keeps only its shard from now on
            p._data = shard._data.copy() if meta.here else shard._data
            p._global = GlobalMeta(meta.placement, target, meta.shape)
            p._bump_version()
            self.sharded.append(p)
            return p
        leaf = _leaf_like(p, shard)
        self.pairs.append((p, leaf))
        self._in_step.append((p._data, p._version))
        return leaf

    # ------------------------------------------------------------------ the step
    def refresh_shards(self):
        """Give the shard of every parameter written since the two last matched (a checkpoint
        resumed or `load_weight` loaded after ZeRO was applied, a user's load_state_dict) the
        parameter's values: B -> S is a local slice, no communication. Without it the next
        step would update the stale shard and gather it over the loaded weights."""
        with no_grad():
            for i, (p, shard) in enumerate(self.pairs):
                array, version = self._in_step[i]
                if not p._global.here or (array is p._data and version == p._version):
                    continue
                fresh = global_to_global(p.detach(), shard._global.placement, shard._global.sbp)
                shard._data[...] = fresh._data
                shard._bump_version()
                self._in_step[i] = (p._data, p._version)

    def reduce_gradients(self):
        """Each shard's gradient from its parameter's: stage 1 slices the all-reduced gradient,
        stage 2 reduce-scatters the partial one; the full gradient is dropped. Shards whose
        parameter was written since the last step take its values first (refresh_shards)."""
        self.refresh_shards()
        if self.stage == 1:  # the all-reduces (P -> B), in buckets: the loop below then only slices
            sync_grads([p for p, _ in self.pairs])
        with no_grad():
            for p, shard in self.pairs:
                if p.grad is None:
                    shard.grad = None
                    continue
                shard.grad = global_to_global(p.grad, shard._global.placement, shard._global.sbp)
                p.grad = None

    def gather_parameters(self):
        """Write every updated shard back into its parameter (all-gather, S -> B), in place."""
        with no_grad():
            for i, (p, shard) in enumerate(self.pairs):
                if not p._global.here:
                    continue
                full = global_to_global(shard.detach(), p._global.placement, p._global.sbp)
                p._data[...] = full._data
                p._bump_version()
                self._in_step[i] = (p._data, p._version)

    def zero_grad(self):
        for p, shard in self.pairs:
            p.grad = None
            shard.grad = None

    # ------------------------------------------------------------------ accounting
    def local_bytes(self):
        """{"parameters": bytes of the parameters held on this rank (stage 3: shards),
        "optimizer_state": bytes of the optimizer state tensors on this rank}."""
        shards = {id(s) for _, s in self.pairs}
        held = {id(p): p for g in self.optimizer.param_groups for p in g["params"] if id(p) not in shards}
        owned = [p for p, _ in self.pairs] + list(held.values())
        state = sum(v._data.nbytes for st in self.optimizer.state.values() for v in st.values()
                    if hasattr(v, "_data") and getattr(v, "ndim", 0) > 0)
        return {"parameters": sum(p._data.nbytes for p in owned), "optimizer_state": state}


def _leaf_like(p, shard):
    """A leaf parameter of `p`'s class holding `shard`'s array (a copy) and layout."""
    leaf = type(p)(shard.detach())
    leaf._data = shard._data.copy()
    leaf._global = shard._global
    leaf.requires_grad_(p.requires_grad)
    return leaf
