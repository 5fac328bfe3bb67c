"""engine.nn layers against torch.nn, and engine.nn.init's distributions.

Each layer is built in both libraries with the same arguments, the torch layer's (randomised)
parameters are loaded into the engine layer with load_state_dict, and forward outputs, input
gradients and parameter gradients are compared for the same inputs and upstream gradient."""
import math
from collections import OrderedDict

import numpy as np
import pytest
import torch

import engine as flow

RTOL, ATOL = 1e-4, 1e-5


def _randomise(tm, rng):
    """Non-default parameter values, so e.g. LayerNorm's weight=1/bias=0 can't hide bugs."""
    with torch.no_grad():
        for p in tm.parameters():
            p.copy_(torch.from_numpy(rng.standard_normal(tuple(p.shape)).astype(np.float32)))


def check_layer(make, inputs, *, randomise=True, train=False, seed=0):
    """make(nn) -> module; inputs: numpy arrays (float arrays get gradients)."""
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    tm, em = make(torch.nn), make(flow.nn)
    if randomise:
        _randomise(tm, rng)
    em.load_state_dict(OrderedDict((k, flow.tensor(v.detach().numpy())) for k, v in tm.state_dict().items()))
    tm.train(train), em.train(train)
    tx = [torch.tensor(a, requires_grad=a.dtype.kind == "f") for a in inputs]
    ex = [flow.tensor(a, requires_grad=a.dtype.kind == "f") for a in inputs]
    tout, eout = tm(*tx), em(*ex)
    assert tuple(eout.shape) == tuple(tout.shape)
    assert eout.dtype.name == str(tout.dtype).replace("torch.", "")
    np.testing.assert_allclose(eout.detach().numpy(), tout.detach().numpy(), rtol=RTOL, atol=ATOL)
    if not tout.requires_grad:
        return em, tm
    g = rng.standard_normal(tuple(tout.shape)).astype(np.float32)
    tout.backward(torch.from_numpy(g))
    eout.backward(flow.tensor(g))
    for a, t, e in zip(inputs, tx, ex):
        if a.dtype.kind == "f":
            np.testing.assert_allclose(e.grad.numpy(), t.grad.numpy(), rtol=RTOL, atol=ATOL)
    tparams = dict(tm.named_parameters())
    for name, p in em.named_parameters():
        tg = tparams[name].grad
        if tg is None:
            assert p.grad is None, name
        else:
            np.testing.assert_allclose(p.grad.numpy(), tg.numpy(), rtol=RTOL, atol=ATOL, err_msg=name)
    return em, tm


def randn(*shape, seed=1):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ---------------------------------------------------------------- layers with parameters
@pytest.mark.parametrize("bias", [True, False])
def test_linear(bias):
    check_layer(lambda nn: nn.Linear(5, 3, bias=bias), [randn(2, 4, 5)])
    check_layer(lambda nn: nn.Linear(5, 3, bias=bias), [randn(5)])


@pytest.mark.parametrize("padding_idx", [None, 1, -2])
def test_embedding(padding_idx):
    idx = np.array([[1, 2, 3, 1], [8, 0, 1, 7]], dtype=np.int64)
    em, tm = check_layer(lambda nn: nn.Embedding(10, 4, padding_idx=padding_idx), [idx])
    assert em.padding_idx == tm.padding_idx


def test_embedding_padding_row_starts_at_zero_and_from_pretrained():
    e = flow.nn.Embedding(6, 3, padding_idx=2)
    assert not e.weight.detach().numpy()[2].any()
    w = flow.tensor(randn(4, 3))
    f = flow.nn.Embedding.from_pretrained(w)
    assert not f.weight.requires_grad
    np.testing.assert_array_equal(f(flow.tensor([3, 0])).numpy(), w.numpy()[[3, 0]])
    assert flow.nn.Embedding.from_pretrained(w, freeze=False).weight.requires_grad


@pytest.mark.parametrize("kwargs", [dict(normalized_shape=6), dict(normalized_shape=(3, 6), eps=1e-6),
                                    dict(normalized_shape=6, elementwise_affine=False),
                                    dict(normalized_shape=6, bias=False)])
def test_layer_norm(kwargs):
    check_layer(lambda nn: nn.LayerNorm(**kwargs), [randn(2, 3, 6)])


def test_layer_norm_default_init():
    ln = flow.nn.LayerNorm(5)
    np.testing.assert_array_equal(ln.weight.detach().numpy(), np.ones(5, np.float32))
    np.testing.assert_array_equal(ln.bias.detach().numpy(), np.zeros(5, np.float32))


@pytest.mark.parametrize("kwargs", [dict(in_channels=3, out_channels=4, kernel_size=3),
                                    dict(in_channels=4, out_channels=6, kernel_size=(3, 2), stride=2, padding=1,
                                         dilation=(1, 2), groups=2, bias=False),
                                    dict(in_channels=2, out_channels=2, kernel_size=3, padding="same"),
                                    dict(in_channels=2, out_channels=4, kernel_size=1, groups=2)])
def test_conv2d(kwargs):
    cin = kwargs["in_channels"]
    check_layer(lambda nn: nn.Conv2d(**kwargs), [randn(2, cin, 7, 6)])


# ---------------------------------------------------------------- parameter-free layers
@pytest.mark.parametrize("make", [
    lambda nn: nn.GELU(), lambda nn: nn.GELU(approximate="tanh"), lambda nn: nn.ReLU(), lambda nn: nn.Tanh(),
    lambda nn: nn.Sigmoid(), lambda nn: nn.SiLU(), lambda nn: nn.Softmax(dim=-1), lambda nn: nn.Softmax(1),
    lambda nn: nn.LogSoftmax(dim=1), lambda nn: nn.Identity(), lambda nn: nn.Flatten(),
    lambda nn: nn.Flatten(0, 1), lambda nn: nn.Unflatten(2, (2, 3)),
], ids=["gelu", "gelu_tanh", "relu", "tanh", "sigmoid", "silu", "softmax-1", "softmax1", "log_softmax",
        "identity", "flatten", "flatten01", "unflatten"])
def test_activation_and_shape_layers(make):
    check_layer(make, [randn(3, 4, 6)])


@pytest.mark.parametrize("make", [lambda nn: nn.AvgPool2d(2), lambda nn: nn.AvgPool2d(3, 2, 1),
                                  lambda nn: nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False),
                                  lambda nn: nn.AdaptiveAvgPool2d((1, 1)), lambda nn: nn.AdaptiveAvgPool2d(3),
                                  lambda nn: nn.AdaptiveAvgPool2d((2, 4))],
                         ids=["avg2", "avg3s2p1", "avg_nopad", "adaptive1", "adaptive3", "adaptive24"])
def test_pooling(make):
    check_layer(make, [randn(2, 3, 7, 8)])


def test_dropout_eval_and_p0_are_identity_and_train_scales():
    x = randn(200, 100)
    check_layer(lambda nn: nn.Dropout(0.3), [x], train=False)
    check_layer(lambda nn: nn.Dropout(0.0), [x], train=True)
    flow.manual_seed(0)
    d = flow.nn.Dropout(0.25)
    xt = flow.tensor(x, requires_grad=True)
    out = d(xt)
    kept = out.detach().numpy() != 0
    assert abs(1 - kept.mean() - 0.25) < 0.01
    np.testing.assert_allclose(out.detach().numpy()[kept], x[kept] / 0.75, rtol=1e-6)
    out.sum().backward()
    np.testing.assert_allclose(xt.grad.numpy(), kept / 0.75, rtol=1e-6)
    d.eval()
    np.testing.assert_array_equal(d(xt).detach().numpy(), x)


def test_sequential_forward():
    check_layer(lambda nn: nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.LayerNorm(8), nn.Linear(8, 2)),
                [randn(5, 4)])


# ---------------------------------------------------------------- losses
def _targets(n, c, seed=2, ignore=None):
    t = np.random.default_rng(seed).integers(0, c, n).astype(np.int64)
    if ignore is not None:
        t[::3] = ignore
    return t


@pytest.mark.parametrize("kwargs", [dict(), dict(reduction="sum"), dict(reduction="none"),
                                    dict(ignore_index=2), dict(label_smoothing=0.1),
                                    dict(weight="w"), dict(weight="w", ignore_index=1, label_smoothing=0.2)])
def test_cross_entropy_loss(kwargs):
    w = np.array([0.5, 1.0, 2.0, 1.5, 0.7], np.float32)

    def make(nn):
        kw = dict(kwargs)
        if kw.get("weight") == "w":
            kw["weight"] = (torch.tensor(w) if nn is torch.nn else flow.tensor(w))
        return nn.CrossEntropyLoss(**kw)

    ignore = kwargs.get("ignore_index")
    check_layer(make, [randn(6, 5), _targets(6, 5, ignore=ignore)])
    check_layer(make, [randn(2, 5, 3), _targets(6, 5).reshape(2, 3)])  # (N, C, d) layout


def test_cross_entropy_weight_is_a_buffer():
    w = flow.tensor([1.0, 2.0])
    loss = flow.nn.CrossEntropyLoss(weight=w)
    assert list(loss.state_dict()) == list(torch.nn.CrossEntropyLoss(weight=torch.ones(2)).state_dict())
    assert list(flow.nn.CrossEntropyLoss().state_dict()) == []


@pytest.mark.parametrize("kwargs", [dict(), dict(reduction="sum"), dict(ignore_index=0)])
def test_nll_loss(kwargs):
    check_layer(lambda nn: nn.NLLLoss(**kwargs), [randn(6, 4), _targets(6, 4)])


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("cls", ["MSELoss", "L1Loss"])
def test_regression_losses(cls, reduction):
    check_layer(lambda nn: getattr(nn, cls)(reduction=reduction), [randn(3, 4), randn(3, 4, seed=5)])


def test_inplace_activations_match_torch():
    for cls in ("ReLU", "SiLU"):
        x = randn(4, 5)
        t = torch.tensor(x)
        e = flow.tensor(x)
        tout, eout = getattr(torch.nn, cls)(inplace=True)(t), getattr(flow.nn, cls)(inplace=True)(e)
        np.testing.assert_allclose(eout.numpy(), tout.numpy(), rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(e.numpy(), t.numpy(), rtol=RTOL, atol=ATOL)  # the input was overwritten


@pytest.mark.parametrize("kwargs", [dict(), dict(reduction="sum"), dict(pos_weight="p")])
def test_bce_with_logits_loss(kwargs):
    p = np.array([1.0, 2.0, 0.5, 3.0], np.float32)

    def make(nn):
        kw = dict(kwargs)
        if kw.get("pos_weight") == "p":
            kw["pos_weight"] = torch.tensor(p) if nn is torch.nn else flow.tensor(p)
        return nn.BCEWithLogitsLoss(**kw)

    target = (np.random.default_rng(3).random((3, 4)) > 0.5).astype(np.float32)
    check_layer(make, [randn(3, 4), target])


# ---------------------------------------------------------------- containers
def test_sequential_container_ops():
    nn = flow.nn
    a, b, c = nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 3)
    s = nn.Sequential(a, b)
    s.append(c)
    assert len(s) == 3 and s[0] is a and s[-1] is c and list(s) == [a, b, c]
    sub = s[1:]
    assert isinstance(sub, nn.Sequential) and list(sub) == [b, c]
    assert list(sub._modules) == ["1", "2"]  # torch keeps the original keys on slicing
    assert list(torch.nn.Sequential(torch.nn.ReLU(), torch.nn.ReLU(), torch.nn.ReLU())[1:]._modules) == ["1", "2"]
    s.insert(1, nn.Tanh())
    assert [type(m).__name__ for m in s] == ["Linear", "Tanh", "ReLU", "Linear"]
    del s[1]
    assert list(s._modules) == ["0", "1", "2"] and s[1] is b
    od = nn.Sequential(OrderedDict(first=a, second=b))
    assert list(dict(od.named_children())) == ["first", "second"]
    with pytest.raises(IndexError):
        s[5]


def test_module_list_ops():
    nn = flow.nn
    ml = nn.ModuleList([nn.Linear(1, 1) for _ in range(2)])
    ml.append(nn.ReLU())
    ml.extend([nn.Tanh(), nn.Sigmoid()])
    ml.insert(0, nn.Identity())
    assert [type(m).__name__ for m in ml] == ["Identity", "Linear", "Linear", "ReLU", "Tanh", "Sigmoid"]
    assert len(ml) == 6 and isinstance(ml[1:3], nn.ModuleList) and len(ml[1:3]) == 2
    assert ml[-1] is list(ml)[-1]
    assert [n for n, _ in ml.named_parameters()] == ["1.weight", "1.bias", "2.weight", "2.bias"]
    ml[0] = nn.GELU()
    assert type(ml[0]).__name__ == "GELU"
    with pytest.raises(TypeError):
        ml.extend(nn.Linear(1, 1))


def test_module_dict_and_parameter_containers():
    nn = flow.nn
    md = nn.ModuleDict({"b": nn.ReLU(), "a": nn.Linear(2, 2)})
    md["c"] = nn.Tanh()
    assert list(md.keys()) == ["b", "a", "c"] and "a" in md and len(md) == 3
    assert md.pop("b").__class__.__name__ == "ReLU" and list(md) == ["a", "c"]
    pl = nn.ParameterList([nn.Parameter(flow.zeros(2)), flow.ones(3)])
    pl.append(flow.ones(1))
    assert len(pl) == 3 and all(isinstance(p, nn.Parameter) for p in pl)
    tpl = torch.nn.ParameterList([torch.zeros(2), torch.ones(3), torch.ones(1)])
    assert [n for n, _ in pl.named_parameters()] == [n for n, _ in tpl.named_parameters()]
    pd = nn.ParameterDict({"x": flow.zeros(2)})
    pd["y"] = nn.Parameter(flow.ones(1))
    assert list(pd.keys()) == ["x", "y"] and isinstance(pd["x"], nn.Parameter)
    assert [n for n, _ in pd.named_parameters()] == ["x", "y"]


# ---------------------------------------------------------------- init
def _tensor(*shape):
    return flow.empty(*shape)


@pytest.mark.parametrize("nl,param", [("linear", None), ("conv2d", None), ("sigmoid", None), ("tanh", None),
                                      ("relu", None), ("leaky_relu", None), ("leaky_relu", 0.2), ("selu", None)])
def test_calculate_gain_matches_torch(nl, param):
    assert flow.nn.init.calculate_gain(nl, param) == pytest.approx(torch.nn.init.calculate_gain(nl, param))


def test_fan_computation_matches_torch():
    for shape in [(3, 4), (8, 3, 5, 5), (6, 2, 3)]:
        assert flow.nn.init._calculate_fan_in_and_fan_out(_tensor(*shape)) == \
            torch.nn.init._calculate_fan_in_and_fan_out(torch.empty(*shape))


def _stats(t):
    a = t.detach().numpy().astype(np.float64)
    return a.mean(), a.std(), a.min(), a.max()


def test_uniform_normal_constant():
    init = flow.nn.init
    t = _tensor(400, 500)
    mean, std, lo, hi = _stats(init.uniform_(t, -2.0, 3.0))
    assert lo >= -2.0 and hi < 3.0 and abs(mean - 0.5) < 0.02 and abs(std - 5 / math.sqrt(12)) < 0.02
    mean, std, _, _ = _stats(init.normal_(t, 1.5, 0.5))
    assert abs(mean - 1.5) < 0.005 and abs(std - 0.5) < 0.005
    np.testing.assert_array_equal(init.constant_(t, 0.25).detach().numpy(), np.full((400, 500), 0.25, np.float32))
    assert not init.zeros_(t).detach().numpy().any()
    assert (init.ones_(t).detach().numpy() == 1).all()
    np.testing.assert_array_equal(init.eye_(_tensor(3, 4)).numpy(), np.eye(3, 4, dtype=np.float32))
    h = flow.empty(1000, 100, dtype=flow.bfloat16)
    mean, std, _, _ = _stats(init.normal_(h, 0.0, 2.0).float())
    assert h.dtype is flow.bfloat16 and abs(std - 2.0) < 0.03


def test_init_is_reproducible_with_manual_seed_and_not_recorded():
    w = flow.nn.Parameter(flow.empty(10, 10))
    flow.manual_seed(123)
    a = flow.nn.init.normal_(w).detach().numpy().copy()
    flow.manual_seed(123)
    b = flow.nn.init.normal_(w).detach().numpy().copy()
    np.testing.assert_array_equal(a, b)
    assert w.is_leaf and w.grad_fn is None and w.requires_grad


@pytest.mark.parametrize("mean,std,a,b", [(0.0, 1.0, -2.0, 2.0), (0.0, 0.02, -0.04, 0.04), (1.0, 2.0, 0.0, 1.5),
                                          (0.0, 1.0, 2.0, 3.0), (0.0, 1.0, -8.0, -6.0),
                                          (0.0, 1.0, 6.0, 8.0), (0.5, 0.1, 0.9, 5.0)])
def test_trunc_normal_bounds_and_moments(mean, std, a, b):
    t = flow.nn.init.trunc_normal_(_tensor(500, 400), mean=mean, std=std, a=a, b=b)
    x = t.detach().numpy().astype(np.float64)
    assert x.min() >= a and x.max() <= b
    from scipy.stats import truncnorm
    dist = truncnorm((a - mean) / std, (b - mean) / std, loc=mean, scale=std)
    assert abs(x.mean() - dist.mean()) < 5 * dist.std() / math.sqrt(x.size) + 1e-6
    assert abs(x.std() - dist.std()) < 0.01 * dist.std() + 1e-6


@pytest.mark.parametrize("shape", [(300, 500), (64, 32, 3, 3)])
def test_xavier(shape):
    init = flow.nn.init
    fan_in, fan_out = torch.nn.init._calculate_fan_in_and_fan_out(torch.empty(*shape))
    gain = init.calculate_gain("tanh")
    expect = gain * math.sqrt(2.0 / (fan_in + fan_out))
    _, std, lo, hi = _stats(init.xavier_uniform_(_tensor(*shape), gain=gain))
    bound = math.sqrt(3.0) * expect
    assert -bound <= lo and hi <= bound and abs(std / expect - 1) < 0.02
    mean, std, _, _ = _stats(init.xavier_normal_(_tensor(*shape), gain=gain))
    assert abs(std / expect - 1) < 0.02 and abs(mean) < 0.02 * expect


@pytest.mark.parametrize("mode", ["fan_in", "fan_out"])
@pytest.mark.parametrize("nonlinearity,a", [("relu", 0), ("leaky_relu", math.sqrt(5)), ("leaky_relu", 0.1)])
def test_kaiming(mode, nonlinearity, a):
    init = flow.nn.init
    shape = (128, 64, 3, 3)
    fan_in, fan_out = torch.nn.init._calculate_fan_in_and_fan_out(torch.empty(*shape))
    fan = fan_in if mode == "fan_in" else fan_out
    expect = torch.nn.init.calculate_gain(nonlinearity, a) / math.sqrt(fan)
    _, std, lo, hi = _stats(init.kaiming_uniform_(_tensor(*shape), a=a, mode=mode, nonlinearity=nonlinearity))
    assert -math.sqrt(3) * expect <= lo and hi <= math.sqrt(3) * expect and abs(std / expect - 1) < 0.02
    _, std, _, _ = _stats(init.kaiming_normal_(_tensor(*shape), a=a, mode=mode, nonlinearity=nonlinearity))
    assert abs(std / expect - 1) < 0.02


def test_orthogonal():
    for shape in [(20, 50), (50, 20), (8, 4, 3)]:
        w = flow.nn.init.orthogonal_(_tensor(*shape), gain=2.0).numpy().reshape(shape[0], -1).astype(np.float64)
        small = min(w.shape)
        gram = w @ w.T if w.shape[0] == small else w.T @ w
        np.testing.assert_allclose(gram, 4.0 * np.eye(small), atol=1e-4)


def test_default_layer_init_distributions_match_torch():
    # Linear / Conv2d: weight ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (kaiming_uniform a=sqrt(5)), bias the same
    for e, t in [(flow.nn.Linear(256, 512), torch.nn.Linear(256, 512)),
                 (flow.nn.Conv2d(16, 64, 3), torch.nn.Conv2d(16, 64, 3))]:
        for name in ("weight", "bias"):
            ea = getattr(e, name).detach().numpy()
            ta = getattr(t, name).detach().numpy()
            bound = 1 / math.sqrt(e.weight[0].numel())
            assert np.abs(ea).max() <= bound
            assert abs(ea.std() / ta.std() - 1) < (0.03 if ea.size > 10000 else 0.3)
    emb = flow.nn.Embedding(1000, 64).weight.detach().numpy()
    assert abs(emb.mean()) < 0.01 and abs(emb.std() - 1) < 0.01
