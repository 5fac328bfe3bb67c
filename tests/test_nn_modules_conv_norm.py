"""Convolution, pooling and normalisation modules of engine.nn against torch.nn.

Each module is built in both libraries with the same arguments; repr (extra_repr), public
attributes and state_dict keys/shapes/dtypes must match. The parameters and buffers of one side
are randomised and loaded into the other (both directions), then for several inputs (odd sizes,
batch 1, unbatched) in train and then eval mode: outputs, input gradients, parameter gradients
and every buffer after the step (running statistics, num_batches_tracked) are compared.
Functional-level parity (and finite-difference gradients) of the underlying ops is in
tests/ops/cases_conv.py and cases_normalization.py."""
import math
import warnings
from collections import OrderedDict

import numpy as np
import pytest
import torch

import engine as flow

TOL = {np.float32: (2e-5, 2e-5), np.float64: (1e-10, 1e-12)}
TORCH_DT = {np.float32: torch.float32, np.float64: torch.float64}
FLOW_DT = {np.float32: flow.float32, np.float64: flow.float64}


# ------------------------------------------------------------------ helpers
def _random_state(state, rng):
    """Random values for a state_dict: running_var positive, num_batches_tracked a small count."""
    out = OrderedDict()
    for k, v in state.items():
        if k.endswith("num_batches_tracked"):
            out[k] = np.array(3, dtype=np.int64)
        elif k.endswith("running_var"):
            out[k] = rng.uniform(0.5, 2.0, v.shape).astype(v.dtype)
        else:
            out[k] = rng.standard_normal(v.shape).astype(v.dtype)
    return out


def _np_state(module):
    return OrderedDict((k, v.detach().numpy().copy()) for k, v in module.state_dict().items())


def _public_attrs(m):
    return {k: v for k, v in vars(m).items() if not k.startswith("_") and k != "training"}


def _check_structure(tm, em):
    assert repr(em) == repr(tm)
    assert _public_attrs(em) == _public_attrs(tm)
    if hasattr(tm, "_reversed_padding_repeated_twice"):
        assert list(em._reversed_padding_repeated_twice) == list(tm._reversed_padding_repeated_twice)
    ts, es = tm.state_dict(), em.state_dict()
    assert list(es) == list(ts)
    for k in ts:
        assert tuple(es[k].shape) == tuple(ts[k].shape), k
        assert es[k].dtype.name == str(ts[k].dtype).replace("torch.", ""), k
    assert [n for n, _ in em.named_parameters()] == [n for n, _ in tm.named_parameters()]
    assert [n for n, _ in em.named_buffers()] == [n for n, _ in tm.named_buffers()]


def _sync(tm, em, direction, rng):
    """Randomise the state of one side and load it into the other."""
    if direction == "torch->engine":
        state = _random_state(_np_state(tm), rng)
        tm.load_state_dict(OrderedDict((k, torch.from_numpy(v.copy())) for k, v in state.items()))
        em.load_state_dict(OrderedDict((k, flow.tensor(v)) for k, v in _np_state(tm).items()))
    else:
        state = _random_state(_np_state(em), rng)
        with flow.no_grad():
            for k, v in em.state_dict(keep_vars=True).items():
                v.copy_(flow.tensor(state[k]))
        tm.load_state_dict(OrderedDict((k, torch.from_numpy(v)) for k, v in _np_state(em).items()))


def _close(e, t, dtype, what):
    rtol, atol = TOL[dtype]
    e = e.detach().numpy() if isinstance(e, flow.Tensor) else e
    t = t.detach().numpy()
    assert e.shape == t.shape, f"{what}: shape {e.shape} != torch {t.shape}"
    assert e.dtype == t.dtype, f"{what}: dtype {e.dtype} != torch {t.dtype}"
    if e.dtype.kind in "iub":
        np.testing.assert_array_equal(e, t, err_msg=what)
    else:
        np.testing.assert_allclose(e, t, rtol=rtol, atol=atol, err_msg=what)


def check_module(make, shapes, *, dtype=np.float32, direction="torch->engine", modes=(True, False), seed=0,
                 call=None, ints=None):
    """make(nn, **factory) -> module. For each mode (train / eval) and each input shape: forward,
    backward of a random upstream gradient, and the whole state afterwards, compared with torch."""
    rng = np.random.default_rng(seed)
    tm = make(torch.nn, dtype=TORCH_DT[dtype])
    em = make(flow.nn, dtype=FLOW_DT[dtype])
    _check_structure(tm, em)
    _sync(tm, em, direction, rng)
    call = call or (lambda m, x: m(x))
    for training in modes:
        tm.train(training)
        em.train(training)
        for shape in shapes:
            if ints is not None:
                a = rng.integers(0, ints, shape)
                tx, ex = torch.from_numpy(a), flow.tensor(a)
            else:
                a = rng.standard_normal(shape).astype(dtype)
                tx, ex = torch.tensor(a, requires_grad=True), flow.tensor(a, requires_grad=True)
            what = f"{type(tm).__name__} train={training} input {shape}"
            to, eo = call(tm, tx), call(em, ex)
            touts = to if isinstance(to, tuple) else (to,)
            eouts = eo if isinstance(eo, tuple) else (eo,)
            assert len(eouts) == len(touts), what
            for i, (e, t) in enumerate(zip(eouts, touts)):
                _close(e, t, dtype, f"{what}: output {i}")
            g = rng.standard_normal(tuple(touts[0].shape)).astype(dtype)
            if touts[0].requires_grad:
                touts[0].backward(torch.from_numpy(g))
                eouts[0].backward(flow.tensor(g))
                if ints is None:
                    _close(ex.grad, tx.grad, dtype, f"{what}: input grad")
                tparams = dict(tm.named_parameters())
                for name, p in em.named_parameters():
                    tg = tparams[name].grad
                    assert (p.grad is None) == (tg is None), f"{what}: grad of {name}"
                    if tg is not None:
                        _close(p.grad, tg, dtype, f"{what}: grad of {name}")
                tm.zero_grad()
                em.zero_grad()
            ts = tm.state_dict()
            for k, v in em.state_dict().items():
                _close(v, ts[k], dtype, f"{what}: {k} after the step")
    return tm, em


DIRECTIONS = ["torch->engine", "engine->torch"]


# ------------------------------------------------------------------ convolutions
CONV_CASES = [
    ("conv1d", lambda nn, **f: nn.Conv1d(3, 4, 3, **f), [(2, 3, 10), (1, 3, 5), (3, 7)]),
    ("conv1d-all", lambda nn, **f: nn.Conv1d(4, 6, 3, stride=2, padding=2, dilation=2, groups=2, bias=False, **f),
     [(2, 4, 11), (1, 4, 6)]),
    ("conv1d-same", lambda nn, **f: nn.Conv1d(2, 3, 4, padding="same", dilation=3, **f), [(2, 2, 9)]),
    ("conv1d-reflect", lambda nn, **f: nn.Conv1d(2, 3, 3, padding=2, padding_mode="reflect", **f), [(2, 2, 7), (2, 5)]),
    ("conv1d-circular", lambda nn, **f: nn.Conv1d(2, 3, 3, padding=1, stride=2, padding_mode="circular", **f),
     [(1, 2, 8)]),
    ("conv2d-replicate", lambda nn, **f: nn.Conv2d(2, 3, (3, 2), padding=(1, 2), padding_mode="replicate", **f),
     [(2, 2, 5, 6), (2, 4, 3)]),
    ("conv2d-same-reflect", lambda nn, **f: nn.Conv2d(2, 2, 4, padding="same", padding_mode="reflect", **f),
     [(1, 2, 6, 5)]),
    ("convt1d", lambda nn, **f: nn.ConvTranspose1d(3, 4, 3, **f), [(2, 3, 7), (1, 3, 1), (3, 5)]),
    ("convt1d-all", lambda nn, **f: nn.ConvTranspose1d(4, 6, 4, stride=3, padding=2, output_padding=1, groups=2,
                                                      dilation=2, **f), [(2, 4, 5), (1, 4, 2)]),
    ("convt2d", lambda nn, **f: nn.ConvTranspose2d(3, 2, (3, 2), **f), [(2, 3, 5, 4), (1, 3, 1, 1), (3, 4, 3)]),
    ("convt2d-all", lambda nn, **f: nn.ConvTranspose2d(4, 6, 3, stride=(2, 3), padding=(1, 2), output_padding=(1, 2),
                                                      groups=2, bias=False, **f), [(2, 4, 5, 3), (1, 4, 2, 2)]),
    ("convt2d-outpad-dilation", lambda nn, **f: nn.ConvTranspose2d(2, 3, 2, dilation=3, output_padding=2, **f),
     [(2, 2, 4, 3)]),
    ("convt2d-depthwise", lambda nn, **f: nn.ConvTranspose2d(3, 3, 3, stride=2, groups=3, **f), [(2, 3, 4, 4)]),
]


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("name, make, shapes", CONV_CASES, ids=[c[0] for c in CONV_CASES])
def test_conv_modules(name, make, shapes, direction):
    check_module(make, shapes, direction=direction)


@pytest.mark.parametrize("make, shape", [
    (lambda nn, **f: nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1, **f), (2, 3, 5, 5)),
    (lambda nn, **f: nn.ConvTranspose1d(3, 4, 3, stride=2, padding=1, groups=1, **f), (1, 3, 6)),
], ids=["convt2d", "convt1d"])
def test_conv_transpose_float64_and_output_size(make, shape):
    """Float64 at tight tolerance, and forward(x, output_size) picking output_padding as torch."""
    check_module(make, [shape], dtype=np.float64)
    tm, em = make(torch.nn), make(flow.nn)
    em.load_state_dict(OrderedDict((k, flow.tensor(v.detach().numpy())) for k, v in tm.state_dict().items()))
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    lo, nd = 2 * shape[-1] - 1, len(shape) - 2  # (L - 1) * 2 - 2 + 3 = 2L - 1, up to 2L with the stride
    for size in ([lo] * nd, [lo + 1] * nd, list(shape[:2]) + [lo + 1] * nd):
        _close(em(flow.tensor(x), output_size=size), tm(torch.tensor(x), output_size=size), np.float32,
               f"output_size={size}")
    for bad in ([lo - 1] * nd, [lo + 2] * nd, [lo] * (nd + 3)):
        with pytest.raises(ValueError):
            tm(torch.tensor(x), output_size=bad)
        with pytest.raises(ValueError):
            em(flow.tensor(x), output_size=bad)


# ------------------------------------------------------------------ pooling
POOL_CASES = [
    ("maxpool1d", lambda nn, **f: nn.MaxPool1d(3), [(2, 3, 10), (1, 2, 3), (3, 7)]),
    ("maxpool1d-all", lambda nn, **f: nn.MaxPool1d(3, 2, 1, dilation=2, ceil_mode=True), [(2, 3, 10), (1, 1, 6)]),
    ("maxpool1d-indices", lambda nn, **f: nn.MaxPool1d(4, 3, 2, return_indices=True), [(2, 3, 11), (4, 9)]),
    ("maxpool2d", lambda nn, **f: nn.MaxPool2d((3, 2), (2, 1), (1, 0), ceil_mode=True), [(2, 3, 7, 5), (3, 4, 4)]),
    ("maxpool2d-indices", lambda nn, **f: nn.MaxPool2d(3, 2, 1, dilation=(1, 2), return_indices=True),
     [(1, 2, 9, 8)]),
    ("avgpool1d", lambda nn, **f: nn.AvgPool1d(3), [(2, 3, 10), (3, 7)]),
    ("avgpool1d-all", lambda nn, **f: nn.AvgPool1d(4, 3, 2, ceil_mode=True, count_include_pad=False),
     [(2, 3, 11), (1, 1, 4)]),
    ("adaptiveavgpool1d", lambda nn, **f: nn.AdaptiveAvgPool1d(4), [(2, 3, 10), (1, 2, 3), (3, 7)]),
    ("adaptiveavgpool1d-1", lambda nn, **f: nn.AdaptiveAvgPool1d((1,)), [(2, 3, 5)]),
]


@pytest.mark.parametrize("name, make, shapes", POOL_CASES, ids=[c[0] for c in POOL_CASES])
def test_pool_modules(name, make, shapes):
    # distinct values: max-pool windows have no ties (the gradient is then well defined)
    check_module(lambda nn, dtype: make(nn), shapes)


def test_max_pool_integer_input_and_indices():
    x = np.random.default_rng(0).integers(-9, 9, (2, 3, 9))
    for kw in (dict(return_indices=True), dict(return_indices=True, padding=1, stride=2)):
        tv, ti = torch.nn.functional.max_pool1d(torch.from_numpy(x), 3, **kw)
        ev, ei = flow.nn.functional.max_pool1d(flow.tensor(x), 3, **kw)
        np.testing.assert_array_equal(ev.numpy(), tv.numpy())
        np.testing.assert_array_equal(ei.numpy(), ti.numpy())
        assert ei.dtype is flow.int64


# ------------------------------------------------------------------ batch / instance norm
NORM_CASES = [
    ("bn1d", lambda nn, **f: nn.BatchNorm1d(3, **f), [(4, 3), (2, 3, 5), (1, 3, 7), (5, 3, 1)]),
    ("bn1d-momentum-none", lambda nn, **f: nn.BatchNorm1d(3, momentum=None, **f), [(4, 3), (2, 3, 5), (3, 3)]),
    ("bn1d-no-affine", lambda nn, **f: nn.BatchNorm1d(3, affine=False, momentum=0.3, eps=1e-3, **f), [(4, 3, 2)]),
    ("bn1d-no-tracking", lambda nn, **f: nn.BatchNorm1d(3, track_running_stats=False, **f), [(4, 3), (2, 3, 3)]),
    ("bn1d-no-bias", lambda nn, **f: nn.BatchNorm1d(3, bias=False, **f), [(4, 3)]),
    ("bn2d", lambda nn, **f: nn.BatchNorm2d(3, **f), [(2, 3, 4, 5), (1, 3, 3, 3), (3, 3, 1, 2)]),
    ("bn2d-bare", lambda nn, **f: nn.BatchNorm2d(2, affine=False, track_running_stats=False, **f), [(2, 2, 3, 3)]),
    ("in1d", lambda nn, **f: nn.InstanceNorm1d(3, **f), [(2, 3, 5), (1, 3, 4), (3, 6)]),
    ("in1d-affine-tracked", lambda nn, **f: nn.InstanceNorm1d(3, affine=True, track_running_stats=True, **f),
     [(2, 3, 5), (3, 6), (1, 3, 2)]),
    ("in1d-momentum-none", lambda nn, **f: nn.InstanceNorm1d(3, momentum=None, track_running_stats=True, **f),
     [(2, 3, 5)]),
    ("in2d", lambda nn, **f: nn.InstanceNorm2d(2, affine=True, **f), [(2, 2, 3, 4), (2, 5, 3)]),
    ("in2d-tracked", lambda nn, **f: nn.InstanceNorm2d(2, track_running_stats=True, momentum=0.2, **f),
     [(2, 2, 3, 4), (1, 2, 2, 3)]),
    ("gn", lambda nn, **f: nn.GroupNorm(3, 6, **f), [(2, 6, 4, 5), (1, 6, 3), (3, 6)]),
    ("gn-no-affine", lambda nn, **f: nn.GroupNorm(2, 4, affine=False, eps=1e-3, **f), [(2, 4, 5)]),
    ("gn-no-bias", lambda nn, **f: nn.GroupNorm(1, 3, bias=False, **f), [(2, 3, 2, 2)]),
    ("rms", lambda nn, **f: nn.RMSNorm(4, **f), [(2, 3, 4), (4,), (1, 4)]),
    ("rms-2d-eps", lambda nn, **f: nn.RMSNorm([3, 4], eps=1e-3, **f), [(2, 3, 4), (3, 4)]),
    ("rms-no-affine", lambda nn, **f: nn.RMSNorm((5,), elementwise_affine=False, **f), [(3, 5)]),
]


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("name, make, shapes", NORM_CASES, ids=[c[0] for c in NORM_CASES])
def test_norm_modules(name, make, shapes, direction):
    check_module(make, shapes, direction=direction)


@pytest.mark.parametrize("name, make, shapes", [c for c in NORM_CASES if c[0] in ("bn2d", "in1d-affine-tracked",
                                                                                   "gn", "rms")],
                         ids=["bn2d", "in1d-affine-tracked", "gn", "rms"])
def test_norm_modules_float64(name, make, shapes):
    check_module(make, shapes, dtype=np.float64)


def test_batch_norm_momentum_none_is_a_cumulative_average():
    """Several training steps from fresh stats: running_mean is the plain average of the batch means."""
    em = flow.nn.BatchNorm1d(2, momentum=None)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((4, 2)).astype(np.float32) for _ in range(3)]
    for x in xs:
        em(flow.tensor(x))
    np.testing.assert_allclose(em.running_mean.numpy(), np.mean([x.mean(0) for x in xs], axis=0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(em.running_var.numpy(), np.mean([x.var(0, ddof=1) for x in xs], axis=0), rtol=1e-5)
    assert em.num_batches_tracked.item() == 3 and em.num_batches_tracked.dtype is flow.int64


def test_batch_norm_training_under_no_grad_still_updates_stats_and_eval_does_not():
    em, tm = flow.nn.BatchNorm2d(3), torch.nn.BatchNorm2d(3)
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 4)).astype(np.float32)
    with flow.no_grad(), torch.no_grad():
        em(flow.tensor(x)), tm(torch.tensor(x))
    _close(em.running_var, tm.running_var, np.float32, "running_var")
    em.eval()
    before = em.running_mean.numpy().copy()
    em(flow.tensor(x))
    np.testing.assert_array_equal(em.running_mean.numpy(), before)
    assert em.num_batches_tracked.item() == 1


def test_half_inputs_with_float32_parameters():
    """torch's mixed-dtype CPU kernels: a half input beside float32 weight/bias/running stats."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    for fn in (lambda F, m, a, w, b, rm, rv: F.batch_norm(a, rm, rv, w, b, training=True),
               lambda F, m, a, w, b, rm, rv: F.batch_norm(a, rm, rv, w, b, training=False),
               lambda F, m, a, w, b, rm, rv: F.group_norm(a, 2, w, b)):
        outs = []
        for m in (torch, flow):
            params = (np.full(4, 1.5, np.float32), np.full(4, 0.5, np.float32), np.zeros(4, np.float32),
                      np.ones(4, np.float32))
            args = [m.tensor(x).to(m.bfloat16)] + [m.tensor(v) for v in params]
            outs.append(fn(m.nn.functional, m, *args))
        assert outs[1].dtype is flow.bfloat16
        np.testing.assert_allclose(outs[1].float().numpy(), outs[0].float().numpy(), rtol=2e-2, atol=2e-2)


def test_rms_norm_default_eps_is_the_dtype_epsilon():
    """Values so small that eps moves the result: mean(x^2) is about 2x the dtype's epsilon."""
    for dt, scale in ((np.float32, 1e-4), (np.float64, 1e-8)):
        x = np.array([[1.0, 2.0, 3.0]]) * scale
        e = flow.nn.functional.rms_norm(flow.tensor(x.astype(dt)), (3,)).numpy()
        t = torch.nn.functional.rms_norm(torch.tensor(x.astype(dt)), (3,)).numpy()
        np.testing.assert_allclose(e, t, rtol=1e-6)
        expected = x / np.sqrt((x ** 2).mean() + np.finfo(dt).eps)
        np.testing.assert_allclose(e, expected, rtol=1e-5)
        assert np.abs(expected - x / np.sqrt((x ** 2).mean())).max() > 0.1


def test_autocast_dtypes_match_torch():
    """CPU autocast: transposed convolutions run in the low dtype, batch/group norm keep float32."""
    x = _r((2, 3, 5, 5))
    w = _r((3, 4, 3, 3))
    got = {}
    for m in (torch, flow):
        F = m.nn.functional
        with m.autocast("cpu", dtype=m.bfloat16):
            outs = (F.conv_transpose2d(m.tensor(x), m.tensor(w), stride=2),
                    F.conv_transpose1d(m.tensor(x[:, :, 0]), m.tensor(w[..., 0])),
                    F.batch_norm(m.tensor(x), None, None, training=True), F.group_norm(m.tensor(x), 3),
                    F.rms_norm(m.tensor(x), (5,)), F.max_pool1d(m.tensor(x[:, :, 0]), 2))
        got[m] = [str(o.dtype).split(".")[-1] for o in outs]
    assert got[flow] == got[torch]


def test_a_fused_grad_without_double_backward_raises_a_clear_error():
    """The norms differentiate twice (tests/test_autograd.py); cross-entropy's fused grad keeps no
    input to differentiate again and says so, naming the op."""
    x = flow.tensor(np.random.default_rng(0).standard_normal((4, 3)), requires_grad=True)
    (g,) = flow.autograd.grad(flow.nn.functional.cross_entropy(x, flow.tensor([0, 2, 1, 0])), [x], create_graph=True)
    with pytest.raises(RuntimeError, match="double backward.*cross_entropy"):
        g.sum().backward()


# ------------------------------------------------------------------ init
def _init_pair(make):
    torch.manual_seed(0)
    return make(torch.nn), make(flow.nn)


@pytest.mark.parametrize("make", [
    lambda nn: nn.Conv1d(32, 64, 5),
    lambda nn: nn.ConvTranspose1d(32, 48, 5, groups=2),
    lambda nn: nn.ConvTranspose2d(16, 64, 3),
], ids=["conv1d", "convt1d", "convt2d"])
def test_conv_default_init_matches_torch_distribution(make):
    tm, em = _init_pair(make)
    fan_in = em.weight.shape[1] * int(np.prod(em.weight.shape[2:]))
    bound = 1 / math.sqrt(fan_in)
    for name in ("weight", "bias"):
        ea, ta = getattr(em, name).detach().numpy(), getattr(tm, name).detach().numpy()
        assert np.abs(ea).max() <= bound
        assert abs(ea.std() / ta.std() - 1) < (0.05 if ea.size > 5000 else 0.3)
        assert abs(ea.std() - bound / math.sqrt(3)) < (0.05 if ea.size > 5000 else 0.3) * bound


def test_conv_zero_fan_in_bias_is_zero():
    """No input channels: torch draws the bias from U(-0, 0); it must not be left uninitialised."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns that initialising a zero-element weight is a no-op
        for make in (lambda nn: nn.Conv2d(0, 4, 3), lambda nn: nn.Conv1d(0, 3, 2)):
            tm, em = _init_pair(make)
            _close(em.bias, tm.bias, np.float32, "bias")
            assert tuple(em.weight.shape) == tuple(tm.weight.shape)


def test_norm_default_init_and_buffers():
    for make in (lambda nn: nn.BatchNorm1d(5), lambda nn: nn.InstanceNorm2d(5, affine=True, track_running_stats=True),
                 lambda nn: nn.GroupNorm(1, 5), lambda nn: nn.RMSNorm((2, 5))):
        tm, em = _init_pair(make)
        ts = tm.state_dict()
        for k, v in em.state_dict().items():
            _close(v, ts[k], np.float32, f"{type(tm).__name__}.{k}")


def test_embedding_padding_idx_semantics():
    """Row zero at init, always-zero gradient (also when the padding id repeats), negative index."""
    for padding_idx in (2, -3):
        tm, em = _init_pair(lambda nn: nn.Embedding(7, 4, padding_idx=padding_idx))
        assert em.padding_idx == tm.padding_idx == padding_idx % 7
        assert not em.weight.detach().numpy()[em.padding_idx].any()
        assert repr(em) == repr(tm)
        idx = np.array([[em.padding_idx, 1, em.padding_idx], [0, 6, em.padding_idx]])
        check_module(lambda nn, dtype, p=padding_idx: nn.Embedding(7, 4, padding_idx=p, dtype=dtype), [idx.shape],
                     ints=7, direction="engine->torch")
        out = em(flow.tensor(idx))
        out.backward(flow.ones(*out.shape))
        g = em.weight.grad.numpy()
        assert not g[em.padding_idx].any() and g[1].all()
    pre = flow.nn.Embedding.from_pretrained(flow.ones(3, 2), padding_idx=1)  # torch: from_pretrained keeps the row
    assert pre.weight.numpy()[1].all() and not pre.weight.requires_grad


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, float("inf")])
def test_embedding_max_norm_renormalises_looked_up_rows(norm_type):
    """Rows looked up (and only those) are scaled to max_norm in place before the lookup; the
    state (the renormalised weight) is compared after each step, in train and eval."""
    tm, em = check_module(lambda nn, dtype: nn.Embedding(10, 4, max_norm=1.2, norm_type=norm_type, padding_idx=0,
                                                         dtype=dtype), [(2, 3), (5,)], ints=6)
    assert np.abs(em.weight.detach().numpy()[6:]).max() > 1.2 * 1.001  # rows never looked up keep their norm


# ------------------------------------------------------------------ bad input: torch's exception type
def _r(shape, dtype=np.float32):
    return np.random.default_rng(0).standard_normal(shape).astype(dtype)


BAD = [
    ("conv1d wrong channels", lambda nn: nn.Conv1d(3, 4, 3), lambda: _r((2, 5, 8))),
    ("conv1d 4-d input", lambda nn: nn.Conv1d(3, 4, 3), lambda: _r((2, 3, 8, 8))),
    ("conv1d input too short", lambda nn: nn.Conv1d(3, 4, 5), lambda: _r((2, 3, 4))),
    ("conv2d 5-d input", lambda nn: nn.Conv2d(3, 4, 3), lambda: _r((1, 2, 3, 8, 8))),
    ("convt1d wrong channels", lambda nn: nn.ConvTranspose1d(3, 4, 3), lambda: _r((2, 4, 8))),
    ("convt1d 1-d input", lambda nn: nn.ConvTranspose1d(3, 4, 3), lambda: _r((8,))),
    ("convt2d wrong channels", lambda nn: nn.ConvTranspose2d(3, 4, 3), lambda: _r((2, 5, 4, 4))),
    ("convt2d 2-d input", lambda nn: nn.ConvTranspose2d(3, 4, 3), lambda: _r((3, 4))),
    ("convt2d float64 input", lambda nn: nn.ConvTranspose2d(3, 4, 3), lambda: _r((1, 3, 4, 4), np.float64)),
    ("maxpool1d 4-d", lambda nn: nn.MaxPool1d(2), lambda: _r((2, 3, 4, 4))),
    ("maxpool1d too short", lambda nn: nn.MaxPool1d(3), lambda: _r((2, 3, 2))),
    ("maxpool1d big padding", lambda nn: nn.MaxPool1d(3, padding=2), lambda: _r((2, 3, 9))),
    ("maxpool1d empty length", lambda nn: nn.MaxPool1d(1), lambda: _r((2, 3, 0))),
    ("maxpool2d 2-d", lambda nn: nn.MaxPool2d(2), lambda: _r((4, 4))),
    ("maxpool2d dilated padding", lambda nn: nn.MaxPool2d(3, padding=2, dilation=2), lambda: _r((1, 2, 9, 9))),
    ("maxpool2d empty channels", lambda nn: nn.MaxPool2d(2), lambda: _r((2, 0, 4, 4))),
    ("maxpool2d stride 0", lambda nn: nn.MaxPool2d(2, 0), lambda: _r((1, 2, 4, 4))),
    ("avgpool1d 4-d", lambda nn: nn.AvgPool1d(2), lambda: _r((2, 3, 4, 4))),
    ("avgpool1d kernel pair", lambda nn: nn.AvgPool1d((2, 2)), lambda: _r((2, 3, 4))),
    ("adaptiveavgpool1d 4-d", lambda nn: nn.AdaptiveAvgPool1d(2), lambda: _r((2, 3, 4, 4))),
    ("bn1d 4-d", lambda nn: nn.BatchNorm1d(3), lambda: _r((2, 3, 4, 4))),
    ("bn1d wrong channels", lambda nn: nn.BatchNorm1d(3), lambda: _r((2, 4))),
    ("bn1d one value per channel", lambda nn: nn.BatchNorm1d(3), lambda: _r((1, 3))),
    ("bn2d 3-d", lambda nn: nn.BatchNorm2d(3), lambda: _r((3, 4, 4))),
    ("bn2d wrong channels no affine", lambda nn: nn.BatchNorm2d(3, affine=False), lambda: _r((2, 4, 2, 2))),
    ("bn2d integer input", lambda nn: nn.BatchNorm2d(3), lambda: np.ones((2, 3, 2, 2), np.int64)),
    ("in1d 4-d", lambda nn: nn.InstanceNorm1d(3), lambda: _r((2, 3, 4, 4))),
    ("in1d wrong channels affine", lambda nn: nn.InstanceNorm1d(3, affine=True), lambda: _r((2, 4, 5))),
    ("in1d wrong channels tracked", lambda nn: nn.InstanceNorm1d(3, track_running_stats=True), lambda: _r((2, 4, 5))),
    ("in1d one spatial element", lambda nn: nn.InstanceNorm1d(3), lambda: _r((2, 3, 1))),
    ("in2d 2-d", lambda nn: nn.InstanceNorm2d(3), lambda: _r((3, 4))),
    ("gn wrong channels", lambda nn: nn.GroupNorm(3, 6), lambda: _r((2, 9, 5))),
    ("gn 1-d", lambda nn: nn.GroupNorm(3, 6), lambda: _r((6,))),
    ("gn one value per group", lambda nn: nn.GroupNorm(3, 3, affine=False), lambda: _r((1, 3))),
    ("rms wrong trailing shape", lambda nn: nn.RMSNorm(4), lambda: _r((2, 3))),
    ("rms integer input", lambda nn: nn.RMSNorm(4), lambda: np.ones((2, 4), np.int64)),
    ("embedding index out of range", lambda nn: nn.Embedding(5, 3), lambda: np.array([1, 5])),
    ("embedding float indices", lambda nn: nn.Embedding(5, 3), lambda: _r((3,))),
]


def _raised(fn):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn()
    except Exception as e:  # noqa: BLE001 (the type is what is compared)
        return type(e)
    return None


@pytest.mark.parametrize("name, make, arg", BAD, ids=[b[0] for b in BAD])
def test_bad_input_raises_torchs_exception_type(name, make, arg):
    a = arg()
    expected = _raised(lambda: make(torch.nn)(torch.from_numpy(a)))
    assert expected is not None, f"{name}: torch accepts this input"
    got = _raised(lambda: make(flow.nn)(flow.tensor(a)))
    assert got is expected, f"{name}: engine raised {got}, torch {expected}"


BAD_CALLS = [
    ("conv groups", lambda m: m.nn.Conv1d(4, 6, 3, groups=4)),
    ("conv padding mode", lambda m: m.nn.Conv2d(2, 2, 3, padding_mode="wrap")),
    ("conv same strided", lambda m: m.nn.Conv1d(2, 2, 3, padding="same", stride=2)),
    ("convt padding mode", lambda m: m.nn.ConvTranspose2d(2, 2, 3, padding_mode="reflect")),
    ("gn groups", lambda m: m.nn.GroupNorm(4, 6)),
    ("embedding padding_idx", lambda m: m.nn.Embedding(5, 3, padding_idx=5)),
    ("embedding negative padding_idx", lambda m: m.nn.Embedding(5, 3, padding_idx=-6)),
    ("embedding weight shape", lambda m: m.nn.Embedding(5, 3, _weight=m.ones(4, 3))),
    ("convt output_padding", lambda m: m.nn.functional.conv_transpose2d(m.ones(1, 2, 3, 3), m.ones(2, 2, 3, 3),
                                                                         stride=2, output_padding=2)),
    ("convt negative output_padding", lambda m: m.nn.functional.conv_transpose1d(m.ones(1, 2, 3), m.ones(2, 2, 3),
                                                                                 output_padding=-1)),
    ("convt string padding", lambda m: m.nn.functional.conv_transpose2d(m.ones(1, 2, 3, 3), m.ones(2, 2, 3, 3),
                                                                         padding="same")),
    ("convt groups", lambda m: m.nn.functional.conv_transpose2d(m.ones(1, 4, 3, 3), m.ones(4, 2, 3, 3), groups=3)),
    ("convt bias shape", lambda m: m.nn.functional.conv_transpose2d(m.ones(1, 4, 3, 3), m.ones(4, 2, 3, 3),
                                                                     m.ones(4))),
    ("convt1d stride pair", lambda m: m.nn.functional.conv_transpose1d(m.ones(1, 2, 3), m.ones(2, 2, 3),
                                                                       stride=(1, 2))),
    ("bn eval without stats", lambda m: m.nn.functional.batch_norm(m.ones(2, 3), None, None)),
    ("bn one stat", lambda m: m.nn.functional.batch_norm(m.ones(2, 3), m.zeros(3), None, training=True)),
    ("bn eps", lambda m: m.nn.functional.batch_norm(m.ones(2, 3), None, None, training=True, eps=0.0)),
    ("bn weight size", lambda m: m.nn.functional.batch_norm(m.ones(2, 3), None, None, m.ones(2), training=True)),
    ("bn float64 weight", lambda m: m.nn.functional.batch_norm(m.ones(2, 3), None, None, m.ones(3, dtype=m.float64),
                                                               training=True)),
    ("in no stats", lambda m: m.nn.functional.instance_norm(m.ones(2, 3, 4), use_input_stats=False)),
    ("gn weight size", lambda m: m.nn.functional.group_norm(m.ones(2, 4, 3), 2, m.ones(3))),
    ("rms weight shape", lambda m: m.nn.functional.rms_norm(m.ones(2, 4), (4,), m.ones(2, 2))),
    ("rms empty shape", lambda m: m.nn.functional.rms_norm(m.ones(2, 4), ())),
]


@pytest.mark.parametrize("name, call", BAD_CALLS, ids=[b[0] for b in BAD_CALLS])
def test_bad_arguments_raise_torchs_exception_type(name, call):
    expected = _raised(lambda: call(torch))
    assert expected is not None, f"{name}: torch accepts this call"
    got = _raised(lambda: call(flow))
    assert got is expected, f"{name}: engine raised {got}, torch {expected}"


def test_unsupported_options_raise_not_implemented():
    for kw in (dict(scale_grad_by_freq=True), dict(sparse=True)):
        with pytest.raises(NotImplementedError, match=next(iter(kw))):
            flow.nn.Embedding(5, 3, **kw)
    with pytest.raises(NotImplementedError, match="max_pool1d"):
        flow.nn.functional.max_pool1d(flow.ones(1, 2, 4, dtype=flow.int64), 2)  # as torch's (no integer kernel)
