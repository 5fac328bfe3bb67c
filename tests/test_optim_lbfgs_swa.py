"""engine.optim.LBFGS and engine.optim.swa_utils against torch 2.13 on the same initial values.

LBFGS: every closure evaluation (the parameters it sees and its loss) and the parameters after each
`step` are compared with torch's on float64 problems (Rosenbrock, least squares, a tiny MLP), with
and without the strong-Wolfe line search; the state dict has torch's layout and round-trips.
SWA: AveragedModel's averages (SWA, EMA, custom avg_fn, buffers) and SWALR's lrs step by step,
and update_bn's recomputed batch-norm statistics."""
import inspect
import os

import numpy as np
import pytest
import torch

import engine as flow
from engine import optim

DEVICE = os.environ.get("ENGINE_TEST_DEVICE", "cpu")
TOL = 1e-10


# ------------------------------------------------------------------ problems
def _rosenbrock(lib, params):
    (x,) = params
    return (1 - x[0]) ** 2 + 100 * (x[1] - x[0] ** 2) ** 2


_RNG = np.random.default_rng(3)
_A, _B = _RNG.standard_normal((8, 5)), _RNG.standard_normal(8)
_XIN, _YOUT = _RNG.standard_normal((6, 3)), _RNG.standard_normal((6, 2))


def _lstsq(lib, params):
    (x,) = params
    A = lib.tensor(_A, dtype=lib.float64)
    b = lib.tensor(_B, dtype=lib.float64)
    r = A @ x - b
    return (r * r).sum() + 0.1 * (x * x).sum()


def _mlp(lib, params):
    w1, b1, w2, b2 = params
    x = lib.tensor(_XIN, dtype=lib.float64)
    y = lib.tensor(_YOUT, dtype=lib.float64)
    h = (x @ w1 + b1).tanh()
    out = h @ w2 + b2
    return ((out - y) ** 2).mean()


PROBLEMS = {
    "rosenbrock": (_rosenbrock, [np.array([-1.2, 1.0])]),
    "lstsq": (_lstsq, [np.zeros(5)]),
    "mlp": (_mlp, [_RNG.standard_normal((3, 4)) * 0.5, np.zeros(4), _RNG.standard_normal((4, 2)) * 0.5,
                   np.zeros(2)]),
}


def _setup(problem, lib, **kw):
    fn, init = PROBLEMS[problem]
    if lib is torch:
        params = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in init]
        opt = torch.optim.LBFGS(params, **kw)
    else:
        params = [flow.tensor(a, dtype=flow.float64, device=DEVICE, requires_grad=True) for a in init]
        opt = optim.LBFGS(params, **kw)
    trace = []

    def closure():
        opt.zero_grad()
        loss = fn(lib, params)
        loss.backward()
        trace.append((float(loss.detach()), _flat(params)))
        return loss

    return params, opt, closure, trace


def _flat(params):
    return np.concatenate([np.asarray(p.detach().cpu().numpy()).ravel() for p in params])


LBFGS_CONFIGS = {
    "default": dict(),
    "strong_wolfe": dict(line_search_fn="strong_wolfe"),
    "small_history": dict(history_size=3, max_iter=7, lr=0.5),
    "wolfe_small_history": dict(history_size=2, max_iter=10, line_search_fn="strong_wolfe"),
}


@pytest.mark.parametrize("problem", sorted(PROBLEMS))
@pytest.mark.parametrize("config", sorted(LBFGS_CONFIGS))
def test_lbfgs_trajectory_matches_torch(problem, config):
    kw = LBFGS_CONFIGS[config]
    if problem == "rosenbrock" and "line_search_fn" not in kw:
        kw = dict(kw, lr=0.05 * kw.get("lr", 1))  # a fixed step diverges on Rosenbrock otherwise
    pe, oe, ce, te = _setup(problem, flow, **kw)
    pt, ot, ct, tt = _setup(problem, torch, **kw)
    for step in range(4):
        le, lt = oe.step(ce), ot.step(ct)
        le, lt = float(le.detach()), float(lt.detach())
        assert abs(le - lt) <= TOL * max(1, abs(lt))
        np.testing.assert_allclose(_flat(pe), _flat(pt), rtol=0, atol=TOL, err_msg=f"step {step}")
    assert len(te) == len(tt)
    for i, ((fe, xe), (ft, xt)) in enumerate(zip(te, tt)):
        np.testing.assert_allclose(xe, xt, rtol=0, atol=TOL, err_msg=f"evaluation {i}")
        assert abs(fe - ft) <= TOL * max(1, abs(ft)), (i, fe, ft)
    se, st = oe.state_dict(), ot.state_dict()
    assert sorted(se["state"][0]) == sorted(st["state"][0])
    assert se["param_groups"][0] == {k: v for k, v in st["param_groups"][0].items()}
    for k in ("func_evals", "n_iter"):
        assert se["state"][0][k] == st["state"][0][k]
    for k in ("d", "prev_flat_grad"):
        np.testing.assert_allclose(se["state"][0][k].numpy(), st["state"][0][k].numpy(), rtol=0, atol=TOL)
    assert len(se["state"][0]["old_dirs"]) == len(st["state"][0]["old_dirs"])


def test_lbfgs_state_dict_round_trip_continues_identically():
    pa, oa, ca, _ = _setup("mlp", flow, history_size=5, max_iter=5)
    oa.step(ca)
    sd = oa.state_dict()
    pb, ob, cb, _ = _setup("mlp", flow, history_size=5, max_iter=5)
    for p, q in zip(pb, pa):
        p.data = q.detach().clone()
    ob.load_state_dict(sd)
    # a torch LBFGS fed the same state (tensors converted) continues the same way too
    pt, ot, ct, _ = _setup("mlp", torch, history_size=5, max_iter=5)
    with torch.no_grad():
        for p, q in zip(pt, pa):
            p.copy_(torch.tensor(q.detach().numpy()))

    def to_torch(v):
        if isinstance(v, list):
            return [to_torch(x) for x in v]
        return torch.tensor(v.numpy()) if isinstance(v, flow.Tensor) else v

    ot.load_state_dict({"state": {0: {k: to_torch(v) for k, v in sd["state"][0].items()}},
                        "param_groups": sd["param_groups"]})
    for _ in range(2):
        oa.step(ca)
        ob.step(cb)
        ot.step(ct)
    np.testing.assert_array_equal(_flat(pa), _flat(pb))
    np.testing.assert_allclose(_flat(pa), _flat(pt), rtol=0, atol=TOL)


def test_lbfgs_loads_torch_state_dict():
    pt, ot, ct, _ = _setup("lstsq", torch, max_iter=3)
    pe, oe, ce, _ = _setup("lstsq", flow, max_iter=3)
    ot.step(ct)

    def to_ours(v):
        if isinstance(v, list):
            return [to_ours(x) for x in v]
        return flow.tensor(v.detach().numpy()) if isinstance(v, torch.Tensor) else v

    sd = ot.state_dict()
    oe.load_state_dict({"state": {0: {k: to_ours(v) for k, v in sd["state"][0].items()}},
                        "param_groups": sd["param_groups"]})
    pe[0].data = flow.tensor(pt[0].detach().numpy())
    for _ in range(2):
        ot.step(ct)
        oe.step(ce)
    np.testing.assert_allclose(_flat(pe), _flat(pt), rtol=0, atol=TOL)


def test_lbfgs_signature_defaults_and_errors_match_torch():
    ours, theirs = inspect.signature(optim.LBFGS), inspect.signature(torch.optim.LBFGS)
    assert list(ours.parameters) == list(theirs.parameters)
    assert {k: v.default for k, v in ours.parameters.items()} == {k: v.default for k, v in theirs.parameters.items()}
    p = flow.zeros(3, requires_grad=True)
    g = optim.LBFGS([p]).param_groups[0]
    q = torch.zeros(3, requires_grad=True)
    assert {k: v for k, v in g.items() if k != "params"} == \
        {k: v for k, v in torch.optim.LBFGS([q]).param_groups[0].items() if k != "params"}
    with pytest.raises(ValueError, match="Invalid learning rate"):
        optim.LBFGS([p], lr=-1)
    with pytest.raises(ValueError, match="per-parameter options"):
        optim.LBFGS([{"params": [p]}, {"params": [flow.zeros(2, requires_grad=True)]}])
    opt = optim.LBFGS([p], line_search_fn="bogus")
    with pytest.raises(RuntimeError, match="strong_wolfe"):
        opt.step(lambda: ((p - 1) ** 2).sum().backward() or ((p - 1) ** 2).sum())


def test_lbfgs_float32_close_to_torch():
    init = np.array([-1.2, 1.0], dtype=np.float32)
    pe = flow.tensor(init, requires_grad=True)
    pt = torch.tensor(init, requires_grad=True)
    oe = optim.LBFGS([pe], line_search_fn="strong_wolfe")
    ot = torch.optim.LBFGS([pt], line_search_fn="strong_wolfe")

    def closure(opt, x, lib):
        def c():
            opt.zero_grad()
            loss = _rosenbrock(lib, [x])
            loss.backward()
            return loss
        return c

    for _ in range(3):
        oe.step(closure(oe, pe, flow))
        ot.step(closure(ot, pt, torch))
    assert oe.state_dict()["state"][0]["d"].dtype == flow.float32
    np.testing.assert_allclose(pe.detach().numpy(), pt.detach().numpy(), rtol=0, atol=1e-4)


# ------------------------------------------------------------------ swa_utils
from engine.optim import swa_utils  # noqa: E402
from torch.optim import swa_utils as torch_swa  # noqa: E402


def _models(seed=0, dtype="float64"):
    """The same small Linear-BatchNorm-Linear model in torch and in the engine."""
    torch.manual_seed(seed)
    tm = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    tm = tm.double() if dtype == "float64" else tm
    em = flow.nn.Sequential(flow.nn.Linear(3, 4), flow.nn.BatchNorm1d(4), flow.nn.Linear(4, 2))
    em = em.double() if dtype == "float64" else em
    em.load_state_dict({k: flow.tensor(v.numpy()) for k, v in tm.state_dict().items()})
    return tm, em


def _perturb(tm, em, step):
    """A new set of weights and batch-norm statistics in both models (as training would give)."""
    rng = np.random.default_rng(1000 + step)
    with torch.no_grad():
        for (name, tp), (_, ep) in zip(tm.state_dict().items(), em.state_dict().items()):
            if tp.is_floating_point():
                v = tp.numpy() + rng.standard_normal(tp.shape)
                if "running_var" in name:
                    v = np.abs(v) + 0.1
            else:
                v = tp.numpy() + 1
            tp.copy_(torch.tensor(v, dtype=tp.dtype))
            ep.copy_(flow.tensor(v, dtype=ep.dtype))


def _compare_models(ours, theirs, atol=1e-12):
    sd_o, sd_t = ours.state_dict(), theirs.state_dict()
    assert list(sd_o) == list(sd_t)
    for k in sd_t:
        np.testing.assert_allclose(sd_o[k].numpy(), sd_t[k].numpy(), rtol=0, atol=atol, err_msg=k)


AVG_CONFIGS = {
    "swa": lambda m: dict(),
    "swa-buffers": lambda m: dict(use_buffers=True),
    "ema-multi": lambda m: dict(multi_avg_fn=m.get_ema_multi_avg_fn(0.9)),
    "ema-multi-buffers": lambda m: dict(multi_avg_fn=m.get_ema_multi_avg_fn(0.7), use_buffers=True),
    "swa-multi": lambda m: dict(multi_avg_fn=m.get_swa_multi_avg_fn()),
    "ema-avg-fn": lambda m: dict(avg_fn=m.get_ema_avg_fn(0.95)),
    "swa-avg-fn": lambda m: dict(avg_fn=m.get_swa_avg_fn()),
    "custom-avg-fn": lambda m: dict(avg_fn=lambda a, p, n: 0.25 * a + 0.75 * p + n * 0.001),
}


@pytest.mark.parametrize("config", sorted(AVG_CONFIGS))
def test_averaged_model_matches_torch(config):
    tm, em = _models()
    ta = torch_swa.AveragedModel(tm, **AVG_CONFIGS[config](torch_swa))
    ea = swa_utils.AveragedModel(em, **AVG_CONFIGS[config](swa_utils))
    for step in range(6):
        _perturb(tm, em, step)
        ta.update_parameters(tm)
        ea.update_parameters(em)
        _compare_models(ea, ta)
        assert int(ea.n_averaged.item()) == int(ta.n_averaged.item()) == step + 1
    x = np.random.default_rng(0).standard_normal((5, 3))
    ta.eval()
    ea.eval()
    np.testing.assert_allclose(ea(flow.tensor(x)).detach().numpy(), ta(torch.tensor(x)).detach().numpy(),
                               rtol=0, atol=1e-12)
    assert ea.n_averaged.dtype == flow.int64 and "n_averaged" in ea.state_dict()


def test_averaged_model_float32_and_errors():
    tm, em = _models(dtype="float32")
    ta, ea = torch_swa.AveragedModel(tm), swa_utils.AveragedModel(em)
    for step in range(4):
        _perturb(tm, em, step)
        ta.update_parameters(tm)
        ea.update_parameters(em)
    _compare_models(ea, ta, atol=1e-6)
    with pytest.raises(AssertionError, match="Only one of avg_fn and multi_avg_fn"):
        swa_utils.AveragedModel(em, avg_fn=swa_utils.get_swa_avg_fn(), multi_avg_fn=swa_utils.get_swa_multi_avg_fn())
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="Invalid decay value"):
            swa_utils.get_ema_avg_fn(bad)
        with pytest.raises(ValueError, match="Invalid decay value"):
            swa_utils.get_ema_multi_avg_fn(bad)


@pytest.mark.parametrize("name", swa_utils.__all__)
def test_swa_utils_signatures_match_torch(name):
    assert sorted(swa_utils.__all__) == sorted(torch_swa.__all__)
    ours, theirs = inspect.signature(getattr(swa_utils, name)), inspect.signature(getattr(torch_swa, name))
    assert list(ours.parameters) == list(theirs.parameters)
    assert [p.default for p in ours.parameters.values()] == [p.default for p in theirs.parameters.values()]


SWALR_CONFIGS = {
    "cos": dict(swa_lr=0.05),
    "linear": dict(swa_lr=0.05, anneal_strategy="linear", anneal_epochs=4),
    "no-anneal": dict(swa_lr=0.02, anneal_epochs=0),
    "per-group": dict(swa_lr=[0.05, 0.001], anneal_epochs=3),
}


@pytest.mark.parametrize("config", sorted(SWALR_CONFIGS))
def test_swalr_matches_torch(config):
    kw = SWALR_CONFIGS[config]
    pe, pt = [flow.zeros(2, requires_grad=True), flow.zeros(3, requires_grad=True)], \
        [torch.zeros(2, requires_grad=True), torch.zeros(3, requires_grad=True)]
    oe = optim.SGD([{"params": pe[:1]}, {"params": pe[1:], "lr": 0.3}], lr=0.5)
    ot = torch.optim.SGD([{"params": pt[:1]}, {"params": pt[1:], "lr": 0.3}], lr=0.5)
    se, st = swa_utils.SWALR(oe, **kw), torch_swa.SWALR(ot, **kw)
    np.testing.assert_allclose(se.get_last_lr(), st.get_last_lr(), rtol=1e-15)
    for step in range(15):
        oe.step()
        ot.step()
        se.step()
        st.step()
        np.testing.assert_allclose(se.get_last_lr(), st.get_last_lr(), rtol=1e-14, err_msg=f"step {step}")
        assert [g["swa_lr"] for g in oe.param_groups] == [g["swa_lr"] for g in ot.param_groups]
        if step == 2:  # a state-dict round trip into a fresh scheduler continues identically
            sd = se.state_dict()
            # torch's base scheduler also keeps a _get_lr_called_within_step flag; the engine's has none
            assert sorted(sd) == sorted(k for k in st.state_dict() if k != "_get_lr_called_within_step")
            se = swa_utils.SWALR(oe, **kw)
            se.load_state_dict(sd)


def test_swalr_errors():
    p = flow.zeros(2, requires_grad=True)
    opt = optim.SGD([p], lr=0.1)
    with pytest.raises(ValueError, match="anneal_strategy must be one of"):
        swa_utils.SWALR(opt, 0.01, anneal_strategy="exp")
    with pytest.raises(ValueError, match="anneal_epochs must be equal or greater than 0"):
        swa_utils.SWALR(opt, 0.01, anneal_epochs=-1)
    with pytest.raises(ValueError, match="swa_lr must have the same length"):
        swa_utils.SWALR(opt, [0.01, 0.02])


@pytest.mark.parametrize("tuples", [False, True])
def test_update_bn_matches_torch(tuples):
    tm, em = _models()
    _perturb(tm, em, 0)
    tm.eval()
    em.eval()
    tm[1].momentum = em[1].momentum = 0.3
    rng = np.random.default_rng(5)
    batches = [rng.standard_normal((n, 3)) * 2 + 1 for n in (4, 7, 5)]
    wrap = (lambda b, lib: (lib.tensor(b), lib.tensor(b[:, 0]))) if tuples else (lambda b, lib: lib.tensor(b))
    torch_swa.update_bn([wrap(b, torch) for b in batches], tm)
    swa_utils.update_bn([wrap(b, flow) for b in batches], em)
    _compare_models(em, tm)
    assert not em.training and em[1].momentum == 0.3
    swa_utils.update_bn([], flow.nn.Linear(2, 2))  # no batch norm: nothing to do
