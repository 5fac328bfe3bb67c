"""Autocast's low-precision copies of parameters kept across steps (engine/ops/cast_cache.py).

The property that matters: whatever writes a parameter, a forward under autocast computes what it
computes with the cache off (`cache_enabled=False`, a cast at every use), bit for bit. Checked on
the CPU for each way the engine writes a parameter, for a copy still held by a backward that has
not run, for nn.Graph (whose replays update parameters without Python), and on CUDA through the
CuPy double: the fused AdamW kernel writes the float16 copies, so the next forward casts no
weight, and CUDA graph replays see the parameters' current values whichever optimizer ran.
"""
import gc

import numpy as np
import pytest

import engine as flow
from engine.ops import cast_cache


def _mlp(device="cpu", seed=0):
    flow.manual_seed(seed)
    return flow.nn.Sequential(flow.nn.Linear(12, 16), flow.nn.GELU(), flow.nn.Linear(16, 5)).to(device)


def _forward(model, x, cache, device_type="cpu", dtype=None):
    with flow.autocast(device_type, dtype=dtype, cache_enabled=cache):
        return model(x).float()


def _bits(t):
    return t.detach().cpu().numpy().copy()


def _copy_of(param, dtype=flow.bfloat16):
    return cast_cache._copies[id(param)][1][dtype.np]


def test_a_copy_is_reused_while_the_parameter_is_unchanged():
    model, x = _mlp(), flow.randn(3, 12)
    first = _bits(_forward(model, x, True))
    w = model[0].weight
    copy = _copy_of(w)
    buf = copy.buf
    np.testing.assert_array_equal(buf, w.detach().numpy().astype(flow.bfloat16.np))
    np.testing.assert_array_equal(_bits(_forward(model, x, True)), first)
    assert _copy_of(w) is copy and copy.buf is buf and copy.version == w._version
    np.testing.assert_array_equal(_bits(_forward(model, x, False)), first)


def _write(kind, model):
    """One way of writing model[0].weight (and for some, every parameter)."""
    w = model[0].weight
    if kind == "add_":
        with flow.no_grad():
            w.add_(0.25)
    elif kind == "data.mul_":
        w.data.mul_(-1.5)
    elif kind == "data =":
        w.data = flow.randn(*w.shape)
    elif kind == "setitem":
        with flow.no_grad():
            w[1] = 3.0
    elif kind == "view write":
        with flow.no_grad():
            w.view(-1)[:7].fill_(-2.0)
    elif kind == "copy_":
        with flow.no_grad():
            w.copy_(flow.randn(*w.shape))
    elif kind == "init":
        flow.nn.init.normal_(w)
    elif kind == "load_state_dict":
        model.load_state_dict(_mlp(seed=7).state_dict())
    else:  # an optimizer step
        opt = {"sgd": flow.optim.SGD(model.parameters(), lr=0.5, momentum=0.9),
               "adamw": flow.optim.AdamW(model.parameters(), lr=0.1)}[kind]
        for p in model.parameters():
            p.grad = flow.ones_like(p)
        opt.step()


@pytest.mark.parametrize("kind", ["add_", "data.mul_", "data =", "setitem", "view write", "copy_", "init",
                                  "load_state_dict", "sgd", "adamw"])
def test_every_write_to_a_parameter_is_seen(kind):
    model, x = _mlp(), flow.randn(3, 12)
    before = _bits(_forward(model, x, True))
    _write(kind, model)
    cached = _bits(_forward(model, x, True))
    uncached = _bits(_forward(model, x, False))
    np.testing.assert_array_equal(cached, uncached)
    assert not np.array_equal(cached, before)  # the write changed the output: the check can fail


def test_a_copy_held_by_a_pending_backward_is_not_overwritten():
    """forward 1, a parameter written in place, forward 2, then backward 1: backward 1 uses the
    weights forward 1 saw, as with a cast at every use (PyTorch's behaviour)."""
    def run(cache):
        model, x = _mlp(), flow.randn(3, 12, requires_grad=True)
        out1 = _forward(model, x, cache)
        with flow.no_grad():
            model[2].weight.mul_(3.0)
        out2 = _forward(model, x, cache)
        out1.sum().backward()
        g1 = _bits(x.grad)
        x.grad = None
        out2.sum().backward()
        return _bits(out1), _bits(out2), g1, _bits(x.grad)

    for got, want in zip(run(True), run(False)):
        np.testing.assert_array_equal(got, want)


def test_training_with_the_cache_is_bitwise_training_without_it():
    def train(cache):
        model = _mlp()
        rng = np.random.default_rng(0)
        xs = [flow.tensor(rng.standard_normal((8, 12)).astype(np.float32)) for _ in range(5)]
        return _adamw_losses(model, xs, lambda x: (_forward(model, x, cache) ** 2).mean(), lr=1e-2)

    assert train(True) == train(False)


def _adamw_losses(model, batches, loss_of, lr):
    """The losses of AdamW steps of `model`, one per batch."""
    opt = flow.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for x in batches:
        loss = loss_of(x)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss))
    return losses


def test_cache_switches_and_clearing():
    model, x = _mlp(), flow.randn(3, 12)
    cast_cache.clear()
    assert flow.is_autocast_cache_enabled()
    with flow.autocast("cpu", cache_enabled=False):
        assert not flow.is_autocast_cache_enabled()
        with flow.autocast("cpu"):  # an inner autocast keeps the enclosing choice
            assert not flow.is_autocast_cache_enabled()
            model(x)
    assert flow.is_autocast_cache_enabled()
    assert id(model[0].weight) not in cast_cache._copies
    _forward(model, x, True)
    assert id(model[0].weight) in cast_cache._copies
    flow.amp.clear_autocast_cache()
    assert not cast_cache._copies
    _forward(model, x, None)  # the default caches
    assert id(model[0].weight) in cast_cache._copies


def test_activations_and_frozen_parameters_are_not_cached():
    model, x = _mlp(), flow.randn(3, 12, requires_grad=True) * 2  # an activation: not a leaf
    model[0].weight.requires_grad_(False)
    cast_cache.clear()
    _forward(model, x, True)
    assert id(model[0].weight) not in cast_cache._copies and id(x) not in cast_cache._copies
    assert id(model[2].weight) in cast_cache._copies


def test_copies_die_with_their_parameters():
    model, x = _mlp(), flow.randn(3, 12)
    _forward(model, x, True)
    keys = [id(p) for p in model.parameters()]
    assert all(k in cast_cache._copies for k in keys)
    del model
    gc.collect()
    assert not any(k in cast_cache._copies for k in keys)


def test_nn_graph_replays_cast_the_parameters_its_optimizer_updated():
    """An nn.Graph step (forward, backward, AdamW) replays kernels without Python, so without
    version bumps: its trace must record the casts, and its losses equal eager training's."""
    class Step(flow.nn.Graph):
        def __init__(self, model, opt):
            super().__init__()
            self.model = model
            self.add_optimizer(opt)
            self.config.enable_amp(True, dtype=flow.bfloat16)

        def build(self, x):
            loss = (self.model(x).float() ** 2).mean()
            loss.backward()
            return loss

    rng = np.random.default_rng(1)
    xs = [flow.tensor(rng.standard_normal((8, 12)).astype(np.float32)) for _ in range(4)]
    model = _mlp()
    step = Step(model, flow.optim.AdamW(model.parameters(), lr=1e-2))
    graph_losses = [float(step(x)) for x in xs]
    model = _mlp()
    opt = flow.optim.AdamW(model.parameters(), lr=1e-2)
    eager = []
    for x in xs:
        loss = (_forward(model, x, True, dtype=flow.bfloat16) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        eager.append(float(loss))
    assert graph_losses == eager
    assert len(set(eager)) == len(eager)


# ------------------------------------------------------------------ CUDA, through the CuPy double
def _cuda_train(double, cache, steps=4, optimizer="adamw"):
    """(losses, float16-cast launches per forward) of fp16 training of the MLP on 'cuda'."""
    model = _mlp("cuda")
    opt = (flow.optim.AdamW(model.parameters(), lr=1e-2) if optimizer == "adamw"
           else flow.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9))
    scaler = flow.amp.GradScaler("cuda", init_scale=2.0 ** 8)
    rng = np.random.default_rng(0)
    stats = double._double.stats
    losses, casts = [], []
    for _ in range(steps):
        x = flow.tensor(rng.standard_normal((8, 12)).astype(np.float32), device="cuda")
        stats.reset()
        out = _forward(model, x, cache, "cuda", flow.float16)
        casts.append(stats.by_name["astype"] + stats.by_name["copyto"] + stats.by_name["engine_cast__float_half"]
                     + stats.by_name["engine_cast__half_float"])  # engine/kernels/cast.py
        loss = (out ** 2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        losses.append(float(loss))
    return losses, casts, model


def test_fused_adamw_writes_the_float16_copies_and_the_forward_casts_no_weight(cuda_double):
    cached, cached_casts, model = _cuda_train(cuda_double, True)
    uncached, uncached_casts, _ = _cuda_train(cuda_double, False)
    assert cached == uncached  # numpy underneath: the same arithmetic, bit for bit
    # the input and the activation after GELU are cast every time; the 4 parameters only once
    assert uncached_casts == [6] * 4 and cached_casts == [6, 2, 2, 2], (uncached_casts, cached_casts)
    for p in model.parameters():
        copy = _copy_of(p, flow.float16)
        assert copy.version == p._version  # written by the optimizer's kernel
        np.testing.assert_array_equal(copy.buf.get(), p.detach().cpu().numpy().astype(np.float16))


def test_an_optimizer_without_the_fused_write_leaves_copies_to_be_cast_again(cuda_double):
    cached, casts, _ = _cuda_train(cuda_double, True, optimizer="sgd")
    uncached, _, _ = _cuda_train(cuda_double, False, optimizer="sgd")
    assert cached == uncached
    assert casts == [6] * 4  # cast again each step, into the same buffers


def test_fused_adamw_skips_a_copy_a_pending_backward_holds(cuda_double):
    model = _mlp("cuda")
    opt = flow.optim.AdamW(model.parameters(), lr=1e-2)
    x = flow.randn(4, 12, device="cuda")
    pending = _forward(model, x, True, "cuda", flow.float16)  # its backward saved the copies
    for p in model.parameters():
        p.grad = flow.ones_like(p)
    w = model[0].weight
    held = _copy_of(w, flow.float16).buf
    old = held.get().copy()
    opt.step()
    np.testing.assert_array_equal(held.get(), old)  # not written under the pending backward
    assert _copy_of(w, flow.float16).version == -1
    fresh = _bits(_forward(model, x, True, "cuda", flow.float16))
    assert _copy_of(w, flow.float16).buf is not held  # cast into a new buffer
    np.testing.assert_array_equal(fresh, _bits(_forward(model, x, False, "cuda", flow.float16)))
    del pending


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_cuda_graph_replays_read_current_copies(cuda_double, optimizer):
    """A capture reads the kept copies in place (no cast kernel in the graph); after an optimizer
    step, fused (copies written) or not (copies cast again before the replay), a replay computes
    what an eager step from the same weights computes. (An eager forward between replays reads a
    buffer of its own: see test_a_replay_never_rewrites_what_a_pending_eager_backward_saved.)"""
    model = _mlp("cuda")
    opt = (flow.optim.AdamW(model.parameters(), lr=1e-2) if optimizer == "adamw"
           else flow.optim.SGD(model.parameters(), lr=1e-2))
    x = flow.randn(8, 12, device="cuda")

    def forward_backward():
        opt.zero_grad(set_to_none=True)
        loss = (_forward(model, x, True, "cuda", flow.float16) ** 2).mean()
        loss.backward()
        return loss

    for _ in range(2):
        forward_backward()
        opt.step()
    forward_backward()  # the copies current (SGD leaves them stale): the capture reads them
    g = flow.cuda.CUDAGraph()
    with flow.cuda.graph(g):
        static = forward_backward()
    assert len(g._copies) == 4  # every parameter's copy read in place
    stats = cuda_double._double.stats
    for _ in range(3):
        g.replay()
        opt.step()
        stats.reset()
        g.replay()  # right after the step: the copies must be current for this replay
        refreshed = stats.by_name["copyto"]
        assert refreshed == (0 if optimizer == "adamw" else 4), refreshed
        replayed = float(static)
        grads = [_bits(p.grad) for p in model.parameters()]
        want = float(forward_backward())  # eager, from the same weights
        assert replayed == want
        for got, p in zip(grads, model.parameters()):
            np.testing.assert_array_equal(got, _bits(p.grad))
    g.reset()
    assert all(not (_copy_of(p, flow.float16).pins or {}) for p in model.parameters())


# ------------------------------------------------------------------ found by review (2026-11-29)
@pytest.mark.parametrize("tie", ["data =", "Parameter(other)"])
def test_two_parameters_on_one_array_see_each_others_writes(tie):
    """A weight tied by `.data =` or `Parameter(other)` shares the other's version counter (as
    torch's Parameter(t), a detach of t), so a write through one makes the other's copy stale."""
    def run(cache):
        flow.manual_seed(0)
        emb, head = flow.nn.Linear(3, 3, bias=False), flow.nn.Linear(3, 3, bias=False)
        if tie == "data =":
            head.weight.data = emb.weight.data
        else:
            head.weight = flow.nn.Parameter(emb.weight)
        x = flow.ones(1, 3)
        outs = [_bits(_forward(head, x, cache))]
        with flow.no_grad():
            emb.weight.add_(2.0)
        outs.append(_bits(_forward(head, x, cache)))
        return outs

    cached, uncached = run(True), run(False)
    for got, want in zip(cached, uncached):
        np.testing.assert_array_equal(got, want)
    assert not np.array_equal(cached[0], cached[1])


def test_an_op_output_aliasing_a_copy_cannot_corrupt_it():
    """einsum('ij->ij', w) under autocast returns the cast weight's own memory; an in-place write
    to that result must not reach later forwards (the copy's version counter moves)."""
    def run(cache):
        flow.manual_seed(0)
        lin, x = flow.nn.Linear(4, 4, bias=False), flow.randn(2, 4)
        with flow.no_grad(), flow.autocast("cpu", cache_enabled=cache):
            w = flow.einsum("ij->ij", lin.weight)
        w.mul_(0.0)
        return _bits(_forward(lin, x, cache))

    np.testing.assert_array_equal(run(True), run(False))


def test_checkpoint_recomputes_with_the_first_runs_cache_switch():
    from engine.utils.checkpoint import checkpoint

    lin = flow.nn.Linear(4, 4)
    cast_cache.clear()
    with flow.autocast("cpu", cache_enabled=False):
        out = checkpoint(lin, flow.randn(2, 4, requires_grad=True), use_reentrant=False)
    out.float().sum().backward()  # the recomputation runs outside the autocast block
    assert id(lin.weight) not in cast_cache._copies


def test_a_copy_does_not_keep_the_parameters_old_array_alive():
    import weakref

    lin = flow.nn.Linear(4, 4)
    _forward(lin, flow.randn(2, 4), True)
    old = weakref.ref(lin.weight._data)
    lin.half()
    gc.collect()
    assert old() is None


def test_a_parameter_moved_between_cpu_and_cuda_gets_a_copy_on_its_device(cuda_double):
    for first, second in (("cuda", "cpu"), ("cpu", "cuda")):  # float16 on both: one cache entry
        lin = _mlp(first)
        _forward(lin, flow.randn(2, 12, device=first), True, first, flow.float16)
        lin.to(second)
        x = flow.randn(2, 12, device=second)
        np.testing.assert_array_equal(_bits(_forward(lin, x, True, second, flow.float16)),
                                      _bits(_forward(lin, x, False, second, flow.float16)))


def test_fused_adamw_never_writes_a_copy_of_another_layout(cuda_double):
    """A parameter first F-ordered (a transposed checkpoint tensor) then C-ordered: the copy is
    always C-ordered, as the kernel writes it flat."""
    def run(cache):
        flow.manual_seed(0)
        model = flow.nn.Linear(5, 3, bias=False).to("cuda")
        model.weight = flow.nn.Parameter(flow.randn(5, 3, device="cuda").t())
        x = flow.randn(4, 5, device="cuda")
        _forward(model, x, cache, "cuda", flow.float16)
        model.weight.data = flow.randn(3, 5, device="cuda")
        return _adamw_losses(model, [x] * 3, lambda x: (_forward(model, x, cache, "cuda", flow.float16) ** 2).mean(),
                             lr=0.1)

    assert run(True) == run(False)


def _graph_model(cache, optimizer="sgd"):
    flow.manual_seed(0)
    model = flow.nn.Linear(8, 4).to("cuda")
    opt = flow.optim.SGD(model.parameters(), lr=0.1) if optimizer == "sgd" else \
        flow.optim.AdamW(model.parameters(), lr=0.1)

    def loss_of(x):
        return (_forward(model, x, cache, "cuda", flow.float16) ** 2).mean()

    return model, opt, loss_of


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_a_cuda_graph_that_steps_the_optimizer_replays_with_current_copies(cuda_double, optimizer):
    """The whole step captured, optimizer included: replays write the parameters without Python,
    so the graph re-casts the copies it reads before each replay and bumps the parameters'
    versions after it (eager code then sees them changed)."""
    def run(cache):
        model, opt, loss_of = _graph_model(cache, optimizer)
        x = flow.randn(5, 8, device="cuda")

        def step():
            opt.zero_grad(set_to_none=False)
            loss = loss_of(x)
            loss.backward()
            opt.step()
            return loss

        for _ in range(2):
            step()
        opt.zero_grad(set_to_none=False)
        loss_of(x)  # the copies current: the capture reads them
        g = flow.cuda.CUDAGraph()
        with flow.cuda.graph(g):
            static = step()
        losses = []
        for _ in range(4):
            g.replay()
            losses.append(float(static))
        losses.append(float(loss_of(x)))  # eager after replays
        return losses, len(g._copies)

    (cached, pinned), (uncached, _) = run(True), run(False)
    assert pinned == 2 and cached == uncached and len(set(cached)) == len(cached)


def test_a_replay_never_rewrites_what_a_pending_eager_backward_saved(cuda_double):
    def run(cache):
        model, opt, loss_of = _graph_model(cache)
        x = flow.randn(5, 8, device="cuda")
        xg = flow.randn(5, 8, device="cuda").requires_grad_()
        for _ in range(2):
            opt.zero_grad(set_to_none=True)
            loss_of(x).backward()
            opt.step()
        opt.zero_grad(set_to_none=True)
        loss_of(x).backward()
        opt.zero_grad(set_to_none=True)
        g = flow.cuda.CUDAGraph()
        with flow.cuda.graph(g):
            loss_of(x).backward()
        pending = loss_of(xg)  # eager; its backward saved the float16 weight
        opt.step()             # the weight changes; SGD does not write the copies
        g.replay()             # casts the new weight into the buffer the graph reads
        pending.backward()
        return _bits(xg.grad), len(g._copies)

    (cached, pinned), (uncached, _) = run(True), run(False)
    assert pinned == 2
    np.testing.assert_array_equal(cached, uncached)
