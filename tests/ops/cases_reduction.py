"""Parity cases for engine/ops/reduction.py (reductions, scans, selections, unique/searchsorted/bincount)."""
import math

import numpy as np

from harness import Input as I, OpCase

F = I((3, 4, 5))
NC = I((3, 4, 5), noncontig=True)
D = I((3, 4, 5), kind="distinct")  # distinct values: max/sort/topk have one answer and a gradient
DNC = I((3, 4, 5), kind="distinct", noncontig=True)
INT = I((3, 4), "int64", "int", -5, 5)
BOOL = I((3, 4), "bool", "bool")
POS = I((3, 4), kind="positive")

CASES = [
    # sum
    OpCase("sum", lambda m, a: m.sum(a), [F]),
    OpCase("sum", lambda m, a: a.sum(1), [NC], name="dim"),
    OpCase("sum", lambda m, a: a.sum((0, -1), keepdim=True), [NC], name="tuple-keepdim"),
    OpCase("sum", lambda m, a: a.sum(-2), [F], name="neg"),
    OpCase("sum", lambda m, a: a.sum(dim=1, dtype=m.float64), [F], name="dtype"),
    OpCase("sum", lambda m, a: a.sum(1), [INT], name="int"),
    OpCase("sum", lambda m, a: a.sum(), [BOOL], name="bool"),
    OpCase("sum", lambda m, a: a.sum(0, dtype=m.int32), [I((3, 4), "int32", "int", -5, 5)], name="int32-dtype"),
    OpCase("sum", lambda m, a: a.sum(1), [I((3, 0))], name="empty", gradcheck=False),
    OpCase("sum", lambda m, a: a.sum(0), [I(())], name="0d"),
    OpCase("sum", lambda m, a: a.sum(1), [I((2, 1, 3))], name="size1"),
    # mean
    OpCase("mean", lambda m, a: m.mean(a), [F]),
    OpCase("mean", lambda m, a: a.mean((1, 2)), [NC], name="tuple"),
    OpCase("mean", lambda m, a: a.mean(-1, keepdim=True), [F], name="keepdim"),
    OpCase("mean", lambda m, a: a.mean(0, dtype=m.float64), [F], name="dtype"),
    OpCase("mean", lambda m, a: a.mean(dtype=m.float32), [INT], name="int-dtype"),
    OpCase("mean", lambda m, a: a.mean(1), [I((3, 0))], name="empty", backward=False),
    # var / std
    OpCase("var", lambda m, a: m.var(a), [F]),
    OpCase("var", lambda m, a: a.var(1, keepdim=True), [NC], name="dim-keepdim"),
    OpCase("var", lambda m, a: a.var((0, 2), unbiased=False), [F], name="biased"),
    OpCase("var", lambda m, a: a.var(-1, correction=0), [F], name="correction"),
    OpCase("var", lambda m, a: m.var(a, False), [F], name="positional-unbiased"),
    OpCase("std", lambda m, a: m.std(a), [F]),
    OpCase("std", lambda m, a: a.std(-1, keepdim=True), [NC], name="dim-keepdim"),
    OpCase("std", lambda m, a: a.std(0, unbiased=False), [F], name="biased"),
    OpCase("std", lambda m, a: a.std(1, correction=2), [F], name="correction"),
    OpCase("var_mean", lambda m, a: m.var_mean(a, 1), [F]),
    OpCase("std_mean", lambda m, a: m.std_mean(a, (0, 1), keepdim=True), [NC]),
    # prod
    OpCase("prod", lambda m, a: m.prod(a), [I((2, 3), kind="positive")]),
    OpCase("prod", lambda m, a: a.prod(1), [I((3, 4), kind="unit", noncontig=True)], name="dim"),
    OpCase("prod", lambda m, a: a.prod(-1, keepdim=True), [F], name="keepdim"),
    OpCase("prod", lambda m, a: a.prod(0), [INT], name="int"),
    OpCase("prod", lambda m, a: a.prod(1), [I((3, 4), value=[[1.0, 0.0, 2.0, 3.0], [0.0, 0.0, 1.5, 2.0], [1.0, 2.0, 3.0, 4.0]])], name="zeros"),
    OpCase("prod", lambda m, a: a.prod(), [I((4,), value=[2.0, 0.0, 3.0, -1.0])], name="zero-all"),
    OpCase("prod", lambda m, a: a.prod(1, dtype=m.float64), [POS], name="dtype"),
    # max / min
    OpCase("max", lambda m, a: m.max(a), [D]),
    OpCase("max", lambda m, a: m.max(a, 1), [DNC], name="dim"),
    OpCase("max", lambda m, a: a.max(dim=-1, keepdim=True), [D], name="keepdim"),
    OpCase("max", lambda m, a: a.max(0)[0], [D], name="values"),
    OpCase("max", lambda m, a, b: m.max(a, b), [I((3, 4), kind="distinct"), I((4,), kind="distinct")], name="binary"),
    OpCase("max", lambda m, a: a.max(1), [INT], name="int"),
    OpCase("max", lambda m, a: a.max(), [I((5,), value=[1.0, 3.0, 3.0, -2.0, 3.0])], name="ties", gradcheck=False),  # kink at ties
    OpCase("max", lambda m, a: a.max(0), [I(())], name="0d"),
    OpCase("min", lambda m, a: m.min(a), [D]),
    OpCase("min", lambda m, a: a.min(-2), [DNC], name="dim"),
    OpCase("min", lambda m, a: a.min(1, True), [D], name="keepdim"),
    OpCase("min", lambda m, a, b: a.min(b), [I((3, 4), kind="distinct"), I((3, 4), kind="distinct")], name="binary"),
    OpCase("min", lambda m, a: a.min(), [INT], name="int"),
    OpCase("amax", lambda m, a: m.amax(a, (0, 2)), [DNC]),
    OpCase("amax", lambda m, a: a.amax(-1, keepdim=True), [D], name="keepdim"),
    OpCase("amax", lambda m, a: a.amax(), [D], name="all"),
    OpCase("amax", lambda m, a: a.amax(1), [I((2, 3), value=[[1.0, 2.0, 2.0], [0.5, 0.5, 0.5]])], name="ties", gradcheck=False),  # kink at ties
    OpCase("amax", lambda m, a: a.amax(0), [INT], name="int"),
    OpCase("amin", lambda m, a: m.amin(a, 1), [DNC]),
    OpCase("amin", lambda m, a: a.amin((0, 1), keepdim=True), [D], name="keepdim"),
    OpCase("argmax", lambda m, a: m.argmax(a), [D]),
    OpCase("argmax", lambda m, a: a.argmax(1), [DNC], name="dim"),
    OpCase("argmax", lambda m, a: a.argmax(-1, keepdim=True), [D], name="keepdim"),
    OpCase("argmax", lambda m, a: a.argmax(0), [INT], name="int"),
    OpCase("argmin", lambda m, a: m.argmin(a), [D]),
    OpCase("argmin", lambda m, a: a.argmin(dim=-2, keepdim=True), [DNC], name="dim"),
    # logsumexp
    OpCase("logsumexp", lambda m, a: m.logsumexp(a, 1), [F]),
    OpCase("logsumexp", lambda m, a: a.logsumexp((0, -1), keepdim=True), [NC], name="tuple-keepdim"),
    OpCase("logsumexp", lambda m, a: a.logsumexp(1), [I((3, 4), kind="uniform", low=80, high=100)], name="large"),
    OpCase("logsumexp", lambda m, a: a.logsumexp(0), [INT], name="int"),
    OpCase("logsumexp", lambda m, a: a.logsumexp(1), [I((3, 0))], name="empty", gradcheck=False),
    # norm
    OpCase("norm", lambda m, a: m.norm(a), [F]),
    OpCase("norm", lambda m, a: a.norm(2, dim=1), [NC], name="p2-dim"),
    OpCase("norm", lambda m, a: a.norm("fro", dim=(0, 1), keepdim=True), [F], name="fro"),
    OpCase("norm", lambda m, a: a.norm(1, dim=-1), [F], name="p1"),
    OpCase("norm", lambda m, a: a.norm(math.inf), [D], name="inf"),
    OpCase("norm", lambda m, a: a.norm(-math.inf, dim=1), [D], name="-inf"),
    OpCase("norm", lambda m, a: a.norm(3, dim=0), [F], name="p3"),
    OpCase("norm", lambda m, a: a.norm(0.5), [POS], name="p0.5"),
    OpCase("norm", lambda m, a: a.norm(dim=1), [I((2, 3), value=[[0.0, 0.0, 0.0], [1.0, 2.0, 2.0]])], name="zero-row", gradcheck=False),  # not differentiable at 0
    # logical
    OpCase("all", lambda m, a: m.all(a), [BOOL]),
    OpCase("all", lambda m, a: a.all(1, keepdim=True), [BOOL], name="dim"),
    OpCase("all", lambda m, a: a.all(-1), [INT], name="int"),
    OpCase("all", lambda m, a: a.all(), [I((0,), "bool", "bool")], name="empty"),
    OpCase("any", lambda m, a: m.any(a), [BOOL]),
    OpCase("any", lambda m, a: a.any(0), [F], name="float"),
    OpCase("count_nonzero", lambda m, a: m.count_nonzero(a), [INT]),
    OpCase("count_nonzero", lambda m, a: a.count_nonzero((0, 1)), [I((2, 3, 4), "int64", "int", -1, 2)], name="dims"),
    # scans
    OpCase("cumsum", lambda m, a: m.cumsum(a, 1), [F]),
    OpCase("cumsum", lambda m, a: a.cumsum(-1), [NC], name="neg"),
    OpCase("cumsum", lambda m, a: a.cumsum(0), [INT], name="int"),
    OpCase("cumsum", lambda m, a: a.cumsum(0), [BOOL], name="bool"),
    OpCase("cumsum", lambda m, a: a.cumsum(1, dtype=m.float64), [F], name="dtype"),
    OpCase("cumsum", lambda m, a: a.cumsum(0), [I(())], name="0d"),
    OpCase("cumprod", lambda m, a: m.cumprod(a, 1), [I((3, 4), kind="positive")]),
    OpCase("cumprod", lambda m, a: a.cumprod(-1), [I((3, 4), kind="unit", noncontig=True)], name="neg"),
    OpCase("cumprod", lambda m, a: a.cumprod(0), [INT], name="int"),
    OpCase("cumprod", lambda m, a: a.cumprod(1), [I((2, 4), value=[[1.5, 0.0, 2.0, 3.0], [0.0, 2.0, 0.0, 2.0]])], name="zeros"),
    # topk / sort / argsort
    OpCase("topk", lambda m, a: m.topk(a, 2), [D]),
    OpCase("topk", lambda m, a: a.topk(3, dim=1, largest=False), [DNC], name="smallest"),
    OpCase("topk", lambda m, a: a.topk(1, 0).values, [D], name="values"),
    OpCase("topk", lambda m, a: a.topk(5, -1), [D], name="all"),
    OpCase("topk", lambda m, a: a.topk(0, -1), [D], name="k0"),
    OpCase("topk", lambda m, a: a.topk(2), [I((6,), "int64", "int", -100, 100, value=[5, -3, 9, 0, 7, 1])], name="int"),
    OpCase("sort", lambda m, a: m.sort(a), [D]),
    OpCase("sort", lambda m, a: a.sort(1, descending=True), [DNC], name="desc"),
    OpCase("sort", lambda m, a: a.sort(dim=0, stable=True), [I((8,), value=[3.0, 1.0, 2.0, 1.0, 3.0, 0.0, 2.0, 1.0])], name="stable-ties", gradcheck=False),  # ties: kinks
    OpCase("sort", lambda m, a: a.sort(dim=0, descending=True, stable=True), [I((8,), "int64", value=[3, 1, 2, 1, 3, 0, 2, 1])], name="stable-desc-int"),
    OpCase("sort", lambda m, a: a.sort(-1), [I((3, 0))], name="empty"),
    OpCase("argsort", lambda m, a: m.argsort(a), [D]),
    OpCase("argsort", lambda m, a: a.argsort(0, descending=True), [DNC], name="desc"),
    OpCase("argsort", lambda m, a: a.argsort(), [BOOL], name="bool"),
]

# ---------------------------------------------------------------- kthvalue
CASES += [
    OpCase("kthvalue", lambda m, a: m.kthvalue(a, 2), [D]),
    OpCase("kthvalue", lambda m, a: a.kthvalue(4, 1, keepdim=True), [DNC], name="dim-keepdim"),
    OpCase("kthvalue", lambda m, a: a.kthvalue(3, 0).values, [D], name="values"),
    OpCase("kthvalue", lambda m, a: a.kthvalue(1), [I((), kind="distinct")], name="0-dim"),
    OpCase("kthvalue", lambda m, a: a.kthvalue(5), [I((3, 5), "int64", "distinct")], name="int"),
    OpCase("kthvalue", lambda m, a: a.kthvalue(4, 1), [I(value=np.array([[3.0, 1.0, np.nan, 2.0]], np.float32))],
           name="nan-last", gradcheck=False),
]

# ---------------------------------------------------------------- median
NANS = I(value=np.array([[1.0, np.nan, 2.0, 0.5], [3.0, 1.0, -1.0, 2.0], [np.nan, 0.0, np.nan, 1.0]], dtype=np.float32))
CASES += [
    OpCase("median", lambda m, a: m.median(a), [D]),
    OpCase("median", lambda m, a: a.median(), [I((2, 3), kind="distinct", noncontig=True)], name="even-count"),
    OpCase("median", lambda m, a: m.median(a, 1), [DNC], name="dim"),
    OpCase("median", lambda m, a: a.median(-1, keepdim=True), [I((3, 4), kind="distinct")], name="keepdim-even"),
    OpCase("median", lambda m, a: a.median(0).values, [D], name="values"),
    OpCase("median", lambda m, a: a.median(), [INT], name="int"),
    OpCase("median", lambda m, a: a.median(1), [INT], name="int-dim"),
    OpCase("median", lambda m, a: a.median(), [I((7,), value=[1.0, 3.0, 3.0, -2.0, 3.0, 0.0, 3.0])], name="ties", gradcheck=False),
    OpCase("median", lambda m, a: a.median(0), [I((7,), value=[1.0, 3.0, 3.0, -2.0, 3.0, 0.0, 3.0])], name="ties-dim",
           gradcheck=False),
    OpCase("median", lambda m, a: a.median(), [NANS], name="nan", gradcheck=False),
    OpCase("median", lambda m, a: a.median(1), [NANS], name="nan-dim", gradcheck=False),
    OpCase("median", lambda m, a: a.median(), [I(())], name="0d"),
    OpCase("median", lambda m, a: a.median(0), [I(())], name="0d-dim"),
    OpCase("median", lambda m, a: a.median(), [I((0,))], name="empty"),
    OpCase("median", lambda m, a: a.median(0), [I((2, 0))], name="empty-other-dim"),
]

# ---------------------------------------------------------------- logcumsumexp
CASES += [
    OpCase("logcumsumexp", lambda m, a: m.logcumsumexp(a, 1), [F]),
    OpCase("logcumsumexp", lambda m, a: a.logcumsumexp(-1), [NC], name="neg-noncontig"),
    OpCase("logcumsumexp", lambda m, a: a.logcumsumexp(0), [I((9, 2), kind="uniform", low=-60, high=60)], name="wide-range"),
    OpCase("logcumsumexp", lambda m, a: a.logcumsumexp(0), [I(value=np.array([-1000.0, 0.0, -np.inf, 2.0], dtype=np.float32))],
           name="extremes", gradcheck=False),
    OpCase("logcumsumexp", lambda m, a: a.logcumsumexp(1), [I((2, 5), "float64")], name="float64"),
    OpCase("logcumsumexp", lambda m, a: a.logcumsumexp(0), [I(())], name="0d"),
    OpCase("logcumsumexp", lambda m, a: a.logcumsumexp(0), [I((0, 3))], name="empty", gradcheck=False),
    OpCase("logcumsumexp", lambda m, a: a.logcumsumexp(0).logcumsumexp(0), [I((5,))], name="twice"),
]

# ---------------------------------------------------------------- unique, searchsorted, bucketize, bincount
DUP = I((3, 4), "int64", "int", 0, 4)
SEQ = I(value=np.array([-1.0, 0.0, 0.0, 1.5, 3.0]))
CASES += [
    OpCase("unique", lambda m, a: m.unique(a), [DUP]),
    OpCase("unique", lambda m, a: a.unique(return_inverse=True, return_counts=True), [DUP], name="inverse-counts"),
    OpCase("unique", lambda m, a: m.unique(a, sorted=True, return_counts=True), [I(value=np.array([2.0, np.nan, 2.0, np.nan, -1.0]), requires_grad=False)],
           name="float-nan"),
    OpCase("unique", lambda m, a: m.unique(a, return_inverse=True, dim=0),
           [I(dtype="int64", value=np.array([[1, 2], [0, 5], [1, 2], [0, 5], [0, 1]]))], name="dim0"),
    OpCase("unique", lambda m, a: m.unique(a, return_counts=True, dim=1), [I(dtype="int64", value=np.array([[1, 1, 0], [2, 2, 3]]))], name="dim1"),
    OpCase("unique", lambda m, a: m.unique(a, return_inverse=True, return_counts=True, dim=1),
           [I(value=np.array([[[1.0, 2.0], [0.5, 2.0], [1.0, 2.0]], [[0.0, 1.0], [0.0, 1.0], [0.0, 1.0]]]), requires_grad=False)],
           name="dim-3d"),
    OpCase("unique", lambda m, a: m.unique(a, dim=-1), [I((2, 6), "bool", "bool")], name="dim-bool"),
    OpCase("unique", lambda m, a: m.unique(a, return_inverse=True), [I((), requires_grad=False)], name="0d"),
    OpCase("unique", lambda m, a: m.unique(a, return_inverse=True, return_counts=True), [I((0, 2), requires_grad=False)], name="empty"),
    OpCase("unique", lambda m, a: m.unique(a), [BOOL], name="bool"),
    OpCase("searchsorted", lambda m, s, v: m.searchsorted(s, v), [SEQ, I((2, 3), kind="uniform", low=-2, high=4)]),
    OpCase("searchsorted", lambda m, s, v: m.searchsorted(s, v, right=True), [SEQ, I(value=np.array([0.0, 3.0, 5.0, -4.0]))],
           name="right-ties"),
    OpCase("searchsorted", lambda m, s, v: m.searchsorted(s, v, side="right", out_int32=True), [SEQ, I(value=np.array([0.0, 1.5]))],
           name="side-int32"),
    OpCase("searchsorted", lambda m, s: m.searchsorted(s, 1.0), [SEQ], name="scalar"),
    OpCase("searchsorted", lambda m, s, v: m.searchsorted(s, v),
           [I(value=np.array([[0.0, 1.0, 2.0], [-3.0, -1.0, 5.0]])), I(value=np.array([[1.0, 2.5, -1.0, 0.0], [0.0, 5.0, -3.0, 9.0]]))],
           name="batched"),
    OpCase("searchsorted", lambda m, s, v, o: m.searchsorted(s, v, sorter=o),
           [I(value=np.array([3.0, -1.0, 2.0, 0.5])), I(value=np.array([1.0, -2.0, 2.0])), I(dtype="int64", value=np.array([1, 3, 2, 0]))],
           name="sorter"),
    OpCase("searchsorted", lambda m, s, v: m.searchsorted(s, v), [I(dtype="int64", value=np.array([0, 2, 4, 6])), I((5,), "int64", "int", -1, 8)],
           name="int"),
    OpCase("searchsorted", lambda m, s, v: m.searchsorted(s, v), [I(dtype="int64", value=np.array([0, 2, 4])), I(value=np.array([1.5, 4.0]))],
           name="promote"),
    OpCase("searchsorted", lambda m, s, v: m.searchsorted(s, v), [SEQ, I((0,))], name="empty"),
    OpCase("bucketize", lambda m, v, b: m.bucketize(v, b), [I((3, 4), kind="uniform", low=-2, high=4), SEQ]),
    OpCase("bucketize", lambda m, v, b: m.bucketize(v, b, right=True, out_int32=True),
           [I(value=np.array([[0.0, 3.0], [-1.0, 9.0]])), SEQ], name="right-int32"),
    OpCase("bucketize", lambda m, b: m.bucketize(1.5, b), [SEQ], name="scalar"),
    OpCase("bucketize", lambda m, v, b: m.bucketize(v, b), [I((), requires_grad=False), SEQ], name="0d"),
    OpCase("bincount", lambda m, a: m.bincount(a), [I((10,), "int64", "int", 0, 6)]),
    OpCase("bincount", lambda m, a: a.bincount(minlength=9), [I((10,), "int64", "int", 0, 6)], name="minlength"),
    OpCase("bincount", lambda m, a, w: m.bincount(a, w), [I((6,), "int64", "int", 0, 4), I((6,), requires_grad=False)], name="weights"),
    OpCase("bincount", lambda m, a, w: m.bincount(a, weights=w), [I((6,), "int32", "int", 0, 4), I((6,), "float64", requires_grad=False)],
           name="weights-float64"),
    OpCase("bincount", lambda m, a, w: m.bincount(a, weights=w), [I((5,), "int64", "int", 0, 4), I((5,), "int64", "int", -3, 3)],
           name="int-weights"),
    OpCase("bincount", lambda m, a: m.bincount(a, minlength=3), [I((0,), "int64", "int", 0, 3)], name="empty"),
]

# ---------------------------------------------------------------- unique(dim=) and searchsorted on empty inputs
CASES += [
    OpCase("unique", lambda m, a: m.unique(a, return_inverse=True, return_counts=True, dim=0), [I((0, 3), requires_grad=False)],
           name="dim-empty-selected"),
    OpCase("unique", lambda m, a: m.unique(a, return_inverse=True, return_counts=True, dim=1), [I((3, 0), "int64", "int", 0, 3)],
           name="dim1-empty-selected"),
    OpCase("unique", lambda m, a: a.unique(dim=-1), [I((0,), "bool", "bool")], name="dim-empty-1d"),
    OpCase("searchsorted", lambda m, s, v: m.searchsorted(s, v), [I((0, 0)), I((0, 0))], name="empty-2d"),
    OpCase("searchsorted", lambda m, s, v: m.searchsorted(s, v, right=True), [I((2, 0)), I((2, 3))], name="empty-rows"),
    OpCase("searchsorted", lambda m, s, v: m.searchsorted(s, v), [I((0, 3)), I((0, 2))], name="no-rows"),
    OpCase("searchsorted", lambda m, s, v: m.searchsorted(s, v), [I((2, 0, 3)), I((2, 0, 1))], name="empty-batch-3d"),
    OpCase("searchsorted", lambda m, s, v: m.searchsorted(s, v), [SEQ, I((0, 2))], name="empty-values"),
]
