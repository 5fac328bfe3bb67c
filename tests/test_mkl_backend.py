"""engine.backend.mkl (MKL's gemm and vector math through ctypes) against numpy, the reference.

Every MKL entry point either computes exactly what numpy computes (to rounding) or declines
(returns False) so that numpy does it: odd layouts, dtypes and sizes are the inputs here."""
import os
import platform
import subprocess
import sys

import numpy as np
import pytest
import scipy.special

from engine.backend import mkl, parallel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
rng = np.random.default_rng(0)


def test_mkl_is_in_use_where_it_is_a_dependency():
    if platform.machine() == "x86_64" and sys.platform == "linux":
        assert mkl.available(), mkl.why_unavailable()
        assert mkl.why_unavailable() is None
    else:  # pragma: no cover - other machines run on numpy alone
        assert not mkl.available() and mkl.why_unavailable()


needs_mkl = pytest.mark.skipif(not mkl.available(), reason=f"MKL not in use: {mkl.why_unavailable()}")


def _layouts(rows, cols, dtype):
    """The same matrix as C-ordered, F-ordered, a row-strided slice and a column-strided slice."""
    base = rng.standard_normal((rows, cols)).astype(dtype)
    wide = np.zeros((rows, cols + 3), dtype)
    wide[:, 1:cols + 1] = base
    tall = np.zeros((rows * 2, cols), dtype)
    tall[::2] = base
    return {"C": base, "F": np.asfortranarray(base), "rowslice": wide[:, 1:cols + 1],
            "every-other-row": tall[::2]}


def _tol(dtype, k):
    return (1e-5 if dtype == np.float32 else 1e-12) * max(1, k) ** 0.5


@needs_mkl
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m,k,n", [(7, 5, 3), (1, 9, 4), (6, 1, 5), (4, 8, 1), (65, 130, 33)])
def test_gemm_matches_numpy_on_every_layout(dtype, m, k, n):
    for la, a in _layouts(m, k, dtype).items():
        for lb, b in _layouts(k, n, dtype).items():
            want = a.astype(np.float64) @ b.astype(np.float64)
            out = np.full((m, n), np.nan, dtype)
            assert mkl.gemm(a, b, out), (la, lb)  # every layout here has a unit stride
            np.testing.assert_allclose(out, want, rtol=_tol(dtype, k), atol=_tol(dtype, k), err_msg=f"{la} @ {lb}")


@needs_mkl
def test_gemm_writes_into_a_slice_of_a_bigger_output():
    a = rng.standard_normal((6, 4)).astype(np.float32)
    b = rng.standard_normal((4, 10)).astype(np.float32)
    out = np.zeros((6, 10), np.float32)
    assert mkl.gemm(a, b[:, 3:7], out[:, 3:7])  # a column block: row stride 10, unit column stride
    np.testing.assert_allclose(out[:, 3:7], a @ b[:, 3:7], rtol=1e-5, atol=1e-5)
    assert not out[:, :3].any() and not out[:, 7:].any()


@needs_mkl
def test_gemm_declines_what_it_cannot_take():
    f32 = rng.standard_normal((4, 4)).astype(np.float32)
    out = np.empty((4, 4), np.float32)
    assert not mkl.gemm(f32[::2, ::2], f32[:2], out[:2, :2])  # no unit stride in a
    assert not mkl.gemm(f32, f32.astype(np.float64), out)  # mixed dtypes
    ints = np.ones((4, 4), np.int64)
    assert not mkl.gemm(ints, ints, ints.copy())
    assert not mkl.gemm(f32, f32, np.empty((4, 4), np.float32, order="F"))  # output not row-major
    assert not mkl.gemm(np.empty((0, 4), np.float32), f32, np.empty((0, 4), np.float32))


@needs_mkl
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gemm_batched_contiguous_permuted_and_declined(dtype):
    a = rng.standard_normal((3, 5, 7, 4)).astype(dtype)
    b = rng.standard_normal((3, 5, 4, 6)).astype(dtype)
    out = np.empty((3, 5, 7, 6), dtype)
    assert mkl.gemm_batched(a, b, out)
    np.testing.assert_allclose(out, np.matmul(a, b), rtol=_tol(dtype, 4), atol=_tol(dtype, 4))
    # per-head views of a [batch, seq, heads, dim] array: the batch axes do not merge
    qkv = rng.standard_normal((3, 7, 5, 12)).astype(dtype)
    q = qkv[..., :4].transpose(0, 2, 1, 3)  # [3, 5, 7, 4]
    k_t = qkv[..., 4:8].transpose(0, 2, 3, 1)  # [3, 5, 4, 7]
    out = np.empty((3, 5, 7, 7), dtype)
    assert mkl.gemm_batched(q, k_t, out)
    np.testing.assert_allclose(out, np.matmul(q, k_t), rtol=_tol(dtype, 4), atol=_tol(dtype, 4))
    # one matrix repeated along the batch (stride 0), read many times: fine
    rep = np.broadcast_to(b[0, 0], (3, 5, 4, 6))
    out = np.empty((3, 5, 7, 6), dtype)
    assert mkl.gemm_batched(a, rep, out)
    np.testing.assert_allclose(out, np.matmul(a, rep), rtol=_tol(dtype, 4), atol=_tol(dtype, 4))
    # per-head parts of one [batch, seq, heads, dim] output: interleaved but disjoint matrices
    ctx = np.full((3, 7, 5, 6), np.nan, dtype)
    assert mkl.gemm_batched(a, b, ctx.transpose(0, 2, 1, 3))
    np.testing.assert_allclose(ctx.transpose(0, 2, 1, 3), np.matmul(a, b), rtol=_tol(dtype, 4), atol=_tol(dtype, 4))
    # a broadcast output would be written several times: declined
    assert not mkl.gemm_batched(a, b, np.broadcast_to(np.empty((7, 6), dtype), (3, 5, 7, 6)))


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_parallel_matmul_equals_numpy(threads):
    """The engine's split product (MKL pieces where in use) against one numpy product."""
    before = parallel.get_num_threads()
    parallel.set_num_threads(threads)
    try:
        cases = [((300, 200), (200, 180)), ((64, 300), (300, 512)), ((8, 6, 70, 33), (8, 6, 33, 70)),
                 ((5, 90, 80), (80, 100)), ((2, 1, 40, 50), (3, 50, 60)), ((257, 129), (129, 1)),
                 ((1300, 96), (96, 100))]  # thin: blocks of THIN_ROWS rows, the last one short
        for sa, sb in cases:
            for dtype in (np.float32, np.float64):
                a = rng.standard_normal(sa).astype(dtype)
                b = rng.standard_normal(sb).astype(dtype)
                got = parallel.matmul(a, b)
                want = np.matmul(a.astype(np.float64), b.astype(np.float64))
                assert got.shape == want.shape and got.dtype == dtype
                tol = _tol(dtype, sa[-1])
                np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=f"{sa} @ {sb} {dtype}")
                bt = np.swapaxes(np.ascontiguousarray(np.swapaxes(b, -1, -2)), -1, -2)  # transposed layout
                np.testing.assert_allclose(parallel.matmul(a, bt), want, rtol=tol, atol=tol)
        ints = rng.integers(-5, 5, (40, 30))
        assert np.array_equal(parallel.matmul(ints, ints.T), ints @ ints.T)
    finally:
        parallel.set_num_threads(before)


@needs_mkl
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_vector_math_matches_the_references(dtype):
    x = np.concatenate([rng.standard_normal(5000) * 4, [0.0, -0.0, 40.0, -40.0, 1e-30, np.inf, -np.inf, np.nan]])
    x = x.astype(dtype)
    refs = {"CdfNorm": scipy.special.ndtr, "Erf": scipy.special.erf, "Exp": np.exp, "Tanh": np.tanh}
    for name, ref in refs.items():
        out = np.empty_like(x)
        with np.errstate(over="ignore"):
            want = ref(x.astype(np.float64))
            assert mkl.vml(name, x, out)
        finite = np.isfinite(want)
        rtol = 3e-7 if dtype == np.float32 else 1e-14
        np.testing.assert_allclose(out[finite], want[finite], rtol=rtol, atol=rtol * 1e-3, err_msg=name)
        assert np.array_equal(np.isnan(out), np.isnan(want)), name
        assert np.array_equal(out[np.isinf(want)], want[np.isinf(want)]), name
    out = np.empty(10, dtype)
    assert not mkl.vml("Exp", x[:20:2], out)  # not contiguous: numpy's turn
    assert not mkl.vml("Exp", np.zeros(10, np.float16), np.zeros(10, np.float16))
    assert mkl.vml("Exp", x[:0], out[:0])


def test_gelu_with_and_without_mkl_agree():
    """The numpy GELU kernel (ENGINE_MKL=0, the reference) and the MKL one, through the engine
    (the compiled kernels off: they take float32 GELU where numba is installed)."""
    code = ("import numpy as np, engine as flow; from engine.backend import mkl; "
            "x = np.random.default_rng(1).standard_normal(300000).astype(np.float32) * 3; "
            "t = flow.tensor(x, requires_grad=True); y = flow.nn.functional.gelu(t); y.sum().backward(); "
            "np.save(__import__('sys').argv[1], np.stack([y.detach().numpy(), t.grad.numpy()])); "
            "print('mkl', mkl.available(), mkl.why_unavailable())")
    results = {}
    for flag in ("1", "0"):
        path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"gelu_mkl{flag}_{os.getpid()}.npy")
        env = dict(os.environ, ENGINE_MKL=flag, ENGINE_JIT="0", PYTHONPATH=ROOT)
        r = subprocess.run([sys.executable, "-c", code, path], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        results[flag] = (np.load(path), r.stdout)
        os.unlink(path)
    assert "mkl False turned off by ENGINE_MKL=0" in results["0"][1]
    x = (np.random.default_rng(1).standard_normal(300000).astype(np.float32) * 3).astype(np.float64)
    cdf = scipy.special.ndtr(x)
    exact = np.stack([x * cdf, cdf + x * np.exp(-x * x / 2) / np.sqrt(2 * np.pi)])  # float64 truth
    # MKL's normal CDF is accurate to a float32 ulp everywhere, the far tail included; the
    # gradient Phi + x phi cancels near x = -0.75, where float32 leaves ~1e-7 absolute
    np.testing.assert_allclose(results["1"][0][0], exact[0], rtol=2e-6, atol=1e-30)
    np.testing.assert_allclose(results["1"][0][1], exact[1], rtol=2e-6, atol=1e-7)
    # the numpy kernel's erf fit is good to 1.4e-7 absolute (docstring of engine.ops.unary), so
    # x * Phi(x) to ~|x| * 0.7e-7 where Phi is tiny (x < -5)
    np.testing.assert_allclose(results["0"][0], exact, rtol=2e-6, atol=5e-7)


def test_thin_products_run_in_row_blocks_with_the_same_bits_on_any_thread_count():
    """A thin product (short inner dimension, narrow result, many rows) is one BLAS call per block
    of THIN_ROWS rows, so its bits do not depend on how many threads took the blocks; the bias
    is added to each block."""
    assert parallel._thin_rows(16384, 96, 384) == parallel.THIN_ROWS
    assert parallel._thin_rows(16384, 384, 96) is None  # deep: one call per thread, as before
    assert parallel._thin_rows(16384, 96, 1536) is None  # wide
    assert parallel._thin_rows(2 * parallel.THIN_ROWS - 1, 96, 384) is None  # too few rows
    a = rng.standard_normal((3 * parallel.THIN_ROWS + 77, 96)).astype(np.float32)
    b = rng.standard_normal((96, 288)).astype(np.float32)
    bias = rng.standard_normal(288).astype(np.float32)
    results = []
    calls = []
    real = parallel._product_into

    def counted(x, y, out):
        calls.append(x.shape[0])
        real(x, y, out)

    before = parallel.get_num_threads()
    try:
        parallel._product_into = counted
        for threads in (1, 2, 3):
            parallel.set_num_threads(threads)
            calls.clear()
            results.append(parallel.matmul(a, b, bias))
            assert sorted(calls) == sorted([parallel.THIN_ROWS] * 3 + [77]), (threads, calls)
    finally:
        parallel._product_into = real
        parallel.set_num_threads(before)
    assert all(np.array_equal(results[0], x) for x in results[1:])
    want = np.matmul(a.astype(np.float64), b.astype(np.float64)) + bias
    np.testing.assert_allclose(results[0], want, rtol=_tol(np.float32, 96), atol=_tol(np.float32, 96))
