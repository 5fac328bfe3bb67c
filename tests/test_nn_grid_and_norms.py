"""grid_sample / affine_grid argument checks against torch (the values and gradients are parity
cases in tests/ops/cases_vision.py), and nn.utils weight_norm, spectral_norm and parametrize
against torch with the same initial values: forward, backward, buffers and state_dict keys."""
import warnings

import numpy as np
import pytest
import torch

import engine as flow
import engine.nn.functional as F
from engine import nn
from engine.nn.utils import parametrize

warnings.filterwarnings("ignore", message=".*(align_corners|weight_norm is deprecated).*")


def _pair(a, requires_grad=False):
    a = np.asarray(a)
    t = torch.tensor(a, requires_grad=requires_grad)
    f = flow.tensor(a, requires_grad=requires_grad)
    return f, t


def _same_error(fn_f, fn_t):
    with pytest.raises(Exception) as et:
        fn_t()
    with pytest.raises(type(et.value)) as ef:
        fn_f()
    assert str(ef.value).split(",")[0] == str(et.value).split(",")[0], (str(ef.value), str(et.value))


rng = np.random.default_rng(0)
X4 = rng.standard_normal((2, 3, 4, 5))
G4 = rng.uniform(-1, 1, (2, 3, 3, 2))


@pytest.mark.parametrize("make", [
    lambda m, x, g: m.nn.functional.grid_sample(x, g.double(), align_corners=False),
    lambda m, x, g: m.nn.functional.grid_sample(x.long(), g.long(), align_corners=False),
    lambda m, x, g: m.nn.functional.grid_sample(x[0], g[0], align_corners=False),
    lambda m, x, g: m.nn.functional.grid_sample(x, g[:1], align_corners=False),
    lambda m, x, g: m.nn.functional.grid_sample(x, g[..., :1], align_corners=False),
    lambda m, x, g: m.nn.functional.grid_sample(x[:, :, :0], g, align_corners=False),
    lambda m, x, g: m.nn.functional.grid_sample(x, g, mode="area", align_corners=False),
    lambda m, x, g: m.nn.functional.grid_sample(x, g, padding_mode="circular", align_corners=False),
    lambda m, x, g: m.nn.functional.grid_sample(x[..., None], m.zeros(2, 1, 1, 1, 3), mode="bicubic",
                                                align_corners=False),
    lambda m, x, g: m.nn.functional.grid_sample(x, m.zeros(2, 1, 1, 1, 2), align_corners=False),
    lambda m, x, g: m.nn.functional.affine_grid(x[:, 0, :2, :3].long(), (2, 1, 3, 3), align_corners=False),
    lambda m, x, g: m.nn.functional.affine_grid(x[:, 0, :2, :3], (2, 1, 3, 3, 3), align_corners=False),
    lambda m, x, g: m.nn.functional.affine_grid(x[:, 0, :2, :3], (2, 1, 3), align_corners=False),
    lambda m, x, g: m.nn.functional.affine_grid(x[:, 0, :2, :3], (2, 1, 0, 3), align_corners=False),
    lambda m, x, g: m.nn.functional.affine_grid(x[:, 0, :2, :3], (3, 1, 2, 3), align_corners=False),
    lambda m, x, g: m.nn.functional.affine_grid(x[0, 0, :2, :3], (2, 1, 2, 3), align_corners=False),
], ids=["grid-dtype", "integer", "3d-input", "batch", "grid-last-dim", "empty-spatial", "mode", "padding_mode",
        "bicubic-5d", "4d-input-5d-grid", "theta-int", "theta-shape", "size-3d", "size-zero", "theta-batch",
        "theta-2d"])
def test_errors_match_torch(make):
    (fx, tx), (fg, tg) = _pair(X4.astype(np.float32)), _pair(G4.astype(np.float32))
    _same_error(lambda: make(flow, fx, fg), lambda: make(torch, tx, tg))


def test_align_corners_default_warns_as_torch():
    fx, _ = _pair(X4)
    fg, _ = _pair(G4)
    with pytest.warns(UserWarning, match="align_corners=False since 1.3.0"):
        F.grid_sample(fx, fg)
    with pytest.warns(UserWarning, match="align_corners=False since 1.3.0"):
        F.affine_grid(fx[:, 0, :2, :3], (2, 1, 3, 3))


def test_double_backward_is_refused_by_name():
    """A known difference: torch 2.13 differentiates grid_sampler_2d_backward; the engine refuses
    it clearly instead of returning a wrong second derivative."""
    x, g = _pair(X4, True)[0], _pair(G4, True)[0]
    out = F.grid_sample(x, g, align_corners=True)
    gx, gg = flow.autograd.grad(out.square().sum(), [x, g], create_graph=True)
    with pytest.raises(RuntimeError, match="double backward .* through grid_sampler is not supported"):
        flow.autograd.grad(gg.sum(), [x])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_inputs(dtype):
    """Half inputs are computed in float32 and rounded once (torch's bfloat16 CPU kernel rounds its
    coordinates in bfloat16): compared with torch's float32 result on the same rounded inputs."""
    (fx, tx), (fg, tg) = _pair(X4.astype(np.float32)), _pair(G4.astype(np.float32))
    tx, tg = (a.to(getattr(torch, dtype)) for a in (tx, tg))
    f = F.grid_sample(fx.to(getattr(flow, dtype)), fg.to(getattr(flow, dtype)), mode="bicubic", align_corners=False)
    t = torch.nn.functional.grid_sample(tx.float(), tg.float(), mode="bicubic", align_corners=False)
    assert f.dtype == getattr(flow, dtype)
    np.testing.assert_allclose(f.float().numpy(), t.numpy(), atol=2e-2, rtol=2e-2)


# ------------------------------------------------------------------ weight norm / spectral norm
def _twin(make_t, make_f, wrap=None, **kw):
    """A torch module and an engine module with the same parameters, each passed through the
    library's `nn.utils.<wrap>(module, **kw)` when given."""
    torch.manual_seed(0)
    t = make_t(torch).double()
    f = make_f(flow).double()
    f.load_state_dict({k: flow.tensor(v.detach().numpy()) for k, v in t.state_dict().items()})
    if wrap is not None:
        t, f = getattr(torch.nn.utils, wrap)(t, **kw), getattr(nn.utils, wrap)(f, **kw)
    return t, f


LAYERS = {
    "linear": (lambda m: m.nn.Linear(5, 4), (3, 5)),
    "conv2d": (lambda m: m.nn.Conv2d(3, 4, 3), (2, 3, 5, 6)),
    "conv_transpose2d": (lambda m: m.nn.ConvTranspose2d(3, 2, 3), (2, 3, 4, 4)),
}


def _step(t, f, shape, seed):
    x = np.random.default_rng(seed).standard_normal(shape)
    (fx, tx) = _pair(x, True)
    yt, yf = t(tx), f(fx)
    g = np.random.default_rng(seed + 100).standard_normal(tuple(yt.shape))
    yt.backward(torch.tensor(g))
    yf.backward(flow.tensor(g))
    np.testing.assert_allclose(yf.detach().numpy(), yt.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(fx.grad.numpy(), tx.grad.numpy(), rtol=1e-10, atol=1e-12)


def _assert_params_and_grads(t, f):
    tp, fp = dict(t.named_parameters()), dict(f.named_parameters())
    assert list(fp) == list(tp)
    for k in tp:
        np.testing.assert_allclose(fp[k].detach().numpy(), tp[k].detach().numpy(), rtol=1e-10, atol=1e-12, err_msg=k)
        np.testing.assert_allclose(fp[k].grad.numpy(), tp[k].grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=k)


def _assert_state(t, f):
    ts, fs = t.state_dict(), f.state_dict()
    assert list(fs) == list(ts)
    for k in ts:
        np.testing.assert_allclose(fs[k].numpy(), ts[k].numpy(), rtol=1e-10, atol=1e-12, err_msg=k)


@pytest.mark.parametrize("dim", [0, 1, None])
@pytest.mark.parametrize("layer", list(LAYERS))
def test_weight_norm(layer, dim):
    make, shape = LAYERS[layer]
    t, f = _twin(make, make, "weight_norm", dim=dim)
    assert tuple(f.weight_g.shape) == tuple(t.weight_g.shape)
    _assert_state(t, f)
    _step(t, f, shape, 0)
    _assert_params_and_grads(t, f)
    f2 = make(flow).double()  # a torch checkpoint loads into a fresh engine module
    nn.utils.weight_norm(f2, dim=dim).load_state_dict({k: flow.tensor(v.numpy()) for k, v in t.state_dict().items()})
    _assert_state(t, f2)
    torch.nn.utils.remove_weight_norm(t)
    nn.utils.remove_weight_norm(f)
    _assert_state(t, f)
    assert isinstance(f.weight, nn.Parameter) and not f._forward_pre_hooks


def test_weight_norm_errors():
    f = nn.utils.weight_norm(nn.Linear(3, 2))
    with pytest.raises(RuntimeError, match="Cannot register two weight_norm hooks"):
        nn.utils.weight_norm(f)
    with pytest.raises(ValueError, match="weight_norm of 'bias' not found"):
        nn.utils.remove_weight_norm(f, "bias")
    with pytest.warns(FutureWarning, match="parametrizations.weight_norm"):
        nn.utils.weight_norm(nn.Linear(3, 2))


@pytest.mark.parametrize("layer", list(LAYERS))
def test_parametrizations_weight_norm(layer):
    make, shape = LAYERS[layer]
    t, f = _twin(make, make)
    t = torch.nn.utils.parametrizations.weight_norm(t)
    f = nn.utils.parametrizations.weight_norm(f)
    assert type(f).__name__ == type(t).__name__ and parametrize.is_parametrized(f, "weight")
    _assert_state(t, f)  # parametrizations.weight.original0 / original1
    _step(t, f, shape, 1)
    _assert_params_and_grads(t, f)
    torch.nn.utils.parametrize.remove_parametrizations(t, "weight")
    parametrize.remove_parametrizations(f, "weight")
    assert type(f) is type(f).__mro__[0] and type(f).__name__ == type(t).__name__ and not parametrize.is_parametrized(f)
    _assert_state(t, f)


class _Symmetric:
    """A parametrization written once for both libraries."""

    @staticmethod
    def make(m):
        class Symmetric(m.nn.Module):
            def forward(self, x):
                return x.triu() + x.triu(1).transpose(0, 1)

            def right_inverse(self, a):
                return a.triu()

        class Scale(m.nn.Module):
            def forward(self, x):
                return 2 * x

            def right_inverse(self, a):
                return a / 2

        return Symmetric(), Scale()


def test_register_parametrization_chain_cached_and_remove():
    t, f = _twin(lambda m: m.nn.Linear(4, 4), lambda m: m.nn.Linear(4, 4))
    for m, mod in ((torch, t), (flow, f)):
        sym, scale = _Symmetric.make(m)
        m.nn.utils.parametrize.register_parametrization(mod, "weight", sym)
        m.nn.utils.parametrize.register_parametrization(mod, "weight", scale)
    _assert_state(t, f)
    np.testing.assert_allclose(f.weight.detach().numpy(), t.weight.detach().numpy(), rtol=1e-12)
    with parametrize.cached():
        assert f.weight is f.weight
    assert f.weight is not f.weight
    value = np.arange(16.0).reshape(4, 4)
    with torch.no_grad():
        t.weight = torch.tensor(value + value.T)
    f.weight = flow.tensor(value + value.T)  # the setter: right_inverse down the chain
    _assert_state(t, f)
    _step(t, f, (3, 4), 2)
    _assert_params_and_grads(t, f)
    torch.nn.utils.parametrize.remove_parametrizations(t, "weight", leave_parametrized=False)
    parametrize.remove_parametrizations(f, "weight", leave_parametrized=False)
    _assert_state(t, f)
    with pytest.raises(ValueError, match="does not have a parametrization on weight"):
        parametrize.remove_parametrizations(f, "weight")
    with pytest.raises(ValueError, match="does not have a parameter, a buffer, or a parametrized element"):
        parametrize.register_parametrization(f, "nope", _Symmetric.make(flow)[0])


def _copy_uv(t, f):
    f.weight_u.copy_(flow.tensor(t.weight_u.numpy()))
    f.weight_v.copy_(flow.tensor(t.weight_v.numpy()))


@pytest.mark.parametrize("n_iter", [1, 3])
@pytest.mark.parametrize("layer", list(LAYERS))
def test_spectral_norm(layer, n_iter):
    make, shape = LAYERS[layer]
    t, f = _twin(make, make, "spectral_norm", n_power_iterations=n_iter)
    assert tuple(f.weight_u.shape) == tuple(t.weight_u.shape) and tuple(f.weight_v.shape) == tuple(t.weight_v.shape)
    _copy_uv(t, f)  # u and v are random draws: start from torch's
    _assert_state(t, f)  # weight_orig, weight_u, weight_v (+ bias)
    for step in range(3):  # training: the power iteration updates u and v in place each forward
        for p in list(t.parameters()) + list(f.parameters()):
            p.grad = None
        _step(t, f, shape, step)
        _assert_params_and_grads(t, f)
        _assert_state(t, f)
    t.eval()
    f.eval()
    for p in list(t.parameters()) + list(f.parameters()):
        p.grad = None
    _step(t, f, shape, 9)  # eval: the stored u and v
    _assert_params_and_grads(t, f)
    _assert_state(t, f)
    torch.nn.utils.remove_spectral_norm(t)
    nn.utils.remove_spectral_norm(f)
    _assert_state(t, f)


def test_spectral_norm_loads_torch_checkpoint_and_checks_arguments():
    t = torch.nn.utils.spectral_norm(torch.nn.Linear(5, 3).double())
    t(torch.randn(2, 5, dtype=torch.float64))
    f = nn.utils.spectral_norm(nn.Linear(5, 3).double())
    f.load_state_dict({k: flow.tensor(v.numpy()) for k, v in t.state_dict().items()})
    _assert_state(t, f)
    t.eval()
    f.eval()
    x = np.random.default_rng(0).standard_normal((2, 5))
    np.testing.assert_allclose(f(flow.tensor(x)).detach().numpy(), t(torch.tensor(x)).detach().numpy(), rtol=1e-12)
    with pytest.raises(RuntimeError, match="Cannot register two spectral_norm hooks"):
        nn.utils.spectral_norm(f)
    with pytest.raises(ValueError, match="Expected n_power_iterations to be positive"):
        nn.utils.spectral_norm(nn.Linear(2, 2), n_power_iterations=0)
    with pytest.raises(ValueError, match="spectral_norm of 'bias' not found"):
        nn.utils.remove_spectral_norm(f, "bias")
    assert nn.utils.spectral_norm(nn.ConvTranspose2d(2, 3, 2)).weight_u.shape[0] == 3  # dim=1 by default
