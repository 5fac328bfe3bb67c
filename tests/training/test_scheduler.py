"""libai.scheduler: lr sequences against their closed forms (LiBai / OneFlow WarmupLR semantics)."""
import math
from bisect import bisect_right

import pytest

import engine as flow
from libai.scheduler import (
    WarmupCosineAnnealingLR, WarmupCosineLR, WarmupExponentialLR, WarmupMultiStepLR, WarmupPolynomialLR,
    WarmupStepLR,
)

BASE = 0.5
N = 40


def _opt():
    p = flow.nn.Parameter(flow.zeros(3))
    return flow.optim.SGD([p], lr=BASE)


def _warm(t, w, factor, method):
    if method == "constant":
        return factor
    return factor + (1 - factor) * t / w


def _lrs(sched, n=N):
    out = [sched.get_last_lr()[0]]
    for _ in range(n - 1):
        sched.step()
        out.append(sched.optimizer.param_groups[0]["lr"])
    return out


CASES = {
    "cosine": (
        lambda o, w, f, m: WarmupCosineLR(o, max_iter=N, warmup_factor=f, warmup_iter=w, alpha=0.1, warmup_method=m),
        lambda t: BASE * ((1 - 0.1) * 0.5 * (1 + math.cos(math.pi * min(t, N) / N)) + 0.1),
    ),
    "cosine_annealing": (
        lambda o, w, f, m: WarmupCosineAnnealingLR(o, max_iter=N, warmup_factor=f, warmup_iter=w, eta_min=0.01,
                                                   warmup_method=m),
        lambda t: 0.01 + (BASE - 0.01) * 0.5 * (1 + math.cos(math.pi * t / N)),
    ),
    "multistep": (
        lambda o, w, f, m: WarmupMultiStepLR(o, max_iter=N, milestones=[10, 25], warmup_factor=f, warmup_iter=w,
                                             gamma=0.2, warmup_method=m),
        lambda t: BASE * 0.2 ** bisect_right([10, 25], t),
    ),
    "step": (
        lambda o, w, f, m: WarmupStepLR(o, max_iter=N, step_size=7, warmup_factor=f, warmup_iter=w, gamma=0.5,
                                        warmup_method=m),
        lambda t: BASE * 0.5 ** (t // 7),
    ),
    "exponential": (
        lambda o, w, f, m: WarmupExponentialLR(o, max_iter=N, gamma=0.9, warmup_factor=f, warmup_iter=w,
                                               warmup_method=m),
        lambda t: BASE * 0.9 ** t,
    ),
    "polynomial": (
        lambda o, w, f, m: WarmupPolynomialLR(o, max_iter=N, warmup_factor=f, warmup_iter=w, end_learning_rate=1e-3,
                                              power=2.0, warmup_method=m),
        lambda t: (BASE - 1e-3) * (1 - min(t, N) / N) ** 2 + 1e-3,
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("warmup,factor,method", [(0, 0.001, "linear"), (5, 0.001, "linear"),
                                                  (8, 0.25, "constant"), (4, 0.0, "linear")])
def test_lr_sequence_matches_closed_form(name, warmup, factor, method):
    build, decay = CASES[name]
    got = _lrs(build(_opt(), warmup, factor, method))
    want = [BASE * _warm(t, warmup, factor, method) if t < warmup else decay(t) for t in range(N)]
    assert got == pytest.approx(want, rel=1e-12, abs=1e-15)


def test_polynomial_cycle_and_step_epochs():
    s = WarmupPolynomialLR(_opt(), max_iter=10, warmup_factor=0.1, warmup_iter=0, end_learning_rate=0.0,
                           power=1.0, cycle=True)
    got = _lrs(s, 25)
    want = []
    for t in range(25):
        steps = 10 * max(1, math.ceil(t / 10))
        want.append(BASE * (1 - t / steps))
    assert got == pytest.approx(want)
    # LiBai: with train_epoch, step_size counts epochs -> step_size / train_epoch * max_iter iterations
    s = WarmupStepLR(_opt(), max_iter=40, step_size=1, train_epoch=4, warmup_iter=0, gamma=0.5)
    assert _lrs(s, 40) == pytest.approx([BASE * 0.5 ** (t // 10) for t in range(40)])


def test_resume_from_state_dict_continues_the_sequence():
    ref = _lrs(WarmupCosineLR(_opt(), max_iter=N, warmup_factor=0.01, warmup_iter=6))
    s = WarmupCosineLR(_opt(), max_iter=N, warmup_factor=0.01, warmup_iter=6)
    for _ in range(12):
        s.step()
    state = s.state_dict()
    s2 = WarmupCosineLR(_opt(), max_iter=N, warmup_factor=0.01, warmup_iter=6)
    s2.load_state_dict(state)
    assert s2.get_last_lr()[0] == ref[12]
    s2.step()
    assert s2.optimizer.param_groups[0]["lr"] == ref[13]


def test_bad_arguments():
    with pytest.raises(ValueError, match="warmup method"):
        WarmupCosineLR(_opt(), max_iter=10, warmup_factor=0.1, warmup_iter=2, warmup_method="quadratic")
    with pytest.raises(ValueError, match="increasing"):
        WarmupMultiStepLR(_opt(), max_iter=10, milestones=[5, 2])
