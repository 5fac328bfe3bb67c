"""engine.amp against torch.amp: autocast's per-op output dtypes and values (CPU policy, float16
and bfloat16), float32 gradients for float32 parameters, backward outside autocast, and the
GradScaler step by step against torch.amp.GradScaler with injected inf/nan gradients."""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import engine as flow
import engine.nn.functional as F

rng = np.random.default_rng(0)
X = rng.standard_normal((4, 8)).astype(np.float32)
W = rng.standard_normal((6, 8)).astype(np.float32)
B = rng.standard_normal(6).astype(np.float32)
IMG = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
K = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
T = np.array([0, 5, 2, 1])
QKV = rng.standard_normal((2, 5, 3 * 8)).astype(np.float32)

DTYPES = [(flow.bfloat16, torch.bfloat16), (flow.float16, torch.float16)]


def _ops(lib, Fn, t):
    """name -> a call of that op in `lib` on the shared inputs (converted by `t`)."""
    x, w, b, img, k, tgt = t(X), t(W), t(B), t(IMG), t(K), t(T)
    return {
        "linear": lambda: Fn.linear(x, w, b),
        "matmul": lambda: x @ w.transpose(0, 1),
        "bmm": lambda: lib.bmm(x[None], w.transpose(0, 1)[None]),
        "conv2d": lambda: Fn.conv2d(img, k),
        "softmax": lambda: Fn.softmax(x, dim=-1),
        "log_softmax": lambda: Fn.log_softmax(x, dim=-1),
        "layer_norm": lambda: Fn.layer_norm(x, (8,)),
        "cross_entropy": lambda: Fn.cross_entropy(Fn.linear(x, w), tgt),
        "nll_loss": lambda: Fn.nll_loss(Fn.log_softmax(x, dim=-1), tgt),
        "mse_loss": lambda: Fn.mse_loss(Fn.linear(x, w), Fn.linear(x, w)),
        "gelu": lambda: Fn.gelu(x),
        "gelu_of_linear": lambda: Fn.gelu(Fn.linear(x, w)),
        "add_low_and_fp32": lambda: Fn.linear(x, w) + b,
        "layer_norm_of_linear": lambda: Fn.layer_norm(Fn.linear(x, w), (6,)),
        "softmax_of_linear": lambda: Fn.softmax(Fn.linear(x, w), dim=-1),
        "sum": lambda: x.sum(),
        "embedding": lambda: Fn.embedding(tgt, w),
    }


@pytest.mark.parametrize("dt,tdt", DTYPES, ids=["bfloat16", "float16"])
def test_autocast_output_dtypes_and_values_match_torch_cpu(dt, tdt):
    ours = _ops(flow, F, flow.tensor)
    theirs = _ops(torch, TF, torch.tensor)
    for name in ours:
        with flow.autocast("cpu", dtype=dt):
            y = ours[name]()
        with torch.autocast("cpu", dtype=tdt):
            ty = theirs[name]()
        assert y.dtype.name == str(ty.dtype).replace("torch.", ""), (name, y.dtype, ty.dtype)
        # one rounding of the low dtype apart (bfloat16 keeps 8 bits, float16 11)
        tol = 2 ** -7 if dt == flow.bfloat16 else 2 ** -10
        np.testing.assert_allclose(y.float().detach().numpy(), ty.float().detach().numpy(), rtol=2 * tol,
                                   atol=2 * tol * max(1.0, float(ty.float().abs().max())), err_msg=name)


def test_packed_attention_runs_in_the_low_dtype_like_torch_sdpa():
    with flow.autocast("cpu", dtype=flow.bfloat16):
        y = F.packed_qkv_attention(flow.tensor(QKV), 2)
    q, k, v = (torch.tensor(QKV).view(2, 5, 2, 3, 4)[..., i, :].transpose(1, 2) for i in range(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ty = TF.scaled_dot_product_attention(q, k, v)
    assert y.dtype == flow.bfloat16 and ty.dtype == torch.bfloat16
    ref = ty.float().transpose(1, 2).reshape(2, 5, 8).numpy()
    np.testing.assert_allclose(y.float().numpy(), ref, atol=3e-2)


def test_float32_parameters_get_float32_gradients_and_backward_is_not_autocast():
    w = flow.tensor(W, requires_grad=True)
    b = flow.tensor(B, requires_grad=True)
    x = flow.tensor(X, requires_grad=True)
    with flow.autocast("cpu", dtype=flow.float16):
        y = F.layer_norm(F.linear(x, w, b), (6,))
        assert y.dtype == flow.float16
        loss = F.mse_loss(y, flow.zeros(4, 6))
        assert loss.dtype == flow.float32
        loss.backward()  # inside the context: the backward ops still run uncast
    assert w.grad.dtype == b.grad.dtype == x.grad.dtype == flow.float32
    tw, tb, tx = (torch.tensor(a, requires_grad=True) for a in (W, B, X))
    with torch.autocast("cpu", dtype=torch.float16):
        TF.mse_loss(TF.layer_norm(TF.linear(tx, tw, tb), (6,)), torch.zeros(4, 6)).backward()
    for ours, theirs in [(w, tw), (b, tb), (x, tx)]:
        np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=2e-2, atol=2e-3)


def _low_linear_grads(dt, device="cpu"):
    """Under autocast(dt) on `device`: y = linear(x, W, b) and y.backward(g); returns the
    leaves' gradients and the reference W and b gradients in float64 from the low-precision
    g and x the backward sees (the products' exact values)."""
    x = rng.standard_normal((3, 7, 16)).astype(np.float32)
    w = rng.standard_normal((10, 16)).astype(np.float32)
    b = rng.standard_normal(10).astype(np.float32)
    g = rng.standard_normal((3, 7, 10)).astype(np.float32)
    X, Wt, Bt = (flow.tensor(a, device=device, requires_grad=True) for a in (x, w, b))
    with flow.autocast(device, dtype=dt):
        y = F.linear(X, Wt, Bt)
    assert y.dtype == dt
    low = flow.tensor(g).to(dt)
    y.backward(low.to(device))
    x64 = flow.tensor(x).to(dt).double().numpy().reshape(-1, 16)
    g64 = low.double().numpy().reshape(-1, 10)
    grads = [t.grad.cpu() for t in (X, Wt, Bt)]
    return grads, g64.T @ x64, g64.sum(0)


@pytest.mark.parametrize("dt", [flow.bfloat16, flow.float16], ids=["bfloat16", "float16"])
def test_master_weight_gradients_come_from_the_product_in_float32(dt):
    """A float32 weight and bias lowered by autocast get float32 gradients straight from the
    low-precision product's float32 accumulator (Megatron's wgrad into fp32 main_grad): equal to
    the exact product of the low-precision g and x up to float32 rounding, not that product
    rounded to the low dtype first and cast (what PyTorch's autocast gives, checked to be far
    coarser here, so this test fails on a rounding backward)."""
    (gx, gw, gb), want_w, want_b = _low_linear_grads(dt)
    assert gw.dtype == gb.dtype == gx.dtype == flow.float32
    for got, want in ((gw.numpy(), want_w), (gb.numpy(), want_b)):
        err = np.abs(got - want).max() / np.abs(want).max()
        rounded = flow.tensor(want.astype(np.float32)).to(dt).double().numpy()
        assert err < 1e-6, err
        assert np.abs(rounded - want).max() / np.abs(want).max() > 100 * 1e-6


def test_a_broadcast_bias_of_another_shape_keeps_the_float32_weight_gradient():
    """linear(x, W, b) with b of shape [1, out] (added after the product): W's gradient still
    comes from the product in float32, the bias's through the add, as PyTorch gives them."""
    x = flow.tensor(X, requires_grad=True)
    w = flow.tensor(W, requires_grad=True)
    b = flow.tensor(B[None], requires_grad=True)
    with flow.autocast("cpu", dtype=flow.bfloat16):
        y = F.linear(x, w, b)
    y.float().sum().backward()
    assert y.grad_fn.name_() == "AddBackward" and w.grad.dtype == b.grad.dtype == flow.float32
    x16 = flow.tensor(X).to(flow.bfloat16).double().numpy()
    want = np.ones((4, 6)).T @ x16  # the exact product: bfloat16 rounding of it would be ~1e-3 off
    np.testing.assert_allclose(w.grad.numpy(), want, rtol=1e-6)
    np.testing.assert_allclose(b.grad.numpy(), np.full((1, 6), 4.0))


def test_master_weight_gradients_on_cuda_through_the_double(cuda_double):
    """The same on CUDA: cuBLAS writes the float32 gradients from float16 operands."""
    (gx, gw, gb), want_w, want_b = _low_linear_grads(flow.float16, device="cuda")
    assert gw.dtype == gb.dtype == flow.float32
    for got, want in ((gw.numpy(), want_w), (gb.numpy(), want_b)):
        assert np.abs(got - want).max() / np.abs(want).max() < 1e-6


@pytest.mark.parametrize("wdt,twdt", [(flow.float16, torch.float16), (flow.float64, torch.float64)],
                         ids=["float16", "float64"])
def test_weights_autocast_does_not_lower_keep_their_gradient_dtype(wdt, twdt):
    """Only float32 masters take the float32 path: a float16 weight (not cast) and a float64
    one (never cast) get gradients in their own dtype, as in PyTorch."""
    x = flow.tensor(X, requires_grad=True)
    w = flow.tensor(W, dtype=wdt, requires_grad=True)
    with flow.autocast("cpu", dtype=flow.float16):
        y = F.linear(x.to(wdt), w)
    y.float().sum().backward()
    assert w.grad.dtype == wdt
    tw = torch.tensor(W, dtype=twdt, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.float16):
        TF.linear(torch.tensor(X).to(tw.dtype), tw).float().sum().backward()
    np.testing.assert_allclose(w.grad.float().numpy(), tw.grad.float().numpy(), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dt,tdt", DTYPES, ids=["bfloat16", "float16"])
def test_double_backward_through_an_autocast_linear_matches_torch(dt, tdt):
    """create_graph through the float32 gradient product: its backward passes the gradient in
    the operands' low dtype, as the cast it replaces would."""
    x, w, b = (flow.tensor(a, requires_grad=True) for a in (X, W, B))
    with flow.autocast("cpu", dtype=dt):
        y = F.linear(x, w, b)
    gw, gb = flow.autograd.grad((y.float() ** 2).sum(), (w, b), create_graph=True)
    gx, = flow.autograd.grad((gw ** 2).sum() + (gb ** 2).sum(), (x,))
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (X, W, B))
    with torch.autocast("cpu", dtype=tdt):
        ty = TF.linear(tx, tw, tb)
    tgw, tgb = torch.autograd.grad((ty.float() ** 2).sum(), (tw, tb), create_graph=True)
    tgx, = torch.autograd.grad((tgw ** 2).sum() + (tgb ** 2).sum(), (tx,))
    assert gw.dtype == gb.dtype == gx.dtype == flow.float32
    np.testing.assert_allclose(gx.numpy(), tgx.numpy(), rtol=2e-2, atol=2e-2 * np.abs(tgx.numpy()).max())


def test_nesting_disabling_decorator_and_float64():
    x64 = flow.tensor(X.astype(np.float64))
    with flow.autocast("cpu"):  # bfloat16 by default on the CPU
        assert flow.amp.is_autocast_enabled("cpu") and flow.amp.get_autocast_dtype("cpu") == flow.bfloat16
        assert F.linear(flow.tensor(X), flow.tensor(W)).dtype == flow.bfloat16
        assert F.linear(x64, flow.tensor(W, dtype=flow.float64)).dtype == flow.float64  # never cast
        with flow.autocast("cpu", enabled=False):
            assert F.linear(flow.tensor(X), flow.tensor(W)).dtype == flow.float32
        with flow.autocast("cuda"):  # a CUDA autocast leaves CPU tensors alone
            assert F.linear(flow.tensor(X), flow.tensor(W)).dtype == flow.float32
    assert not flow.amp.is_autocast_enabled()

    @flow.amp.autocast("cpu", dtype=flow.float16)
    def f(a, b):
        return a @ b

    assert f(flow.tensor(X), flow.tensor(W.T)).dtype == flow.float16
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        flow.autocast("cpu", dtype=flow.float32)
    with pytest.raises(ValueError, match="device_type"):
        flow.autocast("tpu")


# ------------------------------------------------------------------ GradScaler
def _grads_for_step(i):
    g = rng.standard_normal((3, 2)).astype(np.float32)
    if i in (2, 5):
        g[1, 0] = np.inf if i == 2 else np.nan
    return g


def test_grad_scaler_matches_torch_step_by_step():
    w0 = rng.standard_normal((3, 2)).astype(np.float32)
    w, tw = flow.tensor(w0, requires_grad=True), torch.tensor(w0, requires_grad=True)
    opt, topt = flow.optim.SGD([w], lr=0.1), torch.optim.SGD([tw], lr=0.1)
    kw = dict(init_scale=2.0 ** 4, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
    scaler, tscaler = flow.amp.GradScaler(**kw), torch.amp.GradScaler("cpu", **kw)
    for i in range(10):
        g = _grads_for_step(i)
        for param, sc, make in ((w, scaler, flow.tensor), (tw, tscaler, torch.tensor)):
            param.grad = None
            sc.scale((param * make(g)).sum()).backward()  # the gradient is g times the scale
        before = w.detach().numpy().copy()
        scaler.step(opt)
        tscaler.step(topt)
        skipped = scaler.found_inf(opt)
        assert skipped == (i in (2, 5))
        if skipped:
            np.testing.assert_array_equal(w.detach().numpy(), before)  # the step was skipped
        scaler.update()
        tscaler.update()
        assert scaler.get_scale() == tscaler.get_scale(), (i, scaler.get_scale(), tscaler.get_scale())
        np.testing.assert_allclose(w.detach().numpy(), tw.detach().numpy(), rtol=1e-6)
    # halved at the infs (steps 2, 5), doubled after 3 clean steps in a row (after steps 8)
    assert scaler.get_scale() == 2.0 ** 4 * 0.5 * 0.5 * 2


def test_grad_scaler_unscale_clip_state_and_disabled():
    w = flow.tensor(np.ones((2, 2), np.float32), requires_grad=True)
    opt = flow.optim.SGD([w], lr=1.0)
    scaler = flow.amp.GradScaler(init_scale=8.0)
    scaler.scale((w * 3.0).sum()).backward()
    np.testing.assert_array_equal(w.grad.numpy(), 24.0)
    scaler.unscale_(opt)
    np.testing.assert_array_equal(w.grad.numpy(), 3.0)  # clip_grad_norm_ would see true gradients here
    with pytest.raises(RuntimeError, match="already been called"):
        scaler.unscale_(opt)
    scaler.step(opt)  # does not unscale a second time
    np.testing.assert_array_equal(w.detach().numpy(), -2.0)
    scaler.update()
    state = scaler.state_dict()
    other = flow.amp.GradScaler()
    other.load_state_dict(state)
    assert other.get_scale() == 8.0 and other.state_dict() == state
    off = flow.amp.GradScaler(enabled=False)
    loss = (w * 2.0).sum()
    assert off.scale(loss) is loss and off.get_scale() == 1.0 and off.state_dict() == {}


@pytest.mark.parametrize("model_name", ["gpt2", "bert_pretraining", "bert_classification", "vit", "swin"])
@pytest.mark.parametrize("dt", [flow.bfloat16, flow.float16], ids=["bfloat16", "float16"])
def test_every_model_trains_under_autocast_with_float32_master_gradients(model_name, dt):
    """Each model's loss under autocast is close to float32's, and every parameter's gradient is
    float32 and close to float32's (the models of tests/distributed/test_pipeline.py)."""
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "distributed"))
    import test_pipeline as models

    make = {"gpt2": models._gpt, "bert_pretraining": lambda: models._bert("BertForPreTraining"),
            "bert_classification": lambda: models._bert("BertForSequenceClassification"),
            "vit": lambda: models._vision("vit"), "swin": lambda: models._vision("swin")}[model_name]
    results = []
    for enabled in (False, True):
        flow.manual_seed(0)
        model, batch = make()
        with flow.autocast("cpu", dtype=dt, enabled=enabled):
            out = model(**batch)
        loss = out.get("total_loss", out.get("losses", out.get("lm_loss", out.get("loss"))))
        assert loss.dtype == flow.float32
        loss.backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        assert all(g.dtype == flow.float32 for g in grads.values())
        results.append((float(loss.item()), grads))
    (ref, ref_grads), (got, got_grads) = results
    assert abs(got - ref) <= 1e-3 * abs(ref)  # measured at most 2.3e-4 (Swin, bfloat16)
    scale = max(float(g.abs().max()) for g in ref_grads.values())
    # gradients within a fraction of the largest one: measured at most 1.7e-2 (bfloat16, 8 bits)
    # and 3.3e-3 (float16, 11 bits)
    tol = 3e-2 if dt == flow.bfloat16 else 5e-3
    for n, g in ref_grads.items():
        np.testing.assert_allclose(got_grads[n].numpy(), g.numpy(), atol=tol * scale, err_msg=n)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("placement", ["local", "global"])
def test_cuda_autocast_cross_entropy_reads_float16_logits_itself(cuda_double, reduction, placement):
    """Under a CUDA autocast the fused cross-entropy kernel reads float16 logits as float32 (no
    cast of the logits, none of their gradient back): the loss is float32 and the loss and the
    float16 gradient are bit for bit those of casting to float32 first (PyTorch's policy), with
    two fewer passes over the logits; ignored targets included."""
    from engine.kernels import cross_entropy as ce_kernels

    logits = (rng.standard_normal((12, 37)) * 3).astype(np.float16)
    target = np.array([3, 0, 36, -100, 5, 5, 17, 1, -100, 30, 2, 9])
    g = rng.standard_normal(12).astype(np.float32) if reduction == "none" else None

    def run(autocast):
        x = flow.tensor(logits, device="cuda")
        t = flow.tensor(target, device="cuda")
        if placement == "global":
            p = flow.placement("cuda", [0])
            x, t = x.to_global(p, flow.sbp.broadcast), t.to_global(p, flow.sbp.broadcast)
        x.requires_grad_(True)
        calls = []
        real = ce_kernels.cross_entropy_fwd
        ce_kernels.cross_entropy_fwd = lambda x2, *a: calls.append(x2.dtype) or real(x2, *a)
        try:
            with flow.autocast("cuda", dtype=flow.float16, enabled=autocast):
                loss = F.cross_entropy(x if autocast else x.float(), t, reduction=reduction)
        finally:
            ce_kernels.cross_entropy_fwd = real
        loss.backward(flow.tensor(g, device="cuda").to_global(p, flow.sbp.broadcast) if g is not None and
                      placement == "global" else flow.tensor(g, device="cuda") if g is not None else None)
        grad = x.grad.to_local() if placement == "global" else x.grad
        return loss, grad, calls

    loss, grad, calls = run(autocast=True)
    ref_loss, ref_grad, _ = run(autocast=False)
    assert calls == [np.float16]  # the kernel got the float16 logits
    assert loss.dtype == flow.float32 and grad.dtype == flow.float16
    local = loss.to_local() if placement == "global" else loss
    ref_local = ref_loss.to_local() if placement == "global" else ref_loss
    np.testing.assert_array_equal(local.detach().cpu().numpy(), ref_local.detach().cpu().numpy())
    np.testing.assert_array_equal(grad.cpu().numpy(), ref_grad.cpu().numpy())


def test_fused_cross_entropy_refuses_logits_changed_in_place_before_the_backward(cuda_double):
    """The CUDA kernel recomputes the gradient from the logits, so they are saved: an in-place
    change between forward and backward is the usual error, not a silently wrong gradient."""
    x = flow.tensor(rng.standard_normal((4, 16)).astype(np.float32), device="cuda", requires_grad=True)
    y = x * 1.0
    loss = F.cross_entropy(y, flow.tensor(np.array([1, 0, 15, 3]), device="cuda"))
    with flow.no_grad():
        y.mul_(3.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


# ------------------------------------------------------------------ GradScaler on a GPU, no host read
SKIPPED_STEPS = (0, 3, 4, 9)  # the very first step too: torch then keeps no optimizer state


def _grads_on_device_steps(i, shape):
    g = np.random.default_rng(100 + i).standard_normal(shape).astype(np.float32)
    if i in SKIPPED_STEPS:
        g.reshape(-1)[i % g.size] = np.nan if i % 2 else np.inf
    return g


@pytest.mark.parametrize("clip", [False, True])
def test_grad_scaler_on_cuda_skips_on_the_device_as_torch_on_the_host(cuda_double, clip):
    """On CUDA (the CuPy double) GradScaler + AdamW never read the inf/nan flag inside a step:
    the unscale raises it on the device, the AdamW kernel skips on it, the scale is updated on
    the device; the host learns each flag a step later. Against torch's GradScaler + AdamW on
    the CPU, step by step with inf/nan at steps 0, 3, 4 and 9 and growth every 2 clean steps:
    the same parameters, scale (get_scale) and step counts (a skipped first step leaves no
    state, as torch's), and no host synchronisation in any step (the one wait per step is for
    the previous step's flag, queued before the step began)."""
    stats = cuda_double._double.stats
    shapes = [(3, 4), (5,)]
    w0 = [np.random.default_rng(7 + k).standard_normal(s).astype(np.float32) for k, s in enumerate(shapes)]
    ws = [flow.tensor(a, device="cuda", requires_grad=True) for a in w0]
    tws = [torch.tensor(a, requires_grad=True) for a in w0]
    opt = flow.optim.AdamW(ws, lr=0.05, weight_decay=0.1)
    topt = torch.optim.AdamW(tws, lr=0.05, weight_decay=0.1)
    kw = dict(init_scale=2.0 ** 3, growth_factor=2.0, backoff_factor=0.5, growth_interval=2)
    scaler, tscaler = flow.amp.GradScaler("cuda", **kw), torch.amp.GradScaler("cpu", **kw)
    for i in range(12):
        grads = [_grads_on_device_steps(i, s) for s in shapes]
        for params, sc, make in ((ws, scaler, lambda a: flow.tensor(a, device="cuda")), (tws, tscaler, torch.tensor)):
            for p in params:
                p.grad = None
            loss = sum((p * make(g)).sum() for p, g in zip(params, grads))
            stats.reset()
            clock = type(stats).clock
            sc.scale(loss).backward()  # the gradients are the grads times the scale
            if clip:
                sc.unscale_(opt if params is ws else topt)
                (flow if params is ws else torch).nn.utils.clip_grad_norm_(params, 1.0)
            sc.step(opt if params is ws else topt)
            sc.update()
            if params is ws:
                kernels = {k.split("__")[0]: n for k, n in stats.by_name.items() if k.startswith("engine_")}
                assert kernels == {"engine_grad_unscale": 1, "engine_adamw": 1, "engine_amp_update_scale": 1,
                                   **({"engine_grad_norm_partial": 1, "engine_grad_norm_finish": 1,
                                       "engine_grad_scale": 1} if clip else {})}, kernels
                assert stats.syncs == 0, stats.sync_sites
                assert all(stamp < clock for stamp in stats.event_waits), (stats.event_waits, clock)
        assert scaler.get_scale() == tscaler.get_scale(), (i, scaler.get_scale(), tscaler.get_scale())
        for p, tp in zip(ws, tws):
            np.testing.assert_allclose(p.detach().cpu().numpy(), tp.detach().numpy(), rtol=2e-6, atol=1e-7,
                                       err_msg=f"step {i}")
        steps = {k: int(v["step"]) for k, v in opt.state_dict()["state"].items()}
        tsteps = {k: int(v["step"]) for k, v in topt.state_dict()["state"].items()}
        assert steps == tsteps, (i, steps, tsteps)
    # skipped at 0, 3, 4, 9 (scale halved), grown after each 2 clean steps in a row (1-2, 5-6, 7-8, 10-11)
    assert scaler.get_scale() == 2.0 ** 3 * 0.5 ** 4 * 2.0 ** 4
    assert scaler.state_dict() == {"scale": scaler.get_scale(), "growth_factor": 2.0, "backoff_factor": 0.5,
                                   "growth_interval": 2, "_growth_tracker": 0}


def test_grad_scaler_on_cuda_keeps_the_host_path_for_optimizers_without_a_flag(cuda_double):
    """SGD does not take the device flag: GradScaler.step reads it (the flag's one wait) and
    skips on the host, with torch's results."""
    w0 = np.arange(6, dtype=np.float32).reshape(2, 3)
    w, tw = flow.tensor(w0, device="cuda", requires_grad=True), torch.tensor(w0, requires_grad=True)
    opt, topt = flow.optim.SGD([w], lr=0.1), torch.optim.SGD([tw], lr=0.1)
    scaler, tscaler = flow.amp.GradScaler("cuda", init_scale=4.0), torch.amp.GradScaler("cpu", init_scale=4.0)
    for i in range(3):
        g = np.full((2, 3), np.inf if i == 1 else 1.0, np.float32)
        for p, sc, o, make in ((w, scaler, opt, lambda a: flow.tensor(a, device="cuda")), (tw, tscaler, topt, torch.tensor)):
            p.grad = None
            sc.scale((p * make(g)).sum()).backward()
            sc.step(o)
            sc.update()
        np.testing.assert_allclose(w.detach().cpu().numpy(), tw.detach().numpy(), rtol=1e-6)
        assert scaler.get_scale() == tscaler.get_scale()


def test_loss_scale_rule_matches_torch_update_scale():
    """engine.kernels.loss_scale.next_scale against torch._amp_update_scale_ (float32 scale,
    growth kept only when finite), including a growth that overflows float32."""
    from engine.kernels.loss_scale import next_scale

    cases = [(65536.0, 0, True), (65536.0, 1, False), (65536.0, 2, False), (3.3, 2, False), (3.3, 0, True),
             (3.0e38, 2, False), (1e-30, 5, True)]
    for scale, tracker, found in cases:
        ts, tt = torch.tensor([scale], dtype=torch.float32), torch.tensor([tracker], dtype=torch.int32)
        torch._amp_update_scale_(ts, tt, torch.tensor([float(found)]), 2.0, 0.5, 3)
        assert next_scale(scale, tracker, found, 2.0, 0.5, 3) == (ts.item(), tt.item()), (scale, tracker, found)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_grad_scaler_whose_scale_underflows_skips_every_step_as_torch(device, request):
    """A scale halved down to 0 (float32) makes the inverse scale inf, as torch's, and nothing
    raises (a ZeroDivisionError before). Every later step is skipped: the engine checks the
    unscaled gradient (0 * inf is NaN), where torch checks the scaled one (0, finite) and then
    steps with NaN gradients (its weights become NaN; the scale sequence is the same)."""
    if device == "cuda":
        request.getfixturevalue("cuda_double")
    w0 = np.ones((2, 2), np.float32)
    w, tw = flow.tensor(w0, device=device, requires_grad=True), torch.tensor(w0, requires_grad=True)
    opt, topt = flow.optim.AdamW([w], lr=0.1), torch.optim.AdamW([tw], lr=0.1)
    kw = dict(init_scale=3e-45, backoff_factor=0.5)
    scaler, tscaler = flow.amp.GradScaler(device, **kw), torch.amp.GradScaler("cpu", **kw)
    for i in range(4):
        g = np.full((2, 2), np.inf if i < 2 else 1.0, np.float32)
        for p, sc, o, make in ((w, scaler, opt, lambda a: flow.tensor(a, device=device)), (tw, tscaler, topt, torch.tensor)):
            p.grad = None
            sc.scale((p * make(g)).sum()).backward()
            sc.step(o)
            sc.update()
        assert scaler.get_scale() == tscaler.get_scale()
    assert scaler.get_scale() == 0.0
    assert np.isnan(tw.detach().numpy()).all()
    np.testing.assert_array_equal(w.detach().cpu().numpy(), w0)


def test_grad_scaler_steps_are_refused_inside_a_cuda_graph_capture(cuda_double):
    """Only the forward and the scaled backward may be captured: the scaler's device flag queues a
    copy to host memory and an event that a replay could not redo (the capture is refused with
    a clear error, not left to fail later)."""
    w = flow.tensor(np.ones((2, 3), np.float32), device="cuda", requires_grad=True)
    opt = flow.optim.AdamW([w], lr=0.1)
    scaler = flow.amp.GradScaler("cuda")
    scaler.scale((w * 2.0).sum()).backward()  # warm-up: the scale lives outside the graph
    scaler.step(opt)
    scaler.update()
    g = flow.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="GradScaler.unscale_.*inside a CUDA graph capture"):
        with flow.cuda.graph(g):
            scaler.scale((w * 2.0).sum()).backward()
            scaler.step(opt)


def test_grad_scaler_on_cuda_state_saved_right_after_a_skipped_step_resumes_exactly(cuda_double):
    """A checkpoint taken right after a skipped step, while its flag is still unread on the host:
    the optimizer's and the scaler's state dicts settle it first (the provisional step count taken
    back, the halved scale), so a run resumed from them continues exactly as the uninterrupted
    one (parameters, step counts, scale)."""
    shapes = [(4, 3), (6,)]
    w0 = [np.random.default_rng(40 + k).standard_normal(s).astype(np.float32) for k, s in enumerate(shapes)]

    def make():
        ws = [flow.tensor(a, device="cuda", requires_grad=True) for a in w0]
        return ws, flow.optim.AdamW(ws, lr=0.05), flow.amp.GradScaler("cuda", init_scale=8.0, growth_interval=2)

    def train(ws, opt, scaler, steps):
        for i in steps:
            for p in ws:
                p.grad = None
            grads = [flow.tensor(_grads_on_device_steps(i, s), device="cuda") for s in shapes]
            scaler.scale(sum((p * g).sum() for p, g in zip(ws, grads))).backward()
            scaler.step(opt)
            scaler.update()

    ws, opt, scaler = make()
    train(ws, opt, scaler, range(8))
    ws2, opt2, scaler2 = make()
    train(ws2, opt2, scaler2, range(5))  # step 4 was skipped (SKIPPED_STEPS)
    opt_state, scaler_state = opt2.state_dict(), scaler2.state_dict()
    assert {int(v["step"]) for v in opt_state["state"].values()} == {2}  # steps 1 and 2 taken; 0, 3, 4 skipped
    ws3, opt3, scaler3 = make()
    for p, q in zip(ws3, ws2):
        p.detach().copy_(q.detach())
    opt3.load_state_dict(opt_state)
    scaler3.load_state_dict(scaler_state)
    train(ws3, opt3, scaler3, range(5, 8))
    for p, q in zip(ws3, ws):
        np.testing.assert_array_equal(p.detach().cpu().numpy(), q.detach().cpu().numpy())
    assert scaler3.state_dict() == scaler.state_dict()
    assert [int(v["step"]) for v in opt3.state_dict()["state"].values()] == \
        [int(v["step"]) for v in opt.state_dict()["state"].values()]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_unscale_of_float16_gradients_multiplies_in_float32_as_torch(device, request):
    """float16 gradients are unscaled by torch's float32 inverse scale, the product rounded once:
    at a scale of 2^25 a float16 factor would be 0 (its smallest subnormal is 2^-24) and zero
    every gradient. Against torch._amp_foreach_non_finite_check_and_unscale_, bit for bit."""
    if device == "cuda":
        request.getfixturevalue("cuda_double")
    scale = 2.0 ** 25
    g = (np.random.default_rng(5).standard_normal((4, 5)) * 2000).astype(np.float16)
    p = flow.zeros((4, 5), dtype=flow.float16, device=device, requires_grad=True)
    p.grad = flow.tensor(g, device=device)
    scaler = flow.amp.GradScaler(device, init_scale=scale)
    opt = flow.optim.SGD([p], lr=0.1)
    scaler.unscale_(opt)
    tg, found = torch.tensor(g), torch.zeros(1)
    torch._amp_foreach_non_finite_check_and_unscale_([tg], found, torch.tensor([1.0 / scale]))
    got = p.grad.cpu().numpy()
    assert np.count_nonzero(got) > 10
    np.testing.assert_array_equal(got.view(np.uint16), tg.numpy().view(np.uint16))
    assert scaler.found_inf(opt) is False and found.item() == 0.0


@pytest.mark.parametrize("bad", [None, "cpu", "cuda"])
def test_grad_scaler_with_gradients_on_the_host_and_a_gpu(cuda_double, bad):
    """One optimizer over a CPU and a CUDA parameter: the host path unscales the CPU gradient by
    the kernel's numpy reference and the GPU one by the unscale kernel there (its flag read
    back), with torch's float32 inverse scale; an inf on either side skips the step."""
    g_cpu = np.full((2, 3), 6.0, np.float32)
    g_gpu = np.full((4,), 12.0, np.float16)
    if bad == "cpu":
        g_cpu[0, 0] = np.inf
    elif bad == "cuda":
        g_gpu[1] = np.inf
    p = flow.zeros((2, 3), requires_grad=True)
    q = flow.zeros(4, dtype=flow.float16, device="cuda", requires_grad=True)
    p.grad, q.grad = flow.tensor(g_cpu), flow.tensor(g_gpu, device="cuda")
    opt = flow.optim.SGD([p, q], lr=1.0)
    scaler = flow.amp.GradScaler("cuda", init_scale=3.0)
    stats = cuda_double._double.stats
    stats.reset()
    scaler.unscale_(opt)
    assert stats.by_name["engine_grad_unscale__half"] == 1
    assert scaler.found_inf(opt) == (bad is not None)
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(p.grad.numpy(), g_cpu * np.float32(1 / 3))
        np.testing.assert_array_equal(q.grad.cpu().numpy(),
                                      (g_gpu.astype(np.float32) * np.float32(1 / 3)).astype(np.float16))
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == (1.5 if bad else 3.0)
    np.testing.assert_array_equal(p.detach().numpy(), 0.0 if bad else -g_cpu / 3)
