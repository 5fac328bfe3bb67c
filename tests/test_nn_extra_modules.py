"""Layers and functions third-party torch scripts use, against torch: Upsample and its 2-D
shorthands, PixelShuffle / PixelUnshuffle, the padding layers, Fold / Unfold, AdaptiveMaxPool1d/2d,
nn.utils.parameters_to_vector / vector_to_parameters (forward, backward, reprs, error types);
and the random ones by their statistics and structure: Dropout1d/2d/3d (whole channels zeroed,
survivors scaled by 1/(1-p), eval is the identity, torch's rank rules and warnings),
AlphaDropout / FeatureAlphaDropout (mean and variance kept), gumbel_softmax (sample frequencies
follow softmax(logits), hard=True is one-hot with the soft sample's gradient)."""
import warnings

import numpy as np
import pytest
import torch

import engine as flow
import engine.nn.functional as F

RTOL, ATOL = 1e-5, 1e-6


def _pair(a, requires_grad=True):
    return (flow.tensor(a, requires_grad=requires_grad and a.dtype.kind == "f"),
            torch.tensor(a, requires_grad=requires_grad and a.dtype.kind == "f"))


def _outputs(out):
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def check_same(f_fn, t_fn, *arrays, seed=0):
    """f_fn(engine tensors) and t_fn(torch tensors) agree in values, shapes and dtypes, and so do
    the input gradients of one random upstream gradient. Returns the largest differences."""
    pairs = [_pair(a) for a in arrays]
    fo, to = _outputs(f_fn(*[p[0] for p in pairs])), _outputs(t_fn(*[p[1] for p in pairs]))
    assert len(fo) == len(to)
    errs = [0.0, 0.0]
    for f, t in zip(fo, to):
        assert tuple(f.shape) == tuple(t.shape), (tuple(f.shape), tuple(t.shape))
        assert f.dtype.name == str(t.dtype).replace("torch.", "")
        np.testing.assert_allclose(f.detach().numpy(), t.detach().numpy(), rtol=RTOL, atol=ATOL)
        if f.numel():
            errs[0] = max(errs[0], float(np.abs(f.detach().numpy() - t.detach().numpy()).max()))
    if not to[0].requires_grad:
        return errs
    g = np.random.default_rng(seed).standard_normal(tuple(to[0].shape)).astype(arrays[0].dtype)
    fo[0].backward(flow.tensor(g))
    to[0].backward(torch.tensor(g))
    for (f, t) in pairs:
        if t.grad is not None:
            np.testing.assert_allclose(f.grad.numpy(), t.grad.numpy(), rtol=RTOL, atol=ATOL)
            errs[1] = max(errs[1], float(np.abs(f.grad.numpy() - t.grad.numpy()).max()))
    return errs


def check_module(make, *arrays):
    """The same layer built from `make(nn)` in both libraries: same repr and same numbers."""
    em, tm = make(flow.nn), make(torch.nn)
    assert repr(em) == repr(tm)
    return check_same(em, tm, *arrays)


def same_error(f_call, t_call):
    """The engine raises the exception type torch raises."""
    with pytest.raises(Exception) as t_err:
        t_call(torch)
    with pytest.raises(type(t_err.value)):
        f_call(flow)


def randn(*shape, seed=1, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# ------------------------------------------------------------------ Upsample
UPSAMPLE = [
    ((2, 3, 5), dict(scale_factor=2)),
    ((2, 3, 5), dict(size=8, mode="linear")),
    ((2, 3, 5), dict(scale_factor=1.7, mode="linear", align_corners=True)),
    ((2, 3, 5, 4), dict(scale_factor=2)),
    ((2, 3, 5, 4), dict(size=(7, 9), mode="nearest")),
    ((2, 3, 5, 4), dict(scale_factor=(1.5, 2.5), mode="nearest-exact")),
    ((2, 3, 5, 4), dict(scale_factor=2, mode="bilinear")),
    ((2, 3, 5, 4), dict(size=(9, 3), mode="bilinear", align_corners=True)),
    ((2, 3, 5, 4), dict(scale_factor=1.3, mode="bilinear", recompute_scale_factor=True)),
    ((2, 3, 5, 4), dict(scale_factor=1.3, mode="bicubic", align_corners=False)),
    ((2, 3, 5, 4), dict(scale_factor=0.6, mode="area")),
    ((1, 2, 3, 4, 5), dict(scale_factor=2)),
    ((1, 2, 3, 4, 5), dict(size=(4, 6, 3), mode="trilinear", align_corners=True)),
    ((1, 2, 3, 4, 5), dict(scale_factor=(1.5, 1.0, 0.7), mode="trilinear", recompute_scale_factor=True)),
]


@pytest.mark.parametrize("shape,kw", UPSAMPLE, ids=[f"{len(s) - 2}d-{i}" for i, (s, _) in enumerate(UPSAMPLE)])
def test_upsample_matches_torch(shape, kw):
    check_module(lambda nn: nn.Upsample(**kw), randn(*shape))


@pytest.mark.parametrize("kw", [dict(scale_factor=2), dict(size=(7, 6)), dict(scale_factor=(2, 3))])
def test_upsampling_2d_shorthands(kw):
    x = randn(2, 3, 4, 5)
    check_module(lambda nn: nn.UpsamplingNearest2d(**kw), x)
    check_module(lambda nn: nn.UpsamplingBilinear2d(**kw), x)
    em = flow.nn.UpsamplingBilinear2d(**kw)
    assert (em.mode, em.align_corners) == ("bilinear", True)


def test_upsample_attributes_as_torch():
    for kw in [dict(scale_factor=2), dict(scale_factor=(2, 3)), dict(scale_factor=0), dict(size=4)]:
        em, tm = flow.nn.Upsample(**kw), torch.nn.Upsample(**kw)
        for attr in ("name", "size", "scale_factor", "mode", "align_corners", "recompute_scale_factor"):
            assert getattr(em, attr) == getattr(tm, attr), attr


@pytest.mark.parametrize("kw", [dict(), dict(size=4, scale_factor=2), dict(size=4, recompute_scale_factor=True),
                                dict(scale_factor=2, mode="nearest", align_corners=True),
                                dict(scale_factor=(2, 2, 2))])
def test_upsample_errors(kw):
    x = randn(1, 2, 3, 4)
    same_error(lambda m: m.nn.Upsample(**kw)(m.tensor(x)), lambda m: m.nn.Upsample(**kw)(m.tensor(x)))


# ------------------------------------------------------------------ pixel shuffle
def test_pixel_shuffle_modules():
    check_module(lambda nn: nn.PixelShuffle(3), randn(2, 18, 3, 5))
    check_module(lambda nn: nn.PixelShuffle(2), randn(8, 3, 1))
    check_module(lambda nn: nn.PixelUnshuffle(2), randn(2, 3, 6, 4))
    check_module(lambda nn: nn.PixelUnshuffle(3), randn(1, 2, 3, 3, 9))


@pytest.mark.parametrize("call", [
    lambda m, x: m.nn.functional.pixel_shuffle(x[0, 0], 2),      # fewer than 3 dims
    lambda m, x: m.nn.functional.pixel_shuffle(x, 3),            # 8 channels, not divisible by 9
    lambda m, x: m.nn.functional.pixel_shuffle(x, 0),
    lambda m, x: m.nn.functional.pixel_shuffle(x, -2),
    lambda m, x: m.nn.functional.pixel_shuffle(x, 2.0),
    lambda m, x: m.nn.functional.pixel_unshuffle(x, 4),          # height 6 not divisible by 4
    lambda m, x: m.nn.functional.pixel_unshuffle(x[..., :3], 2),  # width 3 not divisible by 2
    lambda m, x: m.nn.functional.pixel_unshuffle(x, 0),
    lambda m, x: m.nn.functional.pixel_unshuffle(x[0, 0], 2),
])
def test_pixel_shuffle_errors(call):
    x = randn(2, 8, 6, 4)
    same_error(lambda m: call(m, m.tensor(x)), lambda m: call(m, m.tensor(x)))


# ------------------------------------------------------------------ padding layers
PADS = [
    ("ReflectionPad1d", (2,), (2, 3, 5)), ("ReflectionPad1d", ((3, 1),), (3, 4)),
    ("ReflectionPad2d", (1,), (2, 3, 4, 5)), ("ReflectionPad2d", ((1, 2, 3, 0),), (3, 4, 5)),
    ("ReflectionPad3d", (1,), (1, 2, 3, 4, 5)), ("ReflectionPad3d", ((0, 1, 2, 1, 1, 0),), (2, 3, 4, 3)),
    ("ReplicationPad1d", (3,), (2, 3, 2)), ("ReplicationPad1d", ((0, 4),), (3, 1)),
    ("ReplicationPad2d", (2,), (2, 3, 4, 5)), ("ReplicationPad2d", ((3, 0, 1, 2),), (3, 1, 2)),
    ("ReplicationPad3d", (1,), (1, 2, 3, 4, 5)), ("ReplicationPad3d", ((2, 0, 0, 1, 3, 1),), (2, 2, 1, 3)),
    ("ZeroPad1d", (2,), (2, 3, 5)), ("ZeroPad1d", ((-1, 3),), (3, 4)),
    ("ZeroPad2d", (1,), (2, 3, 4, 5)), ("ZeroPad2d", ((1, -1, 2, 0),), (3, 4, 5)), ("ZeroPad2d", ((1, 2),), (4, 5)),
    ("ZeroPad3d", (1,), (1, 2, 3, 4, 5)), ("ZeroPad3d", ((0, 1, 2, 1, 1, 0),), (3, 4, 3)),
    ("ConstantPad1d", (2, 3.5), (2, 3, 5)), ("ConstantPad1d", ((0, 3), -1.0), (4,)),
    ("ConstantPad2d", (1, 0.5), (2, 3, 4, 5)), ("ConstantPad2d", ((1, 2, -1, 0), 2.0), (3, 4, 5)),
    ("ConstantPad3d", (1, -2.0), (1, 2, 3, 4, 5)), ("ConstantPad3d", ((0, 1, 2, 1, 1, 0), 1.5), (2, 3, 4, 3)),
    ("CircularPad1d", (2,), (2, 3, 5)), ("CircularPad1d", ((3, 1),), (3, 4)),
    ("CircularPad2d", (1,), (2, 3, 4, 5)), ("CircularPad2d", ((1, 2, -1, 3),), (3, 4, 5)),
    ("CircularPad3d", (1,), (1, 2, 3, 4, 5)), ("CircularPad3d", ((0, 1, 2, 1, 1, 0),), (2, 3, 4, 3)),
]


@pytest.mark.parametrize("name,args,shape", PADS, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(PADS)])
def test_padding_layers_match_torch(name, args, shape):
    check_module(lambda nn: getattr(nn, name)(*args), randn(*shape))


def test_padding_layer_attributes():
    for name, args, _ in PADS:
        em, tm = getattr(flow.nn, name)(*args), getattr(torch.nn, name)(*args)
        assert em.padding == tm.padding, name
        assert getattr(em, "value", None) == getattr(tm, "value", None), name
    assert isinstance(flow.nn.ZeroPad2d(1), flow.nn.ConstantPad2d)


@pytest.mark.parametrize("name,args,shape", [
    ("ReflectionPad1d", (3,), (2, 3, 3)),          # padding >= the input size
    ("ReflectionPad2d", (1,), (4, 5)),             # too few dims for a 2-D reflection
    ("ReplicationPad3d", (1,), (3, 4)),
    ("CircularPad1d", (1,), (4,)),                 # the circular layers check the rank themselves
    ("CircularPad2d", (1,), (1, 2, 3, 4, 5)),
    ("CircularPad3d", (1,), (2, 3, 4)),
    ("CircularPad1d", (5,), (2, 3, 4)),            # wraps around more than once
    ("ZeroPad2d", ((-3, -3),), (2, 5)),            # a negative output size
])
def test_padding_layer_errors(name, args, shape):
    x = randn(*shape)
    same_error(lambda m: getattr(m.nn, name)(*args)(m.tensor(x)), lambda m: getattr(m.nn, name)(*args)(m.tensor(x)))


# ------------------------------------------------------------------ fold / unfold
def test_fold_unfold_modules():
    check_module(lambda nn: nn.Unfold(3), randn(2, 3, 6, 5))
    check_module(lambda nn: nn.Unfold((2, 3), dilation=(1, 2), padding=(2, 1), stride=(3, 2)), randn(2, 2, 7, 8))
    check_module(lambda nn: nn.Unfold(2, stride=2), randn(3, 4, 5))
    check_module(lambda nn: nn.Fold((4, 5), 2), randn(2, 12, 12))
    check_module(lambda nn: nn.Fold(6, (2, 3), dilation=2, padding=1, stride=(1, 2)), randn(2, 12, 12))
    check_module(lambda nn: nn.Fold((3, 3), 2), randn(8, 4))


def test_fold_inverts_unfold_up_to_the_overlap_count():
    """torch's documented identity: fold(unfold(x)) == x * fold(unfold(ones))."""
    x = flow.tensor(randn(1, 2, 6, 7))
    kw = dict(kernel_size=(3, 2), dilation=(1, 2), padding=1, stride=1)
    folded = F.fold(F.unfold(x, **kw), (6, 7), **kw)
    count = F.fold(F.unfold(flow.ones(1, 2, 6, 7), **kw), (6, 7), **kw)
    np.testing.assert_allclose(folded.numpy(), (x * count).numpy(), rtol=1e-6)


def test_fold_unfold_half_precision():
    for dtype in ("float16", "bfloat16"):
        x = randn(2, 3, 5, 6)
        f = F.unfold(flow.tensor(x).to(getattr(flow, dtype)), 2, padding=1)
        t = torch.nn.functional.unfold(torch.tensor(x).to(getattr(torch, dtype)), 2, padding=1)
        assert f.dtype.name == dtype
        np.testing.assert_allclose(f.float().numpy(), t.float().numpy())
        cols = randn(2, 12, 12)
        f = F.fold(flow.tensor(cols).to(getattr(flow, dtype)), (4, 5), 2)
        t = torch.nn.functional.fold(torch.tensor(cols).to(getattr(torch, dtype)), (4, 5), 2)
        np.testing.assert_allclose(f.float().numpy(), t.float().numpy(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("call", [
    lambda m, x: m.nn.functional.unfold(x[0, 0], 2),                 # 2-D input: IndexError in torch
    lambda m, x: m.nn.functional.unfold(x[None], 2),                 # 5-D input
    lambda m, x: m.nn.functional.unfold(x[:, :0], 2),                # empty channels
    lambda m, x: m.nn.functional.unfold(x, 0),
    lambda m, x: m.nn.functional.unfold(x, 2, stride=0),
    lambda m, x: m.nn.functional.unfold(x, 2, dilation=(1, 0)),
    lambda m, x: m.nn.functional.unfold(x, 2, padding=-1),
    lambda m, x: m.nn.functional.unfold(x, (2, 2, 2)),
    lambda m, x: m.nn.functional.unfold(x, 8),                       # no block fits
    lambda m, x: m.nn.functional.unfold(x.long(), 2),
    lambda m, x: m.nn.functional.fold(x[0], (3, 4), 2),              # 3-D columns of the wrong size
    lambda m, x: m.nn.functional.fold(x, (3, 4), 2),                 # 4-D input
    lambda m, x: m.nn.functional.fold(x[0, :, :5, :6].reshape(1, 15, 6), (3, 4), 2),  # 15 not divisible by 4
    lambda m, x: m.nn.functional.fold(x[0, :, :4, :6].reshape(1, 12, 8), (3, 4), 2),  # 8 blocks, expected 6
    lambda m, x: m.nn.functional.fold(x[0, :, :4, :6].reshape(1, 12, 8), (3, 4, 5), 2),
    lambda m, x: m.nn.functional.fold(x[0, :, :4, :1].reshape(1, 12, 1), (1, 1), 2),  # no block fits
    lambda m, x: m.nn.functional.fold(x[0, :, :4, :6].reshape(1, 12, 6).long(), (3, 4), 2),
])
def test_fold_unfold_errors(call):
    x = randn(2, 3, 6, 7)
    same_error(lambda m: call(m, m.tensor(x)), lambda m: call(m, m.tensor(x)))


# ------------------------------------------------------------------ adaptive max pools
def _distinct(*shape, seed=2):
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    return (rng.permutation(n).reshape(shape) * 0.37).astype(np.float32)


@pytest.mark.parametrize("make,shape", [
    (lambda nn: nn.AdaptiveMaxPool2d((3, 4)), (2, 3, 7, 9)),
    (lambda nn: nn.AdaptiveMaxPool2d(5, return_indices=True), (2, 3, 7, 9)),
    (lambda nn: nn.AdaptiveMaxPool2d((None, 2), return_indices=True), (3, 5, 7)),
    (lambda nn: nn.AdaptiveMaxPool2d((11, 1)), (1, 2, 4, 3)),
    (lambda nn: nn.AdaptiveMaxPool1d(4), (2, 3, 11)),
    (lambda nn: nn.AdaptiveMaxPool1d(6, return_indices=True), (3, 5)),
])
def test_adaptive_max_pool_modules(make, shape):
    check_module(make, _distinct(*shape))


def test_adaptive_max_pool_ties_and_nans_as_torch():
    """Ties keep the first maximum, a NaN wins its window (the last NaN when there are several)."""
    x = np.zeros((1, 2, 6, 7), np.float32)
    x[0, 0, 1, 1] = x[0, 0, 1, 2] = 5
    x[0, 1, 0, 0] = x[0, 1, 2, 3] = x[0, 1, 4, 6] = np.nan
    for size in [(2, 3), (4, 4), 1]:
        fo, fi = F.adaptive_max_pool2d(flow.tensor(x), size, return_indices=True)
        to, ti = torch.nn.functional.adaptive_max_pool2d(torch.tensor(x), size, return_indices=True)
        np.testing.assert_array_equal(fi.numpy(), ti.numpy())
        np.testing.assert_array_equal(fo.numpy(), to.numpy())


def test_adaptive_max_pool_double_backward():
    def run(m, x):
        y = m.nn.functional.adaptive_max_pool2d(x, (2, 3))
        (g,) = m.autograd.grad((y * y).sum(), [x], create_graph=True)
        return (g * g).sum()
    check_same(lambda x: run(flow, x), lambda x: run(torch, x), _distinct(1, 2, 5, 7).astype(np.float64))


@pytest.mark.parametrize("call", [
    lambda m, x: m.nn.functional.adaptive_max_pool2d(x[0, 0], (2, 2)),   # torch's ValueError
    lambda m, x: m.nn.functional.adaptive_max_pool2d(x[0, 0], 2),
    lambda m, x: m.nn.functional.adaptive_max_pool2d(x[None], 2),
    lambda m, x: m.nn.functional.adaptive_max_pool2d(x, ()),
    lambda m, x: m.nn.functional.adaptive_max_pool2d(x, (2, 2, 2)),
    lambda m, x: m.nn.functional.adaptive_max_pool2d(x, -1),
    lambda m, x: m.nn.functional.adaptive_max_pool2d(x[:, :, :0], 2),
    lambda m, x: m.nn.functional.adaptive_max_pool2d(x.long(), 2),
    lambda m, x: m.nn.functional.adaptive_max_pool1d(x[0, 0, 0], 2),
    lambda m, x: m.nn.functional.adaptive_max_pool1d(x, 2),
    lambda m, x: m.nn.functional.adaptive_max_pool1d(x[0], (2, 2)),
    lambda m, x: m.nn.functional.adaptive_max_pool1d(x[0], None),
    lambda m, x: m.nn.functional.adaptive_max_pool1d(x[0].long(), 2),
])
def test_adaptive_max_pool_errors(call):
    x = randn(2, 3, 5, 7)
    same_error(lambda m: call(m, m.tensor(x)), lambda m: call(m, m.tensor(x)))


# ------------------------------------------------------------------ parameters <-> vector
def _twin_models():
    torch.manual_seed(0)
    tm = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Conv1d(2, 3, 2), torch.nn.LayerNorm(5))
    em = flow.nn.Sequential(flow.nn.Linear(3, 4), flow.nn.Conv1d(2, 3, 2), flow.nn.LayerNorm(5))
    em.load_state_dict({k: flow.tensor(v.detach().numpy()) for k, v in tm.state_dict().items()})
    return em, tm


def test_parameters_to_vector_matches_torch():
    em, tm = _twin_models()
    ev = flow.nn.utils.parameters_to_vector(em.parameters())
    tv = torch.nn.utils.parameters_to_vector(tm.parameters())
    np.testing.assert_array_equal(ev.detach().numpy(), tv.detach().numpy())
    g = randn(ev.numel())
    (ev * flow.tensor(g)).sum().backward()
    (tv * torch.tensor(g)).sum().backward()
    for (name, ep), tp in zip(em.named_parameters(), tm.parameters()):
        np.testing.assert_array_equal(ep.grad.numpy(), tp.grad.numpy(), err_msg=name)


def test_vector_to_parameters_matches_torch():
    em, tm = _twin_models()
    n = sum(p.numel() for p in tm.parameters())
    v = randn(n + 3)  # a longer vector: the rest is ignored, as torch
    flow.nn.utils.vector_to_parameters(flow.tensor(v), em.parameters())
    torch.nn.utils.vector_to_parameters(torch.tensor(v), tm.parameters())
    for (name, ep), tp in zip(em.named_parameters(), tm.parameters()):
        assert isinstance(ep, flow.nn.Parameter) and ep.requires_grad
        np.testing.assert_array_equal(ep.detach().numpy(), tp.detach().numpy(), err_msg=name)
    x = randn(2, 5)
    np.testing.assert_allclose(em[2](flow.tensor(x)).detach().numpy(), tm[2](torch.tensor(x)).detach().numpy(),
                               rtol=1e-6)


def test_vector_to_parameters_refuses_a_non_tensor():
    em, tm = _twin_models()
    for bad in ([1.0, 2.0], np.zeros(3)):
        with pytest.raises(TypeError) as t_err:
            torch.nn.utils.vector_to_parameters(bad, tm.parameters())
        with pytest.raises(TypeError) as f_err:
            flow.nn.utils.vector_to_parameters(bad, em.parameters())
        assert str(f_err.value) == str(t_err.value)


# ------------------------------------------------------------------ channel dropout
N, C = 400, 50


@pytest.mark.parametrize("fn,shape,batched", [
    ("dropout1d", (N, C, 3), True), ("dropout1d", (C, 7), False),
    ("dropout2d", (N, C, 2, 3), True), ("dropout2d", (N, C, 4), True),  # torch reads a 3-D input as (N, C, L)
    ("dropout3d", (N, C, 2, 2, 2), True), ("dropout3d", (C, 2, 3, 1), False),
])
@pytest.mark.parametrize("p", [0.2, 0.7])
def test_channel_dropout_statistics(fn, shape, batched, p):
    """Each (sample, channel) is zeroed whole with probability p; the rest is scaled by 1/(1-p);
    the gradient goes through the same mask."""
    flow.manual_seed(0)
    x = flow.tensor(np.abs(randn(*shape)) + 0.5, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y = getattr(F, fn)(x, p)
    ratio = (y / x).detach().numpy().reshape(shape[:2 if batched else 1] + (-1,))
    per_channel = ratio[..., 0]
    np.testing.assert_allclose(ratio, np.broadcast_to(per_channel[..., None], ratio.shape), rtol=1e-6,
                               err_msg="a channel was partly dropped")
    assert np.all(np.isclose(per_channel, 0) | np.isclose(per_channel, 1 / (1 - p), rtol=1e-6))
    drawn = per_channel.size
    assert abs((per_channel == 0).mean() - p) < 5 * np.sqrt(p * (1 - p) / drawn) + 1e-3
    g = randn(*shape)
    y.backward(flow.tensor(g))
    np.testing.assert_allclose(x.grad.numpy(), g * (y / x).detach().numpy(), rtol=1e-6)


def test_feature_alpha_dropout_statistics():
    flow.manual_seed(1)
    x = flow.tensor(randn(N, C, 6))
    y = F.feature_alpha_dropout(x, 0.3, training=True).numpy()
    a = 1.0 / np.sqrt((1.7580993408473766 ** 2 * 0.3 + 1) * 0.7)
    dropped = np.isclose(y, -1.7580993408473766 * a + 1.7580993408473766 * a * 0.3, atol=1e-6).all(axis=-1)
    kept = np.isclose(y, x.numpy() * a + 1.7580993408473766 * a * 0.3, atol=1e-5).all(axis=-1)
    assert np.all(dropped ^ kept), "a channel was partly dropped"
    assert abs(dropped.mean() - 0.3) < 0.02


@pytest.mark.parametrize("fn,shape", [("dropout1d", (4, 5, 6)), ("dropout2d", (4, 5, 6, 2)),
                                      ("dropout3d", (4, 5, 6, 2, 2)), ("alpha_dropout", (4, 5)),
                                      ("feature_alpha_dropout", (4, 5, 6))])
def test_dropout_eval_p0_p1_and_inplace(fn, shape):
    f = getattr(F, fn)
    x = flow.tensor(randn(*shape))
    assert f(x, 0.5, training=False) is x
    assert f(x, 0.0, training=True) is x
    ones = f(x, 1.0, training=True)
    assert tuple(ones.shape) == shape and not np.any(ones.numpy())  # torch: input * 0, no shift
    flow.manual_seed(3)
    expect = f(x, 0.4, training=True).numpy()
    flow.manual_seed(3)
    y = x.clone()
    assert f(y, 0.4, training=True, inplace=True) is y
    np.testing.assert_array_equal(y.numpy(), expect)
    w = flow.tensor(randn(*shape), requires_grad=True)
    h = w * 1.0
    f(h, 0.4, training=True, inplace=True)  # recorded in place: the gradient goes through the mask
    h.sum().backward()
    assert w.grad is not None


def test_dropout_modules():
    for name in ("Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout"):
        em, tm = getattr(flow.nn, name)(0.3, inplace=True), getattr(torch.nn, name)(0.3, inplace=True)
        assert repr(em) == repr(tm)
        for bad in (-0.1, 1.5):
            same_error(lambda m: getattr(m.nn, name)(bad), lambda m: getattr(m.nn, name)(bad))
        x = flow.tensor(randn(*{"Dropout1d": (3, 4, 5), "Dropout2d": (3, 4, 5, 2)}.get(name, (3, 4, 5, 2, 2))))
        assert em.eval()(x) is x
    flow.manual_seed(0)
    y = flow.nn.Dropout2d(0.5)(flow.ones(64, 32, 3, 3)).numpy()
    assert set(np.unique(y)) == {0.0, 2.0} and np.all(y == y[:, :, :1, :1])


def test_alpha_dropout_keeps_mean_and_variance():
    """On standard normal inputs alpha dropout keeps mean 0 and variance 1 (what SELU needs)."""
    flow.manual_seed(2)
    x = flow.tensor(randn(200_000, seed=5))
    for p in (0.1, 0.5):
        y = F.alpha_dropout(x, p, training=True).numpy()
        assert abs(y.mean()) < 0.01 and abs(y.var() - 1) < 0.02
        a = 1.0 / np.sqrt((1.7580993408473766 ** 2 * p + 1) * (1 - p))
        low = -1.7580993408473766 * a + 1.7580993408473766 * a * p
        assert abs(np.isclose(y, low).mean() - p) < 0.005
    assert F.alpha_dropout(x, 0.5) is x  # training defaults to False, as torch's function
    xg = flow.tensor(randn(1000), requires_grad=True)
    flow.manual_seed(4)
    y = F.alpha_dropout(xg, 0.2, training=True)
    y.sum().backward()
    kept = ~np.isclose(y.detach().numpy(), -1.7580993408473766 * (1 / np.sqrt((1.7580993408473766 ** 2 * 0.2 + 1)
                                                                              * 0.8)) * 0.8)
    a = 1.0 / np.sqrt((1.7580993408473766 ** 2 * 0.2 + 1) * 0.8)
    np.testing.assert_allclose(xg.grad.numpy(), np.where(kept, a, 0.0), rtol=1e-6)


def test_dropout_rank_rules_as_torch():
    x5, x3, x2, x1 = (randn(*s) for s in [(2, 3, 4, 5, 6), (2, 3, 4), (3, 4), (5,)])
    for call in (lambda m: m.nn.functional.dropout1d(m.tensor(x1)),
                 lambda m: m.nn.functional.dropout1d(m.tensor(randn(2, 3, 4, 5)), 0.5, False),
                 lambda m: m.nn.functional.dropout2d(m.tensor(x1)),
                 lambda m: m.nn.functional.feature_alpha_dropout(m.tensor(x1), 0.5, True),
                 lambda m: m.nn.functional.dropout2d(m.tensor(x5), 1.5),
                 lambda m: m.nn.functional.dropout2d(m.tensor(x3).long()),
                 lambda m: m.nn.functional.alpha_dropout(m.tensor(x3).long(), 0.5, True)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            same_error(call, call)
    for fn, x, count in [("dropout2d", x3, 0), ("dropout2d", x2, 1), ("dropout2d", x5, 1), ("dropout3d", x3, 1),
                         ("dropout3d", x2, 1), ("dropout3d", x5, 0), ("dropout2d", randn(2, 3, 4, 5), 0)]:
        for m in (torch, flow):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                getattr(m.nn.functional, fn)(m.tensor(x), 0.5)
            texts = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
            if m is torch:
                expected = texts
            else:
                assert texts == expected, (fn, x.shape)
        assert len(expected) == count + (fn == "dropout2d" and x.ndim == 3), (fn, x.shape)
    flow.manual_seed(0)  # dropout3d of a 3-D input: torch's unsqueeze(0) makes dim 0 the channels
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y = F.dropout3d(flow.ones(40, 3, 2), 0.5).numpy()
    assert np.all(y == y[:, :1, :1])


# ------------------------------------------------------------------ gumbel_softmax
def test_gumbel_softmax_statistics():
    """Samples are distributions over `dim`; their argmax is drawn with probabilities
    softmax(logits) (the Gumbel-max trick); a lower tau gives sharper samples."""
    flow.manual_seed(0)
    logits = np.log(np.array([0.1, 0.2, 0.3, 0.4], np.float32))
    rows = flow.tensor(np.tile(logits, (40_000, 1)))
    y = F.gumbel_softmax(rows, tau=0.7).numpy()
    np.testing.assert_allclose(y.sum(-1), 1.0, rtol=1e-5)
    freq = np.bincount(y.argmax(-1), minlength=4) / len(y)
    np.testing.assert_allclose(freq, [0.1, 0.2, 0.3, 0.4], atol=0.01)
    sharp = F.gumbel_softmax(rows, tau=0.1).numpy().max(-1).mean()
    assert sharp > y.max(-1).mean()
    y0 = F.gumbel_softmax(flow.tensor(np.tile(logits[:, None], (1, 30_000))), dim=0).numpy()
    np.testing.assert_allclose(np.bincount(y0.argmax(0), minlength=4) / y0.shape[1], [0.1, 0.2, 0.3, 0.4],
                               atol=0.012)


def test_gumbel_softmax_hard_is_straight_through():
    """hard=True: the one-hot of the soft sample's argmax, with the soft sample's gradient, i.e.
    y_soft * (w - <w, y_soft>) / tau (the softmax Jacobian of the perturbed logits)."""
    tau = 0.5
    x = randn(6, 5, seed=3)
    w = randn(6, 5, seed=4)
    flow.manual_seed(7)
    soft_in = flow.tensor(x, requires_grad=True)
    soft = F.gumbel_softmax(soft_in, tau=tau)
    flow.manual_seed(7)
    hard_in = flow.tensor(x, requires_grad=True)
    hard = F.gumbel_softmax(hard_in, tau=tau, hard=True)
    s = soft.detach().numpy()
    np.testing.assert_array_equal(hard.detach().numpy(), np.eye(5, dtype=np.float32)[s.argmax(-1)])
    (hard * flow.tensor(w)).sum().backward()
    (soft * flow.tensor(w)).sum().backward()
    expected = s * (w - (w * s).sum(-1, keepdims=True)) / tau
    np.testing.assert_allclose(hard_in.grad.numpy(), expected, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(soft_in.grad.numpy(), expected, rtol=1e-4, atol=1e-6)
    # torch's own formula on the same noise G (recovered from the soft sample: (x + G) / tau = log s)
    tx = torch.tensor(x, requires_grad=True)
    noise = torch.tensor(tau * np.log(s) - x)
    y_soft = ((tx + noise) / tau).softmax(-1)
    y_hard = torch.zeros_like(tx).scatter_(-1, y_soft.max(-1, keepdim=True)[1], 1.0)
    ((y_hard - y_soft.detach() + y_soft) * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(hard_in.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_gumbel_softmax_arguments_as_torch():
    x = randn(3, 4)
    with pytest.warns(UserWarning, match="deprecated"):
        F.gumbel_softmax(flow.tensor(x), eps=1e-5)
    same_error(lambda m: m.nn.functional.gumbel_softmax(m.tensor(x).long()),
               lambda m: m.nn.functional.gumbel_softmax(m.tensor(x).long()))
    y = F.gumbel_softmax(flow.tensor(1.5), hard=True)
    assert tuple(y.shape) == () and float(y) == 1.0
    assert F.gumbel_softmax(flow.tensor(x).double(), dim=0).dtype == flow.float64
