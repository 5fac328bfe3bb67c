"""Parity cases for engine/ops/linalg.py: matmul in all of torch's shape regimes (1-D, batched,
broadcast batch dims, non-contiguous), mm/bmm/mv/addmm/baddbmm, dot/outer, tensordot, einsum, F.linear,
cdist."""
import math

from harness import Input as I, OpCase

CASES = []


def _mm(shapes, name, noncontig=(False, False), dtype="float32", kind="normal", **kw):
    ins = [I(s, dtype, kind, -4, 5, noncontig=nc) for s, nc in zip(shapes, noncontig)]
    return OpCase("matmul", lambda m, a, b: m.matmul(a, b), ins, name=name, **kw)


CASES += [
    _mm([(4,), (4,)], "dot1d"),
    _mm([(4,), (4, 3)], "vec-mat"),
    _mm([(4,), (2, 4, 3)], "vec-batched"),
    _mm([(3, 4), (4,)], "mat-vec"),
    _mm([(2, 3, 4), (4,)], "batched-vec"),
    _mm([(3, 4), (4, 5)], "2d"),
    _mm([(2, 3, 4), (4, 5)], "3d-2d"),
    _mm([(3, 4), (2, 4, 5)], "2d-3d"),
    _mm([(2, 1, 3, 4), (5, 4, 2)], "bcast-batch"),
    _mm([(1, 3, 4), (2, 4, 2)], "bcast-size1"),
    _mm([(3, 4), (4, 5)], "noncontig", noncontig=(True, True)),
    _mm([(2, 3, 4), (2, 4, 5)], "noncontig3d", noncontig=(True, False)),
    _mm([(0, 3), (3, 2)], "empty", gradcheck=False),  # no elements to perturb
    _mm([(3, 4), (4, 2)], "int64", dtype="int64", kind="int"),
    _mm([(3, 4), (4, 2)], "float64", dtype="float64"),
    OpCase("matmul", lambda m, a, b: a @ b, [I((2, 3, 4)), I((4, 2))], name="operator"),
    OpCase("mm", lambda m, a, b: m.mm(a, b), [I((3, 4)), I((4, 5))]),
    OpCase("mm", lambda m, a, b: a.mm(b), [I((3, 4), noncontig=True), I((4, 5))], name="noncontig"),
    OpCase("bmm", lambda m, a, b: m.bmm(a, b), [I((2, 3, 4)), I((2, 4, 5))]),
    OpCase("bmm", lambda m, a, b: a.bmm(b), [I((2, 3, 4), noncontig=True), I((2, 4, 5), noncontig=True)], name="noncontig"),
    OpCase("addmm", lambda m, c, a, b: m.addmm(c, a, b), [I((3, 5)), I((3, 4)), I((4, 5))]),
    OpCase("addmm", lambda m, c, a, b: m.addmm(c, a, b, beta=0.5, alpha=2.0), [I((5,)), I((3, 4)), I((4, 5))], name="scaled-bcast"),
    OpCase("addmm", lambda m, c, a, b: c.addmm(a, b, beta=0), [I((3, 5)), I((3, 4)), I((4, 5))], name="beta0"),
    OpCase("baddbmm", lambda m, c, a, b: m.baddbmm(c, a, b), [I((2, 3, 5)), I((2, 3, 4)), I((2, 4, 5))]),
    OpCase("baddbmm", lambda m, c, a, b: m.baddbmm(c, a, b, beta=0.0, alpha=0.125), [I((2, 3, 5)), I((2, 3, 4)), I((2, 4, 5))], name="attn-scale"),
    OpCase("baddbmm", lambda m, c, a, b: c.baddbmm(a, b, beta=2, alpha=-1), [I((3, 1)), I((2, 3, 4)), I((2, 4, 5))], name="bcast"),
    OpCase("dot", lambda m, a, b: m.dot(a, b), [I((5,)), I((5,))]),
    OpCase("dot", lambda m, a, b: a.dot(b), [I((5,), "int64", "int", -3, 3), I((5,), "int64", "int", -3, 3)], name="int"),
    OpCase("outer", lambda m, a, b: m.outer(a, b), [I((3,)), I((4,))]),
    OpCase("linear", lambda m, x, w, b: m.nn.functional.linear(x, w, b), [I((2, 5, 4)), I((3, 4)), I((3,))]),
    OpCase("linear", lambda m, x, w: m.nn.functional.linear(x, w), [I((6, 4)), I((3, 4))], name="nobias"),
    OpCase("linear", lambda m, x, w, b: m.nn.functional.linear(x, w, b), [I((4,)), I((3, 4)), I((3,))], name="vec"),
    OpCase("linear", lambda m, x, w, b: m.nn.functional.linear(x, w, b), [I((5, 4), noncontig=True), I((3, 4), noncontig=True), I((3,))], name="noncontig"),
    OpCase("linear", lambda m, x, w, b: m.nn.functional.linear(x, w, b), [I((2, 3, 2, 4)), I((3, 4)), I((1,))], name="4d-bias1"),
    OpCase("linear", lambda m, x, w, b: m.nn.functional.linear(x, w, b), [I((0, 4)), I((3, 4)), I((3,))], name="empty", gradcheck=False),
    OpCase("linear", lambda m, x, w, b: m.nn.functional.linear(x, w, b), [I((2, 4), "float64"), I((3, 4), "float64"), I((3,), "float64")], name="float64"),
]

_EIN = [
    ("ij,jk->ik", [(3, 4), (4, 5)], "mm"),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)], "bmm"),
    ("bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)], "attn"),
    ("ij,jk", [(3, 4), (4, 5)], "implicit"),
    ("i,j->ij", [(3,), (4,)], "outer"),
    ("ij->", [(3, 4)], "sum-all"),
    ("ij->j", [(3, 4)], "sum-rows"),
    ("ij->ji", [(3, 4)], "transpose"),
    ("ii->i", [(4, 4)], "diag"),
    ("ii", [(4, 4)], "trace"),
    ("iij->j", [(3, 3, 2)], "diag-sum"),
    ("ij,ik->j", [(3, 4), (3, 5)], "sum-only-in-one"),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 2)], "ellipsis-bcast"),
    ("b...,b...->b", [(2, 3, 4), (2, 3, 4)], "ellipsis-middle"),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)], "chain3"),
]
for eq, shapes, name in _EIN:
    CASES.append(OpCase("einsum", lambda m, *ts, eq=eq: m.einsum(eq, *ts), [I(s) for s in shapes], name=name))
CASES.append(OpCase("einsum", lambda m, a, b: m.einsum("ij,jk->ik", [a, b]), [I((3, 4), noncontig=True), I((4, 2))], name="list-noncontig"))

# ---------------------------------------------------------------- mv, tensordot
CASES += [
    OpCase("mv", lambda m, a, v: m.mv(a, v), [I((3, 4)), I((4,))]),
    OpCase("mv", lambda m, a, v: a.mv(v), [I((5, 3), noncontig=True), I((3,))], name="method-noncontig"),
    OpCase("mv", lambda m, a, v: m.mv(a, v), [I((3, 4), "float64"), I((4,), "float64")], name="float64"),
    OpCase("mv", lambda m, a, v: m.mv(a, v), [I((3, 4), "int64", "int", -3, 4), I((4,), "int64", "int", -3, 4)], name="int"),
    OpCase("mv", lambda m, a, v: m.mv(a, v), [I((0, 4)), I((4,))], name="empty", gradcheck=False),
    OpCase("tensordot", lambda m, a, b: m.tensordot(a, b), [I((3, 4, 5)), I((4, 5, 2))]),
    OpCase("tensordot", lambda m, a, b: m.tensordot(a, b, dims=([0, 2], [2, 1])), [I((3, 4, 5), noncontig=True), I((2, 5, 3))],
           name="pairs"),
    OpCase("tensordot", lambda m, a, b: m.tensordot(a, b, dims=1), [I((2, 3)), I((3, 4, 2))], name="one"),
    OpCase("tensordot", lambda m, a, b: m.tensordot(a, b, dims=0), [I((2, 3)), I((3,))], name="outer"),
    OpCase("tensordot", lambda m, a, b: m.tensordot(a, b, dims=([1], [0])), [I((2, 3)), I((3,))], name="to-vector"),
    OpCase("tensordot", lambda m, a, b: m.tensordot(a, b, dims=2), [I((2, 3)), I((2, 3))], name="full"),
    OpCase("tensordot", lambda m, a, b: m.tensordot(a, b, dims=1), [I((2, 0)), I((0, 3))], name="empty-contraction",
           gradcheck=False),
    OpCase("tensordot", lambda m, a, b: m.tensordot(a, b, dims=([0], [1])), [I((3, 2), "int64", "int", -3, 4), I((2, 3), "int64", "int", -3, 4)],
           name="int"),
]

# ---------------------------------------------------------------- cdist
for p in (2.0, 1.0, math.inf, 3.0, 0.0, 0.5):
    CASES.append(OpCase("cdist", lambda m, a, b, p=p: m.cdist(a, b, p=p), [I((4, 3)), I((5, 3))], name=f"p{p:g}"))
CASES += [
    OpCase("cdist", lambda m, a, b: m.cdist(a, b), [I((2, 1, 4, 3)), I((3, 5, 3), noncontig=True)], name="batch-bcast"),
    OpCase("cdist", lambda m, a, b: m.cdist(a, b), [I((30, 3)), I((4, 3))], name="mm-path"),
    OpCase("cdist", lambda m, a, b: m.cdist(a, b, compute_mode="use_mm_for_euclid_dist"), [I((3, 4)), I((2, 4))], name="mm-forced"),
    OpCase("cdist", lambda m, a, b: m.cdist(a, b, compute_mode="donot_use_mm_for_euclid_dist"), [I((30, 2)), I((3, 2))],
           name="mm-refused"),
    OpCase("cdist", lambda m, a: m.cdist(a, a), [I((3, 2))], name="self-zero-distance", gradcheck=False),  # kink at 0
    OpCase("cdist", lambda m, a, b: m.cdist(a, b), [I((3, 4), "float64"), I((2, 4), "float64")], name="float64"),
    OpCase("cdist", lambda m, a, b: m.cdist(a, b), [I((0, 3)), I((2, 3))], name="empty", gradcheck=False),
    OpCase("cdist", lambda m, a, b: m.cdist(a, b), [I((2, 0)), I((3, 0))], name="no-columns", gradcheck=False),
]

# ---------------------------------------------------------------- einsum's sublist format: op, [labels], ..., [output]
CASES += [
    OpCase("einsum", lambda m, a: m.einsum(a, [0, 1], [1]), [I((2, 3))], name="sublist-sum"),
    OpCase("einsum", lambda m, a: m.einsum(a, [27, 1]), [I((2, 3))], name="sublist-implicit-case"),
    OpCase("einsum", lambda m, a, b: m.einsum(a, [0, 1], b, [1, 2], [0, 2]), [I((2, 3), noncontig=True), I((3, 4))],
           name="sublist-matmul"),
    OpCase("einsum", lambda m, a, b, c: m.einsum(a, [0, 1], b, [1], c, [0], []), [I((2, 3)), I((3,)), I((2,))],
           name="sublist-three-scalar"),
    OpCase("einsum", lambda m, a, b: m.einsum(a, [Ellipsis, 30], b, [30, 31], [Ellipsis, 31]), [I((2, 3, 4)), I((4, 5))],
           name="sublist-ellipsis"),
    OpCase("einsum", lambda m, a: m.einsum(a, [0, Ellipsis, 0], [Ellipsis, 0]), [I((3, 2, 3))], name="sublist-diag-ellipsis"),
    OpCase("einsum", lambda m, a: m.einsum(a, [1, 0]), [I((2, 3))], name="sublist-transpose"),
]
