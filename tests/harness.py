"""PyTorch parity harness (OneFlow's "autotest" idea).

An `OpCase` names the public op it covers and gives one function `fn(lib, *tensors)` that is
valid code for both `lib=engine` and `lib=torch` (the engine's API is PyTorch's). The harness
draws random inputs (broadcasting shapes, non-contiguous layouts, size-1 and zero-size dims as the
case specifies), runs both libraries, compares outputs, backpropagates the same random upstream
gradient through both and compares every input gradient. `gradcheck` checks the engine's analytic
gradient against central finite differences in float64, independently of PyTorch.

Set ENGINE_TEST_DEVICE=cuda to run every case on the CuPy backend.
"""
import os
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np
import torch

import engine as flow

DEVICE = os.environ.get("ENGINE_TEST_DEVICE", "cpu")

_NP = {"float32": np.float32, "float64": np.float64, "float16": np.float16, "int64": np.int64,
       "int32": np.int32, "bool": np.bool_, "bfloat16": np.float32}


@dataclass
class Input:
    """How to draw one input.

    kind: "normal" | "positive" (in [0.5, 2]) | "unit" (in (-0.9, 0.9)) | "uniform" (low..high) |
          "int" (low..high-1) | "bool" | "distinct" (normal values with distinct gaps, for max/sort)
    noncontig: store transposed so the tensor is a non-contiguous (permuted) view
    value: a fixed numpy value/array instead of a random draw (e.g. an index tensor)
    """

    shape: tuple = ()
    dtype: str = "float32"
    kind: str = "normal"
    low: float = 0
    high: float = 1
    requires_grad: Optional[bool] = None
    noncontig: bool = False
    value: object = None

    def draw(self, rng):
        if self.value is not None:
            return np.array(self.value)
        s = self.shape
        if self.kind == "normal":
            a = rng.standard_normal(s)
        elif self.kind == "positive":
            a = rng.uniform(0.5, 2.0, s)
        elif self.kind == "unit":
            a = rng.uniform(-0.9, 0.9, s)
        elif self.kind == "uniform":
            a = rng.uniform(self.low, self.high, s)
        elif self.kind == "int":
            a = rng.integers(int(self.low), int(self.high), s)
        elif self.kind == "bool":
            a = rng.random(s) < 0.5
        elif self.kind == "distinct":
            n = int(np.prod(s)) if len(s) else 1
            a = (rng.permutation(n).reshape(s) * 0.37 + rng.uniform(0, 0.1, s)) / max(n, 1)
        else:
            raise ValueError(self.kind)
        return np.asarray(a).astype(_NP[self.dtype])

    @property
    def grad(self):
        if self.requires_grad is not None:
            return self.requires_grad
        return self.dtype.startswith("float") or self.dtype == "bfloat16"


@dataclass
class OpCase:
    op: str
    fn: Callable
    inputs: Sequence[Input]
    rtol: float = 1e-4
    atol: float = 1e-5
    backward: bool = True
    gradcheck: bool = True
    name: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def id(self):
        return f"{self.op}-{self.name}" if self.name else self.op


def _make_pair(inp, array, dtype_override=None):
    """The same values as an engine tensor and a torch tensor, both leaves."""
    dt = dtype_override or inp.dtype
    if dtype_override and inp.dtype.startswith("float"):
        array = array.astype(_NP[dtype_override])
    # (np.ascontiguousarray would make a 0-dim array 1-dim: the "0d" cases must stay 0-dim)
    base = np.array(array.T if inp.noncontig else array, order="C")
    rg = inp.grad and dt != "bool" and not dt.startswith("int")
    perm = tuple(range(base.ndim - 1, -1, -1)) if inp.noncontig else tuple(range(base.ndim))
    f = flow.from_numpy(base.copy().transpose(perm))  # a leaf with a (maybe) non-contiguous layout
    if DEVICE != "cpu":
        f = flow.Tensor._make(flow.backend.to_device(f._data, flow.device(DEVICE)), flow.device(DEVICE))
    t = torch.from_numpy(base.copy()).permute(perm).detach()
    if dt == "bfloat16":
        f, t = f.bfloat16().detach(), t.bfloat16()
    if rg:
        f.requires_grad_(True)
        t.requires_grad_(True)
    return f, t


def _as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def to_numpy(x):
    if isinstance(x, torch.Tensor):
        x = x.detach()
        if x.dtype == torch.bfloat16:
            x = x.float()
        return x.numpy()
    a = x.detach()._host()
    return a.astype(np.float32) if a.dtype == flow.bfloat16.np else a


def assert_close(f, t, rtol, atol, what):
    """Engine value `f` equals torch value `t`: shape, dtype and numbers."""
    if isinstance(t, torch.Tensor):
        assert isinstance(f, flow.Tensor), f"{what}: engine returned {type(f).__name__}, torch a Tensor"
        assert tuple(f.shape) == tuple(t.shape), f"{what}: shape {tuple(f.shape)} != torch {tuple(t.shape)}"
        tname = str(t.dtype).replace("torch.", "")
        assert f.dtype.name == tname, f"{what}: dtype {f.dtype.name} != torch {tname}"
        a, b = to_numpy(f), to_numpy(t)
        if a.dtype.kind in "biu":
            np.testing.assert_array_equal(a, b, err_msg=what)
        else:
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=what)
    elif isinstance(t, (tuple, list)):
        assert len(f) == len(t), f"{what}: {len(f)} outputs != torch {len(t)}"
        for i, (x, y) in enumerate(zip(f, t)):
            assert_close(x, y, rtol, atol, f"{what}[{i}]")
    else:
        assert f == t or np.allclose(f, t, rtol=rtol, atol=atol), f"{what}: {f} != torch {t}"


def _outputs(out):
    """Tensors of the output that carry gradients (values of torch.max's namedtuple, etc.)."""
    if hasattr(out, "values") and hasattr(out, "indices") and not isinstance(out, (torch.Tensor, flow.Tensor)):
        return (out.values, out.indices)
    return _as_tuple(out)


def run_parity(case, seed=0, dtype=None):
    """Forward and backward of `case` in the engine and in torch; assert everything matches."""
    rng = np.random.default_rng(seed)
    arrays = [inp.draw(rng) for inp in case.inputs]
    pairs = [_make_pair(inp, a, dtype) for inp, a in zip(case.inputs, arrays)]
    fs = [p[0] for p in pairs]
    ts = [p[1] for p in pairs]
    out_t = case.fn(torch, *ts)
    out_f = case.fn(flow, *fs)
    rtol, atol = case.rtol, case.atol
    if dtype in ("float16", "bfloat16"):
        rtol, atol = 2e-2, 2e-2
    outs_t = _outputs(out_t)
    outs_f = _outputs(out_f)
    assert_close(outs_f, outs_t, rtol, atol, f"{case.id} forward")
    if not case.backward:
        return
    diff_t, diff_f, grads = [], [], []
    for f, t in zip(outs_f, outs_t):
        if isinstance(t, torch.Tensor) and t.requires_grad:
            assert f.requires_grad, f"{case.id}: engine output does not require grad but torch's does"
            g = rng.standard_normal(tuple(t.shape)).astype(np.float32)
            diff_t.append(t)
            diff_f.append(f)
            grads.append(g)
    if not diff_t:
        return
    torch.autograd.backward(diff_t, [torch.from_numpy(g).to(t.dtype) for g, t in zip(grads, diff_t)])
    flow.autograd.backward(diff_f, [flow.tensor(g, device=DEVICE).to(f.dtype) for g, f in zip(grads, diff_f)])
    ref_grads = _float64_reference_grads(case, arrays, grads) if case.extra.get("float64_reference") else None
    for i, (f, t) in enumerate(zip(fs, ts)):
        if not t.requires_grad:
            continue
        what = f"{case.id} grad of input {i}"
        if t.grad is None:
            assert f.grad is None or not np.any(to_numpy(f.grad)), f"{what}: torch has none, engine nonzero"
            continue
        assert f.grad is not None, f"{what}: engine produced no gradient"
        if ref_grads is None:
            assert_close(f.grad, t.grad, rtol, atol, what)
        else:
            assert_as_accurate_as_torch(f.grad, t.grad, ref_grads[i], rtol, atol, what)


def _float64_reference_grads(case, arrays, grads):
    """Input gradients computed by torch in float64 on the same values."""
    ts = []
    for inp, a in zip(case.inputs, arrays):
        t = torch.from_numpy(np.array(a, dtype=np.float64, order="C") if inp.grad else a.copy())
        ts.append(t.requires_grad_() if inp.grad else t)
    outs = [o for o in _outputs(case.fn(torch, *ts)) if isinstance(o, torch.Tensor) and o.requires_grad]
    torch.autograd.backward(outs, [torch.from_numpy(g.astype(np.float64)) for g in grads])
    return [t.grad if isinstance(t, torch.Tensor) and t.requires_grad else None for t in ts]


def assert_as_accurate_as_torch(f, t, ref, rtol, atol, what):
    """For long float32 reductions (a weight gradient summed over 1000+ rows) both libraries
    round differently; compare each with the float64 result instead: the engine's error may not
    exceed the tolerance or twice torch's own float32 error, whichever is larger."""
    assert tuple(f.shape) == tuple(t.shape), f"{what}: shape {tuple(f.shape)} != torch {tuple(t.shape)}"
    ref = ref.detach().numpy()
    err_engine = np.abs(to_numpy(f).astype(np.float64) - ref)
    err_torch = float(np.abs(to_numpy(t).astype(np.float64) - ref).max())
    bound = np.maximum(atol + rtol * np.abs(ref), 2 * err_torch)
    worst = float((err_engine - bound).max())
    assert worst <= 0, (f"{what}: engine error {err_engine.max():.3g} vs float64 exceeds the bound "
                        f"(torch's own float32 error {err_torch:.3g})")


def gradcheck(case, seed=0, eps=1e-6, rtol=1e-3, atol=1e-5, max_elems=64):
    """Engine analytic gradients vs central finite differences, in float64."""
    rng = np.random.default_rng(seed)
    arrays = [inp.draw(rng) for inp in case.inputs]
    arrays = [a.astype(np.float64) if inp.grad else a for inp, a in zip(case.inputs, arrays)]

    def build(arrs):
        ts = []
        for inp, a in zip(case.inputs, arrs):
            t = flow.tensor(a, device=DEVICE)
            if inp.grad:
                t.requires_grad_(True)
            ts.append(t)
        return ts

    def scalar_loss(outs, weights):
        total = 0.0
        for o, w in zip(outs, weights):
            total = total + (o.double() * flow.tensor(w, device=DEVICE)).sum()
        return total

    ts = build(arrays)
    outs = [o for o in _outputs(case.fn(flow, *ts)) if isinstance(o, flow.Tensor) and o.requires_grad]
    if not outs:
        return
    weights = [rng.standard_normal(tuple(o.shape)) for o in outs]
    loss = scalar_loss(outs, weights)
    diff_idx = [i for i, t in enumerate(ts) if t.requires_grad]
    analytic = flow.autograd.grad(loss, [ts[i] for i in diff_idx], allow_unused=True)
    for k, i in enumerate(diff_idx):
        a = arrays[i]
        flat_idx = rng.permutation(a.size)[:max_elems]
        num = np.zeros(len(flat_idx))
        for j, fi in enumerate(flat_idx):
            vals = []
            for sgn in (1, -1):
                pert = [x.copy() for x in arrays]
                pert[i].reshape(-1)[fi] += sgn * eps
                with flow.no_grad():
                    o = [x for x in _outputs(case.fn(flow, *build(pert)))
                         if isinstance(x, flow.Tensor) and x.is_floating_point()]
                    vals.append(scalar_loss(o[: len(outs)], weights).item())
            num[j] = (vals[0] - vals[1]) / (2 * eps)
        g = analytic[k]
        got = np.zeros(a.size) if g is None else to_numpy(g).reshape(-1)[flat_idx]
        np.testing.assert_allclose(got, num, rtol=rtol, atol=atol,
                                   err_msg=f"{case.id}: finite-difference check of input {i}")
