"""engine.optim.lr_scheduler against torch.optim.lr_scheduler: the lr of every param group after
each of 30 steps (40, bit for bit, for the newer schedulers), state-dict resume, the epoch= closed
forms, CosineAnnealingWarmRestarts' fractional epochs, ReduceLROnPlateau on a metric sequence and
constructor errors."""
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
    "CosineAnnealingWarmRestarts": lambda S, o: S.CosineAnnealingWarmRestarts(o, T_0=5, T_mult=2, eta_min=0.001),
    "CosineAnnealingWarmRestarts_T_mult_1": lambda S, o: S.CosineAnnealingWarmRestarts(o, T_0=7),
    "CyclicLR": lambda S, o: S.CyclicLR(o, base_lr=0.01, max_lr=0.1, step_size_up=4),
    "CyclicLR_triangular2": lambda S, o: S.CyclicLR(
        o, base_lr=[0.01, 0.02], max_lr=[0.1, 0.3], step_size_up=3, step_size_down=5, mode="triangular2",
        base_momentum=[0.7, 0.8], max_momentum=0.95),
    "CyclicLR_exp_range": lambda S, o: S.CyclicLR(o, base_lr=0.01, max_lr=0.1, step_size_up=3, mode="exp_range",
                                                  gamma=0.95),
    "CyclicLR_scale_fn": lambda S, o: S.CyclicLR(o, base_lr=0.01, max_lr=0.1, step_size_up=3,
                                                 scale_fn=lambda x: 0.5 ** x, scale_mode="iterations",
                                                 cycle_momentum=False),
    "ChainedScheduler": lambda S, o: S.ChainedScheduler(
        [S.ConstantLR(o, factor=0.5, total_iters=4), S.ExponentialLR(o, gamma=0.9)]),
    "ChainedScheduler_cosine_multistep": lambda S, o: S.ChainedScheduler(
        [S.CosineAnnealingLR(o, T_max=10), S.MultiStepLR(o, [5, 12], 0.5)], optimizer=o),
}
NEWER = ["CosineAnnealingWarmRestarts", "CosineAnnealingWarmRestarts_T_mult_1", "CyclicLR", "CyclicLR_triangular2",
         "CyclicLR_exp_range", "CyclicLR_scale_fn", "ChainedScheduler", "ChainedScheduler_cosine_multistep"]


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
                                  "LambdaLR", "OneCycleLR", "CosineAnnealingWarmRestarts", "CyclicLR",
                                  "CyclicLR_exp_range", "CyclicLR_scale_fn", "ChainedScheduler"])
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
    for name in ("StepLR", "CosineAnnealingLR", "LambdaLR", "CosineAnnealingWarmRestarts", "CyclicLR"):
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


# ------------------------------------------------------------------ CosineAnnealingWarmRestarts, CyclicLR, Chained
@pytest.mark.parametrize("kind", ["sgd", "adam"])
@pytest.mark.parametrize("name", NEWER)
def test_newer_schedulers_match_torch_bit_for_bit_over_40_steps(name, kind):
    """lr and momentum (SGD's momentum, Adam's beta1) of both groups after each of 40 steps."""
    ours, mom_o = _lr_trace(flow, SCHEDULERS[name], kind, steps=40)
    theirs, mom_t = _lr_trace(torch, SCHEDULERS[name], kind, steps=40)
    np.testing.assert_array_equal(ours, theirs)
    assert mom_o == mom_t


def test_newer_scheduler_state_dict_keys_match_torch():
    """The same entries as torch's state dicts (torch's also has its get_lr-within-step flag)."""
    def keys(lib, make):
        return set(make(_sched_module(lib), _optimizer(lib)).state_dict()) - {"_get_lr_called_within_step"}

    makes = [SCHEDULERS[n] for n in ("CosineAnnealingWarmRestarts", "CyclicLR", "CyclicLR_scale_fn",
                                      "ChainedScheduler")] + [lambda S, o: S.ReduceLROnPlateau(o)]
    for make in makes:
        assert keys(flow, make) == keys(torch, make)


@pytest.mark.parametrize("T_mult", [1, 2])
def test_cosine_warm_restarts_fractional_epochs_like_torch(T_mult):
    """`step(epoch + i / iters)` inside each epoch (torch's documented use, which warns nothing),
    then step() and step(epoch) interleaved: lr, T_cur, T_i and last_epoch as torch's."""
    result = {}
    for lib in (flow, torch):
        opt = _optimizer(lib)
        sched = _sched_module(lib).CosineAnnealingWarmRestarts(opt, T_0=3, T_mult=T_mult, eta_min=0.01)
        seen = []

        def record():
            seen.append(list(sched.get_last_lr()) + [sched.T_cur, sched.T_i, sched.last_epoch])

        with warnings.catch_warnings():
            warnings.simplefilter("error" if lib is flow else "ignore")
            for epoch in range(12):
                for i in range(4):
                    opt.step()
                    sched.step(epoch + i / 4)
                    record()
            for epoch in (None, 2.5, None, None, 30, None, 0, 7.75):
                opt.step()
                sched.step(epoch)
                record()
        result[lib.__name__] = seen
    assert result["engine"] == result["torch"]


def test_cyclic_lr_with_a_callable_object_saves_its_state():
    class Halving:
        def __init__(self):
            self.base = 0.5

        def __call__(self, x):
            return self.base ** x

    opt = _optimizer(flow)
    fn = Halving()
    sched = optim.lr_scheduler.CyclicLR(opt, 0.01, 0.1, step_size_up=2, scale_fn=fn)
    sd = copy.deepcopy(sched.state_dict())
    assert sd["_scale_fn_custom"] == {"base": 0.5} and "_scale_fn_ref" not in sd
    fn2 = Halving()
    fn2.base = 0.9
    sched2 = optim.lr_scheduler.CyclicLR(_optimizer(flow), 0.01, 0.1, step_size_up=2, scale_fn=fn2)
    sched2.load_state_dict(sd)
    assert fn2.base == 0.5


# ------------------------------------------------------------------ ReduceLROnPlateau
METRICS = [1.0, 0.9, 0.85, 0.85, 0.86, 0.84, 0.9, 0.9, 0.9, 0.83, 0.83, 0.82, 0.9, 0.9, 0.9, 0.9, 0.7, 0.7,
           0.71, 0.72, 0.69, 0.69, 0.69, 0.69, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.4, 0.4, 0.4, 0.41, 0.39, 0.39,
           0.39, 0.39, 0.39, 0.39]
PLATEAU = {
    "min_rel": (dict(patience=2, factor=0.5), METRICS),
    "min_abs_cooldown": (dict(patience=1, threshold=0.05, threshold_mode="abs", cooldown=2, factor=0.3), METRICS),
    "max_rel_min_lrs": (dict(mode="max", patience=1, factor=0.5, cooldown=1, min_lr=[0.02, 0.01]),
                        [-m for m in METRICS]),
    "max_abs_eps": (dict(mode="max", threshold_mode="abs", threshold=0.1, patience=0, factor=0.9, eps=0.004,
                         min_lr=0.03), [1 - m for m in METRICS]),
}


def _plateau_trace(lib, kw, metrics, sched=None, opt=None, start=0):
    if sched is None:
        opt = _optimizer(lib)
        sched = _sched_module(lib).ReduceLROnPlateau(opt, **kw)
    trace = []
    for i, m in enumerate(metrics, start):
        opt.step()
        sched.step(lib.tensor(m) if i % 2 else m)  # a 0-d tensor metric too
        trace.append([*sched.get_last_lr(), sched.best, sched.num_bad_epochs, sched.cooldown_counter,
                      sched.last_epoch])
        assert trace[-1][:2] == [g["lr"] for g in opt.param_groups]
    return trace, sched, opt


@pytest.mark.parametrize("case", list(PLATEAU))
def test_reduce_lr_on_plateau_matches_torch(case):
    kw, metrics = PLATEAU[case]
    ours, _, _ = _plateau_trace(flow, kw, metrics)
    theirs, _, _ = _plateau_trace(torch, kw, metrics)
    assert ours == theirs
    lrs = [row[0] for row in ours]
    assert len(set(lrs)) >= 3, "the sequence should reduce the lr at least twice"
    if kw.get("cooldown"):
        assert any(row[4] > 0 for row in ours)


@pytest.mark.parametrize("case", list(PLATEAU))
def test_reduce_lr_on_plateau_state_dict_resume_equals_uninterrupted(case):
    kw, metrics = PLATEAU[case]
    reference, _, _ = _plateau_trace(flow, kw, metrics)
    first, sched, opt = _plateau_trace(flow, kw, metrics[:15])
    sd, opt_sd = copy.deepcopy(sched.state_dict()), copy.deepcopy(opt.state_dict())
    assert "optimizer" not in sd
    opt2 = _optimizer(flow)
    sched2 = optim.lr_scheduler.ReduceLROnPlateau(opt2, mode="min" if kw.get("mode", "min") == "max" else "max")
    opt2.load_state_dict(opt_sd)
    sched2.load_state_dict(sd)
    rest, _, _ = _plateau_trace(flow, kw, metrics[15:], sched2, opt2, start=15)
    assert first + rest == reference


def test_reduce_lr_on_plateau_new_group_takes_the_scalar_min_lr():
    result = {}
    for lib in (flow, torch):
        opt = _optimizer(lib)
        sched = _sched_module(lib).ReduceLROnPlateau(opt, patience=0, min_lr=0.04)
        opt.add_param_group({"params": [lib.zeros(1, requires_grad=True)], "lr": 1.0})
        for m in (1.0, 2.0, 3.0):
            sched.step(m)
        result[lib.__name__] = (sched.get_last_lr(), sched.min_lrs)
    assert result["engine"] == result["torch"]
    opt = _optimizer(flow)
    sched = optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, min_lr=[0.0, 0.0])
    opt.add_param_group({"params": [flow.zeros(1, requires_grad=True)]})
    sched.step(1.0)
    with pytest.raises(RuntimeError, match=r"The number of param groups in the `optimizer` \(3\) differs"):
        sched.step(2.0)


def test_newer_scheduler_errors():
    S = optim.lr_scheduler
    opt = _optimizer(flow)
    with pytest.raises(ValueError, match=r"Factor should be < 1\.0\."):
        S.ReduceLROnPlateau(opt, factor=1.0)
    with pytest.raises(ValueError, match="mode avg is unknown!"):
        S.ReduceLROnPlateau(opt, mode="avg")
    with pytest.raises(ValueError, match="threshold mode relative is unknown!"):
        S.ReduceLROnPlateau(opt, threshold_mode="relative")
    with pytest.raises(ValueError, match="expected 2 min_lrs, got 1"):
        S.ReduceLROnPlateau(opt, min_lr=[0.1])
    with pytest.raises(TypeError, match="is not an Optimizer"):
        S.ReduceLROnPlateau(object())
    with pytest.raises(ValueError, match="Expected positive integer T_0, but got 0"):
        S.CosineAnnealingWarmRestarts(opt, T_0=0)
    with pytest.raises(ValueError, match="Expected positive integer T_0, but got 2.5"):
        S.CosineAnnealingWarmRestarts(opt, T_0=2.5)
    with pytest.raises(ValueError, match="Expected integer T_mult >= 1, but got 0"):
        S.CosineAnnealingWarmRestarts(opt, T_0=2, T_mult=0)
    with pytest.raises(ValueError, match="Expected float or int eta_min"):
        S.CosineAnnealingWarmRestarts(opt, T_0=2, eta_min="0")
    with pytest.raises(ValueError, match="Expected non-negative epoch, but got -1"):
        S.CosineAnnealingWarmRestarts(opt, T_0=2).step(-1)
    with pytest.raises(ValueError, match="mode is invalid and scale_fn is None"):
        S.CyclicLR(opt, 0.01, 0.1, mode="square")
    with pytest.raises(ValueError, match="base_lr must have the same length as optimizer.param_groups"):
        S.CyclicLR(opt, [0.01], 0.1)
    adagrad = optim.Adagrad([flow.zeros(2, requires_grad=True)])
    with pytest.raises(ValueError, match="optimizer must support momentum or beta1"):
        S.CyclicLR(adagrad, 0.01, 0.1)
    S.CyclicLR(adagrad, 0.01, 0.1, cycle_momentum=False)
    with pytest.raises(ValueError, match="expects at least one scheduler to be chained, but got no scheduler"):
        S.ChainedScheduler([])
    with pytest.raises(ValueError, match="does not support `ReduceLROnPlateau`"):
        S.ChainedScheduler([S.StepLR(opt, 2), S.ReduceLROnPlateau(opt)])
    with pytest.raises(ValueError, match="same optimizer"):
        S.ChainedScheduler([S.StepLR(opt, 2), S.StepLR(_optimizer(flow), 3)])
    with pytest.raises(ValueError, match="same optimizer"):
        S.ChainedScheduler([S.StepLR(opt, 2)], optimizer=_optimizer(flow))
