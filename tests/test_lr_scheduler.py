"""engine.optim.lr_scheduler against torch.optim.lr_scheduler: the lr of every param group after
each of 30 steps, state-dict resume, the epoch= closed forms and constructor errors."""
import copy
import warnings

import numpy as np
import pytest
import torch

import engine as flow
from engine import optim

STEPS = 30


def _optimizer(lib, kind="sgd"):
    p = lib.zeros(3, requires_grad=True)
    q = lib.zeros(2, requires_grad=True)
    groups = [{"params": [p]}, {"params": [q], "lr": 0.05}]
    if kind == "adam":
        return lib.optim.Adam(groups, lr=0.1)
    return lib.optim.SGD(groups, lr=0.1, momentum=0.9)


def _sched_module(lib):
    return lib.optim.lr_scheduler


SCHEDULERS = {
    "LambdaLR": lambda S, o: S.LambdaLR(o, lambda e: 0.95 ** e),
    "LambdaLR_per_group": lambda S, o: S.LambdaLR(o, [lambda e: 1.0 / (e + 1), lambda e: 0.9 ** e]),
    "MultiplicativeLR": lambda S, o: S.MultiplicativeLR(o, lambda e: 0.97),
    "StepLR": lambda S, o: S.StepLR(o, step_size=7, gamma=0.5),
    "MultiStepLR": lambda S, o: S.MultiStepLR(o, milestones=[3, 10, 10, 25], gamma=0.3),
    "ConstantLR": lambda S, o: S.ConstantLR(o, factor=0.25, total_iters=6),
    "LinearLR": lambda S, o: S.LinearLR(o, start_factor=0.1, end_factor=0.9, total_iters=12),
    "LinearLR_default": lambda S, o: S.LinearLR(o),
    "ExponentialLR": lambda S, o: S.ExponentialLR(o, gamma=0.9),
    "PolynomialLR": lambda S, o: S.PolynomialLR(o, total_iters=20, power=2.0),
    "CosineAnnealingLR": lambda S, o: S.CosineAnnealingLR(o, T_max=10),
    "CosineAnnealingLR_eta_min": lambda S, o: S.CosineAnnealingLR(o, T_max=12, eta_min=0.001),
    "SequentialLR": lambda S, o: S.SequentialLR(
        o, [S.LinearLR(o, start_factor=0.01, total_iters=5), S.CosineAnnealingLR(o, T_max=20)], milestones=[5]),
    "SequentialLR_three": lambda S, o: S.SequentialLR(
        o, [S.ConstantLR(o, factor=0.5, total_iters=4), S.ExponentialLR(o, gamma=0.9),
            S.StepLR(o, step_size=3)], milestones=[4, 15]),
    "OneCycleLR": lambda S, o: S.OneCycleLR(o, max_lr=[1.0, 0.5], total_steps=STEPS + 1),
    "OneCycleLR_linear_three_phase": lambda S, o: S.OneCycleLR(
        o, max_lr=0.8, epochs=4, steps_per_epoch=8, anneal_strategy="linear", three_phase=True),
}


def _lr_trace(lib, make, kind="sgd", steps=STEPS):
    opt = _optimizer(lib, kind)
    sched = make(_sched_module(lib), opt)
    trace = [list(sched.get_last_lr())]
    momenta = []
    for _ in range(steps):
        opt.step()
        sched.step()
        trace.append(list(sched.get_last_lr()))
        assert trace[-1] == [g["lr"] for g in opt.param_groups]
        momenta.append([g.get("momentum", g.get("betas", (None,))[0]) for g in opt.param_groups])
    return np.array(trace, dtype=np.float64), momenta


@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_lr_sequence_matches_torch(name):
    ours, mom_o = _lr_trace(flow, SCHEDULERS[name])
    theirs, mom_t = _lr_trace(torch, SCHEDULERS[name])
    np.testing.assert_allclose(ours, theirs, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(np.array(mom_o, dtype=float), np.array(mom_t, dtype=float), rtol=1e-9)


def test_onecycle_cycles_adam_beta1_like_torch():
    make = SCHEDULERS["OneCycleLR"]
    ours, mom_o = _lr_trace(flow, make, kind="adam")
    theirs, mom_t = _lr_trace(torch, make, kind="adam")
    np.testing.assert_allclose(ours, theirs, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(np.array(mom_o), np.array(mom_t), rtol=1e-9)


def test_cosine_annealing_printed_values():
    """Values torch prints for CosineAnnealingLR(T_max=4) from lr=1: 1, .853553, .5, .146447, 0, ..."""
    opt = _optimizer(flow)
    sched = optim.lr_scheduler.CosineAnnealingLR(opt, T_max=4)
    seq = [sched.get_last_lr()[0]]
    for _ in range(6):
        opt.step()
        sched.step()
        seq.append(sched.get_last_lr()[0])
    expected = [0.1 * (1 + np.cos(np.pi * t / 4)) / 2 for t in range(7)]
    np.testing.assert_allclose(seq, expected, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("name", ["StepLR", "MultiStepLR", "ExponentialLR", "LinearLR", "CosineAnnealingLR",
                                  "ConstantLR", "PolynomialLR"])
def test_step_with_epoch_uses_closed_form_like_torch(name):
    make = SCHEDULERS[name]
    result = {}
    for lib in (flow, torch):
        opt = _optimizer(lib)
        sched = make(_sched_module(lib), opt)
        lrs = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for epoch in (3, 7, 11, 2, 25):
                opt.step()
                sched.step(epoch)
                lrs.append(list(sched.get_last_lr()))
        result[lib.__name__] = np.array(lrs)
    np.testing.assert_allclose(result["engine"], result["torch"], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", ["StepLR", "MultiStepLR", "CosineAnnealingLR", "LinearLR", "SequentialLR",
                                  "LambdaLR", "OneCycleLR"])
def test_scheduler_state_dict_resume_equals_uninterrupted(name):
    make = SCHEDULERS[name]
    reference, _ = _lr_trace(flow, make)

    opt = _optimizer(flow)
    sched = make(optim.lr_scheduler, opt)
    trace = [list(sched.get_last_lr())]
    for _ in range(10):
        opt.step()
        sched.step()
        trace.append(list(sched.get_last_lr()))
    sd = copy.deepcopy(sched.state_dict())
    opt_sd = copy.deepcopy(opt.state_dict())
    assert "optimizer" not in sd

    opt2 = _optimizer(flow)
    sched2 = make(optim.lr_scheduler, opt2)
    opt2.load_state_dict(opt_sd)
    sched2.load_state_dict(sd)
    for _ in range(STEPS - 10):
        opt2.step()
        sched2.step()
        trace.append(list(sched2.get_last_lr()))
    np.testing.assert_allclose(np.array(trace), reference, rtol=1e-12, atol=0)


def test_state_dict_matches_torch_keys():
    for name in ("StepLR", "CosineAnnealingLR", "LambdaLR"):
        ours = SCHEDULERS[name](optim.lr_scheduler, _optimizer(flow)).state_dict()
        theirs = SCHEDULERS[name](torch.optim.lr_scheduler, _optimizer(torch)).state_dict()
        for key in ("last_epoch", "base_lrs", "_last_lr", "_step_count"):
            assert ours[key] == theirs[key], (name, key)


def test_initial_lr_and_base_lrs():
    opt = _optimizer(flow)
    sched = optim.lr_scheduler.StepLR(opt, step_size=2)
    assert sched.base_lrs == [0.1, 0.05]
    assert [g["initial_lr"] for g in opt.param_groups] == [0.1, 0.05]
    assert sched.last_epoch == 0 and sched.get_last_lr() == [0.1, 0.05]


def test_scheduler_errors():
    S = optim.lr_scheduler
    with pytest.raises(TypeError, match="is not an Optimizer"):
        S.StepLR(object(), step_size=1)
    opt = _optimizer(flow)
    with pytest.raises(ValueError, match="Expected 2 lr_lambdas, but got 1"):
        S.LambdaLR(opt, [lambda e: 1.0])
    with pytest.raises(TypeError, match="lr_lambda should be a function"):
        S.MultiplicativeLR(opt, 0.5)
    with pytest.raises(KeyError, match="initial_lr"):
        S.StepLR(_optimizer(flow), step_size=1, last_epoch=3)
    with pytest.raises(ValueError, match="step_size must be a positive integer"):
        S.StepLR(opt, step_size=0)
    with pytest.raises(ValueError, match="Starting multiplicative factor"):
        S.LinearLR(opt, start_factor=0)
    with pytest.raises(ValueError, match="between 0 and 1"):
        S.ConstantLR(opt, factor=2.0)
    with pytest.raises(ValueError, match="number of milestones"):
        S.SequentialLR(opt, [S.StepLR(opt, 2), S.StepLR(opt, 3)], milestones=[])
    with pytest.raises(ValueError, match="same optimizer"):
        S.SequentialLR(opt, [S.StepLR(opt, 2), S.StepLR(_optimizer(flow), 3)], milestones=[2])
    with pytest.raises(ValueError, match="total_steps OR"):
        S.OneCycleLR(opt, max_lr=1.0)
    one = S.OneCycleLR(_optimizer(flow), max_lr=1.0, total_steps=2)
    one.step()
    one.step()
    with pytest.raises(ValueError, match="Tried to step 3 times"):
        one.step()
