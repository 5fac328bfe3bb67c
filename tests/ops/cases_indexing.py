"""Parity cases for engine/ops/indexing.py: gather/scatter families (duplicate indices where the
op accumulates), index_select/index_add, masks, one_hot, embedding (repeated ids, padding_idx).
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
