"""Every fused CUDA kernel on a real GPU against its numpy reference (skipped without one).

The CPU suite checks each launcher through the strict CuPy double, which runs the numpy reference
on the memory the kernel would see: that proves the launch geometry and the arguments, not the
device code's arithmetic. Here the compiled kernels run on the GPU on fresh random inputs, odd and
real sizes, and are compared with the references by ||out - ref|| / ||ref|| (NVRTC contracts to
fused multiply-adds and flushes float32 denormals, so the last bits differ). The memory pool is
poisoned with NaN before each launch so that an element a kernel forgets to write fails the
check. The random-number kernels must give the references' bits.
"""
import math
import os

import numpy as np
import pytest

from engine import backend
from engine.kernels import adamw as ka
from engine.kernels import cross_entropy as kce
from engine.kernels import add, bias_add, cast, dropout_add, gelu, layer_norm, philox, softmax
from engine.kernels import flash_attention as flash
from engine.kernels import grad_norm as kgn
from engine.kernels import scatter_add
from gpu_helper import real_cupy


def _cupy_under_test():
    """Real CuPy with a GPU; or the CuPy double when the whole process runs on it
    (ENGINE_CUPY_DOUBLE=1, as tests/test_cuda_double_suite.py runs this file in CI), which checks
    the calls here, not the arithmetic; else None."""
    if os.environ.get("ENGINE_CUPY_DOUBLE") == "1":
        return backend.cupy()
    return real_cupy()


cp = _cupy_under_test()
# the double runs each kernel's numpy emulator, not its CUDA source (CUPY_DOUBLE_RUN_SOURCES=1 does)
EMULATED = os.environ.get("ENGINE_CUPY_DOUBLE") == "1" and os.environ.get("CUPY_DOUBLE_RUN_SOURCES") != "1"
pytestmark = pytest.mark.skipif(cp is None, reason="needs CuPy with a CUDA GPU (the CPU suite checks these "
                                                   "launchers through the CuPy double)")

# ||out - ref|| / ||ref|| allowed per dtype
REL = {np.float16: 2e-3, np.float32: 2e-6, np.float64: 1e-13}


def _rng():
    return np.random.default_rng()  # fresh inputs on every run


def _poison():
    """Fill the pool's free memory with NaN so that unwritten outputs show up."""
    pool = cp.get_default_memory_pool()
    junk = cp.full(64 * 2 ** 20 // 8, np.nan, np.float64)
    del junk  # returned to the pool, NaN inside: later empty() arrays are carved from it
    return pool


def _host(a):
    return None if a is None else cp.asnumpy(a)


def _dev(a):
    return None if a is None else cp.asarray(a)


def _rel(got, want, dtype, what, scale=0.0):
    """||got - want|| / max(||want||, scale) <= REL[dtype]; `scale` is the size of the terms that
    cancel into `want` where they can cancel to nothing."""
    got, want = np.asarray(_host(got), np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert not np.isnan(got).any() or np.array_equal(np.isnan(got), np.isnan(want)), f"{what}: NaN written"
    ok = ~np.isnan(want)
    denom = np.linalg.norm(want[ok])
    err = np.linalg.norm(got[ok] - want[ok]) / (max(denom, scale) or 1.0)
    assert err <= REL[dtype], f"{what} ({np.dtype(dtype).name}): relative error {err:.3e} > {REL[dtype]:g}"
    return err


DTYPES = [np.float16, np.float32, np.float64]


@pytest.mark.parametrize("dtype,y_dtype", [(t, t) for t in DTYPES] + [(np.float32, np.float16)],
                         ids=[np.dtype(t).name for t in DTYPES] + ["float32-half-y"])
@pytest.mark.parametrize("shape", [(7, 33), (3, 1), (64, 768), (17, 4097)])
@pytest.mark.parametrize("affine", [(True, True), (True, False), (False, False)])
def test_layer_norm(dtype, y_dtype, shape, affine):
    """Forward and backward against the references; float32 rows also with a float16 y and a
    float16 output gradient (layer_norm_into_autocast), whose dx, dw and db stay float32."""
    rng = _rng()
    m, d = shape
    x = (rng.standard_normal(shape) * 3 + 1.5).astype(dtype)
    w = rng.standard_normal(d).astype(dtype) if affine[0] else None
    b = rng.standard_normal(d).astype(dtype) if affine[1] else None
    g = rng.standard_normal(shape).astype(y_dtype)
    half_y = None if y_dtype == dtype else y_dtype
    want = layer_norm.forward_reference(x, w, b, 1e-5, half_y)
    _poison()
    got = layer_norm.forward_cuda(_dev(x), _dev(w), _dev(b), 1e-5, half_y)
    assert got[0].dtype == y_dtype
    for name, gv, wv in zip(("y", "mean", "rstd"), got, want):
        _rel(gv, wv, y_dtype if name == "y" else dtype, f"layer_norm {name}")
    want_b = layer_norm.backward_reference(g, x, *want[1:], w, b is not None)
    _poison()
    got_b = layer_norm.backward_cuda(_dev(g), _dev(x), got[1], got[2], _dev(w), b is not None)
    # dx = rstd * (g w - mean(g w) - xhat mean(g w xhat)) cancels to 0 for rows of one element:
    # measured against the size of rstd * g w (the kernel rounds g w once fused, once not)
    gw_scale = np.linalg.norm(want[2].astype(np.float64)[:, None] * g * (1 if w is None else w))
    for name, gv, wv in zip(("dx", "dw", "db"), got_b, want_b):
        if wv is None:
            assert gv is None
        else:
            assert gv.dtype == dtype, (name, gv.dtype)
            _rel(gv, wv, dtype, f"layer_norm {name}", gw_scale if name == "dx" else 0.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("key", ["rows", "mesh", "slices"])
def test_segment_add(dtype, key):
    """The deterministic scatter-add (engine.use_deterministic_algorithms): the bits of numpy's
    add.at, every value of a repeated target added in order and rounded to the element type;
    row keys (negatives wrapped), per-axis index arrays, and a key with slices."""
    rng = _rng()
    out = rng.standard_normal((7, 5, 3)).astype(dtype)
    if key == "rows":
        k = rng.integers(-7, 7, 40)
        vals = rng.standard_normal((40, 5, 3)).astype(dtype)
    elif key == "mesh":
        k = tuple(rng.integers(0, n, (6, 9)) for n in out.shape)
        vals = rng.standard_normal((6, 9)).astype(dtype)
    else:
        k = (slice(None), rng.integers(0, 5, 11))
        vals = rng.standard_normal((7, 11, 3)).astype(dtype)
    want = out.copy()
    np.add.at(want, k, vals)
    got = _dev(out)
    dev_key = tuple(_dev(a) if isinstance(a, np.ndarray) else a for a in k) if isinstance(k, tuple) else _dev(k)
    scatter_add.add_at_cuda(got, dev_key, _dev(vals))
    np.testing.assert_array_equal(_host(got), want)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int64, np.int8, np.bool_])
@pytest.mark.parametrize("key", ["rows", "mesh"])
def test_segment_store(dtype, key):
    """The deterministic indexed store: of a repeated target's values the last wins, as numpy's
    assignment leaves it (any dtype, moved as words of its size)."""
    rng = _rng()
    out = (rng.standard_normal((7, 5)) * 50).astype(dtype)
    if key == "rows":
        k = rng.integers(-7, 7, 30)
        vals = (rng.standard_normal((30, 5)) * 50).astype(dtype)
    else:
        k = tuple(rng.integers(0, n, (4, 8)) for n in out.shape)
        vals = (rng.standard_normal((4, 8)) * 50).astype(dtype)
    want = out.copy()
    want[k] = vals
    got = _dev(out)
    dev_key = tuple(_dev(a) for a in k) if isinstance(k, tuple) else _dev(k)
    scatter_add.store_at_cuda(got, dev_key, _dev(vals))
    np.testing.assert_array_equal(_host(got), want)
    # values read from the memory being written, many threads apart: copied first, as numpy does
    n = 4096
    big = (rng.standard_normal(n) * 50).astype(dtype)
    shift = np.concatenate([np.arange(1, n), [n - 1]])
    want = big.copy()
    want[shift] = big.copy()
    got = _dev(big)
    scatter_add.store_at_cuda(got, _dev(shift), got)
    np.testing.assert_array_equal(_host(got), want)


def _mask(rng, kind, shape):
    b, h, q, k = shape
    return {"none": None, "padding": rng.random((b, 1, 1, k)) < 0.3, "square": rng.random((1, 1, q, k)) < 0.3,
            "full": rng.random(shape) < 0.3, "additive": (rng.standard_normal((q, k)) * 2).astype(np.float32)}[kind]


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("shape", [(2, 3, 5, 9), (1, 2, 64, 64), (2, 1, 7, 1030)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kind", ["none", "padding", "square", "full", "additive"])
def test_scale_mask_softmax(dtype, shape, causal, kind):
    rng = _rng()
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    mask = _mask(rng, kind, shape)
    g = rng.standard_normal(shape).astype(dtype)
    want = softmax.forward_reference(x, mask, 0.7, -10000.0, causal)
    _poison()
    y = softmax.forward_cuda(_dev(x), _dev(mask), 0.7, -10000.0, causal)
    _rel(y, want, dtype, "softmax y")
    _poison()
    dx = softmax.backward_cuda(_dev(g), y, _dev(mask), 0.7, causal)
    _rel(dx, softmax.backward_reference(g, _host(y), mask, 0.7, causal), dtype, "softmax dx")


# dS = P * (dP - D) cancels to float32 rounding noise where a row's softmax is one-hot (a single
# unmasked key, or scores far apart at head size 128): dq and dk are then measured against the size
# of the terms that cancel, times this factor. Float32 sums leave ~1e-7 of that size; a wrong tile,
# key or scale leaves all of it.
CANCELLATION = 1e-3


def _flash_grad_terms(g4, qkv4, out4, lse, mask, scale, causal, dropout):
    """The norms of dq, dk and dv computed with every term of dS = P * (dP - D) taken by its size,
    P * (|dP| + |D|), and |q|, |k|: how large the terms are that cancel into dq and dk."""
    q, k, v, z, off = flash._scores(qkv4, mask, scale, -10000.0, causal)
    q, k, v = (t.astype(np.float64) for t in (q, k, v))
    go = g4.astype(np.float64).transpose(0, 2, 1, 3)
    p = np.exp(z.astype(np.float64) - lse[..., None])
    keep = flash.keep_factors(z.shape, dropout)
    dsum = (go * out4.astype(np.float64).transpose(0, 2, 1, 3)).sum(-1)
    ds = np.where(off, 0.0, p * (np.abs(go @ v.transpose(0, 1, 3, 2)) * keep + np.abs(dsum)[..., None]))
    dv = (p * keep).transpose(0, 1, 3, 2) @ np.abs(go)
    return [np.linalg.norm(t) for t in (ds @ np.abs(k) * scale, ds.transpose(0, 1, 3, 2) @ np.abs(q) * scale, dv)]


@pytest.mark.parametrize("d", [32, 64, 80, 128])  # 80: the fused backward's largest head size
@pytest.mark.parametrize("shape", [(2, 3, 5), (1, 2, 64), (2, 2, 200), (1, 12, 1024)])  # b, heads, s
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kind", ["none", "padding", "square", "full"])
@pytest.mark.parametrize("p", [0.0, 0.2])
def test_flash_attention(d, shape, causal, kind, p):
    b, heads, s = shape
    if s == 1024 and (d != 64 or kind in ("full", "square")):
        pytest.skip("the GPT-2 124M shape is checked at its own head size, with the masks it uses")
    if p and kind in ("full", "square"):
        pytest.skip("dropout is checked without a mask and with padding (fully masked rows dropped too)")
    if s == 1024 and EMULATED and not (causal and kind == "none" and p):
        pytest.skip("through the double's emulators the GPT-2 shape checks the launch geometry once (GPT-2's "
                    "causal dropout case); the arithmetic at this size is checked on a GPU")
    rng = _rng()
    dropout = (p, int(rng.integers(2 ** 63)), int(rng.integers(2 ** 40))) if p else None
    qkv = (rng.standard_normal((b, s, heads, 3 * d)) * 1.5).astype(np.float16)
    mask = None if kind == "none" else _mask(rng, kind, (b, heads, s, s))
    if kind == "padding":
        mask[0] = True  # a batch row with every key masked: uniform rows
    g = rng.standard_normal((b, s, heads, d)).astype(np.float16)
    want_out, want_lse = flash.forward_reference(qkv, mask, 0.7, -10000.0, causal, dropout)
    _poison()
    out, lse = flash.forward_cuda(_dev(qkv), _dev(mask), 0.7, -10000.0, causal, dropout)
    _rel(out, want_out, np.float16, "flash ctx")
    np.testing.assert_allclose(_host(lse), want_lse, rtol=1e-4, atol=1e-3)
    _poison()
    dqkv, dsum = flash.backward_cuda(_dev(g), _dev(qkv), out, lse, _dev(mask), 0.7, -10000.0, causal, dropout)
    want_dqkv, want_dsum = flash.backward_reference(g, qkv, _host(out), _host(lse), mask, 0.7, -10000.0, causal,
                                                    dropout)
    terms = _flash_grad_terms(g, qkv, _host(out), _host(lse), mask, 0.7, causal, dropout)
    for i, part in enumerate("qkv"):
        _rel(_host(dqkv)[..., i * d:(i + 1) * d], want_dqkv[..., i * d:(i + 1) * d], np.float16, f"flash d{part}",
             scale=CANCELLATION * terms[i])
    np.testing.assert_allclose(_host(dsum), want_dsum, rtol=2e-3, atol=2e-3)
    if d <= flash.FUSED_MAX_HEAD_SIZE:  # the fused backward (dq by float32 atomics) on the same output
        _poison()
        dqkv, dsum = flash.backward_cuda(_dev(g), _dev(qkv), out, lse, _dev(mask), 0.7, -10000.0, causal, dropout,
                                         fused=True)
        for i, part in enumerate("qkv"):
            _rel(_host(dqkv)[..., i * d:(i + 1) * d], want_dqkv[..., i * d:(i + 1) * d], np.float16,
                 f"fused flash d{part}", scale=CANCELLATION * terms[i])
        np.testing.assert_allclose(_host(dsum), want_dsum, rtol=2e-3, atol=2e-3)


def _laid_out(a, layout):
    """`a` on the device: C-contiguous ("rows"), starting one element into its memory
    ("unaligned", the raw kernels' one-element path) or transposed ("strided", the ElementwiseKernel)."""
    if layout == "strided":
        return _dev(np.ascontiguousarray(a.T)).T
    if layout == "unaligned":
        dev = cp.empty(a.size + 1, a.dtype)[1:].reshape(a.shape)
        dev[...] = _dev(a)
        return dev
    return _dev(a)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("shape,layout", [((33, 3072), "rows"), ((5, 1031), "rows"), ((9, 64), "unaligned"),
                                          ((33, 96), "strided")], ids=["16B-rows", "odd-rows", "unaligned", "strided"])
def test_bias_gelu(dtype, approximate, with_bias, shape, layout):
    rng = _rng()
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    bias = rng.standard_normal(shape[-1]).astype(dtype) if with_bias else None
    g = rng.standard_normal(x.shape).astype(dtype)
    _poison()
    _rel(gelu.gelu_cuda(_laid_out(x, layout), _dev(bias), approximate), gelu.gelu_reference(x, bias, approximate),
         dtype, "gelu")
    _poison()
    _rel(gelu.gelu_grad_cuda(_laid_out(g, layout), _laid_out(x, layout), _dev(bias), approximate),
         gelu.gelu_grad_reference(g, x, bias, approximate), dtype, "gelu grad")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,layout", [((9, 1024), "rows"), ((33, 3072), "rows"), ((7, 1031), "rows"),
                                          ((5, 64), "unaligned"), ((1, 8), "rows")],
                         ids=["16B-rows", "gpt2-fc", "odd-rows", "unaligned", "one-row"])
def test_bias_add(dtype, shape, layout):
    """In place; the 16-byte path (rows of a multiple of 16 bytes, aligned) and the one-element
    path (odd rows, an array starting one element into its memory) give the reference's bits: one
    rounding of the sum computed in the accumulation type."""
    rng = _rng()
    y = (rng.standard_normal(shape) * 3).astype(dtype)
    b = rng.standard_normal(shape[-1]).astype(dtype)
    want = bias_add.bias_add_reference(y, b)
    dev, db = _laid_out(y, layout), _dev(b)
    assert bias_add.chunked(dev, db) == (layout == "rows" and shape[-1] * np.dtype(dtype).itemsize % 16 == 0)
    assert bias_add.bias_add_cuda_(dev, db) is dev
    np.testing.assert_array_equal(_host(dev), want)


@pytest.mark.parametrize("dtypes", [(np.float16, np.float16), (np.float32, np.float32), (np.float64, np.float64),
                                    (np.float32, np.float16)], ids=["half", "float", "double", "float+half"])
@pytest.mark.parametrize("shape,layout", [((64, 768), "rows"), ((3, 1031), "rows"), ((5, 64), "unaligned"),
                                          ((7,), "rows")], ids=["chunks", "odd", "unaligned", "short"])
def test_add(dtypes, shape, layout):
    """a + b of one shape, of one dtype or float32 + float16: numpy's bits (the sum computed in
    the accumulation type, rounded once to a's dtype: numpy's promotion) on the vector path and
    the one-element path; inf and NaN kept."""
    rng = _rng()
    a, b = [(rng.standard_normal(shape) * 1e2).astype(dt) for dt in dtypes]
    a.reshape(-1)[:3] = [np.inf, np.nan, -np.inf][:a.size]
    b.reshape(-1)[-1:] = np.inf
    da, db = _dev(a), _laid_out(b, layout)
    want = add.add_reference(a, b)
    _poison()
    got = add.add_cuda(da, db)
    assert got.dtype == dtypes[0] and got.flags.c_contiguous
    assert add.chunked(da, db, got) == (layout == "rows" and a.nbytes % 16 == 0)
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(_host(got), want)
        np.testing.assert_array_equal(want, a + b)  # the reference is numpy's add


@pytest.mark.parametrize("src,dst", [(np.float32, np.float16), (np.float16, np.float32)], ids=["to-half", "to-float"])
@pytest.mark.parametrize("shape,layout", [((64, 768), "rows"), ((3, 1031), "rows"), ((5, 64), "unaligned"),
                                          ((7,), "rows")], ids=["groups-of-8", "odd", "unaligned", "short"])
def test_cast(src, dst, shape, layout):
    """numpy's astype bit for bit: round to nearest even, overflow to inf, NaN kept, subnormal
    halves exact; on the 8-element path and the one-element path."""
    rng = _rng()
    x = (rng.standard_normal(shape) * 1e3).astype(src)
    flat = x.reshape(-1)
    flat[:4] = [np.nan, np.inf, 7e4 if src == np.float32 else -np.inf, 3e-6][:flat.size]  # overflow, subnormal
    dev = _laid_out(x, layout)
    _poison()
    got = cast.cast_cuda(dev, dst)
    assert got.dtype == dst and got.flags.c_contiguous
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(_host(got), x.astype(dst))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", [0.0, 0.1, 0.5])
@pytest.mark.parametrize("parts", [(True, True), (False, True), (False, False)])
def test_bias_dropout_add(dtype, p, parts):
    rng = _rng()
    shape = (9, 1031)
    x = rng.standard_normal(shape).astype(dtype)
    bias = rng.standard_normal(shape[-1]).astype(dtype) if parts[0] else None
    res = rng.standard_normal(shape).astype(dtype) if parts[1] else None
    seed, offset = int(rng.integers(2 ** 63)), int(rng.integers(1000)) * 4
    want = dropout_add.bias_dropout_add_reference(x, bias, res, p, seed, offset)
    _poison()
    got = dropout_add.bias_dropout_add_cuda(_dev(x), _dev(bias), _dev(res), p, seed, offset)
    _rel(got, want, dtype, "bias_dropout_add")
    keep = dropout_add.scaled_mask(shape, dtype, p, seed, offset) != 0
    if res is None:  # the same elements dropped as the reference's (the Philox bits agree)
        np.testing.assert_array_equal(_host(got) != 0, want != 0)
        assert not (want != 0)[~keep].any()
    g = rng.standard_normal(shape).astype(dtype)
    _poison()
    _rel(dropout_add.dropout_grad_cuda(_dev(g), p, seed, offset),
         dropout_add.dropout_grad_reference(g, p, seed, offset), dtype, "dropout grad")


@pytest.mark.parametrize("kind", ["uniform_float", "uniform_double", "normal_float", "normal_double"])
@pytest.mark.parametrize("n", [1, 5, 4099, 1 << 20])
def test_philox_streams(kind, n):
    rng = _rng()
    seed, offset = int(rng.integers(2 ** 63)), int(rng.integers(1 << 20)) * 4
    got, want = _host(philox.draw(cp, kind, n, seed, offset)), philox.reference(kind, n, seed, offset)
    if kind.startswith("uniform"):
        np.testing.assert_array_equal(got, want)  # the integer bits and their scaling: exact
    else:  # log, sqrt and sincospi round differently: a few ulp
        np.testing.assert_allclose(got, want, rtol=4 * np.finfo(want.dtype).eps, atol=4 * np.finfo(want.dtype).eps)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c", [1, 37, 64, 1030, 50304])  # 64, 50304: 8 logits per thread and step
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy(dtype, c, smoothing):
    rng = _rng()
    m = 16 if c > 1000 else 33
    x = (rng.standard_normal((m, c)) * 3).astype(dtype)
    t = rng.integers(0, c, m)
    t[1] = -100
    t[2] = c + 3  # out of range: a NaN loss, on the device as in the reference
    want_loss, want_stats = kce.cross_entropy_fwd_numpy(x, t, -100, smoothing)
    want_dunit = kce.cross_entropy_dunit_numpy(x, want_stats, t, -100, smoothing)
    _poison()
    loss, stats = kce.cross_entropy_fwd_cuda(_dev(x), _dev(t), -100, smoothing)
    acc = np.float64 if dtype == np.float64 else np.float32
    _rel(loss, want_loss, acc, "cross-entropy loss")
    _rel(stats, want_stats, acc, "cross-entropy row statistics")
    scale = rng.standard_normal(m).astype(want_dunit.dtype)
    for sc in (scale, scale[:1]):
        _poison()
        _rel(kce.cross_entropy_bwd_rows_cuda(_dev(x), stats, _dev(t), _dev(sc), -100, smoothing, dtype),
             kce.cross_entropy_bwd_numpy(want_dunit, sc, dtype), dtype, "cross-entropy dx")
        _poison()
        _rel(kce.cross_entropy_bwd_cuda(_dev(want_dunit), _dev(sc), dtype),
             kce.cross_entropy_bwd_numpy(want_dunit, sc, dtype), dtype, "cross-entropy dx from dunit (vocab-parallel)")
    # vocab-parallel phases on two shards of the classes
    m_row = x.astype(acc).max(axis=1)
    half = max(1, c // 2)
    stats = sum(kce.vocab_stats_cuda(_dev(x[:, s:e]), _dev(m_row), _dev(t), s) for s, e in ((0, half), (half, c)))
    want_stats = sum(kce.vocab_stats_numpy(x[:, s:e], m_row, t, s) for s, e in ((0, half), (half, c)))
    _rel(stats, want_stats, acc, "vocab stats")
    for s, e in ((0, half), (half, c)):
        got = kce.vocab_loss_cuda(_dev(x[:, s:e]), _dev(m_row), stats, _dev(t), s, c, -100, smoothing)
        want = kce.vocab_loss_numpy(x[:, s:e], m_row, want_stats, t, s, c, -100, smoothing)
        _rel(got[0], want[0], acc, "vocab loss")
        _rel(got[1], want[1], acc, "vocab unit gradient")


SHAPES = [(3, 5), (7,), (1,), (65, 129), (1000, 33), (2, 3, 4), (4097,), (12, 768)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("amsgrad", [False, True])
def test_multi_tensor_adam(dtype, amsgrad):
    rng = _rng()

    def params(scale=1.0, positive=False):
        out = [(rng.standard_normal(s) * scale).astype(dtype) for s in SHAPES]
        return [np.abs(a) for a in out] if positive else out

    host = [params(), params(), params(0.1), params(0.01, True), params(0.01, True) if amsgrad else None]
    dev = [None if col is None else [_dev(a) for a in col] for col in host]
    # autocast's float16 copies for every other parameter, poisoned: the kernel must write them all
    halves = [cp.full(s, cp.nan, cp.float16) if i % 2 else None for i, s in enumerate(SHAPES)]
    for step in (1, 2, 3):
        hyper = ka.AdamHyper(1e-2, 0.9, 0.999, 1e-8, 0.1, step, step != 2, step != 3, step == 2)
        ka.adam_update_numpy(*host, hyper)
        ka.adam_update_cuda(*dev, hyper, halves)
        for name, hs, ds in zip(("param", "grad", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"), host, dev):
            for a, b in zip(hs or [], ds or []):
                _rel(b, a, dtype, f"adam {name} step {step}")
        for p, half in zip(dev[0], halves):
            if half is not None:  # exactly the parameter the kernel stored, rounded once
                np.testing.assert_array_equal(cp.asnumpy(half).view(np.uint16),
                                              cp.asnumpy(p.astype(cp.float16)).view(np.uint16))


def test_multi_tensor_adam_skips_on_the_device_flag():
    """A set flag (the GradScaler's inf/nan) leaves parameters and moments bit for bit, and
    writes the float16 copies from the parameters; a clear one updates as the reference."""
    rng = _rng()
    cols = [[(rng.standard_normal(s) * 0.1).astype(np.float32) for s in SHAPES] for _ in range(4)]
    cols[3] = [np.abs(a) for a in cols[3]]
    hyper = ka.AdamHyper(1e-2, 0.9, 0.999, 1e-8, 0.1, 4, True, True, False)
    for found in (1.0, 0.0):
        host = [[a.copy() for a in col] for col in cols]
        dev = [[_dev(a) for a in col] for col in cols]
        halves = [cp.full(s, cp.nan, cp.float16) for s in SHAPES]
        ka.adam_update_numpy(*host, None, hyper)
        ka.adam_update_cuda(*dev, None, hyper, halves, _dev(np.asarray(found, np.float32)))
        for col, hcol, orig in zip(dev, host, cols):
            for b, a, o in zip(col, hcol, orig):
                if found:
                    np.testing.assert_array_equal(_host(b), o)
                else:
                    _rel(b, a, np.float32, "adam with a clear flag")
        for p, half in zip(dev[0], halves):
            np.testing.assert_array_equal(_host(half).view(np.uint16), _host(p.astype(cp.float16)).view(np.uint16))


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, math.inf])
@pytest.mark.parametrize("acc", [np.float32, np.float64])
def test_multi_tensor_grad_norm_and_clip(norm_type, acc):
    rng = _rng()
    host = [(rng.standard_normal(s) * 0.3).astype(dt) for s, dt in zip(SHAPES, [np.float32, np.float16] * 4)]
    dev = [_dev(a) for a in host]
    for root in (True, False):
        got = kgn.grad_norm_cuda(dev, norm_type, acc, root)
        _rel(got, kgn.grad_norm_numpy(host, norm_type, acc, root), acc, f"grad norm root={root}")
    total = kgn.grad_norm_numpy(host, norm_type, acc)
    kgn.scale_grads_cuda(dev, _dev(total), 0.25)
    kgn.scale_grads_numpy(host, total, 0.25)
    for a, b in zip(host, dev):
        _rel(b, a, a.dtype.type, "clipped gradient")


@pytest.mark.parametrize("bad", [None, np.inf, np.nan])
def test_multi_tensor_unscale(bad):
    """The GradScaler's unscale: numpy's bits for every dtype, 1 / scale read on the device and
    the flag raised on the device where a result is not finite (never cleared)."""
    rng = _rng()
    host = [(rng.standard_normal(s) * 300).astype(dt) for s, dt in zip(SHAPES, [np.float32, np.float16, np.float64] * 3)]
    if bad is not None:
        host[1].reshape(-1)[-1] = bad
    dev = [_dev(a) for a in host]
    scale, found = np.float32(2.0 ** 13 * 3), np.zeros((), np.float32)
    dev_found = cp.zeros((), dtype=cp.float32)
    kgn.unscale_grads_cuda(dev, _dev(np.asarray(scale)), dev_found)
    kgn.unscale_grads_numpy(host, scale, found)
    for a, b in zip(host, dev):
        np.testing.assert_array_equal(_host(b), a)
    assert float(_host(dev_found)) == float(found) == (0.0 if bad is None else 1.0)


def test_loss_scale_update_kernel():
    """engine_amp_update_scale against next_scale: backoff, a clean step, growth at the interval,
    a growth that would overflow float32 (kept), all on the device."""
    from engine.kernels import loss_scale as kls

    for scale, tracker, found in [(65536.0, 0, 1.0), (65536.0, 0, 0.0), (3.3, 2, 0.0), (3.0e38, 2, 0.0),
                                  (3.3, 1, 1.0)]:
        s, t = _dev(np.asarray(scale, np.float32)), _dev(np.asarray(tracker, np.int32))
        kls.update_scale_cuda(s, t, _dev(np.asarray(found, np.float32)), 2.0, 0.5, 3)
        want = kls.next_scale(scale, tracker, found != 0.0, 2.0, 0.5, 3)
        assert (float(_host(s)), int(_host(t))) == want, (scale, tracker, found)
