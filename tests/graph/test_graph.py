"""engine.nn.Graph against eager: the same bits over many steps, re-tracing, what it refuses."""
import copy

import numpy as np
import pytest

import engine as flow
from engine.autograd.trace import GraphTraceError
from engine.ops.op import Op


def mlp(p=0.1):
    flow.manual_seed(0)
    return flow.nn.Sequential(flow.nn.Linear(8, 32), flow.nn.GELU(), flow.nn.Dropout(p), flow.nn.LayerNorm(32),
                              flow.nn.Linear(32, 3))


class TrainGraph(flow.nn.Graph):
    def __init__(self, model, optimizer, scheduler=None):
        super().__init__()
        self.model = model
        self.add_optimizer(optimizer, lr_sch=scheduler)

    def build(self, x, y):
        loss = flow.nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        return loss


def batch(rng, n=6):
    return (flow.tensor(rng.standard_normal((n, 8)).astype(np.float32)), flow.tensor(rng.integers(0, 3, n)))


def eager_step(model, opt, x, y, scheduler=None):
    loss = flow.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    if any(g.get("clip_grad_max_norm") is not None for g in opt.param_groups):
        opt.clip_grad()
    opt.step()
    opt.zero_grad()
    if scheduler is not None:
        scheduler.step()
    return loss


def same_params(a, b):
    return all(np.array_equal(p.detach().numpy(), q.detach().numpy()) for p, q in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize("p", [0.0, 0.3], ids=["no-dropout", "dropout"])
def test_replay_equals_eager_bit_for_bit_over_20_steps(p):
    model = mlp(p)
    twin = copy.deepcopy(model)
    opt = flow.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    opt2 = flow.optim.AdamW(twin.parameters(), lr=1e-2, weight_decay=0.01)
    sched = flow.optim.lr_scheduler.StepLR(opt, 5, gamma=0.5)
    sched2 = flow.optim.lr_scheduler.StepLR(opt2, 5, gamma=0.5)
    graph = TrainGraph(model, opt, sched)
    rng = np.random.default_rng(0)
    for step in range(20):
        x, y = batch(rng)
        state = flow.get_rng_state()
        got = graph(x, y)
        flow.set_rng_state(state)  # eager draws the same dropout masks from the same state
        want = eager_step(twin, opt2, x, y, sched2)
        assert got.item() == want.item(), step
        assert same_params(model, twin), step
        assert got.grad_fn is None and not got.requires_grad
    assert graph.num_traces == 1
    assert all(q.grad is None for q in model.parameters())


def test_dropout_draws_new_masks_at_every_replay():
    model = mlp(0.5)
    graph = TrainGraph(model, flow.optim.SGD(model.parameters(), lr=0.0))
    x, y = batch(np.random.default_rng(0))
    losses = {graph(x, y).item() for _ in range(4)}  # lr 0: only the masks change the loss
    assert len(losses) == 4


def test_a_new_shape_or_mode_traces_again_and_old_ones_replay():
    model = mlp(0.0)
    twin = copy.deepcopy(model)
    opt, opt2 = flow.optim.SGD(model.parameters(), lr=0.1), flow.optim.SGD(twin.parameters(), lr=0.1)
    graph = TrainGraph(model, opt)
    rng = np.random.default_rng(1)
    for n, traces in ((4, 1), (6, 2), (4, 2), (6, 2), (5, 3)):
        x, y = batch(rng, n)
        assert graph(x, y).item() == eager_step(twin, opt2, x, y).item()
        assert graph.num_traces == traces
    model.eval()
    twin.eval()
    x, y = batch(rng, 4)
    assert graph(x, y).item() == eager_step(twin, opt2, x, y).item()
    assert graph.num_traces == 4  # eval() changes the signature
    assert same_params(model, twin)


def test_gradient_clipping_of_a_param_group():
    model = mlp(0.0)
    twin = copy.deepcopy(model)
    opt = flow.optim.SGD([{"params": list(model.parameters()), "clip_grad_max_norm": 0.05}], lr=0.5)
    opt2 = flow.optim.SGD([{"params": list(twin.parameters()), "clip_grad_max_norm": 0.05}], lr=0.5)
    graph = TrainGraph(model, opt)
    rng = np.random.default_rng(2)
    for _ in range(5):
        x, y = batch(rng)
        assert graph(x, y).item() == eager_step(twin, opt2, x, y).item()
    assert same_params(model, twin)


def test_gradients_accumulate_over_calls_without_an_optimizer():
    """A graph without an optimizer leaves its gradients in .grad; a second call adds to them as
    a second eager backward does (with a different shape: two traces)."""
    class Backward(flow.nn.Graph):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def build(self, x, y):
            loss = flow.nn.functional.cross_entropy(self.model(x), y)
            loss.backward()
            return {"loss": loss, "pair": (loss * 2, None)}

    model = mlp(0.0)
    twin = copy.deepcopy(model)
    graph = Backward(model)
    rng = np.random.default_rng(3)
    for n in (4, 4, 6):
        x, y = batch(rng, n)
        out = graph(x, y)
        flow.nn.functional.cross_entropy(twin(x), y).backward()
        assert set(out) == {"loss", "pair"} and out["pair"][1] is None
        assert out["pair"][0].item() == 2 * out["loss"].item()
    for p, q in zip(model.parameters(), twin.parameters()):
        np.testing.assert_array_equal(p.grad.numpy(), q.grad.numpy())


def test_gradient_accumulation_config_splits_the_batch():
    model = mlp(0.0)
    twin = copy.deepcopy(model)
    opt, opt2 = flow.optim.Adam(model.parameters(), lr=0.01), flow.optim.Adam(twin.parameters(), lr=0.01)
    graph = TrainGraph(model, opt)
    graph.config.set_gradient_accumulation_steps(3)
    rng = np.random.default_rng(4)
    for _ in range(3):
        x, y = batch(rng, 6)
        got = graph(x, y)
        for k in range(3):
            (flow.nn.functional.cross_entropy(twin(x[2 * k:2 * k + 2]), y[2 * k:2 * k + 2]) / 3).backward()
        opt2.step()
        opt2.zero_grad()
        assert tuple(got.shape) == (3,)
    assert same_params(model, twin)
    with pytest.raises(ValueError, match="input 0 has 5 rows along dim 0, not a multiple of 3"):
        graph(*batch(rng, 5))


def test_random_ops_and_inplace_writes_inside_build_are_replayed():
    class Noisy(flow.nn.Graph):
        def build(self, x):
            noise = flow.randn(*x.shape)
            mask = flow.zeros(*x.shape)
            mask[x > 0] = 1.0  # an in-place write on a tensor that needs no gradient
            mask.mul_(2.0)
            return x * mask + noise

    graph = Noisy()
    rng = np.random.default_rng(5)
    for _ in range(3):
        x = flow.tensor(rng.standard_normal((3, 4)).astype(np.float32))
        state = flow.get_rng_state()
        got = graph(x).numpy()
        flow.set_rng_state(state)
        noise = flow.randn(3, 4).numpy()
        mask = np.where(x.numpy() > 0, 2.0, 0.0).astype(np.float32)
        np.testing.assert_array_equal(got, x.numpy() * mask + noise)
    assert graph.num_traces == 1


def test_reading_a_computed_value_in_build_is_refused():
    class DataDependent(flow.nn.Graph):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def build(self, x):
            y = self.model(x)
            if y.sum().item() > 0:  # Python control flow on a value of the step
                return y * 2
            return y

    graph = DataDependent(mlp(0.0))
    with pytest.raises(GraphTraceError, match=r"item/tolist/bool/float/int\) on a tensor of shape \[\] computed "
                                              "inside the graph"):
        graph(batch(np.random.default_rng(0))[0])


class CountPositive(Op):
    """A kernel that keeps a data-dependent Python count for its backward."""

    name = "CountPositive"

    @staticmethod
    def forward(ctx, x):
        ctx.count = int((x > 0).sum())
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        return g / max(ctx.count, 1)


def test_a_kernel_whose_saved_python_values_change_at_replay_is_caught():
    class G(flow.nn.Graph):
        def build(self, x):
            return CountPositive.apply(x) * 3

    graph = G()
    graph(flow.tensor([1.0, -1.0, 2.0]))
    graph(flow.tensor([3.0, -1.0, 5.0]))  # the same count: replays
    with pytest.raises(GraphTraceError, match=r"kernel CountPositive .* computed count=1 where the trace saw 2"):
        graph(flow.tensor([1.0, -1.0, -2.0]))


def test_debug_prints_the_captured_kernels_and_planned_memory(capsys):
    model = mlp(0.1)
    graph = TrainGraph(model, flow.optim.SGD(model.parameters(), lr=0.1))
    graph.debug(1)
    graph(*batch(np.random.default_rng(0), 64))
    out = capsys.readouterr().out
    assert "TrainGraph:" in out and "kernel calls" in out and "planned peak" in out
    for kernel in ("Linear", "Gelu", "Dropout", "NativeLayerNorm", "AccumulateGrad", "CrossEntropyLoss"):
        assert kernel in out, kernel
    tape = graph.last_tape
    assert 0 < tape.planned_peak_bytes < tape.traced_bytes  # intermediates freed after their last reader
    assert "planned peak" in graph.summary() and "1 trace(s)" in repr(graph)


def test_compile_returns_a_graph_backed_callable():
    model = mlp(0.0).eval()
    compiled = flow.compile(model)
    x = batch(np.random.default_rng(0))[0]
    with flow.no_grad():
        want = model(x).numpy()
        for _ in range(3):
            np.testing.assert_array_equal(compiled(x).numpy(), want)
    assert compiled.graph.num_traces == 1


class AttentionStep(flow.nn.Graph):
    """Attention through both fused kernels, with inputs (a padding mask) that change per call."""

    def __init__(self, proj, dropout):
        super().__init__()
        self.proj = proj
        self.dropout = dropout

    def build(self, x, mask):
        qkv = self.proj(x)  # [b, s, heads * 3 * d]
        packed = flow.nn.functional.packed_qkv_attention(qkv, 2, mask=mask, dropout_p=self.dropout)
        q = qkv[..., :8].reshape(2, 5, 2, 4).permute(0, 2, 1, 3)
        sdpa = flow.nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=self.dropout, is_causal=True)
        loss = (packed * packed).sum() + (sdpa * sdpa).sum()
        loss.backward()
        return loss


@pytest.mark.parametrize("dropout", [0.0, 0.3], ids=["no-dropout", "dropout"])
def test_attention_kernels_replay_their_masks_and_saved_layouts(dropout):
    """What a kernel keeps for its backward beyond arrays (the packed core's layout with the
    padding mask, the tiled kernel's seed) is taken from each replay's own forward."""
    flow.manual_seed(0)
    proj = flow.nn.Linear(6, 24)
    twin = copy.deepcopy(proj)
    graph = AttentionStep(proj, dropout)
    rng = np.random.default_rng(7)
    for step in range(4):
        x = flow.tensor(rng.standard_normal((2, 5, 6)).astype(np.float32))
        pad = rng.integers(1, 5, 2)  # valid lengths: keys and query rows past them masked (whole rows)
        pos = np.arange(5)
        keys = pos[None, None, None, :] >= pad[:, None, None, None]
        mask = flow.tensor(keys | (pos[None, None, :, None] >= pad[:, None, None, None]))
        mask = mask if step % 2 else mask[:, :, :1].expand(2, 1, 5, 5)
        state = flow.get_rng_state()
        got = graph(x, mask.contiguous())
        flow.set_rng_state(state)
        want = AttentionStep.build(type("Eager", (), {"proj": twin, "dropout": dropout})(), x, mask.contiguous())
        assert got.item() == want.item(), step
        for p, q in zip(proj.parameters(), twin.parameters()):
            np.testing.assert_array_equal(p.grad.numpy(), q.grad.numpy())
            p.grad = q.grad = None
    assert graph.num_traces == 1


class NoisyKernel(Op):
    """A kernel that draws random numbers and applies another op inside itself."""

    name = "NoisyKernel"

    @staticmethod
    def forward(ctx, x):
        noise = flow.rand(*x.shape)  # a creation (a recorded draw, were it not inside a kernel)
        return (flow.nn.functional.dropout(flow.tensor(x), 0.5) + noise).numpy()

    @staticmethod
    def backward(ctx, g):
        return g


def test_what_a_kernel_does_inside_itself_is_replayed_once():
    """Ops applied and numbers drawn inside a kernel's forward belong to that kernel: a replay
    runs the kernel, which does them again, so they are not recorded a second time."""
    class G(flow.nn.Graph):
        def build(self, x):
            return NoisyKernel.apply(x) * 2

    graph = G()
    x = flow.ones(3, 4)
    for _ in range(3):
        state = flow.get_rng_state()
        got = graph(x).numpy()
        flow.set_rng_state(state)
        np.testing.assert_array_equal(got, (NoisyKernel.apply(x) * 2).numpy())
        assert not np.array_equal(got, graph(x).numpy())  # and the next replay draws anew
    assert graph.num_traces == 1 and len(graph.last_tape.entries) == 2


class GradsOnlyGraph(TrainGraph):
    """No optimizer: the gradients are left in .grad for the caller."""

    def __init__(self, model):
        flow.nn.Graph.__init__(self)
        self.model = model


class AmpGraph(TrainGraph):
    """OneFlow's float16 pattern: enable_amp + set_grad_scaler, a plain `loss.backward()` in build."""

    def __init__(self, model, optimizer, scaler, dtype=None):
        super().__init__(model, optimizer)
        self.config.enable_amp(True, dtype=dtype)
        self.set_grad_scaler(scaler)


@pytest.mark.parametrize("clip", [False, True], ids=["no-clip", "clip"])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # float16 overflows are the point
def test_float16_with_loss_scaling_replays_the_eager_scaler_steps(clip):
    """A start scale that overflows the float16 gradients: the first steps are skipped and the
    scale backs off, later ones grow it again (growth_interval=3). The graph seeds its backward
    with the scaler's *current* scale at every replay (a scale frozen at the trace would unscale
    wrongly once it changed), so losses, scales and parameters follow the eager loop bit for
    bit."""
    model = mlp(0.0)
    twin = copy.deepcopy(model)
    opt = flow.optim.AdamW(model.parameters(), lr=1e-2)
    opt2 = flow.optim.AdamW(twin.parameters(), lr=1e-2)
    if clip:
        for o in (opt, opt2):
            o.param_groups[0]["clip_grad_max_norm"] = 0.5
            o.param_groups[0]["clip_grad_norm_type"] = 2.0
    scaler, scaler2 = (flow.amp.GradScaler(init_scale=2.0 ** 19, growth_interval=3) for _ in range(2))
    graph = AmpGraph(model, opt, scaler)
    rng = np.random.default_rng(0)
    scales, skipped = [], 0
    for step in range(12):
        x, y = batch(rng, 16)
        got = graph(x, y)
        with flow.autocast("cpu", dtype=flow.float16):
            want = flow.nn.functional.cross_entropy(twin(x), y)
        scaler2.scale(want).backward()
        scaler2.unscale_(opt2)
        if clip:
            opt2.clip_grad()
        scaler2.step(opt2)
        skipped += scaler2.found_inf(opt2)
        scaler2.update()
        opt2.zero_grad(set_to_none=True)
        assert got.item() == want.item(), step
        assert scaler.get_scale() == scaler2.get_scale(), step
        assert same_params(model, twin), step
        scales.append(scaler.get_scale())
    assert 0 < skipped < 12 and len(set(scales)) >= 3, (skipped, scales)  # both paths were exercised
    assert graph.num_traces == 1


def test_amp_config_traces_under_autocast_and_static_scaler_keeps_its_scale():
    model = mlp(0.0)
    twin = copy.deepcopy(model)
    opt, opt2 = flow.optim.SGD(model.parameters(), lr=0.1), flow.optim.SGD(twin.parameters(), lr=0.1)
    scaler, scaler2 = flow.amp.StaticGradScaler(1024.0), flow.amp.StaticGradScaler(1024.0)
    graph = AmpGraph(model, opt, scaler, dtype=flow.bfloat16)
    rng = np.random.default_rng(1)
    for _ in range(3):
        x, y = batch(rng)
        got = graph(x, y)
        with flow.autocast("cpu", dtype=flow.bfloat16):
            want = flow.nn.functional.cross_entropy(twin(x), y)
        scaler2.scale(want).backward()
        scaler2.step(opt2)
        scaler2.update()
        opt2.zero_grad()
        assert got.item() == want.item()
    assert same_params(model, twin) and scaler.get_scale() == 1024.0
    assert any(e.label == "ToCopy" or "Cast" in e.label for e in graph.last_tape.entries)  # the autocast casts
    graph.config.enable_amp(False)
    graph(*batch(rng))  # a new autocast mode is a new signature
    assert graph.num_traces == 2
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        graph.config.enable_amp(True, dtype=flow.float32)
    with pytest.raises(ValueError, match="scale_factor must be a positive finite number"):
        flow.amp.StaticGradScaler(0.0)


def test_a_grad_scaler_without_optimizer_leaves_the_gradients_scaled():
    model = mlp(0.0)
    twin = copy.deepcopy(model)

    graph = GradsOnlyGraph(model)
    graph.set_grad_scaler(flow.amp.StaticGradScaler(8.0))
    x, y = batch(np.random.default_rng(2))
    graph(x, y)
    (flow.nn.functional.cross_entropy(twin(x), y) * 8.0).backward()
    for p, q in zip(model.parameters(), twin.parameters()):
        assert np.array_equal(p.grad.numpy(), q.grad.numpy())


def replays_eager(graph, model, twin, opt2, rng, steps, input_grads=False):
    """`steps` graph calls against eager steps of `twin` from the same random state: equal losses
    and parameters (and input gradients) after each."""
    for step in range(steps):
        x, y = batch(rng)
        x2 = x
        if input_grads:
            x.requires_grad_()
            x2 = x.detach().requires_grad_()
        state = flow.get_rng_state()
        got = graph(x, y)
        flow.set_rng_state(state)
        want = eager_step(twin, opt2, x2, y)
        assert got.item() == want.item(), step
        assert same_params(model, twin), step
        if input_grads:
            assert np.array_equal(x.grad.numpy(), x2.grad.numpy()), step


class CheckpointedMLP(flow.nn.Module):
    """Two blocks with dropout, the first recomputed in backward (activation checkpointing)."""

    def __init__(self, p):
        super().__init__()
        self.block = flow.nn.Sequential(flow.nn.Linear(8, 32), flow.nn.GELU(), flow.nn.Dropout(p))
        self.head = flow.nn.Sequential(flow.nn.Dropout(p), flow.nn.Linear(32, 3))

    def forward(self, x):
        return self.head(flow.utils.checkpoint.checkpoint(self.block, x))


@pytest.mark.parametrize("p", [0.0, 0.4], ids=["no-dropout", "dropout"])
def test_activation_checkpointing_inside_a_graph_replays_the_eager_steps(p):
    """The recomputation must draw the dropout masks its forward drew *at this replay*: the
    random state is saved and swapped by calls recorded in the trace, not frozen at it. Input
    needs grad too, so the checkpoint's input gradient flows on."""
    flow.manual_seed(0)
    model = CheckpointedMLP(p)
    twin = copy.deepcopy(model)
    opt = flow.optim.AdamW(model.parameters(), lr=1e-2)
    opt2 = flow.optim.AdamW(twin.parameters(), lr=1e-2)
    graph = TrainGraph(model, opt)
    replays_eager(graph, model, twin, opt2, np.random.default_rng(0), 10, input_grads=True)
    labels = [e.label for e in graph.last_tape.entries]
    assert labels.count("SaveRNGState") == labels.count("RestoreRNGState") == labels.count("ResumeRNGState") == 1
    assert graph.num_traces == 1


def test_inputs_that_require_grad_get_their_gradients_at_every_replay():
    model = mlp(0.0)
    twin = copy.deepcopy(model)

    graph = GradsOnlyGraph(model)
    rng = np.random.default_rng(3)
    for step in range(3):
        x, y = batch(rng)
        x.requires_grad_()
        x2 = x.detach().requires_grad_()
        if step == 2:  # a gradient it already holds is added to, as eagerly
            x.grad, x2.grad = flow.ones_like(x), flow.ones_like(x2)
        graph(x, y)
        flow.nn.functional.cross_entropy(twin(x2), y).backward()
        assert np.array_equal(x.grad.numpy(), x2.grad.numpy()), step
    assert graph.num_traces == 1
    # an input computed outside the graph: the step's gradient flows on into that code
    w = flow.tensor(rng.standard_normal(8).astype(np.float32)).requires_grad_()
    w2 = w.detach().requires_grad_()
    x, y = batch(rng)
    for _ in range(2):
        graph(x * w, y)
        flow.nn.functional.cross_entropy(twin(x * w2), y).backward()
    assert np.array_equal(w.grad.numpy(), w2.grad.numpy())
    # micro-batches of an input that requires grad (views made outside the graph)
    graph.config.set_gradient_accumulation_steps(2)
    x.requires_grad_()
    x2 = x.detach().requires_grad_()
    graph(x, y)
    for k in range(2):
        (flow.nn.functional.cross_entropy(twin(x2[3 * k:3 * k + 3]), y[3 * k:3 * k + 3]) / 2).backward()
    assert np.allclose(x.grad.numpy(), x2.grad.numpy(), rtol=1e-6, atol=1e-7)


def test_oneflow_graph_module_settings_turn_on_activation_checkpointing():
    """OneFlow's `self.block.to(nn.graph.GraphModule).activation_checkpointing = True` in a
    graph's __init__: the block recomputes in backward (its random state swapped by the trace),
    the numbers stay eager's; `to(nn.Module)` gives the module back."""
    flow.manual_seed(0)
    model = flow.nn.Sequential(flow.nn.Sequential(flow.nn.Linear(8, 32), flow.nn.GELU(), flow.nn.Dropout(0.3)),
                               flow.nn.Linear(32, 3))
    twin = copy.deepcopy(model)
    opt, opt2 = (flow.optim.SGD(m.parameters(), lr=0.1) for m in (model, twin))

    class G(TrainGraph):
        def __init__(self):
            super().__init__(model, opt)
            block = self.model[0].to(flow.nn.graph.GraphModule)
            block.activation_checkpointing = True
            assert block.activation_checkpointing and block.to(flow.nn.Module) is model[0]

    graph = G()
    assert model[0].to(flow.nn.Module) is model[0]
    copied = copy.deepcopy(model)  # the checkpointed forward follows the copy
    assert copied[0].forward.__self__ is copied[0]
    replays_eager(graph, model, twin, opt2, np.random.default_rng(5), 4)
    assert [e.label for e in graph.last_tape.entries].count("RestoreRNGState") == 1
    gm = model[0].to(flow.nn.graph.GraphModule)
    gm.activation_checkpointing = False
    assert "forward" not in model[0].__dict__ and not gm.activation_checkpointing
    with pytest.raises(AttributeError, match="GraphModule has no setting 'stage'"):
        gm.stage = 1


def test_graph_module_set_stage_agrees_with_the_placement_or_is_refused():
    """OneFlow's `set_stage(stage_id, placement)`: a pipeline is captured per stage here, so a
    stage that agrees with where the module's parameters are placed is recorded, and one that
    would move them is refused naming the parameter and both placements."""
    p0, p1 = flow.placement("cpu", ranks=[0]), flow.placement("cpu", ranks=[1])
    block = flow.nn.Linear(2, 3).to_global(placement=p0, sbp=flow.sbp.broadcast)
    gm = block.to(flow.nn.graph.GraphModule)
    assert gm.stage_id is None
    gm.set_stage(0, p0)
    assert gm.stage_id == 0 and block.to(flow.nn.graph.GraphModule).stage_id == 0
    flow.nn.GELU().to(flow.nn.graph.GraphModule).set_stage(1, p1)  # no parameters: nothing to move
    with pytest.raises(NotImplementedError, match=r"parameter 'weight' of Linear is placed on .*ranks=\[0\].*"
                                                  r"stage's .*ranks=\[1\].*not implemented"):
        gm.set_stage(1, p1)
    assert gm.stage_id == 0
    with pytest.raises(ValueError, match="stage_id must be a non-negative int, got -1"):
        gm.set_stage(-1, p0)
    with pytest.raises(AttributeError, match="has no setting 'stage_id'"):
        gm.stage_id = 2


@pytest.mark.parametrize("in_graph", [False, True], ids=["eager", "graph"])
def test_checkpointing_under_autocast_recomputes_in_the_first_runs_dtypes(in_graph):
    """The recomputation runs under the autocast of the first run (backward itself has none),
    so its outputs have the first run's dtypes, and the numbers are the unchecked run's."""
    flow.manual_seed(0)
    plain = flow.nn.Sequential(flow.nn.Linear(8, 32), flow.nn.GELU(), flow.nn.Linear(32, 3))
    ckpt = copy.deepcopy(plain)
    ckpt[0].to(flow.nn.graph.GraphModule).activation_checkpointing = True
    opt, opt2 = (flow.optim.SGD(m.parameters(), lr=0.1) for m in (ckpt, plain))

    class Bf16(TrainGraph):
        def __init__(self):
            super().__init__(ckpt, opt)
            self.config.enable_amp(True, dtype=flow.bfloat16)

    graph = Bf16()
    rng = np.random.default_rng(6)
    for step in range(3):
        x, y = batch(rng)
        if in_graph:
            got = graph(x, y)
        else:
            with flow.autocast("cpu", dtype=flow.bfloat16):
                got = flow.nn.functional.cross_entropy(ckpt(x), y)
            got.backward()
            opt.step()
            opt.zero_grad()
        with flow.autocast("cpu", dtype=flow.bfloat16):
            want = flow.nn.functional.cross_entropy(plain(x), y)
        want.backward()
        opt2.step()
        opt2.zero_grad()
        assert got.item() == want.item(), step
        assert same_params(ckpt, plain), step


def test_checkpoint_gives_tensors_passed_by_keyword_their_gradients():
    lin = flow.nn.Linear(4, 4)
    h0 = flow.tensor(np.random.default_rng(7).standard_normal((2, 4)).astype(np.float32)).requires_grad_()
    grads = []
    for use_checkpoint in (True, False):
        h0.grad = None
        h = h0 * 2  # not a leaf: its gradient must reach h0 through the outer graph
        y = (flow.utils.checkpoint.checkpoint(lambda input: lin(input).tanh(), input=h) if use_checkpoint
             else lin(h).tanh()) + h
        y.sum().backward()
        grads.append(h0.grad.numpy().copy())
    assert np.allclose(grads[0], grads[1], rtol=1e-6, atol=1e-7)


def test_a_block_checkpointed_twice_in_a_graph_sums_its_parameters_gradients():
    """A shared block: each checkpoint's recomputation gives the same parameters a gradient,
    recorded as a sum at the second one."""
    flow.manual_seed(0)
    block = flow.nn.Sequential(flow.nn.Linear(8, 8), flow.nn.Tanh())
    head = flow.nn.Linear(8, 3)
    model = flow.nn.ModuleList([block, head])
    twin = copy.deepcopy(model)

    class Twice(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model

        def build(self, x, y):
            ck = flow.utils.checkpoint.checkpoint
            loss = flow.nn.functional.cross_entropy(self.model[1](ck(self.model[0], ck(self.model[0], x))), y)
            loss.backward()
            return loss

    graph = Twice()
    rng = np.random.default_rng(8)
    for _ in range(3):
        x, y = batch(rng)
        graph(x, y)
        flow.nn.functional.cross_entropy(twin[1](twin[0](twin[0](x))), y).backward()
        for p, q in zip(model.parameters(), twin.parameters()):
            assert np.allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-6, atol=1e-7)
        for m in (model, twin):
            for p in m.parameters():
                p.grad = None
    assert graph.num_traces == 1


def test_another_grad_scaler_retraces_and_explicit_gradients_are_scaled():
    model = mlp(0.0)
    twin = copy.deepcopy(model)
    graph = GradsOnlyGraph(model)
    x, y = batch(np.random.default_rng(9))
    for factor in (4.0, 1024.0):
        graph.set_grad_scaler(flow.amp.StaticGradScaler(factor))
        graph(x, y)
        (flow.nn.functional.cross_entropy(twin(x), y) * factor).backward()
        for p, q in zip(model.parameters(), twin.parameters()):
            assert np.array_equal(p.grad.numpy(), q.grad.numpy()), factor
            p.grad = q.grad = None
    assert graph.num_traces == 2

    class Explicit(GradsOnlyGraph):
        def build(self, x, y):
            loss = flow.nn.functional.cross_entropy(self.model(x), y)
            loss.backward(flow.ones_like(loss) * 0.5)
            return loss

    g = Explicit(model)
    g.set_grad_scaler(flow.amp.StaticGradScaler(8.0))
    g(x, y)
    want = flow.nn.functional.cross_entropy(twin(x), y)
    (want * 8.0).backward(flow.ones_like(want) * 0.5)
    for p, q in zip(model.parameters(), twin.parameters()):
        assert np.array_equal(p.grad.numpy(), q.grad.numpy())


def test_a_leaf_made_inside_build_gives_its_gradient_to_later_kernels_at_every_replay():
    """A leaf created in the step from a computed value (what a pipeline stage does with the
    activations it receives): its gradient is read by a later kernel of the step, and replays
    compute it anew instead of refusing a second gradient on the trace's leaf."""

    class StageGraph(flow.nn.Graph):
        def __init__(self, lin):
            super().__init__()
            self.lin = lin

        def build(self, x):
            h = (x * 2).detach().requires_grad_()  # a fresh leaf inside the step
            self.lin(h).square().sum().backward()
            return h.grad * 3  # a kernel that reads the leaf's gradient

    lin = flow.nn.Linear(4, 3)
    graph = StageGraph(lin)
    rng = np.random.default_rng(5)
    for _ in range(3):
        x = flow.tensor(rng.standard_normal((2, 4)).astype(np.float32))
        h = (x * 2).detach().requires_grad_()
        lin(h).square().sum().backward()
        want = h.grad.numpy() * 3
        lin.weight.grad = lin.bias.grad = None
        got = graph(x)
        assert np.array_equal(got.numpy(), want)
    assert graph.num_traces == 1


def test_a_replayed_pipeline_receive_refuses_a_header_it_did_not_trace(monkeypatch):
    """engine.distributed.pipeline: a replay receives the header first and compares it with the
    traced one, so a peer sending another shape is named instead of misread."""
    from engine.distributed import comm, pipeline as handoff
    from engine.distributed.global_tensor import GlobalMeta
    from engine.distributed.sbp import broadcast

    meta = GlobalMeta(flow.placement("cpu", [0]), (broadcast,), (2, 3))
    traced = handoff._encode(np.zeros((2, 3), np.float32), meta, True)
    sent = handoff._encode(np.zeros((4, 3), np.float32), GlobalMeta(meta.placement, (broadcast,), (4, 3)), True)
    monkeypatch.setattr(comm, "recv", lambda buf, src, tag=0: buf.__setitem__(slice(None), sent))
    op = handoff._Recv(src=1, tag=7101, device=None)
    op.expected = traced
    with pytest.raises(GraphTraceError, match=r"rank 1 sent \(tag 7101\) local shape \[4, 3\] where the trace "
                                              r"received \[2, 3\]; logical shape \[4, 3\] where the trace received "
                                              r"\[2, 3\]; every rank"):
        op()
    monkeypatch.setattr(comm, "recv", lambda buf, src, tag=0: buf.__setitem__(slice(None), 99))
    with pytest.raises(GraphTraceError, match="a header that is no tensor's"):
        op()


def test_planned_peak_counts_inputs_a_kernel_holds_until_a_later_entry():
    """A recorded function with `holds_inputs_until = label` (a pipeline send keeps its array
    until the schedule's wait) keeps its inputs live in the planned peak up to that entry."""
    from engine.autograd.grad_mode import _state

    n = 1000  # float32: 4,000 bytes per array

    class Send:
        holds_inputs_until = "Wait"

        def __call__(self, arr):
            pass

    class NoHold:
        def __call__(self, arr):
            pass

    def peak(sender):
        class G(flow.nn.Graph):
            def build(self, x):
                y = x * 2.0
                _state.tracer.call(sender, (y._data,), None, "Send")  # y's last reader
                a = x * 3.0
                b = a * 4.0
                c = b * 5.0
                _state.tracer.call(lambda: None, (), None, "Wait")
                return c

        graph = G()
        x = flow.tensor(np.ones(n, np.float32))
        out = graph(x)
        np.testing.assert_array_equal(out.numpy(), np.full(n, 60.0, np.float32))
        return graph.last_tape.planned_peak_bytes

    # without the hold two arrays of 4,000 bytes are live at once (a and b, then b and c);
    # held until "Wait", y is the third
    assert peak(NoHold()) == 2 * 4 * n
    assert peak(Send()) == 3 * 4 * n
