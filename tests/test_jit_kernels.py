"""The compiled CPU kernels (engine.backend.jit, numba) against the numpy kernels they replace,
which stay the reference: layer_norm forward and backward, on shapes, dtypes and values the
benchmarks do not choose (one column, odd widths, a large offset, inf and nan rows, no affine)."""
import os
import subprocess
import sys

import numpy as np
import pytest

from engine.backend import jit
from engine.ops import normalization as N

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
needs_jit = pytest.mark.skipif(not jit.available(), reason=f"no compiled kernels: {jit.why_unavailable()}")


class _Ctx:
    needs_input_grad = (True, True, True)


def _layer_norm(x, w, b, g, compiled, monkeypatch):
    """(y, mean, rstd, dx, dw, db) through LayerNorm's forward and grad ops, compiled or numpy."""
    if not compiled:
        monkeypatch.setattr(N, "_layer_norm_rows_jit", None)
        monkeypatch.setattr(N, "_layer_norm_grad_rows_jit", None)
    y, mean, rstd = N.LayerNorm.forward(_Ctx(), x, w, b, 1, 1e-5)
    dx, dw, db = N.LayerNormGrad.forward(_Ctx(), g, x, mean, rstd, w, 1, b is not None)
    monkeypatch.undo()
    return y, mean, rstd, dx, dw, db


CASES = {
    "swin-stage1": ((512, 96), np.float32),
    "one-column": ((33, 1), np.float32),
    "odd-width": ((7, 3, 37), np.float32),
    "wide": ((5, 3000), np.float32),
    "float64": ((64, 384), np.float64),
    "offset": ((40, 64), np.float32),
}


@needs_jit
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("case", sorted(CASES))
def test_layer_norm_compiled_equals_numpy(case, affine, monkeypatch):
    shape, dtype = CASES[case]
    rng = np.random.default_rng(len(case))
    x = rng.standard_normal(shape).astype(dtype)
    if case == "offset":
        x += dtype(300.0)  # a large mean: the two-pass variance must not cancel
    d = shape[-1]
    w = (rng.standard_normal(d) + 1).astype(dtype) if affine else None
    b = rng.standard_normal(d).astype(dtype) if affine else None
    g = rng.standard_normal(shape).astype(dtype)
    fast = _layer_norm(x, w, b, g, True, monkeypatch)
    ref = _layer_norm(x, w, b, g, False, monkeypatch)
    if case == "offset":
        # a mean of 300 is known to a float32 ulp (3e-5): both kernels are that far from the
        # float64 result, in different directions; the compiled one must be no worse
        truth = _layer_norm(*(a if a is None else a.astype(np.float64) for a in (x, w, b, g)), False, monkeypatch)
        for name, a, r, t in zip(("y", "mean", "rstd", "dx", "dw", "db"), fast, ref, truth):
            if t is not None and t.size:
                assert np.abs(a - t).max() <= max(2 * np.abs(r - t).max(), 1e-6), name
        return
    tol = dict(rtol=2e-5, atol=2e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
    for name, a, r in zip(("y", "mean", "rstd", "dx", "dw", "db"), fast, ref):
        if r is None or (hasattr(r, "size") and r.size == 0):
            assert a is None or a.size == 0, name
            continue
        assert a.shape == r.shape and a.dtype == r.dtype, name
        np.testing.assert_allclose(a, r, err_msg=name, **tol)


@needs_jit
def test_layer_norm_compiled_propagates_inf_and_nan(monkeypatch):
    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    x[1, 3] = np.nan
    x[2, 5] = np.inf
    w, b = np.ones(16, np.float32), np.zeros(16, np.float32)
    fast = _layer_norm(x, w, b, x, True, monkeypatch)
    ref = _layer_norm(x, w, b, x, False, monkeypatch)
    for a, r in zip(fast[:3], ref[:3]):
        np.testing.assert_array_equal(np.isnan(a), np.isnan(r))
    assert np.isnan(fast[0][1:3]).all() and np.isfinite(fast[0][[0, 3]]).all()


@needs_jit
def test_layer_norm_takes_the_numpy_path_for_what_it_cannot_compile(monkeypatch):
    """Strided rows go to numpy (the kernels want unit-stride rows); results agree."""
    x = np.random.default_rng(1).standard_normal((32, 48)).astype(np.float32)[:, ::2]
    w, b = np.ones(24, np.float32), np.zeros(24, np.float32)
    y = N.LayerNorm.forward(_Ctx(), x, w, b, 1, 1e-5)[0]
    want = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_engine_runs_without_the_jit():
    code = ("import numpy as np, engine as flow; from engine.backend import jit; "
            "from engine.ops import normalization as N; "
            "x = flow.tensor(np.random.default_rng(0).standard_normal((8, 96)).astype(np.float32)); "
            "y = flow.nn.functional.layer_norm(x, (96,)); "
            "print(jit.available(), jit.why_unavailable(), N._layer_norm_rows_jit, "
            "float(abs(y.numpy().mean(-1)).max()) < 1e-6)")
    r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, ENGINE_JIT="0", PYTHONPATH=ROOT),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "turned", "off", "by", "ENGINE_JIT=0", "None", "True"], r.stdout


# ------------------------------------------------------------------ Adam / AdamW update
@needs_jit
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("decoupled,wd,beta1", [(True, 0.05, 0.9), (False, 0.01, 0.9), (True, 0.0, 0.9),
                                                (False, 0.1, 0.3)])
def test_adam_compiled_update_has_the_numpy_bits(monkeypatch, dtype, decoupled, wd, beta1):
    """Adam (L2 decay) and AdamW (decoupled) over several steps, with beta1 <= 0.5 (the other
    branch of torch's lerp) and without decay; sizes that leave a ragged last range."""
    from engine.optim import adam

    rng = np.random.default_rng(7)
    n = 3 * adam._BLOCK + 17
    w0 = rng.standard_normal(n).astype(dtype)
    m0, v0 = (rng.standard_normal(n) * 0.1).astype(dtype), (rng.random(n) * 0.01).astype(dtype)
    grads = [rng.standard_normal(n).astype(dtype) for _ in range(3)]
    results = []
    for compiled in (True, False):
        if not compiled:
            monkeypatch.setattr(adam, "_adam_jit", None)
        w, m, v = w0.copy(), m0.copy(), v0.copy()
        for step, g in enumerate(grads, 1):
            adam._adam_blocked(w, g, m, v, 1e-3, wd, 1e-8, beta1, 0.999, step, decoupled)
        results.append((w, m, v))
        monkeypatch.undo()
    for a, b, what in zip(*results, ("weights", "first moment", "second moment")):
        np.testing.assert_array_equal(a, b, err_msg=what)


# ------------------------------------------------------------------ activations (GELU)
def _compiled(name):
    return jit.kernel(f"engine.ops._jit_activations:{name}", fastmath={"contract"})


@needs_jit
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # np.exp's overflow in the float64 truth
def test_exp_and_normal_cdf_helpers_against_float64():
    """The vectorisable exp and Phi behind the GELU loops, on dense grids: exp within 2 ulp where
    the result is normal, 0 below -86.64, inf above 88.72, nan kept; Phi within 3e-7 absolute
    and, in the left tail, relatively accurate (no cancellation) down to x = -13 (Phi ~ 6e-39)."""
    import scipy.special

    from engine.ops import _jit_activations as A

    numba = jit.import_numba()
    exp_loop = numba.njit(error_model="numpy", fastmath={"contract"})(_exp_loop_source(A.exp_f32))
    x = np.concatenate([np.linspace(-86.6, 88.7, 400001), [-86.7, -150.0, 88.73, 1e4, -np.inf, np.inf, np.nan,
                                                           0.0, -0.0]]).astype(np.float32)
    got = np.empty_like(x)
    exp_loop(x, got)
    want = np.exp(x.astype(np.float64))
    normal = slice(0, 400001)
    np.testing.assert_array_less(np.abs(got[normal] / want[normal] - 1), 2.4e-7)
    assert got[400001:400003].tolist() == [0.0, 0.0]
    assert np.isinf(got[400003:400005]).all() and got[400005] == 0.0 and got[400006] == np.inf
    assert np.isnan(got[400007]) and got[400008] == 1.0 and got[400009] == 1.0

    x = np.linspace(-13.0, 13.0, 1000001).astype(np.float32)
    cdf = np.empty_like(x)
    _compiled("normal_cdf_loop")(x, cdf)
    want = scipy.special.ndtr(x.astype(np.float64))
    assert np.abs(cdf - want).max() < 3e-7
    rel = np.abs(cdf - want) / want
    # the float32 rounding of x and x^2/2 inside the exponent grows with x^2 (measured: 3.7e-7 at
    # x = -1, 7.5e-7 at -5, 4.1e-6 at -13); PyTorch's erf is good to 1.5e-7 absolute only
    np.testing.assert_array_less(rel, 5e-7 + 3e-8 * x.astype(np.float64) ** 2)


def _exp_loop_source(exp_f32):
    def exp_loop(x, out):
        for i in range(x.size):
            out[i] = exp_f32(x[i])
    return exp_loop


@needs_jit
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the float64 truth on inf and nan inputs
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("n", [1, 17, 65536 * 3 + 5])
def test_gelu_compiled_equals_numpy(approximate, n):
    """The compiled GELU loops (forward, gradient) against the numpy kernels, which stay the
    reference, and against float64 truth; inf, nan and signed zeros included."""
    from engine.ops import unary as U

    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 3).astype(np.float32)
    g = rng.standard_normal(n).astype(np.float32)
    specials = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 40.0, -40.0], np.float32)
    x[:len(specials)] = specials[:n]
    tanh = approximate == "tanh"
    pairs = {"forward": (U._COMPILED["gelu_tanh_loop" if tanh else "gelu_loop"], U._k_gelu_tanh if tanh else U._k_gelu,
                         (x,)),
             "grad": (U._COMPILED["gelu_tanh_grad_loop" if tanh else "gelu_grad_loop"],
                      U._k_gelu_tanh_grad if tanh else U._k_gelu_grad, (g, x))}
    x64, g64 = x.astype(np.float64), g.astype(np.float64)
    if tanh:
        u = np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64 ** 3)
        s = 0.5 * (1 + np.tanh(u))
        truth = {"forward": x64 * s,
                 "grad": g64 * (s + x64 * s * (1 - s) * 2 * np.sqrt(2 / np.pi) * (1 + 3 * 0.044715 * x64 ** 2))}
    else:
        import scipy.special

        cdf = scipy.special.ndtr(x64)
        truth = {"forward": x64 * cdf, "grad": g64 * (cdf + x64 * np.exp(-x64 ** 2 / 2) / np.sqrt(2 * np.pi))}
    finite = np.isfinite(x)
    for what, (loop, kernel, arrays) in pairs.items():
        fast = U._apply_compiled(loop, *arrays)
        ref = U._apply(kernel, *arrays)
        assert fast.dtype == np.float32 and fast.shape == x.shape
        np.testing.assert_array_equal(np.isnan(fast), np.isnan(ref) | (np.isnan(fast) & (x == -np.inf)), err_msg=what)
        # (the numpy tanh-GELU gradient cancels in 0.5 (1 + tanh u): off by up to 1.2e-6 |g|)
        np.testing.assert_allclose(fast[finite], ref[finite], rtol=2e-6, atol=1e-5, err_msg=what)
        scale = np.maximum(np.abs(g64), 1.0) if what == "grad" else 1.0
        err = np.abs(fast - truth[what])
        np.testing.assert_array_less((err - 1e-6 * np.abs(truth[what]) - 3e-7 * scale)[finite], 0.0, err_msg=what)
        if what == "forward" and n > 2:
            assert fast[0] == np.inf and np.isnan(fast[2]) and fast[3] == 0.0 and fast[5] == 40.0 and fast[6] == 0.0


@needs_jit
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gelu_compiled_in_low_precision(dtype):
    """float16 / bfloat16 are computed in float32 by the compiled loops and rounded back."""
    import engine as flow

    rng = np.random.default_rng(3)
    x32 = rng.standard_normal(70001).astype(np.float32) * 3
    t = flow.tensor(x32, dtype=getattr(flow, dtype), requires_grad=True)
    y = flow.nn.functional.gelu(t)
    y.sum().backward()
    assert y.dtype == getattr(flow, dtype) and t.grad.dtype == getattr(flow, dtype)
    xr = t.detach().float().numpy().astype(np.float64)
    import scipy.special

    cdf = scipy.special.ndtr(xr)
    tol = 1e-2 if dtype == "bfloat16" else 1e-3
    np.testing.assert_allclose(y.detach().float().numpy(), xr * cdf, rtol=tol, atol=tol)
    np.testing.assert_allclose(t.grad.float().numpy(), cdf + xr * np.exp(-xr ** 2 / 2) / np.sqrt(2 * np.pi),
                               rtol=tol, atol=tol)


@needs_jit
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the numpy reference on inf and nan rows
@pytest.mark.parametrize("d", [1, 17, 65, 1000])
@pytest.mark.parametrize("in_place", [False, True])
def test_softmax_rows_compiled_equal_numpy(d, in_place, monkeypatch):
    """The compiled softmax and softmax-gradient rows against the numpy kernels: random rows,
    rows with nan, +inf, all -inf, a -inf entry, -1e30, -0.0 and huge spreads; in place
    (one array in and out, as the attention core calls them) and not."""
    from engine.ops import softmax as S

    rng = np.random.default_rng(d)
    x = (rng.standard_normal((40, d)) * 6).astype(np.float32)
    g = rng.standard_normal((40, d)).astype(np.float32)
    x[1, d // 2] = np.nan
    x[2, 0] = np.inf
    x[3] = -np.inf
    x[4, -1] = -np.inf
    x[5] = -1e30
    x[6] = -0.0
    x[7, 0] = 80.0  # the others underflow to 0
    results = []
    for compiled in (True, False):
        if not compiled:
            for name in ("_SOFTMAX_JIT", "_SOFTMAX_INPLACE_JIT", "_SOFTMAX_GRAD_JIT", "_SOFTMAX_GRAD_INPLACE_JIT"):
                monkeypatch.setattr(S, name, None)
        z = x.copy()
        S._softmax_rows(z if in_place else x, z, -1, False)
        dx = g.copy()
        S._softmax_grad_rows(dx if in_place else g, z, dx, -1, 0.125, None)
        results.append((z, dx))
        monkeypatch.undo()
    (z, dx), (z_ref, dx_ref) = results
    # (the gradient's g - sum(g y) cancels: the two sums, in different orders, differ by ulps)
    for got, want, atol in ((z, z_ref, 1e-7), (dx, dx_ref, 5e-7)):
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=atol)
    assert np.isnan(z[1]).all() and np.isnan(z[3]).all() and (d == 1 or z[4, -1] == 0.0)
    np.testing.assert_allclose(z[5], 1.0 / d, rtol=1e-6)
    np.testing.assert_allclose(z.sum(-1)[8:], 1.0, rtol=1e-5)


@needs_jit
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_through_compiled_softmax_equals_torch_with_underflowing_targets(reduction):
    """The float32 forward through the compiled softmax rows takes -log p[target]; a target whose
    probability underflows (200 below the row's max, some rows ignored) still gets its exact,
    finite loss, as torch's log-sum-exp gives."""
    import torch

    import engine as flow

    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 300)).astype(np.float32)
    t = rng.integers(0, 300, 512)
    x[:7, 0] = 200.0
    t[:7] = 5  # p[target] ~ exp(-200): underflows in float32
    t[10:14] = -100  # ignored
    xf, xt = flow.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    lf = flow.nn.functional.cross_entropy(xf, flow.tensor(t), reduction=reduction)
    lt = torch.nn.functional.cross_entropy(xt, torch.tensor(t), reduction=reduction)
    assert np.isfinite(lf.detach().numpy()).all()
    np.testing.assert_allclose(lf.detach().numpy(), lt.detach().numpy(), rtol=2e-6, atol=1e-5)
    g = rng.standard_normal(tuple(lt.shape)).astype(np.float32)
    lf.backward(flow.tensor(g))
    lt.backward(torch.tensor(g))
    np.testing.assert_allclose(xf.grad.numpy(), xt.grad.numpy(), rtol=1e-5, atol=1e-7)


# ------------------------------------------------------------------ end to end
_TRAIN_AND_REPORT = """
import runpy, sys
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    from engine.ops import normalization as N, unary as U
    print("COMPILED", N._layer_norm_rows_jit is not None and N._layer_norm_rows_jit.compiled is not None,
          U._COMPILED["gelu_tanh_loop"] is not None and U._COMPILED["gelu_tanh_loop"].compiled is not None)
"""


@needs_jit
def test_a_tiny_gpt2_run_with_the_compiled_kernels_logs_the_numpy_losses(tmp_path):
    """tools/train_net.py on the tiny GPT-2 recipe, 10 iterations, with the compiled kernels
    (ENGINE_JIT=1) and with the numpy ones (ENGINE_JIT=0; the suite's other training runs use
    them, tests/conftest.py): the same losses up to the compiled kernels' reassociation."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "gpt2"))
    from gpt2_helpers import TINY, TRAIN_NET, env, losses, max_rel_err, run_command

    got = {}
    for flag in ("1", "0"):
        out = str(tmp_path / f"jit{flag}")
        _, stdout, _ = run_command(
            [sys.executable, "-c", _TRAIN_AND_REPORT, TRAIN_NET, "--config-file", os.path.join(ROOT, "configs", "gpt2_pretrain.py"),
             *TINY, f"train.output_dir={out}", "train.train_iter=10", "train.log_period=1",
             "train.evaluation.enabled=False", "train.checkpointer.period=0"], env=dict(env(), ENGINE_JIT=flag))
        assert f"COMPILED {flag == '1'} {flag == '1'}" in stdout, stdout[-2000:]  # layer_norm and GELU
        got[flag] = losses(out)
        assert sorted(got[flag]) == list(range(10)), got[flag]
    assert got["1"][9] < got["1"][0]
    err = max_rel_err(got["1"], got["0"])
    print(f"compiled vs numpy kernels, 10 iterations: largest relative loss difference {err:.2e}")
    assert err < 1e-6, (got["1"], got["0"])
