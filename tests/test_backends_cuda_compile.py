"""engine.backends, engine.cuda and engine.compile against torch's behaviour where torch has one
here (torch's CPU build answers for torch.backends and torch.compile's argument checks)."""
import sys
import types
import warnings

import numpy as np
import pytest
import torch

import engine as flow
from engine import backend as engine_backend


@pytest.fixture
def restore_flags(monkeypatch):
    """Every engine switch back to its default afterwards (they are process-wide). torch's own
    switches are only read here (and set where setting them cannot disturb torch's state)."""
    monkeypatch.delenv("CUPY_TF32", raising=False)
    yield monkeypatch
    flow.set_float32_matmul_precision("highest")
    b = flow.backends
    b.cudnn.benchmark = b.cudnn.deterministic = False
    b.cudnn.enabled = b.cudnn.allow_tf32 = b.mkldnn.enabled = True
    for kind in ("flash", "mem_efficient", "math", "cudnn"):
        getattr(b.cuda, f"enable_{kind}_sdp")(True)


# ------------------------------------------------------------------ backends
FLAGS = [("cuda.matmul", "allow_tf32"), ("cudnn", "enabled"), ("cudnn", "benchmark"), ("cudnn", "deterministic"),
         ("cudnn", "allow_tf32"), ("mkldnn", "enabled")]


def _ns(lib, path):
    obj = lib.backends
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize("path,flag", FLAGS)
def test_flags_default_set_and_type_checked_as_torch(restore_flags, path, flag):
    ours, theirs = _ns(flow, path), _ns(torch, path)
    default = getattr(theirs, flag)
    assert getattr(ours, flag) is default
    for value in (not default, default):
        setattr(ours, flag, value)
        assert getattr(ours, flag) is value
    with pytest.raises(RuntimeError, match="expects a bool, but got str"):
        setattr(ours, flag, "yes")
    with pytest.raises(RuntimeError):
        setattr(theirs, flag, "yes")


@pytest.mark.parametrize("flag", ["allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction"])
def test_reduced_precision_reduction_flags_as_torch(restore_flags, flag):
    ours, theirs = flow.backends.cuda.matmul, torch.backends.cuda.matmul
    try:
        for value in [False, (True,), [False, True], True]:
            setattr(ours, flag, value)
            setattr(theirs, flag, value)
            assert getattr(ours, flag) is getattr(theirs, flag)
        for value, exc in [("yes", TypeError), ((True, 1), TypeError), ((), TypeError), ((True, True, True), TypeError),
                           ((True, False), RuntimeError)]:
            with pytest.raises(exc) as e_theirs:
                setattr(theirs, flag, value)
            with pytest.raises(exc, match=str(e_theirs.value).split(",")[0][:40].replace("(", r"\(")):
                setattr(ours, flag, value)
    finally:
        setattr(ours, flag, True)
        setattr(theirs, flag, True)


def test_unknown_names_are_refused(restore_flags):
    for ns in (flow.backends.cudnn, flow.backends.cuda.matmul, flow.backends.mkldnn):
        with pytest.raises(AttributeError, match="Unknown attribute bogus"):
            ns.bogus = True
        with pytest.raises(AttributeError, match="Unknown attribute bogus"):
            ns.bogus


def test_matmul_precision_and_allow_tf32_are_one_setting(restore_flags):
    """As torch: allow_tf32 is True exactly when the precision is not 'highest', and setting it
    sets the precision to 'high' or 'highest'; cudnn.allow_tf32 is separate."""
    assert flow.get_float32_matmul_precision() == torch.get_float32_matmul_precision() == "highest"
    assert flow.backends.cuda.matmul.allow_tf32 is torch.backends.cuda.matmul.allow_tf32 is False
    for precision, tf32 in [("high", True), ("medium", True), ("highest", False)]:
        flow.set_float32_matmul_precision(precision)
        assert flow.get_float32_matmul_precision() == precision and flow.backends.cuda.matmul.allow_tf32 is tf32
        assert flow.backends.cudnn.allow_tf32 is True
    flow.set_float32_matmul_precision("medium")
    for tf32, precision in [(True, "high"), (False, "highest"), (False, "highest"), (True, "high")]:
        flow.backends.cuda.matmul.allow_tf32 = tf32
        assert flow.get_float32_matmul_precision() == precision
    with pytest.warns(UserWarning, match="is not one of 'highest', 'high', or 'medium'"):
        flow.set_float32_matmul_precision("bogus")
    assert flow.get_float32_matmul_precision() == "high"  # unchanged
    with pytest.raises(RuntimeError, match="expects a str, but got int"):
        flow.set_float32_matmul_precision(3)


def test_tf32_reaches_cupy(restore_flags):
    """Before CuPy is loaded the choice goes to CUPY_TF32; once loaded, to its float32 compute type."""
    flow.set_float32_matmul_precision("high")
    assert engine_backend._cupy is not None or __import__("os").environ["CUPY_TF32"] == "1"
    calls = []
    linalg = types.ModuleType("cupy._core._routines_linalg")
    linalg.set_compute_type = lambda dtype, compute_type: calls.append((np.dtype(dtype), compute_type))
    restore_flags.setitem(sys.modules, "cupy._core._routines_linalg", linalg)
    restore_flags.setattr(engine_backend, "_cupy", types.ModuleType("cupy"))
    flow.backends.cuda.matmul.allow_tf32 = False
    flow.set_float32_matmul_precision("medium")
    assert calls == [(np.dtype(np.float32), 1), (np.dtype(np.float32), 7)]  # DEFAULT, then TF32


def test_sdp_switches_and_availability(restore_flags):
    b = flow.backends
    for kind in ("flash", "mem_efficient", "math", "cudnn"):
        enabled = getattr(b.cuda, f"{kind}_sdp_enabled")
        assert enabled() == getattr(torch.backends.cuda, f"{kind}_sdp_enabled")()
        getattr(b.cuda, f"enable_{kind}_sdp")(False)
        assert enabled() is False
        with pytest.raises(RuntimeError, match="expects a bool"):
            getattr(b.cuda, f"enable_{kind}_sdp")(1)
    assert b.mps.is_available() is False and b.mps.is_built() is False
    assert b.cudnn.is_available() is False and b.cudnn.version() is None
    assert b.mkldnn.is_available() == engine_backend.onednn.available()
    assert b.mkl.is_available() == engine_backend.mkl.available()
    assert b.cuda.is_built() == (__import__("importlib").util.find_spec("cupy") is not None)
    import engine.backends.cudnn as cudnn  # the torch idiom `import torch.backends.cudnn as cudnn`

    cudnn.benchmark = True
    assert flow.backends.cudnn.benchmark is True


# ------------------------------------------------------------------ cuda
needs_no_gpu = pytest.mark.skipif(flow.cuda.is_available(), reason="checks the answers of a machine without a GPU")


@needs_no_gpu
def test_cuda_without_a_gpu():
    c = flow.cuda
    assert c.is_available() is False and c.device_count() == 0 and c.is_bf16_supported() is False
    assert c.memory_allocated() == c.max_memory_allocated() == c.memory_reserved() == 0
    c.reset_peak_memory_stats()
    c.empty_cache()
    c.synchronize()
    for fn, args in [(c.set_device, (0,)), (c.current_device, ()), (c.get_device_name, ()),
                     (c.get_device_capability, ())]:
        with pytest.raises(RuntimeError, match="CuPy|GPU"):
            fn(*args)
    c.set_device(-1)  # torch: a negative device is a no-op


def test_cuda_seeds_the_engine_generator():
    flow.cuda.manual_seed(5)
    a = flow.randn(3).numpy()
    flow.manual_seed(5)
    assert np.array_equal(a, flow.randn(3).numpy())
    flow.cuda.manual_seed_all(6)
    b = flow.randn(3).numpy()
    flow.manual_seed(6)
    assert np.array_equal(b, flow.randn(3).numpy())


@needs_no_gpu
def test_cuda_amp_aliases_disable_themselves_without_cuda():
    from engine.cuda.amp import GradScaler, autocast

    assert flow.cuda.amp.GradScaler is GradScaler and flow.cuda.amp.autocast is autocast
    with pytest.warns(UserWarning, match="CUDA is not available"):
        scaler = GradScaler()
    assert not scaler.is_enabled()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not GradScaler(enabled=False).is_enabled()
    with pytest.warns(UserWarning, match="CUDA is not available. Disabling"):
        ctx = autocast()
    with ctx:
        assert not flow.amp.is_autocast_enabled("cuda")


def test_cuda_amp_aliases_with_cuda(monkeypatch):
    monkeypatch.setattr(flow.cuda, "is_available", lambda: True)
    scaler = flow.cuda.amp.GradScaler(init_scale=1024.0, growth_interval=7)
    assert scaler.is_enabled() and scaler.device == "cuda"
    assert scaler.get_scale() == 1024.0 and scaler.get_growth_interval() == 7
    with flow.cuda.amp.autocast(dtype=flow.float16):
        assert flow.amp.is_autocast_enabled("cuda") and flow.amp.get_autocast_dtype("cuda") == flow.float16

    @flow.cuda.amp.autocast()
    def inside():
        return flow.amp.is_autocast_enabled("cuda")

    assert inside() and not flow.amp.is_autocast_enabled()


class _FakePool:
    def __init__(self):
        self.used = 0

    def malloc(self, size):
        self.used += size
        return types.SimpleNamespace(device_id=0, size=size)

    def free(self, size):
        self.used -= size

    def used_bytes(self):
        return self.used

    def total_bytes(self):
        return self.used + 100

    def free_all_blocks(self):
        self.freed = True


def test_memory_statistics_over_cupy(monkeypatch):
    """The figures come from CuPy's pool; the peak from the allocator engine.cuda installs."""
    pool = _FakePool()
    allocator = [pool.malloc]

    class _Device:
        def __init__(self, i=0):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    cuda = types.SimpleNamespace(Device=_Device, runtime=types.SimpleNamespace(getDevice=lambda: 0),
                                 get_allocator=lambda: allocator[0],
                                 set_allocator=lambda f: allocator.__setitem__(0, f))
    fake = types.SimpleNamespace(cuda=cuda, get_default_memory_pool=lambda: pool,
                                 get_default_pinned_memory_pool=lambda: _FakePool())
    monkeypatch.setattr(engine_backend, "_cupy", fake)
    monkeypatch.setattr(flow.cuda, "_tracker", None)
    pool.malloc(10)
    assert flow.cuda.memory_allocated() == 10 and flow.cuda.memory_reserved() == 110
    flow.cuda.reset_peak_memory_stats()
    assert allocator[0] is not pool.malloc and flow.cuda.max_memory_allocated() == 10
    allocator[0](500)  # an allocation through the installed allocator
    pool.free(500)
    assert flow.cuda.memory_allocated() == 10 and flow.cuda.max_memory_allocated(0) == 510
    flow.cuda.reset_peak_memory_stats("cuda:0")
    assert flow.cuda.max_memory_allocated() == 10
    flow.cuda.empty_cache()
    assert pool.freed
    with pytest.raises(ValueError, match="expected a cuda device"):
        flow.cuda.memory_allocated("cpu")


# ------------------------------------------------------------------ compile
def test_compile_wraps_the_model_as_torch_and_checks_options_as_torch():
    m = flow.nn.Linear(3, 2)
    x = flow.randn(4, 3)
    for kwargs in [{}, dict(mode="max-autotune"), dict(mode="reduce-overhead", fullgraph=True, dynamic=False),
                   dict(backend="eager"), dict(backend=lambda gm, inputs: gm), dict(options={"a": 1})]:
        c = flow.compile(m, **kwargs)
        # torch's OptimizedModule: a Module holding the original as _orig_mod
        tc = torch.compile(torch.nn.Linear(3, 2))
        assert isinstance(c, flow.nn.Module) and c._orig_mod is m and type(tc).__name__ == type(c).__name__
        assert list(c.state_dict()) == list(tc.state_dict()) == ["_orig_mod.weight", "_orig_mod.bias"]
        assert c.in_features == 3  # other attributes are the module's
        assert np.array_equal(c(x).detach().numpy(), m(x).detach().numpy())  # autograd needed: eager
        with flow.no_grad():
            assert np.array_equal(c(x).numpy(), m(x).numpy()) and c.graph.num_traces == 1  # a graph replay
    assert flow.compile(m, disable=True) is m

    def f(t):
        return t * 2

    compiled = flow.compile(f)
    assert compiled(flow.tensor(3.0)).item() == 6.0 and compiled.graph.num_traces == 1
    decorated = flow.compile(mode="default")(f)
    assert decorated(flow.tensor(2.0)).item() == 4.0

    @flow.compile
    def g(t):
        return t + 1

    assert g(flow.tensor(1.0)).item() == 2.0
    for kwargs, torch_kwargs in [(dict(mode="bogus"), None), (dict(mode="default", options={"a": 1}), None),
                                 (dict(backend="nonexistent_backend"), None)]:
        with pytest.raises(RuntimeError) as ours:
            flow.compile(m, **kwargs)
        with pytest.raises(RuntimeError) as theirs:
            torch.compile(torch.nn.Linear(3, 2), **kwargs)
        assert str(theirs.value).split(",")[0].split(":")[0] in str(ours.value), (ours.value, theirs.value)
    with pytest.raises(AssertionError, match="A callable function is expected"):
        flow.compile(3)
    with pytest.raises(AssertionError, match="A callable function is expected"):
        torch.compile(3)
