"""Tensor-parallel SBP rules (Megatron-style): vocab-parallel embedding and cross-entropy.

* `indexing.Embedding`: ids S(a) x table B -> S(a) (data parallel); ids B x table S(1) ->
  S(last) (embedding dim split); ids B x table S(0) -> P, the vocab-parallel lookup: each rank
  looks up the ids in its vocab range [start, stop) (the balanced split of the table rows over
  that mesh axis) and writes zeros elsewhere, through the masked kernel
  `parallel_kernels.VocabParallelEmbedding`; its backward scatters only in-range rows into the
  local shard (padding_idx gets none, on the rank that holds it).
* `nn_ops.CrossEntropy` with logits split on the class axis (index targets, no class weights)
  is decomposed into global ops that never gather the logits:
      m   = max over classes        local max -> P(max) -> all_reduce(max); no gradient (a shift)
      z   = x - m                   stays split
      lse = log(sum(exp(z)))        local sum -> P -> all_reduce
      z_t = z[target]               masked local gather (class offset) -> P -> all_reduce
      nll = lse - z_t               (label smoothing adds eps/C * (C * lse - sum(z)))
  so the communication is O(rows), not O(rows * classes), and autograd through these global
  ops yields softmax - onehot on each shard. Logits split only on rows take the same path.
* The helper ops `ClassMax` (split axis -> partial max) and `TargetGather` (split class axis ->
  partial sum) have their own rules below.
"""
from ..ops import indexing, nn_ops
from . import rules
from .boxing import local_slices
from .global_tensor import global_to_global
from .parallel_kernels import ClassMax, TargetGather, VocabParallelEmbedding
from .sbp import Signature, broadcast as B, partial_max, partial_sum as P, split as S


def _split_range(shape, nd, placement, coords, dim):
    """[start, stop) of the logical axis `dim` that the shard at `coords` holds."""
    sl = local_slices(shape, placement, nd, coords)[dim]
    return sl.start, sl.stop


def _splits(nd, dim):
    return any(s.is_split and s.axis == dim for s in nd)


# ------------------------------------------------------------------ embedding
class EmbeddingRule(rules.Rule):
    def signatures(self, shapes, attrs):
        ids, w = shapes
        sigs = rules.Rule.signatures(self, shapes, attrs)
        for a in range(len(ids)):
            if ids[a] > 1:
                sigs.append(Signature([S(a), B], [S(a)]))
        if w[0] > 1:
            sigs.append(Signature([B, S(0)], [P]))
        if w[1] > 1:
            sigs.append(Signature([B, S(1)], [S(len(ids))]))
        return sigs

    def kernel(self, op_cls, chosen):
        if any(sig.ins[1] is not None and sig.ins[1] == S(0) for sig in chosen):
            return VocabParallelEmbedding
        return op_cls

    def local_attrs(self, attrs, shapes, in_nd, placement, coords):
        if not _splits(in_nd[1], 0):
            return attrs
        start, stop = _split_range(shapes[1], in_nd[1], placement, coords, 0)
        return dict(attrs, start=start, stop=stop)

    def out_shapes(self, shapes, attrs):
        return [tuple(shapes[0]) + (shapes[1][1],)]


rules.register(EmbeddingRule(), indexing.Embedding)


# ------------------------------------------------------------------ helper ops of the cross-entropy
class ClassMaxRule(rules.Rule):
    """max over `axis` (kept, size 1): the split axis itself -> partial max; others stay split."""

    def signatures(self, shapes, attrs):
        x, axis = shapes[0], attrs["axis"]
        sigs = rules.Rule.signatures(self, shapes, attrs)
        for a in range(len(x)):
            if x[a] > 1:
                sigs.append(Signature([S(a)], [partial_max if a == axis else S(a)]))
        return sigs

    def out_shapes(self, shapes, attrs):
        shape = list(shapes[0])
        shape[attrs["axis"]] = 1
        return [tuple(shape)]


class TargetGatherRule(rules.Rule):
    """x split on the gathered axis, targets broadcast -> partial sum (zeros off the own range);
    x split on another axis with the targets split alike -> split."""

    def signatures(self, shapes, attrs):
        x, t = shapes
        axis = attrs["axis"]
        sigs = rules.Rule.signatures(self, shapes, attrs)
        for a in range(len(x)):
            if x[a] <= 1:
                continue
            if a == axis:
                sigs.append(Signature([S(a), B], [P]))
            else:
                ta = a if a < axis else a - 1
                sigs.append(Signature([S(a), S(ta)], [S(ta)]))
        return sigs

    def local_attrs(self, attrs, shapes, in_nd, placement, coords):
        axis = attrs["axis"]
        if not _splits(in_nd[0], axis):
            return attrs
        start, _ = _split_range(shapes[0], in_nd[0], placement, coords, axis)
        return dict(attrs, start=attrs.get("start", 0) + start)

    def out_shapes(self, shapes, attrs):
        return [tuple(shapes[1])]


rules.register(ClassMaxRule(), ClassMax)
rules.register(TargetGatherRule(), TargetGather)


# ------------------------------------------------------------------ vocab-parallel cross-entropy
def _settle(t):
    """Finish pending reductions: every partial mesh axis -> broadcast (an all-reduce)."""
    meta = t._global
    if not any(s.is_partial for s in meta.sbp):
        return t
    return global_to_global(t, meta.placement, tuple(B if s.is_partial else s for s in meta.sbp))


def vocab_parallel_cross_entropy(x, target, ignore_index=-100, reduction="mean", smoothing=0.0):
    """Cross-entropy of global logits `x` (class axis 1, or 0 for 1-D) against global index
    targets, written with global ops so that a class-split `x` is never gathered."""
    cd = 1 if x.ndim > 1 else 0
    c = x.shape[cd]
    m = _settle(ClassMax.apply(x, axis=cd))          # two-stage max: local, then all_reduce(max)
    z = x - m                                        # the shift carries no gradient
    lse = _settle(z.exp().sum(dim=cd)).log()         # local sum -> P -> all_reduce
    zt = _settle(TargetGather.apply(z, target, axis=cd, start=0))  # masked gather -> P -> all_reduce
    valid = (target != ignore_index).to(x.dtype)
    per = (lse - zt) * valid
    if smoothing:
        zs = _settle(z.sum(dim=cd))
        smooth = (lse * float(c) - zs) * valid
        per = per * (1.0 - smoothing) + smooth * (smoothing / c)
    if reduction == "none":
        return per
    if reduction == "sum":
        return per.sum()
    return per.sum() / valid.sum()


class CrossEntropyRule(rules.Rule):
    def n_outputs(self, attrs):
        return 2

    def decompose(self, inputs, attrs):
        x, target, w = inputs
        meta = x._global
        if attrs["prob"] or w is not None or not meta.here or x.ndim == 0:
            return None  # soft targets / class weights: the default path (gathers the logits)
        if not any(s.is_split for s in meta.sbp):
            return None
        loss = vocab_parallel_cross_entropy(x, target, attrs["ignore_index"], attrs["reduction"],
                                            attrs["smoothing"])
        return loss, None  # the fused op's hidden softmax output is not needed here


rules.register(CrossEntropyRule(), nn_ops.CrossEntropy)
