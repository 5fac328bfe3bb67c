"""SBP rules of engine/ops/loss.py: Megatron's vocab-parallel cross-entropy.

`CrossEntropy` with logits split on the class axis (index targets, no class weights) is
decomposed into global ops that never gather the logits. Logits [M, C] take three fused phases
(engine/kernels/cross_entropy.py), each one kernel on the shard:
    m     = ClassMax(x)                      local max -> P(max) -> all_reduce(max)
    stats = VocabStats(x, m, target)         local sum of exp(x - m), masked target logit, sum of
                                             x - m ([M, 3]) -> P -> one all_reduce
    loss, dunit = VocabCrossEntropy(x, m, stats, target)   every rank the loss of every row; its
                                             shard of the gradient kept for the backward
so the communication is two all-reduces of O(rows), and the backward is dunit * g on each shard.
Other logits ([N, C, d...]) are written with unfused global ops:
    m   = max over classes        local max -> P(max) -> all_reduce(max); no gradient (a shift)
    z   = x - m                   stays split
    lse = log(sum(exp(z)))        local sum -> P -> all_reduce
    z_t = z[target]               masked local gather (class offset) -> P -> all_reduce
    nll = lse - z_t               (label smoothing adds eps/C * (C * lse - sum(z)))
and autograd through these yields softmax - onehot on each shard. Logits split only on rows take
the same paths. Soft targets and class weights use the default (all-broadcast) path. The helper
ops have their own rules below.
"""
from ...ops import loss
from ..global_tensor import global_to_global
from ..sbp import Signature, broadcast as B, partial_max, partial_sum as P, split as S
from .base import Rule, sbp_rule
from .indexing import split_range, splits


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
    if x.ndim == 2:
        m = _settle(loss.ClassMax.apply(x, axis=1))
        stats = _settle(loss.VocabStats.apply(x, m, target))
        per, _ = loss.VocabCrossEntropy.apply(x, m, stats, target, classes=x.shape[1], ignore_index=ignore_index,
                                              smoothing=smoothing)
        return _reduce_rows(per, target, ignore_index, reduction)
    cd = 1 if x.ndim > 1 else 0
    c = x.shape[cd]
    m = _settle(loss.ClassMax.apply(x, axis=cd))          # two-stage max: local, then all_reduce(max)
    z = x - m                                        # the shift carries no gradient
    lse = _settle(z.exp().sum(dim=cd)).log()         # local sum -> P -> all_reduce
    zt = _settle(loss.TargetGather.apply(z, target, axis=cd, start=0))  # masked gather -> P -> all_reduce
    valid = (target != ignore_index).to(x.dtype)
    per = (lse - zt) * valid
    if smoothing:
        zs = _settle(z.sum(dim=cd))
        smooth = (lse * float(c) - zs) * valid
        per = per * (1.0 - smoothing) + smooth * (smoothing / c)
    return _reduce_rows(per, target, ignore_index, reduction)


def _reduce_rows(per, target, ignore_index, reduction):
    """The loss from per-row losses (ignored rows hold 0): 'mean' is over the rows not ignored."""
    if reduction == "none":
        return per
    if reduction == "sum":
        return per.sum()
    return per.sum() / (target != ignore_index).to(per.dtype).sum()


@sbp_rule(loss.CrossEntropy)
class CrossEntropyRule(Rule):
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


# ------------------------------------------------------------------ its helper ops
@sbp_rule(loss.ClassMax)
class ClassMaxRule(Rule):
    """max over `axis` (kept, size 1): the split axis itself -> partial max; others stay split."""

    def signatures(self, shapes, attrs):
        x, axis = shapes[0], attrs["axis"]
        sigs = Rule.signatures(self, shapes, attrs)
        for a in range(len(x)):
            if x[a] > 1:
                sigs.append(Signature([S(a)], [partial_max if a == axis else S(a)]))
        return sigs

    def out_shapes(self, shapes, attrs):
        shape = list(shapes[0])
        shape[attrs["axis"]] = 1
        return [tuple(shape)]


@sbp_rule(loss.TargetGather)
class TargetGatherRule(Rule):
    """x split on the gathered axis, targets broadcast -> partial sum (zeros off the own range);
    x split on another axis with the targets split alike -> split."""

    def signatures(self, shapes, attrs):
        x, t = shapes
        axis = attrs["axis"]
        sigs = Rule.signatures(self, shapes, attrs)
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
        if not splits(in_nd[0], axis):
            return attrs
        start, _ = split_range(shapes[0], in_nd[0], placement, coords, axis)
        return dict(attrs, start=attrs.get("start", 0) + start)

    def out_shapes(self, shapes, attrs):
        return [tuple(shapes[1])]


def _with_start(attrs, shapes, in_nd, placement, coords):
    """The attributes with `start`, the first class of this rank's shard of x [M, C]."""
    if not splits(in_nd[0], 1):
        return attrs
    start, _ = split_range(shapes[0], in_nd[0], placement, coords, 1)
    return dict(attrs, start=attrs.get("start", 0) + start)


@sbp_rule(loss.VocabStats)
class VocabStatsRule(Rule):
    """x [M, C] split on classes with m and targets broadcast -> partial sums of the shards'
    statistics (each at its class offset); everything split on rows -> split on rows."""

    def signatures(self, shapes, attrs):
        x = shapes[0]
        sigs = Rule.signatures(self, shapes, attrs)
        if x[1] > 1:
            sigs.append(Signature([S(1), B, B], [P]))
        if x[0] > 1:
            sigs.append(Signature([S(0), S(0), S(0)], [S(0)]))
        return sigs

    def local_attrs(self, attrs, shapes, in_nd, placement, coords):
        return _with_start(attrs, shapes, in_nd, placement, coords)

    def out_shapes(self, shapes, attrs):
        return [(shapes[0][0], 3)]


@sbp_rule(loss.VocabCrossEntropy)
class VocabCrossEntropyRule(Rule):
    """x [M, C] split on classes with m, stats and targets broadcast -> the loss broadcast (each
    shard computes every row's loss from the all-reduced statistics) and dunit split like x;
    everything split on rows -> split on rows."""

    def n_outputs(self, attrs):
        return 2

    def signatures(self, shapes, attrs):
        x = shapes[0]
        sigs = Rule.signatures(self, shapes, attrs)
        if x[1] > 1:
            sigs.append(Signature([S(1), B, B, B], [B, S(1)]))
        if x[0] > 1:
            sigs.append(Signature([S(0)] * 4, [S(0), S(0)]))
        return sigs

    def local_attrs(self, attrs, shapes, in_nd, placement, coords):
        return _with_start(attrs, shapes, in_nd, placement, coords)

    def out_shapes(self, shapes, attrs):
        return [(shapes[0][0],), tuple(shapes[0])]
