"""engine.backend.onednn (oneDNN's convolutions through ctypes) against the engine's numpy
im2col kernels, the reference, and through F.conv2d against PyTorch.

Every entry point either computes what the numpy kernels compute (to float32 rounding) or
declines (returns None) so that numpy does it: odd geometries, dtypes, layouts and sizes are the
inputs here."""
import os
import platform
import sys

import numpy as np
import pytest
import torch

import engine as flow
from engine.backend import onednn, parallel
from engine.ops import conv

rng = np.random.default_rng(0)


def test_onednn_is_in_use_where_it_is_a_dependency():
    if platform.machine() == "x86_64" and sys.platform == "linux":
        assert onednn.available(), onednn.why_unavailable()
        assert onednn.why_unavailable() is None and onednn.in_use()
        assert flow.backends.mkldnn.is_available()
    else:  # pragma: no cover - other machines convolve on numpy alone
        assert not onednn.available() and onednn.why_unavailable()


needs_onednn = pytest.mark.skipif(not onednn.available(), reason=f"oneDNN not in use: {onednn.why_unavailable()}")


@pytest.fixture
def numpy_reference():
    """A function that runs a conv kernel with oneDNN switched off."""
    def run(fn, *args):
        onednn.enabled = False
        try:
            return fn(*args)
        finally:
            onednn.enabled = True
    return run


# (N, C, H, W, O, KH, KW, stride, pads (top, bottom, left, right), dilation, groups)
GEOMETRIES = [
    (8, 16, 16, 16, 32, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1),  # the hot-op benchmark's shape
    (2, 3, 17, 13, 5, 3, 3, (2, 2), (1, 0, 2, 1), (1, 1), 1),  # odd sizes, uneven padding, stride
    (2, 4, 9, 9, 6, 3, 3, (1, 1), (2, 2, 2, 2), (2, 2), 2),  # dilation and groups
    (2, 8, 9, 9, 8, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 8),  # depthwise
    (4, 3, 32, 32, 24, 4, 4, (4, 4), (0, 0, 0, 0), (1, 1), 1),  # a patch embedding (stride = kernel)
    (1, 1, 5, 5, 1, 5, 5, (1, 1), (0, 0, 0, 0), (1, 1), 1),  # one output pixel
    (2, 3, 4, 4, 2, 1, 1, (3, 3), (0, 0, 0, 0), (1, 1), 1),  # 1x1 with a stride past the kernel
    (3, 6, 7, 11, 9, 2, 5, (1, 2), (0, 1, 2, 2), (3, 1), 3),  # rectangular everything
]


def _case(n, c, h, w, o, kh, kw, stride, pads, dilation, groups):
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((o, c // groups, kh, kw)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    out_hw = (conv._conv_out(h, kh, stride[0], pads[0], pads[1], dilation[0]),
              conv._conv_out(w, kw, stride[1], pads[2], pads[3], dilation[1]))
    return x, wt, b, out_hw


def _close(got, want):
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * float(np.abs(want).max()))


@needs_onednn
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: "x".join(map(str, g[:7])))
def test_every_pass_matches_the_numpy_kernels(geometry, numpy_reference):
    n, c, h, w, o, kh, kw, stride, pads, dilation, groups = geometry
    x, wt, b, out_hw = _case(*geometry)
    for bias in (b, None):
        y = onednn.conv2d(x, wt, bias, out_hw, stride, pads, dilation, groups)
        assert y is not None, onednn.implementation("forward", x.shape, wt.shape, (n, o) + out_hw, bias is not None,
                                                    stride, pads, dilation, groups)
        _close(y, numpy_reference(conv._conv2d_forward, x, wt, bias, stride, pads, dilation, groups))
    dy = rng.standard_normal(y.shape).astype(np.float32)
    dx = onednn.conv2d_grad_input(dy, wt, x.shape, stride, pads, dilation, groups)
    _close(dx, numpy_reference(conv._conv2d_grad_input, dy, wt, x.shape, stride, pads, dilation, groups))
    dw = onednn.conv2d_grad_weight(dy, x, wt.shape, stride, pads, dilation, groups)
    _close(dw, numpy_reference(conv._conv2d_grad_weight, dy, x, wt.shape, stride, pads, dilation, groups))


@needs_onednn
def test_the_benchmark_shape_runs_a_direct_kernel():
    """The point of the backend: oneDNN's JIT direct convolution, not its GEMM fallback."""
    x, wt, _, out_hw = _case(*GEOMETRIES[0])
    geometry = (x.shape, wt.shape, (8, 32) + out_hw, True, (1, 1), (1, 1, 1, 1), (1, 1), 1)
    assert onednn.implementation("forward", *geometry).startswith("jit:")


@needs_onednn
def test_it_declines_what_it_does_not_take():
    x, wt, b, out_hw = _case(*GEOMETRIES[1])
    args = ((2, 2), (1, 0, 2, 1), (1, 1), 1)
    assert onednn.conv2d(x.astype(np.float64), wt.astype(np.float64), None, out_hw, *args) is None
    assert onednn.conv2d(x[:0], wt, None, out_hw, *args) is None  # an empty batch
    assert onednn.conv2d(x.tolist(), wt, None, out_hw, *args) is None
    dy = np.zeros((2, 5) + out_hw, np.float16)
    assert onednn.conv2d_grad_input(dy, wt, x.shape, *args) is None
    assert onednn.conv2d_grad_weight(dy, x, wt.shape, *args) is None


@needs_onednn
def test_strided_views_give_the_contiguous_result(numpy_reference):
    x, wt, b, out_hw = _case(*GEOMETRIES[0])
    xt = np.ascontiguousarray(x.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)  # same values, W-major strides
    args = ((1, 1), (1, 1, 1, 1), (1, 1), 1)
    assert not xt.flags.c_contiguous
    _close(onednn.conv2d(xt, wt, b, out_hw, *args), numpy_reference(conv._conv2d_forward, x, wt, b, *args))


@needs_onednn
def test_openmp_threads_follow_the_engine_and_are_put_back():
    """oneDNN runs on the engine's thread count; the caller's OpenMP setting (PyTorch's, when torch
    loaded libgomp first) is what it was after the call."""
    x, wt, b, out_hw = _case(*GEOMETRIES[0])
    args = ((1, 1), (1, 1, 1, 1), (1, 1), 1)
    before_omp, before_engine = onednn._omp_get_max_threads(), parallel.get_num_threads()
    seen = []
    real = onednn._lib.dnnl_primitive_execute

    class Spy:
        def __call__(self, *a):
            seen.append(onednn._omp_get_max_threads())
            return real(*a)

        def __getattr__(self, name):
            return getattr(real, name)

    try:
        parallel.set_num_threads(before_omp + 1)
        onednn._lib.dnnl_primitive_execute = Spy()
        onednn.conv2d(x, wt, b, out_hw, *args)
    finally:
        onednn._lib.dnnl_primitive_execute = real
        parallel.set_num_threads(before_engine)
    assert seen and set(seen) == {before_omp + 1}
    assert onednn._omp_get_max_threads() == before_omp


@needs_onednn
def test_a_forked_child_convolves_on_numpy():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.write(write, b"1" if onednn.in_use() else b"0")
        finally:
            os._exit(0)
    os.close(write)
    got = os.read(read, 1)
    os.waitpid(pid, 0)
    assert got == b"0" and onednn.in_use()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_conv2d_module_with_and_without_onednn_matches_torch(dtype):
    """F.conv2d forward and backward through the engine, oneDNN on and off, against PyTorch
    (bfloat16: computed in float32 and rounded, as the numpy path does)."""
    x = rng.standard_normal((4, 6, 11, 9)).astype(np.float32)
    w = rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.2
    b = rng.standard_normal(8).astype(np.float32)
    kw = dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2)
    tx, tw, tb = (torch.tensor(a, dtype=getattr(torch, dtype), requires_grad=True) for a in (x, w, b))
    ty = torch.nn.functional.conv2d(tx, tw, tb, **kw)
    g = rng.standard_normal(tuple(ty.shape)).astype(np.float32)
    ty.backward(torch.tensor(g, dtype=getattr(torch, dtype)))
    tol = 1e-5 if dtype == "float32" else 3e-2
    results = []
    for on in (True, False):
        flow.backends.mkldnn.enabled = on
        try:
            ex, ew, eb = (flow.tensor(a, dtype=getattr(flow, dtype), requires_grad=True) for a in (x, w, b))
            ey = flow.nn.functional.conv2d(ex, ew, eb, **kw)
            ey.backward(flow.tensor(g, dtype=getattr(flow, dtype)))
        finally:
            flow.backends.mkldnn.enabled = True
        got = [t.detach().float().numpy() for t in (ey, ex.grad, ew.grad, eb.grad)]
        for e, t in zip(got, (ty, tx.grad, tw.grad, tb.grad)):
            want = t.float().detach().numpy()
            np.testing.assert_allclose(e, want, rtol=tol, atol=tol * float(np.abs(want).max()))
        results.append(got)
    if dtype == "float32":
        for a, b_ in zip(*results):
            np.testing.assert_allclose(a, b_, rtol=1e-5, atol=1e-5 * float(np.abs(b_).max()))


@needs_onednn
def test_same_bits_every_call():
    """The weight gradient sums over the batch on the OpenMP threads in a fixed order: repeated
    calls at one thread count give the same bits (a run's losses do not wander)."""
    x, wt, b, out_hw = _case(*GEOMETRIES[0])
    args = ((1, 1), (1, 1, 1, 1), (1, 1), 1)
    dy = rng.standard_normal((8, 32) + out_hw).astype(np.float32)
    first = onednn.conv2d_grad_weight(dy, x, wt.shape, *args)
    for _ in range(5):
        assert np.array_equal(onednn.conv2d_grad_weight(dy, x, wt.shape, *args), first)
        assert np.array_equal(onednn.conv2d(x, wt, b, out_hw, *args), onednn.conv2d(x, wt, b, out_hw, *args))


@needs_onednn
def test_least_recently_used_plans_are_destroyed(monkeypatch, numpy_reference):
    """Varying image sizes make a plan each; beyond MAX_PLANS the oldest are destroyed, and a
    shape seen again is planned again and still right."""
    monkeypatch.setattr(onednn, "MAX_PLANS", 3)
    monkeypatch.setattr(onednn, "_plans", type(onednn._plans)())
    wt = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    args = ((1, 1), (1, 1, 1, 1), (1, 1), 1)
    for size in (5, 6, 7, 8, 9, 5):
        x = rng.standard_normal((2, 3, size, size)).astype(np.float32)
        _close(onednn.conv2d(x, wt, None, (size, size), *args), numpy_reference(conv._conv2d_forward, x, wt, None,
                                                                               *args))
        assert len(onednn._plans) <= 3
    assert [k[1][2] for k in onednn._plans] == [8, 9, 5]


@needs_onednn
@pytest.mark.parametrize("stride,padding,output_padding,dilation,groups", [
    ((2, 2), (1, 1), (1, 1), (1, 1), 1), ((3, 2), (0, 1), (2, 0), (1, 2), 2), ((2, 2), (2, 2), (1, 0), (2, 1), 1)])
def test_conv_transpose2d_with_output_padding_runs_on_onednn(stride, padding, output_padding, dilation, groups,
                                                             monkeypatch):
    """conv_transpose2d's forward is the input-gradient pass on a taller output (output_padding):
    oneDNN plans it (no numpy fallback) and matches PyTorch forward and backward."""
    x = rng.standard_normal((2, 4, 5, 6)).astype(np.float32)
    w = rng.standard_normal((4, 6 // groups, 3, 3)).astype(np.float32)
    kw = dict(stride=stride, padding=padding, output_padding=output_padding, dilation=dilation, groups=groups)
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    ty = torch.nn.functional.conv_transpose2d(tx, tw, **kw)
    g = rng.standard_normal(tuple(ty.shape)).astype(np.float32)
    ty.backward(torch.tensor(g))
    monkeypatch.setattr(onednn, "_plans", type(onednn._plans)())
    ex, ew = flow.tensor(x, requires_grad=True), flow.tensor(w, requires_grad=True)
    ey = flow.nn.functional.conv_transpose2d(ex, ew, **kw)
    ey.backward(flow.tensor(g))
    planned = {k[0]: plan is not None for k, plan in onednn._plans.items()}
    assert planned == {"forward": True, "grad_input": True, "grad_weight": True}
    for e, t in ((ey.detach(), ty), (ex.grad, tx.grad), (ew.grad, tw.grad)):
        want = t.detach().numpy()
        np.testing.assert_allclose(e.numpy(), want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


@needs_onednn
def test_a_plan_evicted_while_held_declines_instead_of_running(monkeypatch, numpy_reference):
    """Another thread may evict a plan between the cache lookup and its run: the closed plan
    returns None (the caller convolves on numpy) instead of running destroyed oneDNN objects."""
    monkeypatch.setattr(onednn, "MAX_PLANS", 1)
    monkeypatch.setattr(onednn, "_plans", type(onednn._plans)())
    x, wt, b, out_hw = _case(*GEOMETRIES[0])
    args = ((1, 1), (1, 1, 1, 1), (1, 1), 1)
    held = onednn._plan("forward", x.shape, wt.shape, (8, 32) + out_hw, False, *args)
    onednn._plan("forward", x[:4].shape, wt.shape, (4, 32) + out_hw, False, *args)  # evicts `held`
    assert held.closed and held.run(x, wt) is None
    # through the public entry point the same race falls back to numpy's result
    monkeypatch.setattr(onednn, "_plan", lambda *a: held)
    assert onednn.conv2d(x, wt, None, out_hw, *args) is None
    _close(numpy_reference(conv._conv2d_forward, x, wt, None, *args), conv._conv2d_forward(x, wt, None, *args))
