"""engine.cuda.CUDAGraph / engine.cuda.graph: capture once, replay with one launch.

On the CPU the capture's rules run through the CuPy double (tests/cupy_double/_cuda.py): the
private memory pool is installed for the capture and the previous allocator restored, the
gradients the captured backward creates are recorded, host copies and host reads inside a
capture are refused with an error that says why, a failed capture leaves nothing behind, and
random draws on the GPU replay the numbers of the eager steps they stand for. The replays
(new inputs copied into the captured ones, a GPT-2 fp16 step replayed against an eager step
from the same state, training steps replayed against eager ones) run both
through the double, whose graphs replay the recorded work on the same memory (bit for bit), and
on a real GPU.
"""
import numpy as np
import pytest

import engine as flow
from engine import backend
from engine.ops import attention
from engine.ops.dropout import bias_dropout_add
from gpu_helper import real_cupy


def _small_capture(cp_module):
    x = flow.randn(4, 8, device="cuda")
    w = flow.randn(8, 3, device="cuda", requires_grad=True)
    g = flow.cuda.CUDAGraph()
    before = cp_module.cuda.get_allocator()
    with flow.cuda.graph(g):
        assert flow.cuda.is_current_stream_capturing()
        assert cp_module.cuda.get_allocator() is not before  # the graph's private pool
        loss = (x @ w).sum()
        loss.backward()
    assert cp_module.cuda.get_allocator() == before
    assert not flow.cuda.is_current_stream_capturing()
    return g, w, loss


def test_capture_installs_a_private_pool_and_records_new_gradients(cuda_double):
    g, w, _ = _small_capture(cuda_double)
    assert [(p, t) for p, t in g._grads.values()] == [(w, w.grad)]
    assert g.pool() is not None


@pytest.mark.parametrize("what", ["host copy", "item"])
def test_what_a_graph_cannot_hold_is_refused_and_the_capture_undone(cuda_double, what, monkeypatch):
    x = flow.randn(16, device="cuda")
    g = flow.cuda.CUDAGraph()
    before = cuda_double.cuda.get_allocator()
    expect = {"host copy": "Cause: a copy from cpu to cuda", "item": "Cause: cudaErrorStreamCaptureUnsupported"}[what]
    with pytest.raises(RuntimeError, match=expect):
        with flow.cuda.graph(g):
            if what == "host copy":
                flow.tensor(np.ones(3), device="cuda")
            else:
                (x * 2).sum().item()
    assert backend.capture_state() is None and not flow.cuda.is_current_stream_capturing()
    assert cuda_double.cuda.get_allocator() == before
    with pytest.raises(RuntimeError, match="nothing captured"):
        g.replay()
    _small_capture(cuda_double)  # a fresh capture works after a failed one


def _draws(what, x, qkv):
    """A step that draws random numbers on the GPU: its outputs and, for the ops with a backward
    that draws them again (no mask kept), the input gradients."""
    if what == "dropout":
        return [flow.nn.functional.dropout(x, 0.5, training=True)]
    if what == "rand":
        return [flow.rand(5, 7, device="cuda") + flow.randn(3, device="cuda").sum()]
    if what == "bias dropout add":  # draws in its kernel, and again in the backward's
        y = bias_dropout_add(x, None, x, 0.5)
        (gx,) = flow.autograd.grad(y.sum(), [x])
        return [y, gx]
    with flow.autocast("cuda", dtype=flow.float16):  # flash attention: forward, dq and dkdv draw
        y = flow.nn.functional.packed_qkv_attention(qkv, 2, dropout_p=0.3, causal=True)
    (gq,) = flow.autograd.grad(y.float().sum(), [qkv])
    return [y, gq]


@pytest.mark.parametrize("what", ["dropout", "rand", "bias dropout add", "flash dropout"])
def test_random_draws_replay_the_numbers_of_the_eager_steps(backend_name, what, monkeypatch):
    """Graph-safe Philox: a captured draw reads its stream's position from device memory, so each
    replay draws new numbers, exactly those eager steps draw from the same generator state, and
    leaves the generator where they leave it. Replays copy nothing to the device (two fill
    kernels write the position); a reseed between replays is followed."""
    monkeypatch.setattr(attention, "FLASH_ATTENTION_ON_GPU", True)
    x = flow.randn(16, 8, device="cuda", requires_grad=True)
    qkv = flow.randn(2, 8, 3 * 2 * 16, device="cuda", requires_grad=True)
    host = lambda outs: [o.detach().cpu().numpy() for o in outs]  # noqa: E731

    flow.manual_seed(11)
    eager = [host(_draws(what, x, qkv)) for _ in range(3)]
    eager_state = flow.get_rng_state()["cuda"]
    flow.manual_seed(5)
    eager_reseeded = host(_draws(what, x, qkv))

    flow.manual_seed(11)
    g = flow.cuda.CUDAGraph()
    with flow.cuda.graph(g):
        outs = _draws(what, x, qkv)
    stats = backend.cupy()._double.stats if backend_name == "double" else None
    replayed = []
    for i in range(3):
        if stats is not None:
            stats.reset()
        g.replay()
        if stats is not None:  # the stream's position: written by kernels queued before the replay
            assert stats.h2d == 0 and stats.by_name["fill"] == 2, (i, stats.h2d, stats.by_name)
        replayed.append(host(outs))
    assert flow.get_rng_state()["cuda"] == eager_state
    for step, (got, want) in enumerate(zip(replayed, eager)):
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b, err_msg=f"{what}, replay {step}")
    assert not np.array_equal(replayed[0][0], replayed[1][0])  # new numbers at every replay
    flow.manual_seed(5)
    g.replay()
    for a, b in zip(host(outs), eager_reseeded):
        np.testing.assert_array_equal(a, b, err_msg=f"{what}, after a reseed")


def test_an_eager_backward_after_a_replay_redraws_the_replays_numbers(backend_name):
    """A captured forward whose backward draws again (bias + dropout + add keeps no mask), its
    backward run eagerly after each replay: the stream position stays in device memory until the
    next replay, so the backward drops what that replay's forward dropped."""
    x = flow.ones(64, device="cuda", requires_grad=True)
    g = flow.cuda.CUDAGraph()
    with flow.cuda.graph(g):
        y = bias_dropout_add(x, None, None, 0.5)
    masks = []
    for _ in range(2):
        g.replay()
        (gx,) = flow.autograd.grad(y.sum(), [x], retain_graph=True)
        kept = y.detach().cpu().numpy() != 0
        np.testing.assert_array_equal(gx.cpu().numpy() != 0, kept)
        masks.append(kept)
    assert not np.array_equal(*masks)


def test_checkpointed_dropout_in_a_graph_recomputes_the_forward_draws(backend_name):
    """Activation checkpointing inside a capture: the recomputation restores the RNG state saved
    at its forward, which inside a capture holds the stream's place in the graph, so the
    recomputed masks are the forward's and the gradients those of eager steps."""
    from engine.utils.checkpoint import checkpoint
    w = flow.randn(8, 8, device="cuda", requires_grad=True)
    x = flow.randn(16, 8, device="cuda")

    def step():
        y = checkpoint(lambda t, v: flow.nn.functional.dropout(t @ v, 0.5, training=True) @ v, x, w,
                       use_reentrant=False)
        (g,) = flow.autograd.grad((y * y).sum(), [w])
        return g

    flow.manual_seed(4)
    eager = [step().cpu().numpy() for _ in range(3)]
    flow.manual_seed(4)
    graph = flow.cuda.CUDAGraph()
    with flow.cuda.graph(graph):
        g = step()
    for i, want in enumerate(eager):
        graph.replay()
        np.testing.assert_array_equal(g.cpu().numpy(), want, err_msg=f"replay {i}")


def test_a_failed_capture_leaves_no_uncomputed_gradient(cuda_double):
    """The gradients a failed capture created were never computed: they are not left on the
    parameters (an eager step after the failure would accumulate into garbage)."""
    x = flow.randn(4, 8, device="cuda")
    w = flow.randn(8, 3, device="cuda", requires_grad=True)
    g = flow.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="Cause"):
        with flow.cuda.graph(g):
            (x @ w).sum().backward()
            (x * 2).sum().item()
    assert w.grad is None


def test_grad_scaler_refuses_to_make_its_scale_inside_a_capture(cuda_double):
    """The scale tensor must exist before capture (a fill recorded in the graph would reset it at
    every replay); once it does, scaling inside a capture is fine."""
    scaler = flow.amp.GradScaler("cuda")
    loss = flow.randn((), device="cuda")
    with pytest.raises(RuntimeError, match="call it once eagerly before capturing"):
        with flow.cuda.graph(flow.cuda.CUDAGraph()):
            scaler.scale(loss)
    scaler.scale(loss)
    with flow.cuda.graph(flow.cuda.CUDAGraph()):
        scaled = scaler.scale(loss)
    assert float(scaled) == float(loss) * scaler.get_scale()


def test_captures_do_not_nest_and_a_graph_captures_once(cuda_double):
    g, _, _ = _small_capture(cuda_double)
    with pytest.raises(RuntimeError, match="already holds a capture"):
        g.capture_begin()
    g.reset()
    outer = flow.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="do not nest"):
        with flow.cuda.graph(outer):
            flow.cuda.CUDAGraph().capture_begin()
    assert backend.capture_state() is None


# ------------------------------------------------------------------ replays: the double and a real GPU
@pytest.fixture(params=["double", "gpu"])
def backend_name(request):
    """Each replay test runs through the CuPy double (its graphs replay the recorded work on the
    same memory; numpy underneath, so results are bitwise reproducible) and on a real GPU."""
    from libai.utils import distributed as dist
    if request.param == "double":
        request.getfixturevalue("cuda_layers")
        yield "double"
        return
    if real_cupy() is None:
        pytest.skip("needs CuPy with a CUDA GPU")
    dist.set_device_type("cuda")
    try:
        yield "gpu"
    finally:
        dist.set_device_type("cpu")


def test_replay_recomputes_from_new_inputs_copied_in(backend_name):
    rng = np.random.default_rng()
    x = flow.tensor(rng.standard_normal((64, 32)).astype(np.float32), device="cuda")
    w = flow.tensor(rng.standard_normal((32, 16)).astype(np.float32), device="cuda", requires_grad=True)
    ((x @ w).relu().sum()).backward()  # warm-up
    w.grad = None
    g = flow.cuda.CUDAGraph()
    with flow.cuda.graph(g):
        out = (x @ w).relu()
        out.sum().backward()
    captured_grad = w.grad
    for _ in range(3):
        new = rng.standard_normal((64, 32)).astype(np.float32)
        x.copy_(flow.tensor(new, device="cuda"))
        w.grad = None  # replay gives the captured gradient tensor back
        g.replay()
        want = np.maximum(new.astype(np.float64) @ w.detach().cpu().numpy(), 0)
        np.testing.assert_allclose(out.detach().cpu().numpy(), want, rtol=1e-4, atol=1e-4)
        assert w.grad is captured_grad
        want_g = new.T.astype(np.float64) @ (want > 0)
        np.testing.assert_allclose(w.grad.cpu().numpy(), want_g, rtol=1e-4, atol=1e-3)


def _tiny_gpt2_fp16(vocab=256, seq=64, batch=4):
    """(model, forward_backward, optimizer, scaler) of a 2-layer GPT-2 on 'cuda' layers (the
    caller sets them), dropout off: forward_backward() = zero_grad(set_to_none) + fp16 autocast
    forward + GradScaler-scaled backward on a fixed batch, returning the loss."""
    from libai.models import GPTForPreTraining
    from libai.utils import distributed as dist

    flow.manual_seed(0)
    model = GPTForPreTraining(hidden_layers=2, vocab_size=vocab, hidden_size=64, ffn_hidden_size=256,
                              num_attention_heads=4, max_seq_length=seq, embedding_dropout_prob=0.0,
                              attention_dropout_prob=0.0, output_dropout_prob=0.0)
    model.train()
    opt = flow.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    scaler = flow.amp.GradScaler("cuda", init_scale=2.0 ** 10)
    placement = dist.get_layer_placement(0)
    ids = np.random.RandomState(0).randint(0, vocab, (batch, seq))
    x = flow.tensor(ids, placement=placement, sbp=flow.sbp.broadcast)
    y = flow.tensor(np.roll(ids, -1, 1), placement=placement, sbp=flow.sbp.broadcast)

    def forward_backward():
        opt.zero_grad(set_to_none=True)
        with flow.autocast("cuda", dtype=flow.float16):
            loss = model(x, y)["lm_loss"]
        scaler.scale(loss).backward()
        return loss

    return model, forward_backward, opt, scaler


def _train(graphed, steps, warmup=2):
    """Losses of `steps` fp16 training steps of the tiny GPT-2: all eager, or `warmup` eager and
    then forward + backward replayed from a capture (the optimizer step eager)."""
    model, forward_backward, opt, scaler = _tiny_gpt2_fp16()
    losses, g = [], None
    for i in range(steps):
        if graphed and i == warmup:
            g = flow.cuda.CUDAGraph()
            with flow.cuda.graph(g):
                static_loss = forward_backward()
        if g is not None:
            g.replay()
            loss = static_loss
        else:
            loss = forward_backward()
        scaler.step(opt)
        scaler.update()
        losses.append(float(loss))
    return np.array(losses)


def test_gpt2_fp16_replay_is_an_eager_step_from_the_same_state(backend_name):
    """One replay computes what an eager forward + backward computes from the same weights: the
    same loss (the forward has no atomics: bitwise or within 1e-6) and the same gradients, every
    parameter's given back (float16 products, embedding gradients summed with atomics: their
    order varies, so within 1e-3 of each gradient's norm)."""
    model, forward_backward, opt, scaler = _tiny_gpt2_fp16()
    for _ in range(2):
        forward_backward()
        scaler.step(opt)
        scaler.update()
    g = flow.cuda.CUDAGraph()
    with flow.cuda.graph(g):
        static_loss = forward_backward()
    g.replay()
    replayed = float(static_loss)
    graph_grads = {name: p.grad.cpu().numpy() for name, p in model.named_parameters()}
    eager = float(forward_backward())
    assert abs(replayed - eager) <= (0 if backend_name == "double" else 1e-6) * abs(eager), (replayed, eager)
    for name, p in model.named_parameters():
        want = p.grad.cpu().numpy().astype(np.float64)
        got = graph_grads[name].astype(np.float64)
        assert np.linalg.norm(got - want) <= 1e-3 * np.linalg.norm(want) + 1e-12, name


def test_gpt2_fp16_training_replayed_tracks_eager(backend_name):
    """Eight training steps, the last six replayed, against the same steps eager: the losses agree
    within 5e-5 relative. Eager itself is not bit-reproducible on a GPU (atomics in the embedding
    gradient; AdamW turns their last-bit differences in near-zero gradients into whole-step
    differences): measured on an H100 over 20 steps, eager against eager up to 9e-6 relative in
    the loss, replay against eager up to 6e-6, so the weights are not compared element-wise."""
    eager = _train(graphed=False, steps=8)
    graph = _train(graphed=True, steps=8)
    if backend_name == "double":  # numpy underneath: the replayed work is the eager work, bit for bit
        np.testing.assert_array_equal(graph, eager)
    np.testing.assert_allclose(graph, eager, rtol=5e-5)
    assert eager[-1] < eager[0]


def test_gpt2_fp16_forward_backward_captures_through_the_double(cuda_layers):
    """The whole fp16 GPT-2 forward + scaled backward goes through a capture under the double's
    rules: no CuPy cuBLAS call (the products go through engine.backend.cublas, run here on the
    double's memory by its numpy model of cuBLAS), no host copy, no host read. The captured values
    are the eager ones (the double runs the captured code as it goes)."""
    model, forward_backward, _, _ = _tiny_gpt2_fp16(vocab=128, seq=32, batch=2)
    eager = float(forward_backward())
    eager_grad = model.GPT_model.embeddings.token_embeddings.weight.grad.cpu().numpy()
    products = cuda_layers._double.stats.by_name["cublasGemm"]
    assert products > 0  # the products went through engine.backend.cublas
    g = flow.cuda.CUDAGraph()
    with flow.cuda.graph(g):
        loss = forward_backward()
    assert float(loss) == eager
    grads = {key: t for key, (_, t) in g._grads.items()}
    weight = model.GPT_model.embeddings.token_embeddings.weight
    assert id(weight) in grads
    np.testing.assert_array_equal(grads[id(weight)].cpu().numpy(), eager_grad)
    assert len(g._grads) == len([p for p in model.parameters() if p.requires_grad])


class _Scaled(flow.nn.Module):
    """loss = sum(dropout(x * w)) with its own generator (or none): enough to see each
    micro-batch's gradient and its dropout mask in the loss."""

    def __init__(self, generator=None):
        super().__init__()
        self.w = flow.nn.Parameter(flow.ones(8, device="cuda"))
        self.generator = generator

    def forward(self, x):
        y = x * self.w
        if self.generator is not None:
            y = flow.nn.functional.dropout(y, 0.5, generator=self.generator)
        return {"total_loss": y.sum()}


def _trainer_run(graph, model, batches, m, iters=4):
    """(the gradient before each update, each micro-batch's loss) of `iters` iterations."""
    from libai.engine.trainer import CUDAGraphTrainer, EagerTrainer
    from libai.utils import events
    opt = flow.optim.SGD(model.parameters(), lr=0.0)
    t = (CUDAGraphTrainer(model, batches, opt, warmup_iters=1, grad_acc_steps=m) if graph
         else EagerTrainer(model, batches, opt, m))
    grads, losses = [], []
    update, step = t.update, t.forward_backward

    def recorded_update():
        grads.append(model.w.grad.cpu().numpy().copy())
        update()

    def recorded_step(data):
        result = step(data)
        losses.append(float(result["total_loss"].item()))
        return result

    t.update, t.forward_backward = recorded_update, recorded_step
    with events.EventStorage(0):
        for _ in range(iters):
            t.run_step()
    return grads, losses


def test_accumulation_replays_add_every_micro_batch_also_when_a_later_one_is_captured_anew(cuda_double):
    """3 micro-batches whose second has other shapes than the third: the later graph is captured
    anew in the middle of each iteration, and no micro-batch's gradient is lost."""
    def batches():
        i = 0
        while True:
            n = 2 if i % 3 == 1 else 3
            i += 1
            yield {"x": flow.tensor(np.full((n, 8), float(i)), dtype=flow.float32, device="cuda")}

    eager, _ = _trainer_run(False, _Scaled(), batches(), 3)
    graph, _ = _trainer_run(True, _Scaled(), batches(), 3)
    for a, b in zip(graph, eager):
        np.testing.assert_array_equal(a, b)


def test_accumulation_replays_draw_from_any_generator_as_eager_steps(cuda_double):
    """Dropout from a generator of the model's own (not the default one), 2 micro-batches: each
    micro-batch's loss, its mask included, is the eager one."""
    def batches():
        while True:
            yield {"x": flow.ones(8, device="cuda")}

    _, eager = _trainer_run(False, _Scaled(flow.Generator().manual_seed(3)), batches(), 2)
    _, graph = _trainer_run(True, _Scaled(flow.Generator().manual_seed(3)), batches(), 2)
    assert graph == eager
