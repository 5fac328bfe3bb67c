"""Parity cases for engine/ops/indexing.py: gather/scatter families (duplicate indices where the
op accumulates), scatter_reduce, index_select/index_add/index_put, masks (masked_scatter too),
one_hot, embedding (repeated ids, padding_idx).
`x[key]`, `x[key] = v`, fill_/zero_/copy_ are Tensor methods, not names in `__all__`: their parity
cases are in tests/test_indexing_errors.py."""
import numpy as np

from harness import Input as I, OpCase


def Idx(value):
    return I(dtype="int64", value=np.array(value, dtype=np.int64))


def Mask(shape):
    return I(shape, "bool", "bool")


X = I((4, 3))
CASES = [
    OpCase("gather", lambda m, x, i: m.gather(x, 0, i), [X, Idx([[0, 1, 2], [3, 3, 0]])], name="dim0-dup"),
    OpCase("gather", lambda m, x, i: x.gather(-1, i), [X, Idx([[2, 0], [1, 1], [0, 2], [2, 2]])], name="neg-dim"),
    OpCase("gather", lambda m, x, i: m.gather(x, 1, i), [I((4, 3), noncontig=True), Idx([[0], [2]])], name="smaller-index"),
    OpCase("gather", lambda m, x, i: m.gather(x, 1, i), [I((2, 3, 4)), Idx(np.zeros((2, 2, 4), np.int64))], name="3d-all-same"),
    OpCase("scatter", lambda m, x, i, s: m.scatter(x, 0, i, s), [X, Idx([[0, 1, 2], [3, 0, 1]]), I((2, 3))], name="src"),
    OpCase("scatter", lambda m, x, i, s: x.scatter(-1, i, s.to(x.dtype)), [X, Idx([[2], [0], [1], [0]]), I((4, 2), requires_grad=False)], name="src-larger"),  # torch has no src grad here
    OpCase("scatter", lambda m, x, i: m.scatter(x, 1, i, value=2.5), [X, Idx([[0, 2], [1, 0]])], name="value"),
    OpCase("scatter_add", lambda m, x, i, s: m.scatter_add(x, 0, i, s), [X, Idx([[0, 1, 2], [0, 1, 2], [3, 3, 3]]), I((3, 3))], name="dup"),
    OpCase("scatter_add", lambda m, x, i, s: x.scatter_add(-1, i, s), [I((2, 5), noncontig=True), Idx([[0, 0, 4], [1, 1, 1]]), I((2, 3))], name="neg-dim"),
    OpCase("index_select", lambda m, x, i: m.index_select(x, 0, i), [X, Idx([3, 0, 3, 1])], name="dup"),
    OpCase("index_select", lambda m, x, i: x.index_select(-1, i), [I((2, 3, 4), noncontig=True), Idx([2, 2])], name="neg-dim"),
    OpCase("index_select", lambda m, x, i: m.index_select(x, 1, i), [X, Idx(np.zeros(0, np.int64))], name="empty", gradcheck=False),
    OpCase("index_add", lambda m, x, i, s: m.index_add(x, 0, i, s), [X, Idx([1, 1, 3]), I((3, 3))], name="dup"),
    OpCase("index_add", lambda m, x, i, s: x.index_add(-1, i, s, alpha=2.0), [X, Idx([0, 2]), I((4, 2))], name="alpha"),
    OpCase("masked_fill", lambda m, x, k: m.masked_fill(x, k, -1.5), [X, Mask((4, 3))]),
    OpCase("masked_fill", lambda m, x, k: x.masked_fill(k, -1e4), [I((2, 3, 4)), Mask((3, 1))], name="bcast-mask"),
    OpCase("masked_fill", lambda m, x, k, v: x.masked_fill(k, v.reshape(())), [X, Mask((4, 3)), I((1,))], name="tensor-value"),
    OpCase("masked_fill", lambda m, x, k: x.masked_fill(k, 3), [I((4, 3), "int64", "int", 0, 9), Mask((3,))], name="int"),
    OpCase("masked_select", lambda m, x, k: m.masked_select(x, k), [X, Mask((4, 3))]),
    OpCase("masked_select", lambda m, x, k: x.masked_select(k), [I((3,)), Mask((2, 3))], name="bcast"),
    OpCase("take_along_dim", lambda m, x, i: m.take_along_dim(x, i, dim=1), [X, Idx([[0, 2], [1, 1], [2, 0], [0, 0]])]),
    OpCase("take_along_dim", lambda m, x, i: m.take_along_dim(x, i), [X, Idx([11, 0, 5, 5])], name="flat"),
    OpCase("one_hot", lambda m, i: m.nn.functional.one_hot(i), [Idx([[0, 3], [2, 2]])]),
    OpCase("one_hot", lambda m, i: m.nn.functional.one_hot(i, num_classes=6), [Idx([1, 0, 5])], name="num_classes"),
    OpCase("embedding", lambda m, i, w: m.nn.functional.embedding(i, w), [Idx([[1, 4, 1], [0, 4, 4]]), I((5, 3))], name="dup"),
    OpCase("embedding", lambda m, i, w: m.nn.functional.embedding(i, w, padding_idx=1), [Idx([[1, 4, 1], [0, 2, 1]]), I((5, 3))], name="padding",
           gradcheck=False),  # padding row: torch zeroes its grad by definition, finite differences don't
    OpCase("embedding", lambda m, i, w: m.nn.functional.embedding(i, w, padding_idx=-1), [Idx([4, 0, 4]), I((5, 3), noncontig=True)], name="neg-padding",
           gradcheck=False),  # as above
    OpCase("embedding", lambda m, i, w: m.nn.functional.embedding(i, w), [I(dtype="int32", value=np.array([2, 2, 0], np.int32)), I((3, 4))], name="int32"),
    OpCase("nonzero", lambda m, x: m.nonzero(x), [I((3, 4), "int64", "int", 0, 2)]),
    OpCase("nonzero", lambda m, x: x.nonzero(as_tuple=True), [Mask((2, 3))], name="as_tuple"),
    OpCase("nonzero", lambda m, x: m.nonzero(x), [I((0, 3), "bool", "bool")], name="empty"),
]

# ---------------------------------------------------------------- in-place index_add, scatter's reduce=
CASES += [
    OpCase("index_add", lambda m, x, i, s: x.clone().index_add_(0, i, s), [X, Idx([3, 0, 3]), I((3, 3))], name="inplace"),
    OpCase("index_add", lambda m, x, i, s: x.clone().index_add_(1, i, s, alpha=-1.5), [I((2, 4), noncontig=True), Idx([1, 1]), I((2, 2))],
           name="inplace-alpha"),
    # torch has no gradient for scatter with reduce= (its backward raises): forward only
    OpCase("scatter", lambda m, x, i, s: m.scatter(x, 0, i, s, reduce="add"), [X, Idx([[0, 1, 2], [0, 1, 2]]), I((2, 3))],
           name="reduce-add", backward=False),
    OpCase("scatter", lambda m, x, i, s: x.scatter(1, i, s, reduce="multiply"), [X, Idx([[0, 0], [2, 1], [1, 1], [0, 2]]), I((4, 2))],
           name="reduce-multiply", backward=False),
    OpCase("scatter", lambda m, x, i: x.scatter(0, i, 2.5, reduce="multiply"), [X, Idx([[1, 1, 0], [1, 2, 0]])], name="reduce-value",
           backward=False),
    OpCase("scatter", lambda m, x, i: x.detach().clone().scatter_(0, i, value=-1.0, reduce="add"), [X, Idx([[3, 3, 0]])],
           name="reduce-inplace", backward=False),
    OpCase("scatter", lambda m, x, i, s: x.clone().scatter_(1, i, s, reduce="multiply"), [X, Idx([[1, 1], [0, 2], [2, 2], [0, 0]]),
           I((4, 2))], name="reduce-inplace-recorded", backward=False),
]

# ---------------------------------------------------------------- scatter_reduce
IDX2 = Idx([[0, 1, 0], [2, 0, 0], [0, 1, 2]])  # repeated targets along dim 0, an untouched row (3)
for red in ("sum", "prod", "mean", "amax", "amin"):
    for incl in (True, False):
        CASES.append(OpCase("scatter_reduce", lambda m, x, i, s, red=red, incl=incl: m.scatter_reduce(x, 0, i, s, red, include_self=incl),
                            [X, IDX2, I((3, 3))], name=f"{red}-{'self' if incl else 'noself'}"))
    CASES += [
        OpCase("scatter_reduce", lambda m, x, i, s, red=red: x.scatter_reduce(1, i, s, red), [I((3, 4), noncontig=True),
               Idx([[0, 3, 3], [1, 1, 1], [2, 0, 2]]), I((3, 3))], name=f"{red}-dim1"),
        OpCase("scatter_reduce", lambda m, x, i, s, red=red: x.scatter_reduce(1, i, s, red, include_self=False), [X,
               Idx([[0, 2], [1, 1], [2, 0], [0, 0]]), I((4, 3))], name=f"{red}-src-larger",
               backward=False),  # torch's backward gives src a gradient of the index's shape, and fails
        OpCase("scatter_reduce", lambda m, x, i, s, red=red: m.scatter_reduce(x, 0, i, s, red, include_self=False),
               [I((4,), "int64", "int", -5, 5), Idx([1, 1, 3]), I((3,), "int64", "int", -5, 5)], name=f"{red}-int"),
        OpCase("scatter_reduce", lambda m, x, i, s, red=red: x.clone().scatter_reduce_(0, i, s, red), [X, IDX2, I((3, 3))],
               name=f"{red}-inplace"),
    ]
ZX = I(value=np.array([[1.5, 0.0, 2.0], [0.5, -1.0, 0.0], [2.0, 1.0, 3.0], [0.0, 1.0, -2.0]], dtype=np.float32))
ZS = I(value=np.array([[0.0, 2.0, 1.5], [3.0, 0.0, 0.0], [-1.0, 2.0, 0.5]], dtype=np.float32))
CASES += [
    OpCase("scatter_reduce", lambda m, x, i, s: m.scatter_reduce(x, 0, i, s, "prod"), [ZX, IDX2, ZS], name="prod-zeros",
           gradcheck=False),  # a double zero's gradient is a kink
    OpCase("scatter_reduce", lambda m, x, i, s: m.scatter_reduce(x, 0, i, s, "prod", include_self=False), [ZX, IDX2, ZS],
           name="prod-zeros-noself", gradcheck=False),
    OpCase("scatter_reduce", lambda m, x, i, s: m.scatter_reduce(x, 0, i, s, "amax"),
           [I(value=np.array([[1.0, 2.0], [0.0, 0.0]], dtype=np.float32)), Idx([[0, 0], [0, 1]]),
            I(value=np.array([[1.0, 2.0], [1.0, -1.0]], dtype=np.float32))], name="amax-ties", gradcheck=False),
    OpCase("scatter_reduce", lambda m, x, i, s: m.scatter_reduce(x, 0, i, s, "mean"), [I(()), Idx(0), I(())], name="0d"),
    OpCase("scatter_reduce", lambda m, x, i, s: x.scatter_reduce(0, i, s, "max", include_self=False), [X, IDX2, I((3, 3))],
           name="max-alias", backward=False),  # torch's forward takes "max", its backward does not
    OpCase("scatter_reduce", lambda m, x, i, s: m.scatter_reduce(x, 1, i, s, "sum"), [X, I((4, 0), "int64", "int", 0, 3), I((4, 0))],
           name="empty-index", gradcheck=False),
]

# ---------------------------------------------------------------- index_put
CASES += [
    OpCase("index_put", lambda m, x, i, v: m.index_put(x, (i,), v), [X, Idx([3, 0]), I((2, 3))]),
    OpCase("index_put", lambda m, x, i, v: x.index_put((i,), v, accumulate=True), [X, Idx([1, 3, 1, 1]), I((3,))], name="accumulate-dup"),
    OpCase("index_put", lambda m, x, i, j, v: m.index_put(x, (i, j), v), [X, Idx([0, 2]), Idx([1, 2]), I((2,))], name="two-indices"),
    OpCase("index_put", lambda m, x, i, j, v: m.index_put(x, [i, j], v, True), [I((4, 3), noncontig=True), Idx([0, 0, 3]), Idx([2, 2, 0]), I(())],
           name="two-indices-accumulate"),
    OpCase("index_put", lambda m, x, k, v: m.index_put(x, (k,), v), [X, Mask((4, 3)), I(())], name="mask"),
    OpCase("index_put", lambda m, x, k, v: m.index_put(x, (k,), v, accumulate=True), [X, Mask((4,)), I((3,))], name="row-mask-accumulate"),
    OpCase("index_put", lambda m, x, i, v: x.clone().index_put_((i,), v), [X, Idx([2]), I((3,))], name="inplace"),
    OpCase("index_put", lambda m, x, i, v: x.clone().index_put_((i,), v, accumulate=True), [X, Idx([2, 2]), I((2, 3))],
           name="inplace-accumulate"),
    OpCase("index_put", lambda m, x, i, v: m.index_put(x, (i,), v, accumulate=True),
           [I((5,), "int64", "int", 0, 9), Idx([4, 4, 0]), I((3,), "int64", "int", 0, 9)], name="int"),
    OpCase("index_put", lambda m, x, i, v: m.index_put(x, (i,), v), [X, Idx(np.zeros(0, np.int64)), I((0, 3))], name="empty",
           gradcheck=False),
]

# ---------------------------------------------------------------- masked_scatter
CASES += [
    OpCase("masked_scatter", lambda m, x, k, s: m.masked_scatter(x, k, s), [X, Mask((4, 3)), I((4, 3))]),
    OpCase("masked_scatter", lambda m, x, k, s: x.masked_scatter(k, s), [I((4, 3), noncontig=True), Mask((3,)), I((5, 4))],
           name="bcast-mask-larger-source"),
    OpCase("masked_scatter", lambda m, x, k, s: m.masked_scatter(x, k, s), [I((3,)), Mask((2, 3)), I((6,))], name="bcast-input"),
    OpCase("masked_scatter", lambda m, x, k, s: m.masked_scatter(x, k, s), [I(()), I(dtype="bool", value=np.array(True)), I((2,))], name="0d"),
    OpCase("masked_scatter", lambda m, x, k, s: m.masked_scatter(x, k, s), [I((3,)), I(dtype="bool", value=np.zeros(3, bool)), I((0,))],
           name="no-true", gradcheck=False),
    OpCase("masked_scatter", lambda m, x, k, s: x.clone().masked_scatter_(k, s), [X, Mask((4, 1)), I((12,))], name="inplace"),
    OpCase("masked_scatter", lambda m, x, k, s: m.masked_scatter(x, k, s),
           [I((2, 3), "int64", "int", 0, 9), Mask((2, 3)), I((6,), "int64", "int", 0, 9)], name="int"),
]

# ---------------------------------------------------------------- index_fill, select
def _fill_row_view(x, i):
    y = x * 1
    y[1].index_fill_(0, i, 0.5)  # through a view: y changes, gradients flow through both
    return y


CASES += [
    OpCase("index_fill", lambda m, x, i: m.index_fill(x, 1, i, -2.5), [X, Idx([0, 2, 0])], name="dup"),
    OpCase("index_fill", lambda m, x, i: x.index_fill(-2, i, 1.5), [I((4, 3), noncontig=True), Idx([-1, 1])], name="neg-dim-neg-index"),
    OpCase("index_fill", lambda m, x, i: x.index_fill(0, i.reshape(()), 3.0), [I((2, 3, 4)), Idx([1])], name="0d-index"),
    OpCase("index_fill", lambda m, x, i, v: x.index_fill(2, i, v.reshape(())), [I((2, 3, 4)), Idx([3, 0, 3]), I((1,))],
           name="tensor-value"),
    OpCase("index_fill", lambda m, x, i: x.reshape(()).index_fill(-1, i, 7.0), [I((1,)), Idx([0])], name="0d-input"),
    OpCase("index_fill", lambda m, x, i: x.index_fill(1, i, 2.7), [I((3, 4), "int64", "int", -5, 5), Idx([3])], name="int-float-value"),
    OpCase("index_fill", lambda m, x, i: x.index_fill(0, i, 1.0), [X, Idx(np.zeros(0, np.int64))], name="empty-index"),
    OpCase("index_fill", lambda m, x, i, v: x.clone().index_fill_(1, i, v.reshape(())), [X, Idx([2]), I((1,))], name="inplace"),
    OpCase("index_fill", lambda m, x, i: _fill_row_view(x, i), [X, Idx([0, 2])], name="inplace-view"),
    OpCase("select", lambda m, x: m.select(x, 0, 2), [X]),
    OpCase("select", lambda m, x: x.select(-1, -2), [I((2, 3, 4), noncontig=True)], name="neg"),
    OpCase("select", lambda m, x, i: x.select(1, i.reshape(())), [X, Idx([1])], name="tensor-index"),
    OpCase("select", lambda m, x: x.clone().select(1, 0).mul_(3.0), [X], name="inplace-view"),
]
