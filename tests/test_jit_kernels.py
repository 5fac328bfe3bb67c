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
