"""Fused loss and optimizer kernels (engine/kernels/cross_entropy.py, adamw.py, grad_norm.py):
each numpy reference against torch, each CUDA launcher through the strict CuPy double against its
reference, the engine's CUDA paths (cross_entropy, Adam/AdamW, clip_grad_norm_) against its CPU
paths with their launches and host synchronisations counted, the emulators' launch checks, and
the CUDA sources compiled by NVRTC where it is installed."""
import gc
import math

import numpy as np
import pytest
import torch

import engine as flow
import engine.nn.functional as F
from engine import optim
from engine.kernels import _multi_tensor as mt
from engine.kernels import adamw as ka
from engine.kernels import cross_entropy as kce
from engine.kernels import grad_norm as kgn
from engine.kernels import loss_scale as kls
from engine.nn.utils import clip_grad_norm_, get_total_norm
from nvrtc_helper import nvrtc_compiler

ODD_SHAPES = [(3, 5), (7,), (1, 1), (33, 129), (5000,), (2, 3, 4), (mt.CHUNK + 1,), (0,), (11, 13), (2,)]


def _rng(seed=0):
    return np.random.default_rng(seed)


def _logits(rng, m, c, dtype=np.float32, scale=3.0):
    return (rng.standard_normal((m, c)) * scale).astype(dtype)


def _targets(rng, m, c, ignore_index=-100, ignored=(1, 4)):
    t = rng.integers(0, c, m)
    t[[i for i in ignored if i < m]] = ignore_index
    return t


def _torch_ce(x, t, ignore_index, smoothing):
    """torch's per-row loss and d(sum of losses)/dx, in float64 from the (float16-rounded) logits."""
    xt = torch.tensor(x.astype(np.float64), requires_grad=True)
    loss = torch.nn.functional.cross_entropy(xt, torch.tensor(t), ignore_index=ignore_index, reduction="none",
                                             label_smoothing=smoothing)
    loss.sum().backward()
    return loss.detach().numpy(), xt.grad.numpy()


# ------------------------------------------------------------------ cross-entropy references vs torch
@pytest.mark.parametrize("c", [1, 2, 37, 1001])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_reference_matches_torch(c, dtype, smoothing):
    rng = _rng(c)
    x, t = _logits(rng, 9, c, dtype), _targets(rng, 9, c)
    loss, stats = kce.cross_entropy_fwd_numpy(x, t, -100, smoothing)
    dunit = kce.cross_entropy_dunit_numpy(x, stats, t, -100, smoothing)
    want_loss, want_grad = _torch_ce(x, t, -100, smoothing)
    acc = np.float64 if dtype == np.float64 else np.float32
    assert loss.dtype == acc and stats.dtype == acc and stats.shape == (9, 2)
    assert dunit.dtype == acc and dunit.shape == (9, c)
    tol = 1e-12 if dtype == np.float64 else 2e-6
    np.testing.assert_allclose(loss, want_loss, rtol=tol, atol=tol * 10)
    np.testing.assert_allclose(dunit, want_grad, rtol=tol, atol=tol)
    assert not loss[[1, 4]].any() and not dunit[[1, 4]].any()  # ignored rows: 0 loss, 0 gradient


def test_cross_entropy_reference_ignore_index_inside_the_classes_and_bad_targets():
    rng = _rng(1)
    x, t = _logits(rng, 6, 10), np.array([3, 0, 9, 10, -1, 0])
    loss, stats = kce.cross_entropy_fwd_numpy(x, t, 0, 0.0)  # ignore_index 0 is a class id
    dunit = kce.cross_entropy_dunit_numpy(x, stats, t, 0, 0.0)
    want_loss, want_grad = _torch_ce(x, np.where((t < 0) | (t > 9), 0, t), 0, 0.0)
    good = [0, 1, 2, 5]
    np.testing.assert_allclose(loss[good], want_loss[good], rtol=2e-6)
    np.testing.assert_allclose(dunit[good], want_grad[good], atol=2e-7)
    assert np.isnan(loss[[3, 4]]).all() and np.isnan(dunit[[3, 4]]).all()  # out of range: NaN, no error


def test_cross_entropy_reference_infinite_logits_follow_torch():
    x = np.array([[0.0, -np.inf, 1.0], [-np.inf, -np.inf, -np.inf], [np.inf, 0.0, 1.0]], np.float32)
    loss, stats = kce.cross_entropy_fwd_numpy(x, np.array([0, 0, 1]), -100, 0.0)
    dunit = kce.cross_entropy_dunit_numpy(x, stats, np.array([0, 0, 1]), -100, 0.0)
    want_loss, want_grad = _torch_ce(x, np.array([0, 0, 1]), -100, 0.0)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
    np.testing.assert_allclose(dunit, want_grad, atol=1e-7)


@pytest.mark.parametrize("parts", [[5], [2, 3], [1, 1, 3], [4, 0, 1]])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_vocab_parallel_phases_equal_the_whole_row(parts, smoothing):
    """Shards of the classes, combined with the collectives' max and sum, give every shard the
    loss of the whole row and the shard's columns of its gradient."""
    rng = _rng(2)
    c = 101
    bounds = np.concatenate([[0], np.cumsum(np.array(parts) * c // sum(parts))])
    bounds[-1] = c
    x, t = _logits(rng, 8, c, np.float16), _targets(rng, 8, c)
    shards = [(int(a), x[:, a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    with np.errstate(all="ignore"):
        m = np.max([s.astype(np.float32).max(axis=1) if s.shape[1] else np.full(8, -np.inf, np.float32)
                    for _, s in shards], axis=0)
    stats = sum(kce.vocab_stats_numpy(s, m, t, start) for start, s in shards)
    want_loss, want_grad = _torch_ce(x, t, -100, smoothing)
    for start, s in shards:
        loss, dunit = kce.vocab_loss_numpy(s, m, stats, t, start, c, -100, smoothing)
        np.testing.assert_allclose(loss, want_loss, rtol=2e-6, atol=2e-6)
        np.testing.assert_allclose(dunit, want_grad[:, start: start + s.shape[1]], atol=2e-7)


# ------------------------------------------------------------------ AdamW / Adam references vs torch
def _params(rng, shapes, dtype=np.float32):
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


ADAM_CASES = {
    "adamw": (True, dict(lr=0.01, weight_decay=0.1)),
    "adamw_amsgrad_maximize": (True, dict(lr=0.02, weight_decay=0.05, amsgrad=True, maximize=True)),
    "adam_l2": (False, dict(lr=0.01, weight_decay=0.1)),
    "adam_small_beta1": (False, dict(lr=0.03, betas=(0.3, 0.9), eps=1e-4, maximize=True)),
}


@pytest.mark.parametrize("case", list(ADAM_CASES))
def test_adam_reference_matches_torch(case):
    decoupled, kw = ADAM_CASES[case]
    rng = _rng(3)
    ws = _params(rng, ODD_SHAPES)
    theirs = [torch.tensor(w, requires_grad=True) for w in ws]
    opt = (torch.optim.AdamW if decoupled else torch.optim.Adam)(theirs, foreach=False, **kw)
    ms, vs = [np.zeros_like(w) for w in ws], [np.zeros_like(w) for w in ws]
    vmax = [np.zeros_like(w) for w in ws] if kw.get("amsgrad") else None
    beta1, beta2 = kw.get("betas", (0.9, 0.999))
    for step in range(1, 6):
        gs = _params(rng, ODD_SHAPES)
        for q, g in zip(theirs, gs):
            q.grad = torch.tensor(g)
        opt.step()
        hyper = ka.AdamHyper(kw["lr"], beta1, beta2, kw.get("eps", 1e-8), kw.get("weight_decay", 0.0), step,
                             decoupled, True, kw.get("maximize", False))
        ka.adam_update_numpy(ws, gs, ms, vs, vmax, hyper)
    for w, q in zip(ws, theirs):
        np.testing.assert_allclose(w, q.detach().numpy(), rtol=0, atol=2e-6)


def test_adamw_reference_without_bias_correction_is_the_closed_form():
    """OneFlow's do_bias_correction=False: p <- p (1 - lr wd) - lr m / (sqrt(v) + eps), in float64."""
    rng = _rng(4)
    lr, b1, b2, eps, wd = 0.01, 0.9, 0.99, 1e-6, 0.1
    ws = _params(rng, ODD_SHAPES, np.float64)
    p, m, v = [w.copy() for w in ws], [np.zeros_like(w) for w in ws], [np.zeros_like(w) for w in ws]
    ms, vs = [np.zeros_like(w) for w in ws], [np.zeros_like(w) for w in ws]
    for step in range(1, 5):
        gs = _params(rng, ODD_SHAPES, np.float64)
        ka.adam_update_numpy(ws, gs, ms, vs, None, ka.AdamHyper(lr, b1, b2, eps, wd, step, True, False, False))
        for i, g in enumerate(gs):
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            p[i] = p[i] * (1 - lr * wd) - lr * m[i] / (np.sqrt(v[i]) + eps)
    for w, want in zip(ws, p):
        np.testing.assert_allclose(w, want, rtol=1e-12, atol=1e-14)


def test_adam_reference_float16_computes_in_float32():
    rng = _rng(5)
    w16 = _params(rng, [(9, 7), (5,)], np.float16)
    g16 = _params(rng, [(9, 7), (5,)], np.float16)
    w32 = [w.astype(np.float32) for w in w16]
    hyper = ka.AdamHyper(1e-2, 0.9, 0.999, 1e-8, 0.1, 1, True, True, False)
    ka.adam_update_numpy(w16, g16, [np.zeros_like(w) for w in w16], [np.zeros_like(w) for w in w16], None, hyper)
    ka.adam_update_numpy(w32, [g.astype(np.float32) for g in g16], [np.zeros_like(w) for w in w32],
                         [np.zeros_like(w) for w in w32], None, hyper)
    for a, b in zip(w16, w32):
        assert a.dtype == np.float16
        np.testing.assert_array_equal(a, b.astype(np.float16))


# ------------------------------------------------------------------ gradient norm references vs torch
@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, math.inf])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_grad_norm_and_clip_references_match_torch(norm_type, dtype):
    rng = _rng(6)
    grads = [(g * 0.2).astype(dtype) for g in _params(rng, ODD_SHAPES)]
    acc = np.float64 if dtype == np.float64 else np.float32
    total = kgn.grad_norm_numpy(grads, norm_type, acc)
    theirs = [torch.tensor(g.astype(acc)) for g in grads if g.size]  # torch refuses the inf-norm of nothing
    want = torch.nn.utils.get_total_norm(theirs, norm_type)
    assert total.dtype == acc and total.shape == ()
    np.testing.assert_allclose(total, want.item(), rtol=1e-6 if acc == np.float32 else 1e-12)
    kgn.scale_grads_numpy(grads, total, 0.5)
    params = [torch.nn.Parameter(torch.zeros_like(q)) for q in theirs]
    for p, q in zip(params, theirs):
        p.grad = q.clone()
    torch.nn.utils.clip_grads_with_norm_(params, 0.5, want)
    for g, p in zip([g for g in grads if g.size], params):
        np.testing.assert_allclose(g.astype(np.float64), p.grad.numpy().astype(dtype), rtol=2e-3 if dtype == np.float16
                                   else 1e-6, atol=1e-7)


# ------------------------------------------------------------------ CUDA launchers through the double
def _dev(cuda_double, arrays):
    return [cuda_double.asarray(a) for a in arrays]


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("c", [1, 37, 300, 16385])
def test_cross_entropy_launchers_match_reference(cuda_double, dtype, c):
    rng = _rng(7)
    m = 5 if c > 1000 else 11
    x, t = _logits(rng, m, c, dtype), _targets(rng, m, c)
    t[2] = c + 3  # out of range: NaN on the device
    want_loss, want_stats = kce.cross_entropy_fwd_numpy(x, t, -100, 0.1)
    want_dunit = kce.cross_entropy_dunit_numpy(x, want_stats, t, -100, 0.1)
    xd, td = cuda_double.asarray(x), cuda_double.asarray(t)
    loss, stats = kce.cross_entropy_fwd(xd, td, -100, 0.1)
    np.testing.assert_array_equal(loss.get(), want_loss)
    np.testing.assert_array_equal(stats.get(), want_stats)
    scale = rng.standard_normal(m).astype(want_dunit.dtype)
    for sc in (scale, scale[:1]):  # a gradient per row, or one for all
        dx = kce.cross_entropy_bwd_rows(xd, stats, td, cuda_double.asarray(sc), -100, 0.1, dtype)
        np.testing.assert_array_equal(dx.get(), kce.cross_entropy_bwd_numpy(want_dunit, sc, dtype))
        # the vocab-parallel path's backward from a stored dunit gives the same
        dx = kce.cross_entropy_bwd(cuda_double.asarray(want_dunit), cuda_double.asarray(sc), dtype)
        np.testing.assert_array_equal(dx.get(), kce.cross_entropy_bwd_numpy(want_dunit, sc, dtype))
    m_row = x.astype(want_dunit.dtype).max(axis=1)
    stats = kce.vocab_stats(xd[:, 1:], cuda_double.asarray(m_row), td, 1)  # a strided shard: copied
    np.testing.assert_array_equal(stats.get(), kce.vocab_stats_numpy(x[:, 1:], m_row, t, 1))
    loss2, dunit2 = kce.vocab_loss(xd, cuda_double.asarray(m_row), stats, td, 0, c + 5, -100, 0.0)
    want2 = kce.vocab_loss_numpy(x, m_row, stats.get(), t, 0, c + 5, -100, 0.0)
    np.testing.assert_array_equal(loss2.get(), want2[0])
    np.testing.assert_array_equal(dunit2.get(), want2[1])


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("amsgrad", [False, True])
def test_adam_launcher_matches_reference(cuda_double, dtype, amsgrad):
    rng = _rng(8)
    w, g, m, v, vmax = [_params(rng, ODD_SHAPES, dtype) for _ in range(5)]
    v, vmax = [np.abs(a) for a in v], [np.abs(a) for a in vmax]
    # autocast's float16 copies, written by the same pass, for every other parameter
    halves = [np.full(a.shape, np.nan, np.float16) if i % 2 else None for i, a in enumerate(w)]
    host = [w, g, m, v, vmax if amsgrad else None, halves]
    dev = [None if lst is None else _dev(cuda_double, lst) for lst in host[:5]]
    dev.append([None if a is None else cuda_double.asarray(a) for a in halves])
    stats = cuda_double._double.stats
    for step in (1, 2):
        hyper = ka.AdamHyper(1e-2, 0.9, 0.999, 1e-8, 0.1, step, step == 1, step == 1, step == 2)
        ka.adam_update_numpy(*host[:5], hyper, host[5])
        stats.reset()
        ka.adam_update(*dev[:5], hyper, dev[5])
        # one launch (and, the first time on this device, the zero flag of unconditional steps)
        assert stats.launches == 1 + stats.by_name["zeros"] and stats.by_name["zeros"] <= 1
        for hs, ds in zip(host, dev):
            for a, b in zip(hs or [], ds or []):
                if a is not None:
                    np.testing.assert_array_equal(b.get(), a)
        for p, half in zip(w, halves):
            if half is not None:  # the updated parameter, rounded once
                np.testing.assert_array_equal(half, p.astype(np.float16))


@pytest.mark.parametrize("found", [0.0, 1.0])
def test_adam_kernel_skips_on_the_device_flag(cuda_double, found):
    """The GradScaler's inf/nan flag, read by the kernel on the device: 1 leaves parameters and
    moments as they were (the float16 copies written from the parameters), 0 updates as without
    a flag; one launch, no host read."""
    rng = _rng(9)
    w, g, m, v = [_params(rng, ODD_SHAPES, np.float32) for _ in range(4)]
    v = [np.abs(a) for a in v]
    halves = [np.full(a.shape, np.nan, np.float16) for a in w]
    host = [[a.copy() for a in col] for col in (w, g, m, v)]
    dev = [_dev(cuda_double, col) for col in (w, g, m, v)]
    dev_halves = [cuda_double.asarray(a) for a in halves]
    hyper = ka.AdamHyper(1e-2, 0.9, 0.999, 1e-8, 0.1, 3, True, True, False)
    flag = cuda_double.full((), found, dtype=np.float32)
    ka.adam_update_numpy(*host, None, hyper, halves, np.float32(found))
    stats = cuda_double._double.stats
    stats.reset()
    ka.adam_update(*dev, None, hyper, dev_halves, flag)
    assert stats.launches == 1 and stats.syncs == 0
    for col, hcol, orig in zip(dev, host, (w, g, m, v)):
        for b, a, o in zip(col, hcol, orig):
            np.testing.assert_array_equal(b.get(), a)
            assert np.array_equal(a, o) == (found == 1.0) or a.size == 0 or col is dev[1]
    for b, a, p in zip(dev_halves, halves, host[0]):
        np.testing.assert_array_equal(b.get(), a)
        np.testing.assert_array_equal(a, p.astype(np.float16))  # the parameter as it now is
    with pytest.raises(ValueError, match="one float32 flag"):
        ka.adam_update(*dev, None, hyper, dev_halves, cuda_double.zeros(2, dtype=np.float32))


def test_adam_launcher_refuses_a_half_copy_of_another_size(cuda_double):
    w = [cuda_double.zeros(10, np.float32)]
    cols = [w, [cuda_double.ones(10, np.float32)], [cuda_double.zeros(10, np.float32)],
            [cuda_double.zeros(10, np.float32)]]
    hyper = ka.AdamHyper(1e-2, 0.9, 0.999, 1e-8, 0.1, 1, True, True, False)
    with pytest.raises(ValueError, match="float16 copy must match its parameter's 10 elements, got 9"):
        ka.adam_update(*cols, None, hyper, [cuda_double.zeros(9, np.float16)])


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, math.inf])
def test_grad_norm_launchers_match_reference(cuda_double, norm_type):
    rng = _rng(9)
    host = [(g * 0.3).astype(dt) for g, dt in zip(_params(rng, ODD_SHAPES), [np.float32, np.float16] * 5)]
    dev = _dev(cuda_double, host)
    for acc in (np.float32, np.float64):
        for root in (True, False):
            got = kgn.grad_norm(dev, norm_type, acc, root)
            want = kgn.grad_norm_numpy(host, norm_type, acc, root)
            assert got.dtype == acc and got.shape == ()
            np.testing.assert_allclose(got.get(), want, rtol=1e-6 if acc == np.float32 else 1e-12)
    total = kgn.grad_norm_numpy(host, norm_type, np.float32)
    kgn.scale_grads(dev, cuda_double.asarray(total), 0.25)
    kgn.scale_grads_numpy(host, total, 0.25)
    for a, b in zip(host, dev):
        np.testing.assert_array_equal(b.get(), a)


def test_unscale_grads_launches_once_per_dtype_and_rounds_as_numpy(cuda_double):
    """The GradScaler's unscale: float16/32/64 tensors (odd sizes, several chunks, an F-ordered
    one) times 1 / a device scale in place, one launch per dtype and nothing read back, numpy's
    bits; a strided view through CuPy; the flag stays clear on finite results."""
    rng = _rng(21)
    host = [(g * 300).astype(dt) for g, dt in zip(_params(rng, ODD_SHAPES + [(mt.CHUNK * 2 + 3,)]),
                                                  [np.float32, np.float16, np.float64] * 4)]
    host.append(np.asfortranarray(rng.standard_normal((5, 7)).astype(np.float32)))
    dev = _dev(cuda_double, host)
    big = cuda_double.asarray(rng.standard_normal((4, 6)).astype(np.float32))
    strided, strided_host = big[:, ::2], big.get()[:, ::2] * np.float32(1 / 3)
    scale, found = np.float32(3), np.zeros((), np.float32)
    dev_scale, dev_found = cuda_double.asarray(scale), cuda_double.zeros((), dtype=np.float32)
    stats = cuda_double._double.stats
    stats.reset()
    kgn.unscale_grads(dev, dev_scale, dev_found)
    assert stats.launches == 3 and stats.syncs == 0  # one per dtype
    kgn.unscale_grads([strided], dev_scale, dev_found)
    kgn.unscale_grads_numpy(host, scale, found)
    for a, b in zip(host, dev):
        np.testing.assert_array_equal(b.get(), a)
    np.testing.assert_array_equal(strided.get(), strided_host)
    assert float(dev_found.get()) == float(found) == 0.0


def test_grad_norm_partials_follow_the_kernels_chunk_order():
    """The emulator's model of the partial kernel: block b takes chunks b, b + grid, ..."""
    rng = _rng(10)
    flats = [rng.standard_normal(n).astype(np.float32) for n in (mt.CHUNK * 2 + 5, 3, mt.CHUNK)]
    parts = kgn.chunk_partials(flats, 2, kgn.SUM_SQUARES, np.float32(2), np.float32)
    chunks = [flats[0][:mt.CHUNK], flats[0][mt.CHUNK: 2 * mt.CHUNK], flats[0][2 * mt.CHUNK:], flats[1], flats[2]]
    want = [sum(float(np.dot(c, c)) for c in chunks[b::2]) for b in range(2)]
    np.testing.assert_allclose(parts, want, rtol=1e-5)


# ------------------------------------------------------------------ the engine's CUDA paths vs its CPU paths
def _cpu_and_cuda(arrays):
    return ([flow.tensor(a, requires_grad=True) for a in arrays],
            [flow.tensor(a, device="cuda", requires_grad=True) for a in arrays])


@pytest.mark.parametrize("make", [
    lambda ps: optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
    lambda ps: optim.AdamW(ps, lr=1e-2, betas=(0.3, 0.9), do_bias_correction=False),
    lambda ps: optim.Adam(ps, lr=1e-2, weight_decay=0.1, amsgrad=True, maximize=True),
], ids=["adamw", "adamw_no_bias_correction", "adam_amsgrad_maximize"])
def test_adam_step_on_cuda_is_one_launch_and_matches_cpu(cuda_double, make):
    stats = cuda_double._double.stats
    rng = _rng(11)
    cpu, gpu = _cpu_and_cuda(_params(rng, ODD_SHAPES))
    opt_c, opt_g = make(cpu), make(gpu)
    for step in range(4):
        for p, q in zip(cpu, gpu):
            g = rng.standard_normal(p.shape).astype(np.float32)
            p.grad, q.grad = flow.tensor(g), flow.tensor(g, device="cuda")
        opt_c.step()
        stats.reset()
        opt_g.step()
        if step:  # the first step also creates the moments
            assert (stats.launches, stats.syncs, stats.h2d) == (1, 0, 1)  # 10 parameters, 1 launch; the table
        for p, q in zip(cpu, gpu):
            np.testing.assert_array_equal(q.detach().cpu().numpy(), p.detach().numpy())  # bit for bit
    stats.reset()
    opt_g.step()  # the same gradients again: the pointer table is cached
    assert (stats.launches, stats.syncs, stats.h2d) == (1, 0, 0)


def test_adam_step_groups_by_dtype_and_leaves_mismatched_grads_to_the_per_tensor_path(cuda_double):
    stats = cuda_double._double.stats
    rng = _rng(12)
    arrays = _params(rng, ODD_SHAPES[:4]) + _params(rng, ODD_SHAPES[4:8], np.float16)
    gpu = [flow.tensor(a, device="cuda", requires_grad=True) for a in arrays]
    opt = optim.AdamW(gpu, lr=1e-2)
    for p, a in zip(gpu, arrays):
        p.grad = flow.tensor(np.ones_like(a), device="cuda")
    opt.step()
    stats.reset()
    opt.step()
    assert stats.launches == 2 and stats.syncs == 0  # float32 and float16: one launch each
    gpu[0].grad = flow.tensor(np.ones(gpu[0].shape, np.float64), device="cuda")  # not the parameter's dtype
    before = gpu[0].detach().cpu().numpy()
    opt.step()
    assert not np.array_equal(gpu[0].detach().cpu().numpy(), before)


@pytest.mark.parametrize("norm_type", [2.0, math.inf, 1.0, 3.0, 0.0])
def test_clip_grad_norm_on_cuda_matches_cpu_without_syncs(cuda_double, norm_type):
    stats = cuda_double._double.stats
    rng = _rng(13)
    cpu, gpu = _cpu_and_cuda(_params(rng, ODD_SHAPES))
    for p, q in zip(cpu, gpu):
        g = (rng.standard_normal(p.shape) * 0.3).astype(np.float32)
        p.grad, q.grad = flow.tensor(g), flow.tensor(g, device="cuda")
    want = clip_grad_norm_(cpu, 0.7, norm_type)
    stats.reset()
    got = clip_grad_norm_(gpu, 0.7, norm_type)
    assert stats.syncs == 0
    if norm_type:  # norm type 0 takes the per-gradient path
        assert stats.launches == 3  # partials, finish, scale
    assert got.device.type == "cuda" and got.dtype == flow.float32
    np.testing.assert_allclose(got.cpu().numpy(), want.numpy(), rtol=1e-6)
    for p, q in zip(cpu, gpu):
        np.testing.assert_allclose(q.grad.cpu().numpy(), p.grad.numpy(), rtol=1e-6, atol=1e-9)


def test_clip_with_a_number_and_get_total_norm_on_cuda(cuda_double):
    rng = _rng(14)
    cpu, gpu = _cpu_and_cuda(_params(rng, ODD_SHAPES[:5]))
    for p, q in zip(cpu, gpu):
        g = rng.standard_normal(p.shape).astype(np.float32)
        p.grad, q.grad = flow.tensor(g), flow.tensor(g, device="cuda")
    total = get_total_norm([q.grad for q in gpu])
    np.testing.assert_allclose(total.cpu().numpy(), get_total_norm([p.grad for p in cpu]).numpy(), rtol=1e-6)
    flow.nn.utils.clip_grads_with_norm_(gpu, 1.0, 12.5)
    flow.nn.utils.clip_grads_with_norm_(cpu, 1.0, 12.5)
    for p, q in zip(cpu, gpu):
        np.testing.assert_allclose(q.grad.cpu().numpy(), p.grad.numpy(), rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_on_cuda_matches_cpu_without_syncs(cuda_double, dtype, reduction, smoothing):
    stats = cuda_double._double.stats
    rng = _rng(15)
    x, t = _logits(rng, 3 * 5, 37, dtype).reshape(3, 5, 37).transpose(0, 2, 1).copy(), _targets(rng, 15, 37)
    t = t.reshape(3, 5)
    cpu, gpu = _cpu_and_cuda([x])
    tc, tg = flow.tensor(t), flow.tensor(t, device="cuda")
    stats.reset()
    loss = F.cross_entropy(gpu[0], tg, reduction=reduction, label_smoothing=smoothing)
    (loss.sum() if reduction == "none" else loss).backward()
    assert stats.syncs == 0
    # one fused kernel each way, the reduction and layout copies around them: the class-first
    # logits [3, 37, 5] are laid out [15, 37] for the forward and again for the backward, which
    # recomputes the gradient from them instead of keeping a float32 [15, 37] one
    assert stats.launches <= 13
    want = F.cross_entropy(cpu[0], tc, reduction=reduction, label_smoothing=smoothing)
    (want.sum() if reduction == "none" else want).backward()
    assert loss.dtype == want.dtype and gpu[0].grad.dtype == cpu[0].grad.dtype
    np.testing.assert_allclose(loss.detach().cpu().numpy().astype(np.float64), want.detach().numpy(), rtol=1e-6,
                               atol=1e-6)
    np.testing.assert_allclose(gpu[0].grad.cpu().numpy().astype(np.float64), cpu[0].grad.numpy(), atol=1e-7)


def test_cross_entropy_on_cuda_marks_bad_targets_and_debug_sync_raises(cuda_double, monkeypatch):
    x = flow.tensor(_logits(_rng(16), 4, 6), device="cuda", requires_grad=True)
    t = flow.tensor(np.array([1, 6, -100, 2]), device="cuda")
    loss = F.cross_entropy(x, t, reduction="none")
    loss.sum().backward()
    got, grad = loss.detach().cpu().numpy(), x.grad.cpu().numpy()
    assert np.isnan(got[1]) and np.isfinite(got[[0, 3]]).all() and got[2] == 0
    assert np.isnan(grad[1]).all() and np.isfinite(grad[[0, 2, 3]]).all()
    monkeypatch.setenv("ENGINE_CUDA_SYNC_CHECKS", "1")
    with pytest.raises(IndexError, match="target 6 is out of bounds for 6 classes"):
        F.cross_entropy(x, t)


def test_binary_cross_entropy_on_cuda_checks_its_input_range_only_in_debug_sync_mode(cuda_double, monkeypatch):
    """binary_cross_entropy's check that the probabilities lie in [0, 1] reads them back: on CUDA
    only with ENGINE_CUDA_SYNC_CHECKS=1, as the other host checks (it read them at every call)."""
    p = flow.tensor(np.array([0.2, 0.9, 0.5], np.float32), device="cuda")
    t = flow.tensor(np.array([0.0, 1.0, 1.0], np.float32), device="cuda")
    stats = cuda_double._double.stats
    stats.reset()
    loss = F.binary_cross_entropy(p, t)
    assert stats.syncs == 0
    want = F.binary_cross_entropy(p.cpu(), t.cpu())
    np.testing.assert_allclose(loss.cpu().numpy(), want.numpy(), rtol=1e-6)
    monkeypatch.setenv("ENGINE_CUDA_SYNC_CHECKS", "1")
    with pytest.raises(RuntimeError, match=r"should be between 0 and 1, got values in \[0.2\d*, 1.5\]"):
        F.binary_cross_entropy(flow.tensor(np.array([0.2, 1.5], np.float32), device="cuda"), t[:2])


def test_vocab_cross_entropy_ops_on_cuda_shards_match_cpu(cuda_double):
    """The vocab-parallel phases as engine ops on two shards of the classes: every shard's loss is
    the whole loss, the shards' gradients are the whole gradient's columns (the collectives done
    here by hand, as the SBP rule would)."""
    from engine.ops import loss as L
    rng = _rng(17)
    x, t = _logits(rng, 6, 23), _targets(rng, 6, 23)
    want = F.cross_entropy(flow.tensor(x, requires_grad=True), flow.tensor(t), reduction="none")
    xc = flow.tensor(x, requires_grad=True)
    F.cross_entropy(xc, flow.tensor(t), reduction="none").sum().backward()
    tg = flow.tensor(t, device="cuda")
    shards = [(0, flow.tensor(x[:, :10], device="cuda", requires_grad=True)),
              (10, flow.tensor(x[:, 10:], device="cuda", requires_grad=True))]
    stats = cuda_double._double.stats
    stats.reset()
    m = flow.tensor(np.max(x, axis=1, keepdims=True), device="cuda")
    total = sum(L.VocabStats.apply(s, m, tg, start=start) for start, s in shards)
    for start, s in shards:
        loss, _ = L.VocabCrossEntropy.apply(s, m, total, tg, classes=23, start=start)
        loss.sum().backward()
        np.testing.assert_allclose(loss.detach().cpu().numpy(), want.detach().numpy(), rtol=1e-6)
        np.testing.assert_allclose(s.grad.cpu().numpy(), xc.grad.numpy()[:, start: start + s.shape[1]], atol=1e-7)
    assert stats.syncs == 2 * 2  # the two comparisons above read back, nothing else


# ------------------------------------------------------------------ the emulators' checks
def test_emulator_refuses_a_row_kernel_with_too_few_blocks_or_partial_warps(cuda_double):
    from engine.kernels import _cuda
    x, t = cuda_double.asarray(_logits(_rng(18), 5, 7)), cuda_double.asarray(np.zeros(5, np.int64))
    loss, stats = cuda_double.empty(5, np.float32), cuda_double.empty((5, 2), np.float32)
    kernel = _cuda.raw_kernel(kce.SOURCE, "engine_ce_fwd__float")
    args = (x, t, loss, stats, np.int32(5), np.int32(7), np.int64(-100), np.float64(0), np.int32(0))
    with pytest.raises(ValueError, match="one block per row, 5 rows, got a grid of 4"):
        kernel((4,), (32,), args)
    with pytest.raises(ValueError, match="not a whole number of warps"):
        kernel((5,), (48,), args)
    with pytest.raises(TypeError, match="smoothing must be a float64 scalar"):
        kernel((5,), (32,), args[:-2] + (np.float32(0), np.int32(0)))
    with pytest.raises(ValueError, match="grouped reading of rows of 7 classes"):
        kernel((5,), (32,), args[:-1] + (np.int32(1),))
    kernel((5,), (32,), args)  # the right launch runs


def test_emulator_catches_a_stale_pointer_table_and_a_wrong_grid(cuda_double):
    from engine.kernels import _cuda
    rng = _rng(19)
    grads = _dev(cuda_double, _params(rng, [(5,), (mt.CHUNK * 3,), (4, 4)]))
    src, name = kgn.partial_kernel(np.float32, np.float32)
    kernel = _cuda.raw_kernel(src, name)
    partials = cuda_double.empty(3, np.float32)
    tab, n_chunks = mt.table([grads], [g.size for g in grads])
    args = (tab, np.int32(3), np.int64(n_chunks), np.int32(mt.CHUNK), partials, np.int32(0), np.float32(2))
    kernel((3,), (256,), args)
    with pytest.raises(ValueError, match="partials"):  # more blocks than partials
        kernel((4,), (256,), args)
    with pytest.raises(ValueError, match="1-D grid"):
        kernel((3, 2), (256,), args)
    with pytest.raises(ValueError, match="chunks passed"):
        kernel((3,), (256,), args[:2] + (np.int64(n_chunks + 1),) + args[3:])
    del grads[1]  # the table still points at the freed gradient
    gc.collect()
    with pytest.raises(ValueError, match="not in any live device allocation|runs past its allocation"):
        kernel((3,), (256,), args)


def test_table_reader_checks_the_chunk_starts_against_the_sizes():
    with pytest.raises(ValueError, match="chunk starts"):  # 10 elements cannot take 2 chunks
        mt.read_table(np.array([1 << 32, 10, 0, 2], np.int64), 1, 1)
    with pytest.raises(ValueError, match="has 4 int64 entries"):
        mt.read_table(np.array([1 << 32, 10, 0], np.int64), 1, 1)


# ------------------------------------------------------------------ the CUDA sources compile
def test_cuda_sources_compile_with_nvrtc():
    compile_ = nvrtc_compiler()
    compile_(kce.SOURCE, [f"{b}__{t}" for b in ("engine_ce_fwd", "engine_ce_bwd_rows", "engine_ce_vocab_stats",
                                                 "engine_ce_vocab_loss", "engine_ce_bwd")
                          for t in ("half", "float", "double")])
    for dt in (np.float16, np.float32, np.float64):
        compile_(ka.kernel_source(dt), [ka.kernel_name(dt)])
        for acc in (np.float32, np.float64):
            for src, name in (kgn.partial_kernel(dt, acc), kgn.scale_kernel(dt, acc)):
                compile_(src, [name])
        compile_(*kgn.unscale_kernel(dt)[:1], [kgn.unscale_kernel(dt)[1]])
    compile_(kls.SOURCE, [kls.KERNEL_NAME])
    for acc in (np.float32, np.float64):
        src, name = kgn.finish_kernel(acc)
        compile_(src, [name])


def test_clip_of_strided_gradients_matches_the_cpu(cuda_double):
    """A gradient that is a slice of a larger buffer is not `size` consecutive elements: the
    fused norm reads a dense copy and the clip scales it through its strides (found in review:
    the multi-tensor table walked the buffer instead)."""
    rng = np.random.default_rng(0)
    big = rng.standard_normal((3, 8)).astype(np.float32)
    dense = rng.standard_normal(5).astype(np.float32)
    norms, grads = [], []
    for device in ("cpu", "cuda"):
        p, q = flow.zeros(3, 4, device=device, requires_grad=True), flow.zeros(5, device=device, requires_grad=True)
        buf = flow.tensor(big, device=device)
        p.grad, q.grad = buf[:, ::2], flow.tensor(dense, device=device)
        norms.append(float(flow.nn.utils.clip_grad_norm_([p, q], 1.0)))
        grads.append((p.grad.cpu().numpy(), buf.cpu().numpy()))
    assert abs(norms[0] - norms[1]) <= 1e-6 * norms[0]
    np.testing.assert_allclose(grads[1][0], grads[0][0], rtol=1e-6)
    np.testing.assert_array_equal(grads[1][1][:, 1::2], big[:, 1::2])  # the gaps are untouched


def test_the_pointer_table_refuses_strided_arrays(cuda_double):
    from engine.kernels import _multi_tensor as mt
    a = cuda_double.zeros((4, 4), dtype=np.float32)
    with pytest.raises(ValueError, match="C- or F-contiguous"):
        mt.table([[a[:, ::2]]], [8])


@pytest.mark.parametrize("bad", [None, np.inf, -np.inf, np.nan])
def test_grad_scaler_on_cuda_finds_inf_and_nan_without_a_host_read(cuda_double, bad):
    """GradScaler.unscale_ on CUDA gradients: unscaled in place and checked by one launch per
    dtype, inf/nan raised in a flag on the device, nothing read back (its copy to page-locked
    memory queued); found_inf() then waits for that copy's event only. float16, float32 and
    float64 gradients together."""
    stats = cuda_double._double.stats
    rng = _rng(19)
    dtypes = [np.float32, np.float16, np.float64, np.float32]
    params = [flow.zeros(s, device="cuda", dtype=getattr(flow, np.dtype(dt).name), requires_grad=True)
              for s, dt in zip([(3, 4), (5,), (2, 2), (7,)], dtypes)]
    grads = [(rng.standard_normal(p.shape) * 8).astype(dt) for p, dt in zip(params, dtypes)]
    if bad is not None:
        grads[1][2] = bad  # in the float16 gradient
    for p, g in zip(params, grads):
        p.grad = flow.tensor(g, device="cuda")
    opt = optim.SGD(params, lr=0.1)
    scaler = flow.amp.GradScaler("cuda", init_scale=4.0)
    stats.reset()
    scaler.unscale_(opt)
    assert stats.syncs == 0 and stats.async_d2h == 1 and not stats.event_waits
    assert stats.by_name["multiply"] == 0 and sum(v for k, v in stats.by_name.items() if "grad_unscale" in k) == 3
    assert scaler.found_inf(opt) == (bad is not None)
    assert stats.syncs == 0 and len(stats.event_waits) == 1
    for p, g in zip(params, grads):
        np.testing.assert_array_equal(p.grad.cpu().numpy(), g / g.dtype.type(4))
