"""Local kernels for tensor-parallel signatures (masked lookups on a shard of a split axis).

A vocab-split embedding table or a class-split logits tensor holds only the rows/columns
[start, stop) of the logical axis on each rank. These ops take the logical ids/targets, look up
the ones that fall in the own range (shifting them by `start`) and write zeros for the others;
their backward scatters only in-range entries into the local shard. Summed over the ranks of the
split axis (a partial-sum result) they give the plain lookup.

* `VocabParallelEmbedding` / `...Backward` -- embedding on a vocab shard (rules_parallel.py
  substitutes it for `indexing.Embedding` under the signature ids B x table S(0) -> P);
* `ClassMax` -- max over one axis, no gradient (the constant shift of a log-sum-exp; on a
  split axis it gives a partial max, all-reduced with op=max);
* `TargetGather` / `TargetScatter` -- x[..., t, ...] along one axis for index targets, with
  the local offset `start` (the target logit of a vocab-parallel cross-entropy) and its adjoint.

They also work on plain local tensors (start=0 and the whole axis: every id is in range).
"""
import numpy as np

from ..ops.op import Op
from ..backend import xp_of
from ..ops.indexing import rows_gradient, without_row


def _in_range(xp, ids, start, n):
    local = ids.astype(np.int64, copy=False) - start
    mask = (local >= 0) & (local < n)
    return xp.where(mask, local, 0), mask


def _local_pad(padding_idx, start, stop):
    if padding_idx is None or not start <= padding_idx < stop:
        return None
    return padding_idx - start


class VocabParallelEmbedding(Op):
    """out[i] = weight[ids[i] - start] for start <= ids[i] < stop, zeros elsewhere."""

    name = "VocabParallelEmbedding"
    save_inputs = (0,)

    @staticmethod
    def forward(ctx, ids, weight, padding_idx=None, start=0, stop=None):
        xp = xp_of(weight)
        n = weight.shape[0]
        stop = start + n if stop is None else stop
        if stop - start != n:
            raise ValueError(f"VocabParallelEmbedding: range [{start}, {stop}) does not match the shard's {n} rows")
        safe, mask = _in_range(xp, ids, start, n)
        out = xp.take(weight, safe, axis=0)
        if not mask.all():
            out[~mask] = 0
        ctx.num, ctx.start = n, start
        ctx.padding_idx = _local_pad(padding_idx, start, stop)
        return out

    @staticmethod
    def backward(ctx, g):
        ids = ctx.saved_tensors[0]
        return None, VocabParallelEmbeddingBackward.apply(g, ids, num=ctx.num, start=ctx.start,
                                                          padding_idx=ctx.padding_idx)


class VocabParallelEmbeddingBackward(Op):
    """Dense gradient of the local shard: rows of g summed per in-range id (repeats accumulate);
    `padding_idx` is the local row (or None) that gets no gradient."""

    name = "VocabParallelEmbeddingBackward"
    save_inputs = (1,)

    @staticmethod
    def forward(ctx, g, ids, num, start, padding_idx):
        ctx.num, ctx.start, ctx.padding_idx = num, start, padding_idx
        safe, mask = _in_range(xp_of(g), ids.reshape(-1), start, num)
        rows = g.reshape(-1, g.shape[-1])
        if not mask.all():
            safe, rows = safe[mask], rows[mask]
        return rows_gradient(num, safe, rows, padding_idx)

    @staticmethod
    def backward(ctx, gg):
        ids = ctx.saved_tensors[0]
        w = without_row(gg, ctx.padding_idx)
        return VocabParallelEmbedding.apply(ids, w, padding_idx=None, start=ctx.start,
                                            stop=ctx.start + ctx.num), None


class ClassMax(Op):
    """max over `axis` keeping it (size 1); no gradient: used as a constant shift."""

    name = "ClassMax"
    differentiable = False

    @staticmethod
    def forward(ctx, x, axis):
        return x.max(axis=axis, keepdims=True)


class TargetGather(Op):
    """out = x[..., t - start, ...] along `axis` where start <= t < start + x.shape[axis], else 0.
    `target` has x's shape without `axis`."""

    name = "TargetGather"
    save_inputs = (1,)

    @staticmethod
    def forward(ctx, x, target, axis, start=0):
        xp = xp_of(x)
        ctx.shape, ctx.axis, ctx.start = x.shape, axis, start
        safe, mask = _in_range(xp, target, start, x.shape[axis])
        vals = xp.take_along_axis(x, xp.expand_dims(safe, axis), axis=axis)
        vals = xp.squeeze(vals, axis=axis)
        return xp.where(mask, vals, xp.zeros((), dtype=x.dtype)).astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        target = ctx.saved_tensors[0]
        return TargetScatter.apply(g, target, shape=ctx.shape, axis=ctx.axis, start=ctx.start), None


class TargetScatter(Op):
    """Adjoint of TargetGather: zeros of `shape` with g written at the in-range targets."""

    name = "TargetScatter"
    save_inputs = (1,)

    @staticmethod
    def forward(ctx, g, target, shape, axis, start=0):
        xp = xp_of(g)
        ctx.axis, ctx.start = axis, start
        out = xp.zeros(shape, dtype=g.dtype)
        safe, mask = _in_range(xp, target, start, shape[axis])
        vals = xp.where(mask, g, xp.zeros((), dtype=g.dtype)).astype(g.dtype, copy=False)
        xp.put_along_axis(out, xp.expand_dims(safe, axis), xp.expand_dims(vals, axis), axis=axis)
        return out

    @staticmethod
    def backward(ctx, gg):
        target = ctx.saved_tensors[0]
        return TargetGather.apply(gg, target, axis=ctx.axis, start=ctx.start), None

