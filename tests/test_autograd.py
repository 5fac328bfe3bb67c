"""Autograd engine behaviour against PyTorch: accumulation, retain_graph, hooks, autograd.grad,
higher-order gradients, grad modes, custom Functions and in-place safety checks."""
import numpy as np
import pytest
import torch

import engine as flow


def pair(shape, seed=0):
    a = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return flow.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)


def close(f, t, tol=1e-5):
    np.testing.assert_allclose(f.detach().numpy(), t.detach().numpy(), rtol=1e-5, atol=tol)


def test_grad_accumulates_over_backward_calls():
    xf, xt = pair((3,))
    for _ in range(3):
        (xf * xf).sum().backward()
        (xt * xt).sum().backward()
    close(xf.grad, xt.grad)


def test_shared_subexpression_sums_gradients_and_broadcast_reduces():
    xf, xt = pair((2, 3))
    bf, bt = pair((3,), 1)
    for x, b, m in ((xf, bf, flow), (xt, bt, torch)):
        y = x * b
        z = (y + y * x - b / (x * x + 1)).sum()
        z.backward()
    close(xf.grad, xt.grad)
    close(bf.grad, bt.grad)
    assert tuple(bf.grad.shape) == (3,)


def test_second_backward_without_retain_graph_is_a_clear_error():
    x, _ = pair((3,))
    y = (x * x).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.backward()


def test_retain_graph_allows_second_backward():
    x, _ = pair((3,))
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), 4 * x.detach().numpy(), rtol=1e-6)


def test_backward_on_non_scalar_needs_gradient():
    x, _ = pair((3,))
    with pytest.raises(RuntimeError, match="implicitly created only for scalar"):
        (x * 2).backward()
    g = flow.tensor([1.0, 2.0, 3.0])
    (x * 2).backward(g)
    np.testing.assert_allclose(x.grad.numpy(), [2, 4, 6])


def test_backward_of_tensor_without_grad_fn_errors():
    with pytest.raises(RuntimeError, match="does not require grad"):
        flow.ones(2).sum().backward()


def test_hooks_on_leaf_and_intermediate():
    xf, xt = pair((4,))
    seen = {}
    for x, lib in ((xf, "f"), (xt, "t")):
        h = x.register_hook(lambda g: g * 2)
        y = x * 3
        y.register_hook(lambda g, lib=lib: seen.__setitem__(lib, g.clone()))
        (y * y).sum().backward()
        h.remove()
        (x * 1).sum().backward()  # hook removed: plain accumulation
    close(xf.grad, xt.grad)
    close(seen["f"], seen["t"])


def test_retain_grad_on_intermediate():
    xf, xt = pair((3,))
    out = {}
    for x, k in ((xf, "f"), (xt, "t")):
        y = x * x
        y.retain_grad()
        (y * 3).sum().backward()
        out[k] = y.grad
    close(out["f"], out["t"])
    assert xf.is_leaf and not (xf * 2).is_leaf


def test_autograd_grad_and_double_backward():
    xf, xt = pair((5,))
    res = []
    for x, m in ((xf, flow), (xt, torch)):
        y = (x * x * x).sum()
        (g,) = m.autograd.grad(y, [x], create_graph=True)
        (gg,) = m.autograd.grad(g.sum(), [x])
        res.append((g, gg))
    close(res[0][0], res[1][0])
    close(res[0][1], res[1][1])
    assert xf.grad is None  # autograd.grad never accumulates


def test_autograd_grad_runs_only_the_graph_above_its_inputs():
    """autograd.grad(y, [h]) for an intermediate h runs the nodes between y and h only, as
    PyTorch does: the graph below h is neither run nor freed, so a later backward through it
    works, and a leaf below it gets nothing; with h and a leaf below it both asked for, the path
    between them runs."""
    af, at = pair((3,))
    got = {}
    for a, m in ((af, flow), (at, torch)):
        h = a * 2 + 1
        y = (h * h * a).sum()
        (gh,) = m.autograd.grad(y, [h])  # y's graph is freed, h's (below) is not
        assert a.grad is None
        (h * 3).sum().backward()
        got[m] = (gh, a.grad.clone())
        a.grad = None
        h2 = a * 3
        gh2, ga = m.autograd.grad((h2 * h2 * a).sum(), [h2, a])  # both: the path h2 -> a runs
        got[m] += (gh2, ga)
    for f, t in zip(got[flow], got[torch]):
        close(f, t)


def test_retained_gradients_accumulate_and_backward_inputs_count_once():
    """retain_grad's .grad adds up over backward calls, and backward(inputs=[h]) for a retained
    non-leaf h gives it its gradient once, as in PyTorch."""
    af, at = pair((3,))
    got = {}
    for a, m in ((af, flow), (at, torch)):
        h = a * 2 + 1
        h.retain_grad()
        y = (h * h * a).sum()
        y.backward(retain_graph=True)
        y.backward(retain_graph=True)
        twice = h.grad.clone()
        h.grad = None
        y.backward(inputs=[h])
        got[m] = (twice, h.grad, a.grad)
    for f, t in zip(got[flow], got[torch]):
        close(f, t)


def test_autograd_grad_unused_input():
    x, _ = pair((2,))
    z, _ = pair((2,), 1)
    y = (x * 2).sum()
    with pytest.raises(RuntimeError, match="not have been used"):
        flow.autograd.grad(y, [x, z], retain_graph=True)
    gx, gz = flow.autograd.grad(y, [x, z], allow_unused=True)
    assert gz is None
    np.testing.assert_allclose(gx.numpy(), [2, 2])


def test_grad_modes():
    x, _ = pair((2,))
    with flow.no_grad():
        assert not (x * 2).requires_grad
        with flow.enable_grad():
            assert (x * 2).requires_grad
    with flow.set_grad_enabled(False):
        assert not (x * 2).requires_grad
    assert flow.is_grad_enabled()

    @flow.no_grad()
    def f(t):
        return t * 2

    assert not f(x).requires_grad
    assert (x * 2).requires_grad


class Cube(flow.autograd.Function):
    @staticmethod
    def forward(ctx, x, k):
        ctx.save_for_backward(x)
        ctx.k = k
        return x * x * x * k

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 3 * x * x * ctx.k, None


def test_custom_function():
    xf, xt = pair((4,))
    y = Cube.apply(xf, 2.0)
    assert y.grad_fn is not None
    y.sum().backward()
    (xt * xt * xt * 2.0).sum().backward()
    close(xf.grad, xt.grad)


def test_modified_saved_tensor_is_detected():
    x, _ = pair((3,))
    a = x * 2
    y = a * a
    with flow.no_grad():
        a.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_inplace_on_leaf_requiring_grad_errors():
    x, _ = pair((3,))
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        x.add_(1)
    with flow.no_grad():
        x.add_(1)  # allowed, as in torch


def test_recorded_inplace_op_gradient():
    xf, xt = pair((3,))
    for x in (xf, xt):
        y = x * 2
        y.mul_(x)
        y.add_(1)
        if x is xf:
            y.mul_(y)  # saves its own input, then rebinds it: fine here, an error in torch
        else:
            y = y * y
        y.sum().backward()
    close(xf.grad, xt.grad)


def test_double_backward_through_ops_that_save_outputs():
    xf, xt = pair((4,))
    res = []
    for x, m in ((xf, flow), (xt, torch)):
        y = m.exp(x * 2).sum()
        (g,) = m.autograd.grad(y, [x], create_graph=True)
        (gg,) = m.autograd.grad(g.sum(), [x])
        res.append(gg)
    close(res[0], res[1], tol=1e-4)


def test_zero_dim_results_are_arrays_that_support_inplace():
    t = flow.tensor(2.0).exp()
    with flow.no_grad():
        t.add_(1)
    assert abs(t.item() - (np.exp(2.0) + 1)) < 1e-5


def test_requires_grad_only_for_floats():
    with pytest.raises(RuntimeError, match="floating point"):
        flow.tensor([1, 2]).requires_grad_()


def test_detach_shares_storage_and_drops_history():
    x, _ = pair((3,))
    y = x * 2
    d = y.detach()
    assert d.grad_fn is None and not d.requires_grad
    with flow.no_grad():
        d.zero_() if hasattr(d, "zero_") else d.mul_(0)
    assert float(abs(y.detach()).sum()) == 0.0


def test_leaf_gradients_never_alias_and_fresh_ones_are_adopted():
    y, _ = pair((3,))
    z, _ = pair((3,), 1)
    (y + z).exp().sum().backward()  # Add hands the same fresh gradient to both leaves
    assert not np.shares_memory(y.grad.numpy(), z.grad.numpy())
    before = z.grad.numpy().copy()
    with flow.no_grad():
        y.grad.mul_(0)
    np.testing.assert_array_equal(z.grad.numpy(), before)

    x, _ = pair((3, 4))
    w, _ = pair((4, 5), 1)
    (x @ w).sum().backward()
    assert x.grad.numpy().base is None and w.grad.numpy().base is None

    g = flow.ones(3, 4)
    x2, _ = pair((3, 4))
    (x2 * 1).backward(g)  # Mul's grad is new; but a user-held gradient must never be adopted
    x3, _ = pair((3, 4))
    x3.backward(g) if False else (x3 + 0).backward(g)
    with flow.no_grad():
        x3.grad.add_(1)
    np.testing.assert_array_equal(g.numpy(), np.ones((3, 4), np.float32))


def test_graphs_free_without_the_cycle_collector():
    """Activations must be freed by reference counting alone: a saved output that pointed back
    to its node would keep every step's activations alive until gc runs."""
    import gc
    import weakref

    F = flow.nn.functional
    w = flow.randn(8, 8, requires_grad=True)
    gc.disable()
    try:
        x = flow.randn(4, 8, requires_grad=True)
        h = F.layer_norm(F.linear(x, w), (8,))
        p = F.dropout(F.gelu(h), 0.1).softmax(-1).exp().tanh().sigmoid()
        loss = F.cross_entropy(p, flow.tensor([1, 2, 3, 0]))
        refs = [weakref.ref(t) for t in (h, p, loss)]
        nodes = [weakref.ref(t.grad_fn) for t in (h, p, loss)]
        del h, p, loss
        assert all(r() is None for r in refs + nodes), "a graph survived reference counting"
    finally:
        gc.enable()


def test_region_only_gradient_accumulation_of_basic_indexing():
    xf, xt = pair((3, 4, 5))
    outs = []
    for x in (xf, xt):
        y = x * 2
        q, k, v = y[0], y[1], y[2]
        (q.exp() * k + v * v + y[1:, :2].sum()).sum().backward()
        outs.append(x.grad)
    close(outs[0], outs[1])
    # a user-held gradient is never modified in place
    g = flow.ones(3, 4, 5)
    xf.grad = None
    z = xf * 1
    z.backward(g, retain_graph=True)
    assert float(g.sum()) == 60.0


def test_deepcopy_of_leaves_and_modules():
    import copy

    model = flow.nn.Sequential(flow.nn.Linear(3, 4), flow.nn.GELU(), flow.nn.Linear(4, 2))
    model(flow.randn(5, 3)).sum().backward()
    clone = copy.deepcopy(model)
    for (name, a), (_, b) in zip(model.named_parameters(), clone.named_parameters()):
        assert type(b) is flow.nn.Parameter and b.requires_grad, name
        assert not np.shares_memory(a.detach().numpy(), b.detach().numpy()), name
        np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())
        np.testing.assert_array_equal(a.grad.numpy(), b.grad.numpy())
    with pytest.raises(RuntimeError, match="graph leaves"):
        copy.deepcopy(model(flow.randn(1, 3)))


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "pow", "maximum", "minimum"])
@pytest.mark.parametrize("scalar_first", [False, True])
def test_a_0dim_operand_broadcast_gets_a_0dim_gradient_like_torch(op, scalar_first):
    """A learnable scalar (CLIP's logit_scale) used with a vector: its gradient is 0-dim, summed
    over the broadcast (regression: the reduction returned shape (1,) and backward refused it)."""
    import torch

    v = np.array([0.5, 1.5, 2.0, 3.0, 0.25], np.float32)
    s = np.float32(1.25)
    ours = [flow.tensor(v, requires_grad=True), flow.tensor(s, requires_grad=True)]
    theirs = [torch.tensor(v, requires_grad=True), torch.tensor(s, requires_grad=True)]
    a, b = (1, 0) if scalar_first else (0, 1)
    getattr(flow, op)(ours[a], ours[b]).sum().backward()
    getattr(torch, op)(theirs[a], theirs[b]).sum().backward()
    assert tuple(ours[1].grad.shape) == () and tuple(ours[0].grad.shape) == (5,)
    for x, t in zip(ours, theirs):
        np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-5)


def test_0dim_tensors_format_like_numbers_and_flip_takes_dims_by_keyword():
    import torch

    loss = flow.tensor(1.23456)
    assert f"{loss:.4f}" == f"{torch.tensor(1.23456):.4f}" == "1.2346"
    assert f"{flow.tensor(7):>3d}" == "  7"
    assert f"{flow.tensor([1.0, 2.0])}" == str(flow.tensor([1.0, 2.0]))
    with pytest.raises(TypeError, match="unsupported format string"):
        f"{flow.tensor([1.0, 2.0]):.2f}"
    x = np.arange(6.0).reshape(2, 3)
    for kw in ({"dims": (0,)}, {"dims": [0, 1]}):
        want = torch.flip(torch.tensor(x), **kw).numpy()
        np.testing.assert_array_equal(flow.flip(flow.tensor(x), **kw).numpy(), want)
    np.testing.assert_array_equal(flow.tensor(x).flip(dims=(1,)).numpy(), np.flip(x, 1))
    with pytest.raises(TypeError, match="multiple values"):
        flow.flip(flow.tensor(x), 0, dims=(1,))


def test_index_select_on_a_0dim_tensor_stays_0dim_like_torch():
    import torch

    x = flow.tensor(3.0, requires_grad=True)
    y = flow.index_select(x, 0, flow.tensor([0]))
    assert tuple(y.shape) == tuple(torch.index_select(torch.tensor(3.0), 0, torch.tensor([0])).shape) == ()
    (y * 2).backward()
    assert float(x.grad) == 2.0
    for bad in ([0, 0], []):
        with pytest.raises(RuntimeError, match="Index to scalar can have only 1 value"):
            flow.index_select(x, 0, flow.tensor(bad, dtype=flow.int64))


# ------------------------------------------------------------------ views share version counters
_VIEWS = {
    "view": lambda t: t.view(-1),
    "transpose": lambda t: t.transpose(0, 1),
    "row": lambda t: t[1],
    "slice": lambda t: t[:, 1:3],
    "narrow": lambda t: t.narrow(1, 0, 2),
    "unsqueeze": lambda t: t.unsqueeze(0),
    "permute": lambda t: t.permute(1, 0),
    "detach": lambda t: t.detach(),
}


@pytest.mark.parametrize("how", list(_VIEWS))
def test_a_write_through_a_view_bumps_the_base_version_as_torch(how):
    """As in PyTorch, a view shares its base's version counter: an unrecorded write through the
    view is seen by the base (saved tensors, autocast's kept copies of parameters)."""
    a, ta = flow.zeros(3, 4), torch.zeros(3, 4)
    v, tv = _VIEWS[how](a), _VIEWS[how](ta)
    before = (a._version, v._version)
    with flow.no_grad():
        v[0].fill_(1.0)
    with torch.no_grad():
        tv[0].fill_(1.0)
    assert a._version > before[0] and v._version == a._version
    assert ta._version > 0 and tv._version == ta._version  # the oracle agrees
    np.testing.assert_array_equal(a.numpy(), ta.numpy())


def test_a_saved_tensor_written_through_a_view_is_detected_as_in_torch():
    for lib in (flow, torch):
        x = lib.ones(2, 3, requires_grad=True)
        y = x * 2
        z = y * y  # saves y
        with lib.no_grad():
            y.view(-1)[0] = 5.0
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            z.sum().backward()


@pytest.mark.parametrize("how", ["flip", "cat of one"])
def test_flip_and_cat_of_one_return_new_memory_as_torch(how):
    """torch.flip and torch.cat([x]) copy; a write to their result must not reach the input (nor
    its saved value: numpy's flip is a view, and cat([x]) returned x itself)."""
    def run(lib):
        x = lib.tensor([1.0, 2.0, 4.0], requires_grad=True)
        b = x * 1
        y = b.flip(0) if how == "flip" else lib.cat([b])
        z = b * b  # saves b
        with lib.no_grad():
            y.mul_(-2.0)
        z.sum().backward()
        return x.grad.numpy(), b.detach().numpy()

    for got, want in zip(run(flow), run(torch)):
        np.testing.assert_array_equal(got, want)


def _F(lib):
    return lib.nn.functional


# (name, fn(lib, *differentiable inputs), their shapes): a second derivative through each, as a
# gradient penalty (WGAN-GP critics with normalisation layers) or MAML takes it
DOUBLE_BACKWARD_CASES = [
    ("layer_norm", lambda lib, x, w, b: _F(lib).layer_norm(x, (5,), w, b), [(3, 5), (5,), (5,)]),
    ("layer_norm-2d", lambda lib, x, w, b: _F(lib).layer_norm(x, (2, 5), w, b), [(3, 2, 5), (2, 5), (2, 5)]),
    ("layer_norm-no-affine", lambda lib, x: _F(lib).layer_norm(x, (5,)), [(3, 5)]),
    ("batch_norm", lambda lib, x, w, b: _F(lib).batch_norm(x, None, None, w, b, training=True), [(4, 3, 5), (3,), (3,)]),
    ("instance_norm", lambda lib, x, w, b: _F(lib).instance_norm(x, weight=w, bias=b), [(4, 3, 5), (3,), (3,)]),
    ("group_norm", lambda lib, x, w, b: _F(lib).group_norm(x, 2, w, b), [(4, 4, 5), (4,), (4,)]),
    ("rms_norm", lambda lib, x, w: _F(lib).rms_norm(x, (5,), w), [(3, 5), (5,)]),
    *[(f"{name}-{red}", (lambda fn, red: lambda lib, x, t: fn(lib, x, t, red))(fn, red), [(3, 4), (3, 4)])
      for red in ("mean", "sum", "none") for name, fn in (
          ("mse", lambda lib, x, t, red: _F(lib).mse_loss(x, t, reduction=red)),
          ("l1", lambda lib, x, t, red: _F(lib).l1_loss(x, t, reduction=red)),
          ("smooth_l1", lambda lib, x, t, red: _F(lib).smooth_l1_loss(x, t, reduction=red, beta=0.7)),
          ("huber", lambda lib, x, t, red: _F(lib).huber_loss(x, t, reduction=red, delta=0.6)),
          ("bce_logits", lambda lib, x, t, red: _F(lib).binary_cross_entropy_with_logits(x, t.sigmoid(),
                                                                                           reduction=red)))],
    ("bce_logits-weight", lambda lib, x, t: _F(lib).binary_cross_entropy_with_logits(
        x, t.sigmoid(), weight=lib.tensor(np.linspace(0.5, 2, 4))), [(3, 4), (3, 4)]),
    ("mse-broadcast", lambda lib, x, t: _F(lib).mse_loss(x, t.expand(3, 4)), [(3, 4), (1, 4)]),
]


@pytest.mark.parametrize("name, fn, shapes", DOUBLE_BACKWARD_CASES, ids=[c[0] for c in DOUBLE_BACKWARD_CASES])
def test_double_backward_through_normalisations_and_losses(name, fn, shapes):
    """Their plain backward is one fused op; under create_graph it is written in engine ops, so
    a gradient of the gradient matches torch's (float64, every input)."""
    rng = np.random.default_rng(0)
    values = [rng.standard_normal(s) for s in shapes]
    grads = []
    for lib in (torch, flow):
        inputs = [lib.tensor(v, requires_grad=True) for v in values]
        first = lib.autograd.grad((fn(lib, *inputs) ** 3).sum(), inputs, create_graph=True)
        sum((g ** 2).sum() for g in first).backward()
        grads.append([t.grad.detach().numpy() for t in inputs])
    for want, got in zip(*grads):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
