"""Flash attention (engine/kernels/flash_attention.py) checked without a GPU, in three layers:

1. the numpy references against PyTorch, forward and backward;
2. the CUDA source itself run on CPU threads (tests/cuda_on_cpu) against the references, with
   NaN-poisoned outputs, odd sequence lengths, every kind of mask and fully masked rows;
3. the op (packed_qkv_attention with FLASH_ATTENTION_ON_GPU) through the CuPy double against
   the unfused cuBLAS + fused-softmax path, forward and backward, under fp16 autocast; with
   dropout, from the same generator state (the kernels drop the elements the unfused core drops).

The same kernels on a real GPU: tests/test_fused_kernels_gpu.py::test_flash_attention.
"""
import numpy as np
import pytest
import torch

import engine as flow
from engine.kernels import flash_attention as fa
from engine.ops import attention as A

SCALE, FILL = 0.3, -10000.0
DROPOUT = (0.3, 2 ** 40 + 123, 7)  # p, a seed with high bits, an offset not at a row's start


def _mask(rng, kind, b, heads, s):
    """A bool mask (True = masked) broadcastable to [b, heads, s, s], or None."""
    if kind == "none":
        return None
    if kind == "padding":  # [b, 1, 1, s]; batch row 0 has every key masked (uniform rows)
        m = rng.random((b, 1, 1, s)) < 0.3
        m[0] = True
        return m
    if kind == "square":  # [s, s], broadcast over batch and heads
        return rng.random((s, s)) < 0.4
    return rng.random((b, heads, s, s)) < 0.4  # "full"


def _qkv(rng, b, s, heads, d):
    return (rng.standard_normal((b, s, heads, 3 * d)) * 1.5).astype(np.float16)


def _rel(got, want, what, tol=2e-3):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert np.isfinite(got).all(), f"{what}: non-finite values (an element left unwritten?)"
    err = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)
    assert err <= tol, f"{what}: ||got - want|| / ||want|| = {err:.3g} > {tol}"


# ------------------------------------------------------------------ 1. references against torch
def _torch_attention(qkv, mask, causal, g, keep=1.0):
    b, s, heads, d3 = qkv.shape
    d = d3 // 3
    t = torch.tensor(qkv.astype(np.float32), requires_grad=True)
    q, k, v = (t[..., i * d:(i + 1) * d].permute(0, 2, 1, 3) for i in range(3))
    z = q @ k.transpose(-1, -2) * SCALE
    off = torch.zeros(s, s, dtype=torch.bool)
    if causal:
        off = torch.ones(s, s, dtype=torch.bool).triu(1)
    if mask is not None:
        off = off | torch.tensor(mask)
    z = z.masked_fill(off, FILL)
    ctx = ((torch.softmax(z, -1) * torch.as_tensor(keep)) @ v).permute(0, 2, 1, 3)
    ctx.backward(torch.tensor(g.astype(np.float32)))
    return ctx.detach().numpy(), torch.logsumexp(z, -1).detach().numpy(), t.grad.numpy()


@pytest.mark.parametrize("kind", ["none", "padding", "square", "full"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dropout", [None, DROPOUT], ids=["no_dropout", "dropout"])
def test_references_match_torch(kind, causal, dropout):
    rng = np.random.default_rng(0)
    b, s, heads, d = 2, 9, 3, 16
    qkv = _qkv(rng, b, s, heads, d)
    mask = _mask(rng, kind, b, heads, s)
    g = rng.standard_normal((b, s, heads, d)).astype(np.float16)
    keep = fa.keep_factors((b, heads, s, s), dropout)
    want_ctx, want_lse, want_dqkv = _torch_attention(qkv, mask, causal, g, keep)
    ctx, lse = fa.forward_reference(qkv, mask, SCALE, FILL, causal, dropout)
    _rel(ctx, want_ctx, "ctx")
    np.testing.assert_allclose(lse, want_lse, rtol=1e-5, atol=1e-4)
    dqkv, dsum = fa.backward_reference(g, qkv, ctx, lse, mask, SCALE, FILL, causal, dropout)
    _rel(dqkv, want_dqkv, "dqkv")
    np.testing.assert_allclose(dsum, (g.astype(np.float32) * ctx.astype(np.float32)).sum(-1).transpose(0, 2, 1),
                               rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ 2. the CUDA source on CPU threads
@pytest.fixture(scope="module")
def cpu_kernels():
    from cuda_on_cpu import compile_kernels
    cache = {}

    def get(d, m_tiles=None):
        if (d, m_tiles) not in cache:
            cache[d, m_tiles] = compile_kernels(fa.source(d, m_tiles))
        return cache[d, m_tiles]

    return get


def _run_source(kernels, qkv, mask, causal, g, dropout, m_tiles=None):
    """The three kernels as forward_cuda / backward_cuda launch them, on numpy memory."""
    b, s, heads, d3 = qkv.shape
    d = d3 // 3
    shape = (b, heads, s, s)
    tail = fa._tail(np, mask, shape, SCALE, FILL, causal, dropout, qkv)
    out = np.full((b, s, heads, d), np.nan, np.float16)
    lse = np.full((b, heads, s), np.nan, np.float32)
    fwd_rows = fa.ROWS * (fa.forward_m_tiles(d) if m_tiles is None else m_tiles)
    kernels[fa.forward_name(d, m_tiles)](fa._grid(s, heads, b, fwd_rows), (fa.THREADS,),
                                         (qkv, tail[0], out, lse, *tail[1:]))
    return (out, lse) + _run_backward(kernels, qkv, tail, out, g, lse, fused=False)


def _run_backward(kernels, qkv, tail, out, g, lse, fused):
    """(dqkv, D) of the backward as backward_cuda launches it: the dq and dkdv kernels, or (`fused`)
    flash_bwd_pre, flash_bwd and flash_bwd_dq."""
    b, s, heads, d3 = qkv.shape
    d = d3 // 3
    grid = fa._grid(s, heads, b)
    dqkv = np.full(qkv.shape, np.nan, np.float16)
    dsum = np.full((b, heads, s), np.nan, np.float32)
    if fused:
        rows = b * heads * s
        # flash_bwd_pre zeroes the sums; past their end, -0.0: a query row past s that took an
        # atomic add (of +0.0: its ds are 0) would turn one to +0.0
        store = np.concatenate([np.full(rows * d, np.nan, np.float32), np.full(64 * d, -0.0, np.float32)])
        dq_acc = store[:rows * d].reshape(b, heads, s, d)
        row_grid = (-(-rows // fa.THREADS),)
        kernels[f"flash_bwd_pre__hd{d}"](row_grid, (fa.THREADS,), (out, g, dsum, dq_acc, np.int32(s), np.int32(heads),
                                                                    np.int64(rows)))
        kernels[f"flash_bwd__hd{d}"](grid, (fa.THREADS,), (qkv, tail[0], g, lse, dsum, dqkv, dq_acc, *tail[1:]))
        kernels[f"flash_bwd_dq__hd{d}"](row_grid, (fa.THREADS,), (dq_acc, dqkv, np.int32(s), np.int32(heads),
                                                                   np.float32(SCALE), np.int64(rows)))
        assert np.signbit(store[rows * d:]).all(), "dq sums added past the last query row"
    else:
        kernels[f"flash_dq__hd{d}"](grid, (fa.THREADS,), (qkv, tail[0], out, g, lse, dsum, dqkv, *tail[1:]))
        kernels[f"flash_dkdv__hd{d}"](grid, (fa.THREADS,), (qkv, tail[0], g, lse, dsum, dqkv, *tail[1:]))
    return dqkv, dsum


_SOURCE_CASES = [
    (16, 2, 70, 2, "none", False, None),      # two tiles, the second partial
    (16, 1, 130, 1, "none", True, None),      # causal tile skipping over three tiles
    (32, 2, 33, 3, "padding", False, None),   # a batch row with every key masked: uniform rows
    (16, 2, 67, 2, "padding", True, None),    # causal + padding: no skipping, masked rows still uniform
    (16, 1, 40, 2, "full", False, None),      # a per-head mask read through its strides
    (48, 1, 1, 1, "square", False, None),     # one token
    (64, 1, 65, 2, "square", True, None),     # GPT-2's head size
    # dropout: Philox blocks that straddle rows (odd s), uniform masked rows dropped too, every
    # element dropped (p = 1), over several tiles with causal skipping; s % 4 == 0, where lanes
    # share each Philox block (a partial second tile; causal skipping)
    (32, 2, 33, 3, "padding", False, DROPOUT),
    (16, 2, 67, 2, "full", True, (0.1, 5, 0)),
    (16, 1, 9, 1, "none", False, (1.0, 3, 2)),
    (64, 1, 130, 1, "none", True, DROPOUT),
    (16, 2, 68, 2, "padding", True, DROPOUT),
    (32, 1, 128, 2, "none", True, (0.5, 11, 1)),
    # the forward with one m-tile per warp (64-query blocks: head sizes above 64), GPT-2's two
    # m-tiles at an odd length that ends inside the second m-tile, and at 3 x 64 queries, where
    # the last block's second m-tile has no queries at all
    (16, 1, 130, 1, "none", True, None, 1),
    (32, 2, 33, 3, "padding", False, DROPOUT, 1),
    (16, 2, 67, 2, "full", True, (0.1, 5, 0), 1),
    (16, 2, 100, 2, "none", True, DROPOUT),
    (32, 1, 192, 2, "none", True, None),
    # the largest head size of the fused backward (its shared memory's limit; one forward m-tile)
    (80, 1, 70, 2, "padding", True, DROPOUT),
]


@pytest.mark.parametrize("d,b,s,heads,kind,causal,dropout,m_tiles",
                         [c + (None,) * (8 - len(c)) for c in _SOURCE_CASES])
def test_cuda_source_on_cpu_threads(cpu_kernels, d, b, s, heads, kind, causal, dropout, m_tiles):
    rng = np.random.default_rng(d * 1000 + s)
    qkv = _qkv(rng, b, s, heads, d)
    mask = _mask(rng, kind, b, heads, s)
    g = rng.standard_normal((b, s, heads, d)).astype(np.float16)
    out, lse, dqkv, dsum = _run_source(cpu_kernels(d, m_tiles), qkv, mask, causal, g, dropout, m_tiles)
    want_out, want_lse = fa.forward_reference(qkv, mask, SCALE, FILL, causal, dropout)
    _rel(out, want_out, "ctx")
    np.testing.assert_allclose(lse, want_lse, rtol=1e-5, atol=1e-4)
    want_dqkv, want_dsum = fa.backward_reference(g, qkv, out, lse, mask, SCALE, FILL, causal, dropout)
    for i, part in enumerate("qkv"):
        _rel(dqkv[..., i * d:(i + 1) * d], want_dqkv[..., i * d:(i + 1) * d], f"d{part}")
    np.testing.assert_allclose(dsum, want_dsum, rtol=1e-3, atol=1e-3)
    if m_tiles is None:  # the fused backward on the same forward (every case but the one-m-tile ones)
        tail = fa._tail(np, mask, (b, heads, s, s), SCALE, FILL, causal, dropout, qkv)
        fused, fused_dsum = _run_backward(cpu_kernels(d, m_tiles), qkv, tail, out, g, lse, fused=True)
        for i, part in enumerate("qkv"):
            _rel(fused[..., i * d:(i + 1) * d], want_dqkv[..., i * d:(i + 1) * d], f"fused d{part}")
        np.testing.assert_allclose(fused_dsum, want_dsum, rtol=1e-3, atol=1e-3)


def test_every_head_size_compiles_with_nvrtc():
    from nvrtc_helper import nvrtc_compiler
    compile_ = nvrtc_compiler()
    for d in fa.HEAD_SIZES:
        for m_tiles in (1, 2):
            compile_(fa.source(d, m_tiles), [fa.forward_name(d, m_tiles)] + [f"flash_{k}__hd{d}" for k in fa.backward_kernels(d)])


def test_unsupported_head_sizes_and_dtypes():
    with pytest.raises(ValueError, match="head size 24"):
        fa.source(24)
    assert not fa.supports(np.float32, 64, FILL)
    assert not fa.supports(np.float16, 144, FILL)
    assert not fa.supports(np.float16, 64, float("-inf"))
    assert not fa.supports(np.float16, 64, float("nan"))
    assert fa.supports(np.float16, 64, FILL) and fa.supports(np.float16, 64, -30000.0)
    # float32's min (a common fill) is -inf in the kernels' log2 units, and from 2^15 a fully masked
    # row's lse = fill + log(s) loses log(s) to rounding: the unfused core takes those
    assert not fa.supports(np.float16, 64, float(np.finfo(np.float32).min))
    assert not fa.supports(np.float16, 64, -1e9) and not fa.supports(np.float16, 64, -fa.MAX_FILL)


# ------------------------------------------------------------------ 3. the op through the CuPy double
@pytest.fixture
def flash_on():
    saved = A.FLASH_ATTENTION_ON_GPU
    A.FLASH_ATTENTION_ON_GPU = True
    try:
        yield
    finally:
        A.FLASH_ATTENTION_ON_GPU = saved


def _attention_step(qkv_np, heads, mask_np, causal, g_np, flash, dropout_p=0.0):
    """(ctx, dqkv, the generator's state after) of one attention forward and backward from seed 0."""
    saved = A.FLASH_ATTENTION_ON_GPU
    A.FLASH_ATTENTION_ON_GPU = flash
    try:
        flow.manual_seed(0)
        qkv = flow.tensor(qkv_np, device="cuda", requires_grad=True)
        mask = None if mask_np is None else flow.tensor(mask_np, device="cuda")
        with flow.autocast("cuda", dtype=flow.float16):
            ctx = flow.nn.functional.packed_qkv_attention(qkv, heads, mask, scale=SCALE, fill=FILL, causal=causal,
                                                          dropout_p=dropout_p)
        ctx.backward(flow.tensor(g_np, device="cuda"))
        return ctx.detach().float().cpu().numpy(), qkv.grad.cpu().numpy(), flow.get_rng_state()
    finally:
        A.FLASH_ATTENTION_ON_GPU = saved


_SPLIT, _FUSED = ("dq", "dkdv"), ("bwd_pre", "bwd", "bwd_dq")


@pytest.mark.parametrize("d,kind,causal,dropout_p,backward", [
    (32, "none", True, 0.0, "split"), (32, "padding", False, 0.0, "split"), (32, "padding", True, 0.0, "split"),
    (32, "full", False, 0.0, "split"), (32, "none", True, 0.1, "split"), (32, "padding", False, 0.5, "split"),
    (32, "none", True, 0.1, "fused"), (32, "padding", False, 0.0, "fused"),
    (96, "none", True, 0.0, "fused")])  # above FUSED_MAX_HEAD_SIZE: the split kernels whatever is asked
def test_flash_op_matches_unfused_through_double(cuda_double, monkeypatch, d, kind, causal, dropout_p, backward):
    """With dropout, from the same generator state: the kernels drop what the unfused core's
    mask drops (a different element would move ctx by far more than the tolerance), and the
    generator's device stream ends at the same place. FLASH_BACKWARD = "fused" launches
    flash_bwd_pre, flash_bwd and flash_bwd_dq instead of flash_dq and flash_dkdv."""
    monkeypatch.setattr(A, "FLASH_BACKWARD", backward)
    rng = np.random.default_rng(7)
    b, s, heads = 2, 37, 2
    qkv = rng.standard_normal((b, s, heads * 3 * d)).astype(np.float32)
    mask = _mask(rng, kind, b, heads, s)
    g = rng.standard_normal((b, s, heads * d)).astype(np.float32)
    stats = cuda_double._double.stats
    stats.reset()
    ctx, dqkv, state = _attention_step(qkv, heads, mask, causal, g, True, dropout_p)
    ran = _FUSED if backward == "fused" and d <= fa.FUSED_MAX_HEAD_SIZE else _SPLIT
    assert stats.by_name[fa.forward_name(d)] == 1
    assert {k: stats.by_name[f"flash_{k}__hd{d}"] for k in _SPLIT + _FUSED} == {k: int(k in ran) for k in _SPLIT + _FUSED}
    stats.reset()
    want_ctx, want_dqkv, want_state = _attention_step(qkv, heads, mask, causal, g, False, dropout_p)
    assert stats.by_name[fa.forward_name(d)] == 0 and stats.by_name["cublasGemm"] > 0
    _rel(ctx, want_ctx, "ctx", 4e-3)
    _rel(dqkv, want_dqkv, "dqkv", 4e-3)
    offsets = state.get("cuda", {}), want_state.get("cuda", {})
    assert offsets[0] == offsets[1] == ({"0": -(-b * heads * s * s // 4)} if dropout_p else {}), offsets


def test_flash_backward_choice_is_checked(monkeypatch):
    monkeypatch.setenv("ENGINE_FLASH_BACKWARD", "atomic")
    with pytest.raises(ValueError, match="ENGINE_FLASH_BACKWARD must be split or fused, got 'atomic'"):
        A._flash_backward_from_env()
    monkeypatch.setenv("ENGINE_FLASH_BACKWARD", "fused")
    assert A._flash_backward_from_env() == "fused"


def test_flash_falls_back_where_it_does_not_apply(cuda_double, flash_on):
    rng = np.random.default_rng(3)
    stats = cuda_double._double.stats
    qkv = flow.tensor(rng.standard_normal((2, 5, 2 * 3 * 24)).astype(np.float32), device="cuda")
    stats.reset()
    with flow.autocast("cuda", dtype=flow.float16):  # head size 24: not a multiple of 16
        flow.nn.functional.packed_qkv_attention(qkv, 2)
    qkv = flow.tensor(rng.standard_normal((2, 5, 2 * 3 * 32)).astype(np.float32), device="cuda")
    flow.nn.functional.packed_qkv_attention(qkv, 2)  # float32: no tensor-core kernel
    with flow.autocast("cuda", dtype=flow.float16):
        flow.nn.functional.packed_qkv_attention(qkv, 2, fill=float("-inf"))  # fill -inf: rows could be NaN
        flow.nn.functional.packed_qkv_attention(qkv, 2, fill=float(np.finfo(np.float32).min))  # see MAX_FILL
        flow.backends.cuda.enable_flash_sdp(False)
        try:
            flow.nn.functional.packed_qkv_attention(qkv, 2)
        finally:
            flow.backends.cuda.enable_flash_sdp(True)
    assert not any(name.startswith("flash_") for name in stats.by_name)
    with flow.autocast("cuda", dtype=flow.float16):
        flow.nn.functional.packed_qkv_attention(qkv, 2)
        flow.nn.functional.packed_qkv_attention(qkv, 2, dropout_p=0.1)
    assert stats.by_name[fa.forward_name(32)] == 2


def test_views_off_a_16_byte_boundary_are_copied_first(cuda_double):
    """The kernels copy rows of qkv and of the output gradient 16 bytes at a time (cp.async),
    which faults on a GPU unless the buffer starts on a 16-byte boundary: a contiguous view that
    starts one element into its allocation reaches them as an aligned copy (the double's
    emulators refuse a misaligned one, as the GPU would)."""
    cp = cuda_double
    rng = np.random.default_rng(5)
    b, s, heads, d = 1, 9, 2, 16
    qkv, g = _qkv(rng, b, s, heads, d), rng.standard_normal((b, s, heads, d)).astype(np.float16)

    def off_boundary(a):  # the same values, one float16 (2 bytes) into a larger allocation
        flat = cp.zeros(a.size + 8, np.float16)
        flat[1:1 + a.size] = cp.asarray(a.reshape(-1))
        view = flat[1:1 + a.size].reshape(a.shape)
        assert view.flags.c_contiguous and view.data.ptr % 16 == 2
        return view

    args = (None, SCALE, FILL, True)
    with pytest.raises(ValueError, match="16-byte boundary"):
        raw = fa.raw_kernel(fa.source(d), fa.forward_name(d))
        m, *tail = fa._tail(cp, None, (b, heads, s, s), SCALE, FILL, True, None, cp.empty(1))
        raw(fa._grid(s, heads, b, fa.ROWS * fa.forward_m_tiles(d)), (fa.THREADS,),
            (off_boundary(qkv), m, cp.empty((b, s, heads, d), np.float16), cp.empty((b, heads, s), np.float32), *tail))
    out, lse = fa.forward_cuda(off_boundary(qkv), *args)
    want_out, want_lse = fa.forward_reference(qkv, *args)
    _rel(cp.asnumpy(out), want_out, "ctx")
    dqkv, _ = fa.backward_cuda(off_boundary(g), off_boundary(qkv), out, lse, *args)
    want_dqkv, _ = fa.backward_reference(g, qkv, cp.asnumpy(out), cp.asnumpy(lse), *args)
    _rel(cp.asnumpy(dqkv), want_dqkv, "dqkv")


# ------------------------------------------------------------------ the causal flag on the CPU path
@pytest.mark.parametrize("with_mask", [False, True])
def test_causal_flag_equals_the_causal_mask(with_mask):
    rng = np.random.default_rng(5)
    b, s, heads, d = 2, 6, 2, 4
    qkv_np = rng.standard_normal((b, s, heads * 3 * d)).astype(np.float32)
    pad = rng.random((b, 1, 1, s)) < 0.3
    future = np.triu(np.ones((s, s), bool), 1)
    grads = []
    for causal, mask in ((True, pad if with_mask else None), (False, (future | pad) if with_mask else future)):
        qkv = flow.tensor(qkv_np, requires_grad=True)
        m = None if mask is None else flow.tensor(mask)
        out = flow.nn.functional.packed_qkv_attention(qkv, heads, m, causal=causal)
        out.sum().backward()
        grads.append((out.detach().numpy(), qkv.grad.numpy()))
    np.testing.assert_array_equal(grads[0][0], grads[1][0])
    np.testing.assert_array_equal(grads[0][1], grads[1][1])
