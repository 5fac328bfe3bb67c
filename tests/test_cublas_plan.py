"""engine.backend.cublas: the arithmetic of cuBLAS batched products on strided views.

On the CPU, `plan` runs through a numpy model of cublasGemmStridedBatchedEx (column-major, as
cuBLAS's documentation defines it: op(A) is m x k, A[i, j] at A + i + j * lda for OP_N and the
transpose for OP_T, matrix p of the batch at A + p * strideA) against numpy's matmul, on views of
every kind the engine hands it: the packed-QKV head views of the attention core, transposed
views, broadcast batch axes, batch axes that do not merge into one stride, and degenerate sizes.
The output's buffer is poisoned so that a write outside the view, or an element not written,
fails. On a GPU (tests/test_fused_kernels_gpu.py style) the real call is checked the same way.
"""
import os

import numpy as np
import pytest

from engine.backend import cublas
from gpu_helper import real_cupy


def _cublas_model(buf_a, buf_b, buf_c, tr_a, tr_b, m, n, k, off_a, lda, sa, off_b, ldb, sb, off_c, ldc, sc, batch):
    """cublasGemmStridedBatchedEx(handle, tr_a, tr_b, m, n, k, 1, A, lda, sa, B, ldb, sb, 0, C, ldc,
    sc, batch) on flat numpy buffers (element offsets), in float64."""
    def operand(buf, off, tr, rows, cols, ld):
        i, j = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
        idx = off + (i + j * ld if tr == cublas.OP_N else j + i * ld)
        return buf[idx].astype(np.float64)

    assert lda >= max(1, m if tr_a == cublas.OP_N else k) and ldb >= max(1, k if tr_b == cublas.OP_N else n)
    assert ldc >= max(1, m), "cuBLAS refuses these leading dimensions"
    for p in range(batch):
        a = operand(buf_a, off_a + p * sa, tr_a, m, k, lda)
        b = operand(buf_b, off_b + p * sb, tr_b, k, n, ldb)
        i, j = np.meshgrid(np.arange(m), np.arange(n), indexing="ij")
        buf_c[off_c + p * sc + i + j * ldc] = a @ b


def _elements(x):
    return [s // x.itemsize for s in x.strides]


def _offset(view, base):
    return (view.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // view.itemsize


def _run_plan(a, a_base, b, b_base, out, out_base):
    """out = a @ b through plan + the cuBLAS model, on the views' own buffers."""
    p = cublas.plan(a.shape, _elements(a), b.shape, _elements(b), out.shape, _elements(out))
    if p is None:
        return False
    fa, fb, fc = a_base.reshape(-1), b_base.reshape(-1), out_base.reshape(-1)
    oa, ob, oc = _offset(a, a_base), _offset(b, b_base), _offset(out, out_base)
    for da, db, dc in p.offsets:
        _cublas_model(fb, fa, fc, p.trans_b, p.trans_a, p.m, p.n, p.k, ob + db, p.ld_b, p.stride_b,
                      oa + da, p.ld_a, p.stride_a, oc + dc, p.ld_c, p.stride_c, p.batch)
    return True


def _check(a, a_base, b, b_base, out, out_base):
    out_base[...] = np.nan
    assert _run_plan(a, a_base, b, b_base, out, out_base)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)
    written = np.zeros(out_base.size, bool)
    idx = _offset(out, out_base) + sum(np.indices(out.shape)[i] * s for i, s in enumerate(_elements(out)))
    written[idx.reshape(-1)] = True
    assert np.isnan(out_base.reshape(-1)[~written]).all(), "wrote outside the output view"


def test_attention_head_views():
    """The attention core's products: q k^T into scores, p v into the [b, s, heads, d] context,
    and the backward's dv = p^T g, dq = ds k, dk = ds^T q into the dqkv layout."""
    rng = np.random.default_rng(0)
    b, s, h, d = 3, 5, 4, 6
    qkv = rng.standard_normal((b, s, h, 3 * d))
    heads = [qkv[..., i * d:(i + 1) * d].transpose(0, 2, 1, 3) for i in range(3)]  # [b, h, s, d]
    q, k, v = heads
    scores_base = np.empty((b, h, s, s))
    _check(q, qkv, k.transpose(0, 1, 3, 2), qkv, scores_base, scores_base)
    p = rng.standard_normal((b, h, s, s))
    ctx = np.empty((b, s, h, d))
    _check(p, p, v, qkv, ctx.transpose(0, 2, 1, 3), ctx)
    dqkv = np.empty((b, s, h, 3 * d))
    for part, (x, y) in enumerate([(p, k), (p.transpose(0, 1, 3, 2), q), (p.transpose(0, 1, 3, 2), v)]):
        target = dqkv[..., part * d:(part + 1) * d].transpose(0, 2, 1, 3)
        _check(x, p, y, qkv, target, dqkv)


def test_batch_axes_merge_or_loop():
    """Contiguous batch axes merge into one strided call; the head views' (batch, heads) axes
    cannot, and become one call per batch row."""
    q = np.zeros((3, 4, 5, 6))
    c = cublas.plan((3, 4, 5, 6), _elements(q), (3, 4, 6, 5), [120, 30, 5, 1], (3, 4, 5, 5), [100, 25, 5, 1])
    assert c.batch == 12 and len(c.offsets) == 1
    qkv = np.zeros((3, 5, 4, 18))
    view = qkv[..., :6].transpose(0, 2, 1, 3)
    c = cublas.plan(view.shape, _elements(view), (3, 4, 6, 5), [120, 30, 1, 6], (3, 4, 5, 5), [100, 25, 5, 1])
    assert c.batch == 4 and len(c.offsets) == 3
    assert c.trans_a == cublas.OP_N and c.trans_b == cublas.OP_T and c.ld_a == 4 * 18


@pytest.mark.parametrize("seed", range(40))
def test_random_views(seed):
    """Random shapes (sizes 1 included), random axis orders of the buffers, random slicing steps
    on the batch axes, broadcast batch axes and transposed matrices: where the plan takes a layout
    its result is numpy's; where it refuses, a matrix has no unit stride or the output is not
    row-major."""
    rng = np.random.default_rng(seed)
    nb = int(rng.integers(0, 3))
    batch = tuple(int(x) for x in rng.integers(1, 4, nb))
    m, k, n = (int(x) for x in rng.integers(1, 6, 3))

    def view(shape, broadcast_ok):
        full = shape
        if broadcast_ok and nb and rng.random() < 0.3:
            ax = int(rng.integers(0, nb))
            full = shape[:ax] + (1,) + shape[ax + 1:]
        steps = [int(rng.integers(1, 3)) if i < nb else 1 for i in range(len(full))]
        order = list(range(len(full)))
        if rng.random() < 0.5:
            order[-1], order[-2] = order[-2], order[-1]  # a transposed matrix
        if rng.random() < 0.3:
            rng.shuffle(order)
        base_shape = tuple(full[o] * steps[o] for o in order)
        base = rng.standard_normal(base_shape)
        x = base.transpose(np.argsort(order))[tuple(slice(None, None, st) for st in steps)]
        return np.broadcast_to(x, shape), base

    a, a_base = view(batch + (m, k), True)
    b, b_base = view(batch + (k, n), True)
    out, out_base = view(batch + (m, n), False)
    p = cublas.plan(a.shape, _elements(a), b.shape, _elements(b), out.shape, _elements(out))

    def takes(x, rows, cols):  # a unit stride along one axis, the other at least that axis' size
        r, c = _elements(x)[-2:]
        return ((cols == 1 or c == 1) and (rows == 1 or r >= cols)) or \
            ((rows == 1 or r == 1) and (cols == 1 or c >= rows))
    r, c = _elements(out)[-2:]
    out_ok = (n == 1 or c == 1) and (m == 1 or r >= n)
    assert (p is not None) == (takes(a, m, k) and takes(b, k, n) and out_ok)
    if p is not None:
        _check(a, a_base, b, b_base, out, out_base)


@pytest.mark.parametrize("case", ["3d", "4d-outer", "one-row", "padded-columns", "gap-between-batches"])
def test_shared_right_operand_folds_the_batch_into_rows(case):
    """x[B, T, C] @ W (W broadcast over the batch): one product of B*T rows when the rows of x
    and of the output follow each other across the batch (padded columns included: the row
    stride is the leading dimension); with a gap between batches, a strided batched call."""
    rng = np.random.default_rng(1)
    shape_a = {"3d": (3, 5, 4), "4d-outer": (2, 3, 5, 4), "one-row": (3, 1, 4), "padded-columns": (3, 5, 4),
               "gap-between-batches": (3, 5, 4)}[case]
    base_a = rng.standard_normal({"padded-columns": (3, 5, 6), "gap-between-batches": (3, 6, 4)}.get(case, shape_a))
    a = base_a[..., :5, :4]
    w = rng.standard_normal((1,) * (len(shape_a) - 2) + (4, 7))
    b = np.broadcast_to(w, shape_a[:-2] + (4, 7))
    out = np.empty(shape_a[:-1] + (7,))
    p = cublas.plan(a.shape, _elements(a), b.shape, _elements(b), out.shape, _elements(out))
    folded = case != "gap-between-batches"
    assert (p.batch == 1 and len(p.offsets) == 1) == folded
    if folded:
        assert p.n == int(np.prod(shape_a[:-1]))  # cuBLAS's n: all the rows
    _check(a, base_a, b, w, out, out)


def test_refused_layouts():
    """No unit stride in a matrix, a column-major output, overlapping rows: no plan."""
    assert cublas.plan((4, 6), [12, 2], (6, 5), [5, 1], (4, 5), [5, 1]) is None  # a: strides 12, 2
    assert cublas.plan((4, 6), [6, 1], (6, 5), [5, 1], (4, 5), [1, 4]) is None  # c column-major
    assert cublas.plan((4, 6), [0, 1], (6, 5), [5, 1], (4, 5), [5, 1]) is None  # a's rows overlap
    assert cublas.plan((2, 4, 6), [24, 6, 1], (2, 6, 5), [30, 5, 1], (3, 4, 5), [20, 5, 1]) is None
    assert cublas.plan((2, 4, 6), [24, 6, 1], (2, 6, 5), [30, 5, 1], (2, 4, 5), [0, 5, 1]) is None  # outputs overlap


def test_unavailable_without_cublas_library():
    """Without libcublas (this CPU machine, the CuPy double) the engine says why and falls back."""
    if real_cupy() is not None or os.environ.get("ENGINE_CUPY_DOUBLE") == "1":
        pytest.skip("a GPU is present, or the whole run is on the CuPy double (its cuBLAS stand-in installed)")
    assert not cublas.available()
    assert cublas.why_unavailable()
    a = np.ones((2, 3, 4), np.float16)
    assert cublas.gemm_batched(a, a.transpose(0, 2, 1), np.empty((2, 3, 3), np.float16)) is False


def test_float16_operands_into_a_float32_output(cuda_double):
    """float16 x float16 -> float32 (a master weight's gradient): the float32 accumulator is the
    output, on a transposed operand and through the batch-folding plan; float32 operands into a
    float16 output, and other pairs cuBLAS has no combination for, are declined (False)."""
    cp = cuda_double
    rng = np.random.default_rng(0)
    g = rng.standard_normal((3, 40, 24)).astype(np.float16)
    x = rng.standard_normal((3, 40, 16)).astype(np.float16)
    out = cp.full((24, 16), np.nan, np.float32)
    g2, x2 = cp.asarray(g.reshape(-1, 24)), cp.asarray(x.reshape(-1, 16))
    assert cublas.gemm_batched(g2.T, x2, out)
    want = g.reshape(-1, 24).astype(np.float64).T @ x.reshape(-1, 16).astype(np.float64)
    got = cp.asnumpy(out).astype(np.float64)
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-6  # float32 rounding only
    assert np.abs(want.astype(np.float16) - want).max() / np.abs(want).max() > 1e-4  # float16 would not pass
    batched = cp.full((3, 40, 24), np.nan, np.float32)  # rows of a batch against a shared right operand
    w = rng.standard_normal((16, 24)).astype(np.float16)
    assert cublas.gemm_batched(cp.asarray(x), cp.asarray(w)[None], batched)
    want = x.astype(np.float64) @ w.astype(np.float64)
    assert np.abs(cp.asnumpy(batched) - want).max() / np.abs(want).max() < 1e-6
    f32 = cp.ones((4, 4), np.float32)
    assert cublas.gemm_batched(f32, f32, cp.empty((4, 4), np.float16)) is False
    assert cublas.gemm_batched(f32, f32, cp.empty((4, 4), np.float64)) is False
    h = cp.ones((4, 4), np.float16)
    assert cublas.gemm_batched(h, h, cp.empty((4, 4), np.float64)) is False
    col = cublas.column_sum(g2, np.float32)
    assert col.dtype == np.float32 and col.shape == (24,) and col.base is None  # its own memory
    want = g.reshape(-1, 24).astype(np.float64).sum(0)
    assert np.abs(cp.asnumpy(col) - want).max() / np.abs(want).max() < 1e-6
    assert cublas.matmul(g2.T, x2, np.float32).dtype == np.float32


def test_the_ones_vector_of_one_cupy_module_is_never_given_to_another(cuda_double, monkeypatch):
    """column_sum keeps a ones vector per CuPy module, device and dtype. Found on a GPU: keyed by
    device and dtype alone, a test through the double after a real-GPU test in the same process
    got the real CuPy's vector (an address outside every double allocation), and a real-GPU test
    after a double test handed the double's fake address to cuBLAS (an illegal memory access)."""
    import types

    from engine import backend
    from engine.backend import cublas

    monkeypatch.setattr(cublas, "_ones", {})
    g = cuda_double.asarray(np.arange(12, dtype=np.float16).reshape(4, 3))
    first = cublas.column_sum(g, np.float32)
    other = types.ModuleType("another_cupy")  # the same arrays, another module object (as real CuPy is)
    other.__getattr__ = lambda name: getattr(cuda_double, name)
    monkeypatch.setattr(backend, "_cupy", other)
    second = cublas.column_sum(g, np.float32)
    assert len(cublas._ones) == 2 and {k[0] for k in cublas._ones} == {id(cuda_double), id(other)}
    np.testing.assert_array_equal(cuda_double.asnumpy(first), [18, 22, 26])
    np.testing.assert_array_equal(cuda_double.asnumpy(second), [18, 22, 26])


def test_the_double_refuses_what_cublas_refuses():
    """The double's cuBLAS stand-in fails on a type combination cublasGemmEx has not (so the
    engine's CPU suite cannot pass on a call a GPU would reject)."""
    from cupy_double.cublas import DoubleCublas

    with pytest.raises(AssertionError, match="does not take"):
        DoubleCublas().gemm(None, 0, 0, 1, 1, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 2, 1, 0, 1, 68, -1)


@pytest.mark.skipif(real_cupy() is None, reason="needs CuPy with a CUDA GPU")
def test_real_cublas_on_head_views():
    """The real cuBLAS call on the attention core's float16 views against float64 numpy, the
    poisoned output buffer checked for writes outside the view."""
    cp = real_cupy()
    assert cublas.available(), cublas.why_unavailable()
    rng = np.random.default_rng()
    b, s, h, d = 2, 33, 3, 16
    qkv = rng.standard_normal((b, s, h, 3 * d)).astype(np.float16)
    qkv_d = cp.asarray(qkv)
    q, k, v = (qkv_d[..., i * d:(i + 1) * d].transpose(0, 2, 1, 3) for i in range(3))
    scores = cp.full((b, h, s, s), np.nan, np.float16)
    assert cublas.gemm_batched(q, k.transpose(0, 1, 3, 2), scores)
    hq, hk, hv = (qkv[..., i * d:(i + 1) * d].transpose(0, 2, 1, 3).astype(np.float64) for i in range(3))
    want = hq @ hk.transpose(0, 1, 3, 2)
    got = cp.asnumpy(scores).astype(np.float64)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 2e-3
    ctx = cp.full((b, s, h, 2 * d), np.nan, np.float16)  # the output view covers half of it
    p = rng.standard_normal((b, h, s, s)).astype(np.float16)
    assert cublas.gemm_batched(cp.asarray(p), v, ctx[..., :d].transpose(0, 2, 1, 3))
    got = cp.asnumpy(ctx).astype(np.float64)
    want = (p.astype(np.float64) @ hv).transpose(0, 2, 1, 3)
    assert np.linalg.norm(got[..., :d] - want) / np.linalg.norm(want) < 2e-3
    assert np.isnan(got[..., d:]).all()


@pytest.mark.skipif(real_cupy() is None, reason="needs CuPy with a CUDA GPU")
def test_real_cublas_float16_operands_float32_output():
    """The real cublasGemmEx with float16 operands and a float32 output (a weight gradient)."""
    cp = real_cupy()
    assert cublas.available(), cublas.why_unavailable()
    rng = np.random.default_rng()
    g = rng.standard_normal((300, 48)).astype(np.float16)
    x = rng.standard_normal((300, 40)).astype(np.float16)
    out = cp.full((48, 40), np.nan, np.float32)
    assert cublas.gemm_batched(cp.asarray(g).T, cp.asarray(x), out)
    want = g.astype(np.float64).T @ x.astype(np.float64)
    assert np.abs(cp.asnumpy(out) - want).max() / np.abs(want).max() < 1e-5
    col = cublas.column_sum(cp.asarray(g), np.float32)
    want = g.astype(np.float64).sum(0)
    assert col.dtype == np.float32 and np.abs(cp.asnumpy(col) - want).max() / np.abs(want).max() < 1e-5
