"""engine.utils.checkpoint.checkpoint: the same values and gradients as the plain call (dropout
masks included), against PyTorch's torch.utils.checkpoint on the same function and weights."""
import numpy as np
import pytest
import torch

import engine as flow
from engine.utils.checkpoint import checkpoint

rng = np.random.default_rng(0)
W1 = rng.standard_normal((8, 6)).astype(np.float32)
W2 = rng.standard_normal((6, 8)).astype(np.float32)
X = rng.standard_normal((5, 6)).astype(np.float32)


def block(x, w1, w2, lib):
    h = lib.tanh(x @ w1.T)
    return (h @ w2.T) * x, h.sum()


@pytest.mark.parametrize("x_requires_grad", [True, False])
def test_values_and_gradients_match_pytorch(x_requires_grad):
    w1, w2 = flow.tensor(W1, requires_grad=True), flow.tensor(W2, requires_grad=True)
    x = flow.tensor(X, requires_grad=x_requires_grad)
    y, s = checkpoint(block, x, w1, w2, flow)
    assert y.requires_grad and s.requires_grad  # through the weights even when x needs no grad
    ((y * y).sum() + s).backward()
    tw1, tw2 = torch.tensor(W1, requires_grad=True), torch.tensor(W2, requires_grad=True)
    tx = torch.tensor(X, requires_grad=x_requires_grad)
    ty, ts = torch.utils.checkpoint.checkpoint(block, tx, tw1, tw2, torch, use_reentrant=False)
    ((ty * ty).sum() + ts).backward()
    np.testing.assert_allclose(y.detach().numpy(), ty.detach().numpy(), rtol=1e-6, atol=1e-6)
    for ours, theirs in [(w1, tw1), (w2, tw2)] + ([(x, tx)] if x_requires_grad else []):
        np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-5, atol=1e-5)
    assert (x.grad is None) == (not x_requires_grad)


@pytest.mark.parametrize("how", ["autograd.grad", "backward"])
def test_tensors_the_function_closes_over_get_their_gradients_as_in_pytorch(how):
    """Parameters and non-leaf tensors used inside but not passed (closures, module attributes):
    autograd.grad returns their gradients (and leaves .grad alone), and a non-leaf tensor also
    used outside the checkpoint gets both contributions; its graph outside is run once, by the
    outer backward (the recomputation stops at the function's boundary)."""
    def run(lib, tensor, grad_fn, ckpt):
        w = tensor(W1.T, requires_grad=True)  # [6, 8]
        a = tensor(W2, requires_grad=True)    # [6, 8]: h = a * 2 is made outside, used inside and outside
        h = a * 2
        x = tensor(X)
        y = ckpt(lambda t: lib.tanh(t @ w) * (t @ h), x)
        loss = (y * y).sum() + h.sum()
        if how == "autograd.grad":
            grads = grad_fn(loss, [w, a])
            assert w.grad is None and a.grad is None
            return [g.detach().numpy() for g in grads]
        loss.backward()
        return [w.grad.detach().numpy(), a.grad.detach().numpy()]

    got = run(flow, flow.tensor, flow.autograd.grad, lambda f, x: checkpoint(f, x, use_reentrant=False))
    want = run(torch, torch.tensor, torch.autograd.grad,
               lambda f, x: torch.utils.checkpoint.checkpoint(f, x, use_reentrant=False))
    for g, t in zip(got, want):
        np.testing.assert_allclose(g, t, rtol=1e-5, atol=1e-5)


def _closure_cases():
    """(name, fn(lib, ckpt) -> values) of closed-over tensors that are also inputs, or carry a
    hook or retain_grad (the boundary's hooks run once, with the whole gradient), and a double
    backward through a checkpoint."""
    def t(lib, v):
        return lib.tensor(np.array(v, dtype=np.float32), requires_grad=True)

    def both_input_and_closure(lib, ck):
        w = t(lib, [1., 2., 3.])
        (g,) = lib.autograd.grad(ck(lambda a: a * w, w).sum(), [w])
        return [g, w.grad]

    def nonleaf_input_and_closure(lib, ck):
        x = t(lib, [1., 2., 3.])
        h = x * 2
        (g,) = lib.autograd.grad(ck(lambda a: a * h, h).sum(), [x])
        return [g]

    def retained_closure(lib, ck):
        x, z = t(lib, [1., 2., 3.]), t(lib, [5., 6., 7.])
        h = x * 2
        h.retain_grad()
        (ck(lambda a: a * h, z) + h).sum().backward()
        return [h.grad, x.grad]

    def hooked_closure(lib, ck):
        calls = []
        x, z = t(lib, [1., 2., 3.]), t(lib, [5., 6., 7.])
        h = x * 2
        h.register_hook(lambda g: calls.append(g) or g * 10)
        (ck(lambda a: a * h, z) + h).sum().backward()
        return [x.grad, *calls]

    def double_backward(lib, ck):  # create_graph: the gradient's own graph reaches the inputs
        w, z = t(lib, [1., 2., 3.]), t(lib, [5., 6., 7.])
        (g,) = lib.autograd.grad(ck(lambda a: (a * w) ** 2, z).sum(), [w], create_graph=True)
        gw, gz = lib.autograd.grad(g.sum(), [w, z])
        return [g, gw, gz]

    return [both_input_and_closure, nonleaf_input_and_closure, retained_closure, hooked_closure, double_backward]


@pytest.mark.parametrize("case", _closure_cases(), ids=lambda f: f.__name__)
def test_closed_over_tensors_with_hooks_or_also_passed_match_pytorch(case):
    got = case(flow, lambda f, *a: checkpoint(f, *a, use_reentrant=False))
    want = case(torch, lambda f, *a: torch.utils.checkpoint.checkpoint(f, *a, use_reentrant=False))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert (g is None) == (w is None)
        if w is not None:
            np.testing.assert_allclose(g.detach().numpy(), w.detach().numpy(), rtol=1e-6)


def test_dropout_masks_are_drawn_again_identically_and_rng_moves_on_as_without():
    lin = flow.nn.Linear(6, 6)

    def f(x):
        return flow.nn.functional.dropout(flow.tanh(lin(x)), 0.5)

    x = flow.tensor(X, requires_grad=True)
    grads, outs, after = [], [], []
    for use in (True, False):
        lin.zero_grad()
        x.grad = None
        flow.manual_seed(7)
        y = checkpoint(f, x) if use else f(x)
        (y * flow.arange(6.0)).sum().backward()
        outs.append(y.detach().numpy())
        grads.append((lin.weight.grad.numpy().copy(), x.grad.numpy().copy()))
        after.append(flow.rand(3).numpy())
    np.testing.assert_array_equal(outs[0], outs[1])
    for a, b in zip(grads[0], grads[1]):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(after[0], after[1])  # the recomputation restored the state it found


def test_outputs_in_containers_unused_outputs_and_non_tensor_arguments():
    w = flow.tensor(W1, requires_grad=True)

    def f(x, scale, *, shift):
        y = x @ w.T * scale + shift
        return {"y": y, "unused": y * 2, "note": "kept", "pair": (y.sum(), 3)}

    out = checkpoint(f, flow.tensor(X), 2.0, shift=1.0)
    assert out["note"] == "kept" and out["pair"][1] == 3
    out["y"].sum().backward()  # "unused" and the pair's sum get no gradient
    np.testing.assert_allclose(w.grad.numpy(), 2.0 * np.ones((8, 5), np.float32) @ X, rtol=1e-5)


def test_nested_checkpoints_and_no_grad():
    w = flow.tensor(W2, requires_grad=True)

    def inner(h):
        return flow.tanh(h @ w.T)

    def outer(x):
        return checkpoint(inner, x).sum(dim=1)

    x = flow.tensor(rng.standard_normal((4, 8)).astype(np.float32), requires_grad=True)
    y = checkpoint(outer, x)
    y.sum().backward()
    got = w.grad.numpy().copy()
    w.grad = None
    inner(x).sum(dim=1).sum().backward()
    np.testing.assert_allclose(got, w.grad.numpy(), rtol=1e-6)
    with flow.no_grad():
        assert not checkpoint(inner, x).requires_grad


def test_a_recomputation_with_other_shapes_is_an_error():
    w = flow.tensor(W1, requires_grad=True)
    calls = []

    def f(x):
        calls.append(1)
        return (x[: 6 - len(calls)] @ w.T)

    y = checkpoint(f, flow.tensor(X))
    with pytest.raises(RuntimeError, match="recomputed outputs"):
        y.sum().backward()


def test_unsupported_options_are_refused():
    with pytest.raises(NotImplementedError, match="context_fn"):
        checkpoint(lambda x: x, flow.ones(2), context_fn=lambda: None)
    with pytest.raises(ValueError, match="determinism_check"):
        checkpoint(lambda x: x, flow.ones(2), determinism_check="strict")
