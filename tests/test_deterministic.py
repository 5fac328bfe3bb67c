"""engine.use_deterministic_algorithms and its companions (engine/backend/deterministic.py):
the API against torch's, and what the mode changes on CUDA, through the CuPy double: floating
scatter-adds take the sorted segment sums (the bits of numpy's add.at, which the CPU run gives
here: its row adds match add.at up to 32 repeats of an id), and
flash attention's fused backward gives way to the split one."""
import numpy as np
import pytest
import torch

import engine as flow
from engine.kernels import flash_attention as fa
from engine.ops import attention as A

API = ["are_deterministic_algorithms_enabled", "is_deterministic_algorithms_warn_only_enabled",
       "get_deterministic_debug_mode"]


@pytest.fixture
def restore():
    yield
    flow.use_deterministic_algorithms(False)
    torch.use_deterministic_algorithms(False)


def _state(lib):
    return [getattr(lib, n)() for n in API]


@pytest.mark.parametrize("call", [
    ("use", (True,), {}), ("use", (True,), {"warn_only": True}), ("use", (False,), {"warn_only": True}),
    ("use", (False,), {}), ("debug", ("warn",), {}), ("debug", ("error",), {}), ("debug", (1,), {}),
    ("debug", ("default",), {}), ("debug", (2,), {}), ("debug", (0,), {})])
def test_the_api_reads_back_as_torch(restore, call):
    kind, args, kwargs = call
    for lib in (flow, torch):
        (lib.use_deterministic_algorithms if kind == "use" else lib.set_deterministic_debug_mode)(*args, **kwargs)
    assert _state(flow) == _state(torch)


@pytest.mark.parametrize("call", [
    ("use_deterministic_algorithms", (1,), {}), ("use_deterministic_algorithms", (True,), {"warn_only": 1}),
    ("set_deterministic_debug_mode", ("strict",), {}), ("set_deterministic_debug_mode", (3,), {}),
    ("set_deterministic_debug_mode", (1.0,), {})])
def test_bad_arguments_fail_as_in_torch(restore, call):
    name, args, kwargs = call
    with pytest.raises(Exception) as want:
        getattr(torch, name)(*args, **kwargs)
    with pytest.raises(type(want.value)) as got:
        getattr(flow, name)(*args, **kwargs)
    assert str(got.value).split(":")[-1].strip()[:40] == str(want.value).split(":")[-1].strip()[:40]
    assert _state(flow) == [False, False, 0]


def _scatter_cases(rng):
    """(name, fn(x, device) -> tensor) of ops whose CUDA versions scatter-add floats."""
    idx = rng.integers(0, 6, 50)
    ids = rng.integers(0, 6, (5, 10))
    src = rng.standard_normal((50, 4)).astype(np.float32)
    index2 = rng.integers(0, 6, (7, 4))
    return [
        ("embedding backward", lambda w, dev: _grad(w, dev, lambda t: flow.nn.functional.embedding(
            flow.tensor(ids, device=dev), t))),
        ("index_add", lambda w, dev: flow.tensor(w, device=dev).index_add(0, flow.tensor(idx, device=dev),
                                                                          flow.tensor(src, device=dev))),
        ("scatter_add", lambda w, dev: flow.tensor(w, device=dev).scatter_add(
            0, flow.tensor(index2, device=dev), flow.tensor(src[:7], device=dev))),
        ("index_put accumulate", lambda w, dev: flow.tensor(w, device=dev).index_put(
            (flow.tensor(idx, device=dev),), flow.tensor(src, device=dev), accumulate=True)),
        ("gather backward", lambda w, dev: _grad(w, dev, lambda t: t.gather(0, flow.tensor(index2, device=dev)))),
        ("advanced indexing backward", lambda w, dev: _grad(w, dev, lambda t: t[flow.tensor(idx, device=dev)])),
        ("scatter_reduce sum", lambda w, dev: flow.tensor(w, device=dev).scatter_reduce(
            0, flow.tensor(index2, device=dev), flow.tensor(src[:7], device=dev), "sum")),
        ("scatter_reduce mean", lambda w, dev: flow.tensor(w, device=dev).scatter_reduce(
            0, flow.tensor(index2, device=dev), flow.tensor(src[:7], device=dev), "mean", include_self=False)),
        ("bincount with weights", lambda w, dev: flow.bincount(flow.tensor(idx, device=dev),
                                                               flow.tensor(src[:, 0], device=dev), minlength=9)),
        ("max_pool2d backward", lambda w, dev: _grad(w.reshape(1, 1, 6, 4), dev, lambda t: flow.nn.functional.max_pool2d(
            t, 3, stride=1, padding=1))),
        # stores with repeated targets: the last value wins, as numpy leaves it
        ("index_put", lambda w, dev: flow.tensor(w, device=dev).index_put(
            (flow.tensor(idx, device=dev),), flow.tensor(src, device=dev))),
        ("scatter", lambda w, dev: flow.tensor(w, device=dev).scatter(
            0, flow.tensor(index2, device=dev), flow.tensor(src[:7], device=dev))),
        ("setitem", lambda w, dev: _setitem(flow.tensor(w, device=dev), flow.tensor(idx, device=dev),
                                            flow.tensor(src, device=dev))),
        ("setitem int64", lambda w, dev: _setitem(flow.tensor((w * 100).astype(np.int64), device=dev),
                                                  flow.tensor(idx, device=dev),
                                                  flow.tensor(np.arange(200).reshape(50, 4), device=dev))),
    ]


def _setitem(t, idx, v):
    t[idx] = v
    return t


def _grad(w, dev, fn):
    t = flow.tensor(w, device=dev, requires_grad=True)
    out = fn(t)
    out.backward(flow.tensor(np.linspace(-3, 3, out.numel(), dtype=np.float32).reshape(out.shape), device=dev))
    return t.grad


def test_cuda_scatters_are_the_cpu_bits_in_deterministic_mode(cuda_double, restore):
    rng = np.random.default_rng(3)
    w = rng.standard_normal((6, 4)).astype(np.float32)
    stats = cuda_double._double.stats
    for name, fn in _scatter_cases(rng):
        flow.use_deterministic_algorithms(True)
        stats.reset()
        got = fn(w, "cuda").cpu().numpy()
        assert _segment_launches(stats) >= 1, name
        want = fn(w, "cpu").numpy()
        assert got.dtype == want.dtype, name
        np.testing.assert_array_equal(got, want, err_msg=name)
        flow.use_deterministic_algorithms(False)
        stats.reset()
        fn(w, "cuda")
        assert _segment_launches(stats) == 0, name  # CuPy's atomics and stores outside the mode


def _segment_launches(stats):
    return sum(n for k, n in stats.by_name.items() if k.startswith("engine_segment_"))


def test_deterministic_mode_takes_the_split_flash_backward(cuda_double, restore, monkeypatch):
    monkeypatch.setattr(A, "FLASH_BACKWARD", "fused")
    monkeypatch.setattr(A, "FLASH_ATTENTION_ON_GPU", True)
    rng = np.random.default_rng(2)
    qkv = rng.standard_normal((2, 9, 2 * 3 * 16)).astype(np.float32)
    stats = cuda_double._double.stats
    for mode, kernels in ((False, ("bwd_pre", "bwd", "bwd_dq")), (True, ("dq", "dkdv"))):
        flow.use_deterministic_algorithms(mode)
        x = flow.tensor(qkv, device="cuda", requires_grad=True)
        with flow.autocast("cuda", dtype=flow.float16):
            y = flow.nn.functional.packed_qkv_attention(x, 2, causal=True)
        stats.reset()
        y.float().sum().backward()
        assert all(stats.by_name[f"flash_{k}__hd16"] == 1 for k in kernels), (mode, dict(stats.by_name))


def test_a_gpt2_step_in_deterministic_mode(cuda_layers, restore):
    """The embedding gradients go through the segment sums; each sorts its targets, and CuPy's
    sort (Thrust) waits for the stream: one host synchronisation per embedding and step, none
    else. The losses are those of the default mode (the same sums, in one order)."""
    from test_cuda_double_training import _gpt2_step_counts
    default_counts, default_losses = _gpt2_step_counts(cuda_layers)
    flow.use_deterministic_algorithms(True)
    stats = cuda_layers._double.stats
    counts, losses = _gpt2_step_counts(cuda_layers)
    assert [syncs for _, syncs, _ in counts[1:]] == [2, 2], counts  # the token and position embeddings
    assert all("argsort" in what for what, _ in counts[-1][2]), counts[-1][2]
    assert stats.by_name["engine_segment_add__float"] == 2
    np.testing.assert_allclose(losses, default_losses, rtol=1e-6)


def test_a_cuda_graph_capture_refuses_deterministic_scatter_adds(cuda_double, restore):
    flow.use_deterministic_algorithms(True)
    w = flow.tensor(np.ones((6, 4), np.float32), device="cuda", requires_grad=True)
    ids = flow.tensor(np.array([[1, 2, 1]]), device="cuda")
    flow.nn.functional.embedding(ids, w).sum().backward()  # eagerly: fine
    with pytest.raises(RuntimeError, match="cannot be captured in a CUDA graph: CuPy's sort synchronises"):
        with flow.cuda.graph(flow.cuda.CUDAGraph()):
            flow.nn.functional.embedding(ids, w).sum().backward()


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_empty_is_filled_in_deterministic_mode_as_in_torch(cuda_double, restore, device):
    """torch.utils.deterministic.fill_uninitialized_memory: NaN for floating dtypes, the largest
    integer, True; off with the flag."""
    flow.use_deterministic_algorithms(True)
    torch.use_deterministic_algorithms(True)
    for name in ("float32", "float16", "float64", "int32", "int64", "uint8", "bool"):
        got = flow.empty(3, dtype=getattr(flow, name), device=device).cpu().numpy()
        want = torch.empty(3, dtype=getattr(torch, name)).numpy()
        np.testing.assert_array_equal(got, want, err_msg=name)
    assert np.isnan(flow.empty_like(flow.ones(2, device=device)).cpu().numpy()).all()
    assert np.isnan(flow.ones(2, device=device).new_empty(4).cpu().numpy()).all()
    with pytest.raises(RuntimeError, match="expected a bool, but got int"):
        flow.utils.deterministic.fill_uninitialized_memory = 1
    flow.utils.deterministic.fill_uninitialized_memory = False
    try:
        assert flow.utils.deterministic.fill_uninitialized_memory is False
        from engine.backend import deterministic
        left = np.zeros(3, np.float32)
        assert deterministic.fill_uninitialized(left) is left and not np.isnan(left).any()
    finally:
        flow.utils.deterministic.fill_uninitialized_memory = True



def test_deterministic_stores_and_adds_edge_cases(cuda_double, restore):
    """Values with extra leading unit dims (numpy's assignment drops them), values read from the
    memory being written (x[idx] = x: copied first, as numpy), and a weighted bincount of a
    negative id (an error, as outside the mode) take the deterministic path as numpy would."""
    flow.use_deterministic_algorithms(True)
    for dev in ("cpu", "cuda"):
        x = flow.zeros(5, device=dev)
        x[flow.tensor([1, 1, 2], device=dev)] = flow.tensor([[1.0, 2.0, 3.0]], device=dev)
        assert x.cpu().numpy().tolist() == [0, 2, 3, 0, 0], dev
    n = 300
    host = np.arange(n, dtype=np.float32)
    idx = np.concatenate([np.arange(1, n), [n - 1]])
    want = host.copy()
    want[idx] = host.copy()
    x = flow.tensor(host, device="cuda")
    x[flow.tensor(idx, device="cuda")] = x
    np.testing.assert_array_equal(x.cpu().numpy(), want)
    with pytest.raises(ValueError, match="must be non-negative"):
        flow.bincount(flow.tensor([0, -1, 2], device="cuda"), flow.tensor([1.0, 2.0, 3.0], device="cuda"))
    assert np.isnan(flow.Tensor(3).numpy()).all()  # the legacy sizes constructor is filled too
