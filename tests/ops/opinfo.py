"""Run PyTorch's own OpInfo database (`op_db`) against the engine.

For every OpInfo whose name the engine has (`engine.<name>` or `engine.nn.functional.<name>`), the
reference inputs that torch's test-suite uses are converted to engine tensors and run through the
function, method and in-place variants the engine offers. Forward results are compared with torch
(values, shape, dtype); for samples that require grad, the same random upstream gradient is
backpropagated through both and every input gradient is compared. Error inputs must raise the
exception type torch raises.

A failure that is a deliberate difference is declared in ALLOWED with its reason; an allowed entry
that no failing sample needs is reported as stale so the list stays honest. `run_ops()` returns per-sample
records; tests/ops/test_opinfo.py asserts on them and tools/opinfo_coverage.py writes the table in
docs/op_coverage.md.
"""
import functools
import itertools
import math
import re
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.testing._internal import common_utils as _torch_common_utils
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.opinfo import core as _opinfo_core


def _no_unittest_case():
    """torch's sample iterators look for the unittest.TestCase running them with inspect.stack()
    (half of this harness's time: it reads every frame's source); pytest functions are not
    TestCases, so the answer is always None, which is returned here without the walk."""
    return None


_torch_common_utils.extract_test_fn = _opinfo_core.extract_test_fn = _no_unittest_case

import engine as flow
import engine.nn.functional as F

MAX_SAMPLES = 40  # reference inputs per op and dtype (torch's lists run to hundreds for a few ops)

# Ops whose outputs are random draws or uninitialised memory: only shape, dtype and (for
# distributions) the support are comparable, so the values are not.
NONDETERMINISTIC = {"normal", "normal.in_place", "normal.number_mean", "randn", "randn_like", "rand_like", "randint",
                    "randint_like", "bernoulli", "multinomial", "empty", "empty_like", "nn.functional.dropout",
                    "nn.functional.dropout2d", "nn.functional.dropout3d", "nn.functional.alpha_dropout",
                    "nn.functional.feature_alpha_dropout.with_train"}

# (op, variant or "*", sample predicate or None, reason). Kept short and reviewed: every entry is a
# deliberate difference, never a bug waiting for a fix.
def _has_nan(sample):
    return isinstance(sample.input, torch.Tensor) and bool(torch.isnan(sample.input).any())


ALLOWED = [
    ("nn.functional.hardtanh", "function", _has_nan,
     "gradient at NaN inputs: torch's vectorised kernel gives 0 and its scalar tail gives g (the result depends on "
     "the element's position); the engine always gives g, the scalar rule (its test is x <= min or x >= max)"),
    ("nn.functional.relu6", "function", _has_nan, "torch's relu6 is hardtanh(x, 0, 6): as nn.functional.hardtanh"),
] + [
    (f"nn.functional.{name}", "function", _has_nan,
     "gradient at NaN inputs: torch's vectorised elu_backward gives NaN in the lanes of large tensors and its "
     "scalar path g * scale (a 9-element tensor of NaNs gets g * scale everywhere); the engine always gives "
     "g * scale, the scalar rule (its test is x <= 0)")
    for name in ("elu", "celu", "selu")
]


@dataclass
class Record:
    op: str
    variant: str  # "function" | "method" | "inplace" | "error"
    index: int
    status: str  # "pass" | "fail" | "allowed" | "stale" (an ALLOWED entry no sample needed)
    detail: str = ""
    allowance: int = None  # index in ALLOWED of the entry that declared an "allowed" failure


@dataclass
class OpReport:
    op: str
    variants: list = field(default_factory=list)
    records: list = field(default_factory=list)


def full_name(op):
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


# OpInfos whose `op` is a lambda reordering the arguments of the public function
ARGUMENT_ORDER = {
    "einsum": lambda f: lambda tensors, equation: f(equation, tensors),
    "where": lambda f: lambda self, condition, other, **kw: f(condition, self, other, **kw),
    "nn.functional.embedding": lambda f: lambda weight, idx, **kw: f(idx, weight, **kw),
    "normal.number_mean": lambda f: lambda std, mean, *a, **kw: f(mean, std, *a, **kw),
    "normal.in_place": lambda f: lambda inp, *a, **kw: inp.normal_(*a, **kw),
}


def engine_function(op):
    """The engine's function for an OpInfo, or None when the engine has no such op."""
    if op.name.startswith("nn.functional."):
        fn = getattr(F, op.name[len("nn.functional."):], None)
    else:
        fn = None if "." in op.name else getattr(flow, op.name, None)
    adapt = ARGUMENT_ORDER.get(full_name(op))
    return adapt(fn) if adapt is not None and fn is not None else fn


def engine_ops():
    return [op for op in op_db if engine_function(op) is not None]


# ------------------------------------------------------------------ conversion
def _engine_dtype(torch_dtype):
    dt = getattr(flow, str(torch_dtype).split(".")[-1], None)
    if not isinstance(dt, flow.dtype):
        raise _Unconvertible(f"dtype {torch_dtype}")  # complex and quantized dtypes
    return dt


def to_engine(x, grad_leaves):
    """torch values -> engine values; tensors requiring grad become fresh engine leaves."""
    if isinstance(x, torch.Tensor):
        data = x.detach()
        if data.device.type != "cpu":
            raise _Unconvertible(f"a tensor on {data.device}")
        dt = _engine_dtype(data.dtype)
        arr = data.float().numpy() if data.dtype == torch.bfloat16 else data.numpy()
        t = flow.tensor(np.array(arr), dtype=dt)
        if x.requires_grad:
            t.requires_grad_(True)
            grad_leaves.append((x, t))
        return t
    if isinstance(x, torch.dtype):
        return _engine_dtype(x)
    if isinstance(x, torch.device):
        return flow.device(str(x))
    if isinstance(x, torch.Size):
        return tuple(x)
    if isinstance(x, (list, tuple)):
        conv = [to_engine(v, grad_leaves) for v in x]
        return conv if isinstance(x, list) else tuple(conv)
    if isinstance(x, dict):
        if "out" in x:
            raise _Unconvertible("out= (the engine's functions return new tensors: docs/migrating.md)")
        return {k: to_engine(v, grad_leaves) for k, v in x.items()}
    if isinstance(x, (torch.memory_format, torch.layout, torch.Generator)):
        raise _Unconvertible(f"argument of type {type(x).__name__}")
    return x


class _Unconvertible(Exception):
    """A sample whose arguments have no engine counterpart (memory formats, generators)."""


def _as_numpy(x):
    if isinstance(x, torch.Tensor):
        x = x.detach()
        return (x.float() if x.dtype == torch.bfloat16 else x).numpy()
    arr = x.detach().numpy()
    return arr.astype(np.float32) if arr.dtype.name == "bfloat16" else arr


def _flatten(out):
    if isinstance(out, (tuple, list)):
        items = []
        for o in out:
            items += _flatten(o)
        return items
    if hasattr(out, "values") and hasattr(out, "indices") and not isinstance(out, (torch.Tensor, flow.Tensor)):
        return [out.values, out.indices]
    return [out]


def _tolerance(dtype):
    if dtype in (torch.float16, torch.bfloat16):
        return 1e-2, 1e-2
    if dtype == torch.float32:
        return 1.3e-5, 1e-5
    return 1e-7, 1e-7


def compare(expected, actual, what, dtype_check=True):
    """None when equal, else a message naming what differs."""
    ex, ac = _flatten(expected), _flatten(actual)
    if len(ex) != len(ac):
        return f"{what}: {len(ac)} outputs, torch has {len(ex)}"
    for i, (e, a) in enumerate(zip(ex, ac)):
        if isinstance(e, torch.Tensor):
            if not isinstance(a, flow.Tensor):
                return f"{what}[{i}]: got {type(a).__name__}, torch gives a tensor"
            if tuple(a.shape) != tuple(e.shape):
                return f"{what}[{i}]: shape {tuple(a.shape)}, torch {tuple(e.shape)}"
            if dtype_check and str(a.dtype).split(".")[-1] != str(e.dtype).split(".")[-1]:
                return f"{what}[{i}]: dtype {a.dtype}, torch {e.dtype}"
            ea, aa = _as_numpy(e), _as_numpy(a)
            if ea.dtype.kind in "fc":
                rtol, atol = _tolerance(e.dtype)
                if not np.allclose(aa, ea, rtol=rtol, atol=atol, equal_nan=True):
                    with np.errstate(invalid="ignore"):
                        err = np.nanmax(np.abs(aa.astype(np.float64) - ea)) if ea.size else 0.0
                    return f"{what}[{i}]: values differ (max abs err {err:.3g})"
            elif not np.array_equal(aa, ea):
                return f"{what}[{i}]: values differ"
        elif isinstance(e, float) and isinstance(a, float):
            if not (math.isclose(a, e, rel_tol=1e-7, abs_tol=1e-7) or (math.isnan(a) and math.isnan(e))):
                return f"{what}[{i}]: {a} != torch {e}"
        elif e != a and not isinstance(e, torch.Tensor):
            return f"{what}[{i}]: {a!r} != torch {e!r}"
    return None


# ------------------------------------------------------------------ running one sample
def _call_torch(op, variant, sample):
    if variant == "function":
        return op.op(sample.input, *sample.args, **sample.kwargs)
    if variant == "method":
        return op.method_variant(sample.input, *sample.args, **sample.kwargs)
    return op.inplace_variant(sample.input.clone(), *sample.args, **sample.kwargs)


def _fresh_leaf(t):
    if not (isinstance(t, torch.Tensor) and t.requires_grad):
        return t
    return t.detach().clone().requires_grad_(True)  # clone keeps a dense tensor's strides


def _engine_callable(op, variant):
    name = op.name.split(".")[-1] if op.name.startswith("nn.functional.") else op.name
    if variant == "function":
        fn = engine_function(op)
        return None if isinstance(fn, flow.dtype) else fn  # `torch.float` is a dtype, `x.float()` a method
    if variant == "method":
        return getattr(flow.Tensor, name, None)
    if isinstance(op.inplace_variant, functools.partial):  # F.relu(..., inplace=True) and the like
        fn = engine_function(op)
        return None if fn is None else functools.partial(fn, *op.inplace_variant.args, **op.inplace_variant.keywords)
    return getattr(flow.Tensor, getattr(op.inplace_variant, "__name__", name + "_"), None)


def run_sample(op, variant, sample, rng):
    """Returns None on agreement, else a message."""
    if variant == "inplace":
        sample = sample.transform(lambda t: t.detach() if isinstance(t, torch.Tensor) else t)
    else:  # fresh torch leaves: torch's samples may be views that autograd.grad does not treat as inputs
        sample = sample.transform(_fresh_leaf)
    try:
        expected = _call_torch(op, variant, sample)
    except Exception:
        return "skip"
    leaves = []
    try:
        args = [to_engine(sample.input, leaves)] + list(to_engine(list(sample.args), leaves))
        kwargs = to_engine(dict(sample.kwargs), leaves)
    except _Unconvertible:
        return "skip"
    fn = _engine_callable(op, variant)
    try:
        actual = fn(*args, **kwargs)
    except Exception as e:  # torch accepted this sample
        return f"raises {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    name = full_name(op)
    if name in NONDETERMINISTIC or sample.kwargs.get("dropout_p", 0) > 0:
        return compare_shapes(expected, actual)
    msg = compare(expected, actual, "output")
    if msg or variant == "inplace" or not leaves:
        return msg
    return compare_backward(expected, actual, leaves, rng)


def compare_shapes(expected, actual):
    ex, ac = _flatten(expected), _flatten(actual)
    if len(ex) != len(ac):
        return f"output: {len(ac)} outputs, torch has {len(ex)}"
    for e, a in zip(ex, ac):
        if isinstance(e, torch.Tensor) and (tuple(a.shape) != tuple(e.shape) or
                                            str(a.dtype).split(".")[-1] != str(e.dtype).split(".")[-1]):
            return f"output: {tuple(a.shape)} {a.dtype}, torch {tuple(e.shape)} {e.dtype}"
    return None


def compare_backward(expected, actual, leaves, rng):
    ex, ac = _flatten(expected), _flatten(actual)
    t_terms, e_terms = [], []
    for e, a in zip(ex, ac):
        if isinstance(e, torch.Tensor) and e.requires_grad and e.dtype.is_floating_point:
            g = torch.tensor(rng.standard_normal(tuple(e.shape))).to(e.dtype)  # torch rounds, both get it
            t_terms.append((e, g))
            e_terms.append((a, flow.tensor(_as_numpy(g), dtype=a.dtype)))
    if not t_terms:
        return None
    t_inputs = [t for t, _ in leaves]
    try:
        t_grads = torch.autograd.grad([o for o, _ in t_terms], t_inputs, [g for _, g in t_terms], allow_unused=True)
    except RuntimeError:  # torch cannot differentiate this sample either (e.g. a broadcast in-place)
        return None
    if not all(getattr(a, "requires_grad", False) for a, _ in e_terms):
        return "backward: engine output does not require grad"
    try:
        e_grads = flow.autograd.grad([o for o, _ in e_terms], [e for _, e in leaves], [g for _, g in e_terms],
                                     allow_unused=True)
    except Exception as err:
        return f"backward raises {type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}"
    for i, (tg, eg) in enumerate(zip(t_grads, e_grads)):
        if tg is None:
            if eg is not None and np.any(_as_numpy(eg) != 0):
                return f"grad[{i}]: engine has a gradient where torch has none"
            continue
        if eg is None:
            if torch.any(tg != 0):
                return f"grad[{i}]: engine has no gradient"
            continue
        msg = compare(tg, eg, f"grad[{i}]", dtype_check=False)
        if msg:
            return msg
    return None


def run_error_input(op, err):
    sample = err.sample_input
    try:  # a few generic error generators list calls this op's torch function accepts
        op.op(sample.input, *sample.args, **sample.kwargs)
        return "skip"
    except Exception:
        pass
    leaves = []
    try:
        args = [to_engine(sample.input, leaves)] + list(to_engine(list(sample.args), leaves))
        kwargs = to_engine(dict(sample.kwargs), leaves)
    except (_Unconvertible, ValueError, RuntimeError):  # e.g. a 65-dim tensor numpy cannot hold
        return "skip"
    try:
        engine_function(op)(*args, **kwargs)
    except err.error_type:
        return None
    except Exception as e:
        return f"raises {type(e).__name__}, torch raises {err.error_type.__name__}"
    return f"accepted; torch raises {err.error_type.__name__}({err.error_regex!r})"


# ------------------------------------------------------------------ one op
def _dtype_for(op):
    dts = op.supported_dtypes("cpu")
    for dt in (torch.float64, torch.int64, torch.bool, torch.float32):
        if dt in dts:
            return dt
    return None


def _allowance(name, variant, sample):
    """Index in ALLOWED of the entry that declares this sample's failure, or None."""
    for k, (op_name, var, pred, _reason) in enumerate(ALLOWED):
        if op_name == name and var in ("*", variant) and (pred is None or pred(sample)):
            return k
    return None


def variants_of(op):
    out = ["function"] if _engine_callable(op, "function") is not None else []
    if op.method_variant is not None and _engine_callable(op, "method") is not None:
        out.append("method")
    if op.inplace_variant is not None and _engine_callable(op, "inplace") is not None:
        out.append("inplace")
    return out


def run_op(op):
    name = full_name(op)
    report = OpReport(name, variants_of(op))
    dtype = _dtype_for(op)
    if dtype is None:
        return report
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    grad = op.supports_autograd and dtype.is_floating_point
    samples = _samples(op, dtype, grad)
    for variant in report.variants:
        for i, sample in enumerate(samples):
            if variant == "inplace" and not _inplace_ok(sample):
                continue
            detail = run_sample(op, variant, sample, rng)
            if detail == "skip":
                continue
            report.records.append(_record(name, variant, i, sample, detail))
    torch.manual_seed(0)
    errors = op.error_inputs("cpu") if op.error_inputs_func is not None else ()
    for i, err in enumerate(errors):
        detail = run_error_input(op, err)
        if detail == "skip":
            continue
        report.records.append(_record(name, "error", i, err.sample_input, detail))
    used = {r.allowance for r in report.records if r.status == "allowed"}
    for k, (op_name, var, _pred, _reason) in enumerate(ALLOWED):  # an allowance nothing needs is stale
        if op_name == name and k not in used:
            report.records.append(Record(name, var, -1, "stale", f"ALLOWED[{k}] declares a difference no sample has"))
    return report


def _samples(op, dtype, grad):
    """The first MAX_SAMPLES reference inputs; torch's own generators break off for a few ops (a
    reference input of another dtype asking for grad), keeping the samples drawn before."""
    samples = []
    try:
        for sample in op.reference_inputs("cpu", dtype, requires_grad=grad):
            samples.append(sample)
            if len(samples) == MAX_SAMPLES:
                break
    except ValueError:
        if not samples:
            samples = list(itertools.islice(op.sample_inputs("cpu", dtype, requires_grad=grad), MAX_SAMPLES))
    return samples


def _inplace_ok(sample):
    return isinstance(sample.input, torch.Tensor)


def _record(name, variant, index, sample, detail):
    if detail is None:
        return Record(name, variant, index, "pass")
    k = _allowance(name, variant, sample)
    return Record(name, variant, index, "fail" if k is None else "allowed", detail, k)


def run_ops(ops=None):
    return [run_op(op) for op in (ops if ops is not None else engine_ops())]


def describe(sample):
    return re.sub(r"\s+", " ", repr(sample))[:300]
