"""engine.nn.Module: registration, traversal, naming, state_dict, conversion, hooks, repr.

torch is the oracle: the same nested model is built with both libraries (`build(lib)`) and every
name, order and key must match."""
import re
from collections import OrderedDict

import numpy as np
import pytest
import torch

import engine as flow


def build(lib):
    """A nested model exercising every registration path, for lib in (engine, torch)."""
    nn = lib.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.norm = nn.LayerNorm(4)
            self.register_buffer("running", lib.zeros(4))
            self.register_buffer("scratch", lib.ones(2), persistent=False)
            self.register_buffer("absent", None)
            self.register_parameter("no_bias", None)

        def forward(self, x):
            return self.norm(lib.relu(self.fc(x))) + self.running

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(10, 4, padding_idx=0)
            self.blocks = nn.ModuleList([Block() for _ in range(2)])
            self.head = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Dropout(0.1), nn.Linear(8, 3, bias=False))
            self.extra = nn.ModuleDict({"proj": nn.Linear(3, 3)})
            self.scale = nn.Parameter(lib.ones(1))
            self.tied = self.head[0]  # one module under two names
            self.plain = 5

        def forward(self, idx):
            h = self.embed(idx)
            for b in self.blocks:
                h = b(h)
            return self.extra["proj"](self.head(h)) * self.scale

    return Net()


def to_engine_state(tmodel):
    return OrderedDict((k, flow.tensor(v.detach().numpy())) for k, v in tmodel.state_dict().items())


@pytest.fixture
def pair():
    torch.manual_seed(0)
    tm = build(torch)
    em = build(flow)
    em.load_state_dict(to_engine_state(tm))
    return em, tm


# ---------------------------------------------------------------- names and traversal
def test_traversal_names_match_torch(pair):
    em, tm = pair
    assert [n for n, _ in em.named_parameters()] == [n for n, _ in tm.named_parameters()]
    assert [n for n, _ in em.named_parameters(remove_duplicate=False)] == \
        [n for n, _ in tm.named_parameters(remove_duplicate=False)]
    assert [n for n, _ in em.named_buffers()] == [n for n, _ in tm.named_buffers()]
    assert [n for n, _ in em.named_modules()] == [n for n, _ in tm.named_modules()]
    assert [n for n, _ in em.named_modules(remove_duplicate=False)] == \
        [n for n, _ in tm.named_modules(remove_duplicate=False)]
    assert [n for n, _ in em.named_children()] == [n for n, _ in tm.named_children()]
    assert [n for n, _ in em.blocks[0].named_parameters(prefix="b0")] == \
        [n for n, _ in tm.blocks[0].named_parameters(prefix="b0")]
    assert [n for n, _ in em.named_parameters(recurse=False)] == ["scale"]
    assert len(list(em.parameters())) == len(list(tm.parameters()))
    assert len(list(em.modules())) == len(list(tm.modules()))
    assert len(list(em.children())) == len(list(tm.children()))
    assert all(isinstance(p, flow.nn.Parameter) for p in em.parameters())


def test_state_dict_keys_values_and_detach(pair):
    em, tm = pair
    esd, tsd = em.state_dict(), tm.state_dict()
    assert isinstance(esd, OrderedDict)
    assert list(esd) == list(tsd)  # includes tied.* twice-named entries, excludes non-persistent buffers
    assert "blocks.0.scratch" not in esd and "blocks.0.running" in esd
    for k in tsd:
        np.testing.assert_array_equal(esd[k].numpy(), tsd[k].numpy())
        assert not esd[k].requires_grad and not isinstance(esd[k], flow.nn.Parameter)
    kv = em.state_dict(keep_vars=True)
    assert kv["scale"] is em.scale
    assert list(em.state_dict(prefix="model.")) == ["model." + k for k in tsd]


def test_getattr_setattr_delattr():
    m = flow.nn.Module()
    p = flow.nn.Parameter(flow.zeros(2))
    m.w = p
    assert m.w is p and m._parameters["w"] is p
    m.sub = flow.nn.Linear(2, 2)
    assert "sub" in m._modules
    m.register_buffer("buf", flow.ones(3))
    m.buf = flow.zeros(3)  # reassigning a buffer keeps it a buffer
    assert "buf" in m._buffers and "buf" not in m.__dict__
    with pytest.raises(TypeError, match="parameter 'w'"):
        m.w = flow.zeros(2)  # a plain tensor can't replace a parameter
    m.w = None
    assert m._parameters["w"] is None and m.w is None
    del m.sub
    assert "sub" not in m._modules
    with pytest.raises(AttributeError, match="has no attribute 'sub'"):
        m.sub
    with pytest.raises(KeyError, match="contain"):
        m.register_buffer("a.b", flow.zeros(1))
    with pytest.raises(TypeError):
        m.register_parameter("q", flow.zeros(1))
    with pytest.raises(KeyError, match="already exists"):
        m.x = 3
        m.register_buffer("x", flow.zeros(1))
    names = dir(flow.nn.Linear(2, 2))
    assert "weight" in names and "bias" in names and "forward" in names


def test_get_submodule_and_parameter(pair):
    em, _ = pair
    assert em.get_submodule("blocks.1.fc") is em.blocks[1].fc
    assert em.get_submodule("") is em
    assert em.get_parameter("blocks.1.fc.weight") is em.blocks[1].fc.weight
    with pytest.raises(AttributeError, match="nope"):
        em.get_submodule("blocks.nope")


def test_train_eval_apply_requires_grad(pair):
    em, _ = pair
    assert em.training and em.head[2].training
    assert em.eval() is em
    assert not any(m.training for m in em.modules())
    em.train()
    assert all(m.training for m in em.modules())
    seen = []
    em.apply(lambda m: seen.append(type(m).__name__))
    assert seen[-1] == "Net" and seen.count("Block") == 2
    em.requires_grad_(False)
    assert not any(p.requires_grad for p in em.parameters())


def test_zero_grad():
    m = flow.nn.Linear(3, 2)
    m(flow.ones(4, 3)).sum().backward()
    assert m.weight.grad is not None
    m.zero_grad(set_to_none=False)
    assert m.weight.grad is not None and not m.weight.grad.numpy().any()
    m.zero_grad()
    assert m.weight.grad is None and m.bias.grad is None


# ---------------------------------------------------------------- conversion
def test_to_dtype_keeps_parameter_identity_and_converts_grads():
    m = flow.nn.Sequential(flow.nn.Linear(3, 2), flow.nn.LayerNorm(2))
    m.register_buffer("count", flow.tensor([1, 2]))  # integer buffer: dtype conversion skips it
    m.register_buffer("fbuf", flow.ones(2))
    params = list(m.parameters())
    before = [p.detach().numpy().copy() for p in params]
    m(flow.ones(1, 3)).sum().backward()
    assert m.to(flow.float64) is m
    assert [id(p) for p in m.parameters()] == [id(p) for p in params]
    for p, b in zip(params, before):
        assert isinstance(p, flow.nn.Parameter) and p.requires_grad and p.is_leaf
        assert p.dtype is flow.float64 and p.grad.dtype is flow.float64
        np.testing.assert_array_equal(p.detach().numpy(), b.astype(np.float64))
    assert m.count.dtype is flow.int64 and m.fbuf.dtype is flow.float64
    m.half()
    assert all(p.dtype is flow.float16 for p in params)
    m.bfloat16()
    assert all(p.dtype is flow.bfloat16 for p in params)
    m.float()
    assert all(p.dtype is flow.float32 for p in params)
    m.to("cpu", dtype=flow.float64)
    assert all(p.dtype is flow.float64 and p.device == flow.device("cpu") for p in params)
    m.cpu().double()
    with pytest.raises(TypeError, match="floating point"):
        m.to(flow.int64)
    # still trainable after conversion
    m.zero_grad()
    m(flow.ones(1, 3, dtype=flow.float64)).sum().backward()
    assert params[0].grad.dtype is flow.float64


@pytest.mark.skipif(not flow.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_roundtrip_keeps_identity():
    m = flow.nn.Linear(3, 2)
    w = m.weight
    m.cuda()
    assert m.weight is w and w.device.type == "cuda"
    out = m(flow.ones(2, 3, device="cuda"))
    assert out.device.type == "cuda"
    m.cpu()
    assert w.device.type == "cpu"


# ---------------------------------------------------------------- load_state_dict
def test_load_state_dict_copies_in_place_and_casts():
    torch.manual_seed(1)
    tm, em = torch.nn.Linear(4, 3), flow.nn.Linear(4, 3)
    w = em.weight
    sd = OrderedDict((k, flow.tensor(v.detach().double().numpy())) for k, v in tm.state_dict().items())
    res = em.load_state_dict(sd)
    assert res.missing_keys == [] and res.unexpected_keys == []
    assert repr(res) == "<All keys matched successfully>"
    assert em.weight is w and w.dtype is flow.float32 and w.requires_grad
    np.testing.assert_array_equal(w.detach().numpy(), tm.weight.detach().numpy())
    sd["weight"]._data[0, 0] = 123.0  # the module does not alias the checkpoint's storage
    assert w.detach().numpy()[0, 0] != 123.0


def test_load_state_dict_strict_reports_all_problems_at_once(pair):
    em, tm = pair
    sd = to_engine_state(tm)
    del sd["head.0.bias"], sd["blocks.1.running"]
    sd["bogus"] = flow.zeros(1)
    sd["blocks.0.fc.weight"] = flow.zeros(3, 4)
    before = {k: v.numpy().copy() for k, v in em.state_dict().items()}
    with pytest.raises(RuntimeError) as info:
        em.load_state_dict(sd)
    msg = str(info.value)
    assert msg.startswith("Error(s) in loading state_dict for Net:")
    assert 'Missing key(s) in state_dict: "blocks.1.running", "head.0.bias"' in msg
    assert 'Unexpected key(s) in state_dict: "bogus"' in msg
    assert ("size mismatch for blocks.0.fc.weight: copying a param with shape [3, 4] from checkpoint, "
            "the shape in current model is [4, 4]") in msg
    # nothing was copied
    for k, v in em.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), before[k])


def test_load_state_dict_non_strict_matches_torch(pair):
    em, tm = pair
    tsd = tm.state_dict()
    del tsd["head.3.weight"], tsd["embed.weight"]
    tsd["unknown.weight"] = torch.zeros(2)
    tsd["blocks.0.extra"] = torch.zeros(2)
    tres = tm.load_state_dict(tsd, strict=False)
    eres = em.load_state_dict(OrderedDict((k, flow.tensor(v.numpy())) for k, v in tsd.items()), strict=False)
    assert sorted(eres.missing_keys) == sorted(tres.missing_keys)
    assert sorted(eres.unexpected_keys) == sorted(tres.unexpected_keys)
    assert eres.missing_keys == ["embed.weight", "head.3.weight"]


def test_load_state_dict_shape_mismatch_raises_even_when_not_strict():
    m = flow.nn.Sequential(OrderedDict(fc=flow.nn.Linear(4, 4)))
    sd = m.state_dict()
    sd["fc.weight"] = flow.zeros(3, 4)
    with pytest.raises(RuntimeError, match=re.escape(
            "size mismatch for fc.weight: copying a param with shape [3, 4] from checkpoint, "
            "the shape in current model is [4, 4]")):
        m.load_state_dict(sd, strict=False)


def test_load_state_dict_keeps_optimizer_references():
    m = flow.nn.Linear(2, 2)
    refs = list(m.parameters())
    m.load_state_dict({"weight": flow.ones(2, 2), "bias": flow.zeros(2)})
    assert list(m.parameters()) == refs or all(a is b for a, b in zip(m.parameters(), refs))
    np.testing.assert_array_equal(m.weight.detach().numpy(), np.ones((2, 2), np.float32))


def test_forward_matches_torch_after_load(pair):
    em, tm = pair
    em.eval(), tm.eval()
    idx = np.array([[1, 2, 0, 9], [3, 3, 4, 5]])
    out_t = tm(torch.tensor(idx))
    out_e = em(flow.tensor(idx))
    np.testing.assert_allclose(out_e.detach().numpy(), out_t.detach().numpy(), rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- hooks
def test_forward_hooks_run_modify_and_remove():
    m = flow.nn.Linear(2, 2)
    calls = []

    def pre(mod, args):
        calls.append("pre")
        return (args[0] * 0,)

    def post(mod, args, out):
        calls.append(("post", tuple(args[0].shape)))
        return out + 1

    h1 = m.register_forward_pre_hook(pre)
    h2 = m.register_forward_hook(post)
    x = flow.ones(3, 2)
    out = m(x)
    assert calls == ["pre", ("post", (3, 2))]
    np.testing.assert_allclose(out.detach().numpy(), np.broadcast_to(m.bias.detach().numpy() + 1, (3, 2)))
    assert isinstance(h1, flow.autograd.graph.RemovableHandle)
    h1.remove()
    h2.remove()
    calls.clear()
    out2 = m(x)
    assert calls == []
    np.testing.assert_allclose(out2.detach().numpy(), (x.numpy() @ m.weight.detach().numpy().T) + m.bias.detach().numpy(),
                               rtol=1e-6)


def test_hooks_prepend_and_kwargs():
    order = []

    class M(flow.nn.Module):
        def forward(self, x, scale=1.0):
            return x * scale

    m = M()
    m.register_forward_hook(lambda mod, a, o: order.append("second"))
    m.register_forward_hook(lambda mod, a, o: order.append("first"), prepend=True)
    m.register_forward_pre_hook(lambda mod, a, kw: (a, {"scale": 3.0}), with_kwargs=True)
    m.register_forward_hook(lambda mod, a, kw, o: o + kw["scale"], with_kwargs=True)
    out = m(flow.ones(2), scale=2.0)
    assert order == ["first", "second"]
    np.testing.assert_array_equal(out.numpy(), np.full(2, 6.0, np.float32))


# ---------------------------------------------------------------- repr
def test_repr_matches_torch(pair):
    em, tm = pair
    assert repr(em) == repr(tm)
    for make in (lambda nn: nn.Linear(4, 3), lambda nn: nn.Linear(4, 3, bias=False),
                 lambda nn: nn.Conv2d(3, 8, 3),
                 lambda nn: nn.Conv2d(3, 8, (3, 5), stride=2, padding=1, dilation=2, bias=False),
                 lambda nn: nn.Conv2d(4, 8, 3, groups=2, padding="same"),
                 lambda nn: nn.LayerNorm(4), lambda nn: nn.LayerNorm((2, 4), eps=1e-6, elementwise_affine=False),
                 lambda nn: nn.LayerNorm(4, bias=False),
                 lambda nn: nn.Embedding(10, 4), lambda nn: nn.Embedding(10, 4, padding_idx=0, max_norm=1.0),
                 lambda nn: nn.Dropout(), lambda nn: nn.Dropout(0.1, inplace=True),
                 lambda nn: nn.GELU(), lambda nn: nn.GELU("tanh"), lambda nn: nn.ReLU(), lambda nn: nn.ReLU(True),
                 lambda nn: nn.Tanh(), lambda nn: nn.Sigmoid(), lambda nn: nn.SiLU(), lambda nn: nn.Softmax(dim=-1),
                 lambda nn: nn.LogSoftmax(1), lambda nn: nn.AvgPool2d(2), lambda nn: nn.AvgPool2d(3, 2, 1),
                 lambda nn: nn.AdaptiveAvgPool2d((1, 1)), lambda nn: nn.AdaptiveAvgPool2d(2),
                 lambda nn: nn.Flatten(), lambda nn: nn.Unflatten(1, (2, 3)), lambda nn: nn.Identity(),
                 lambda nn: nn.CrossEntropyLoss(), lambda nn: nn.MSELoss(), lambda nn: nn.BCEWithLogitsLoss(),
                 lambda nn: nn.NLLLoss(),
                 lambda nn: nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Sequential(nn.Linear(2, 2), nn.Tanh())),
                 lambda nn: nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2)]),
                 lambda nn: nn.ModuleList(), lambda nn: nn.ModuleDict({"a": nn.ReLU(), "b": nn.Linear(1, 1)})):
        assert repr(make(flow.nn)) == repr(make(torch.nn))


def test_module_without_forward_raises():
    with pytest.raises(NotImplementedError, match="forward"):
        flow.nn.Module()(1)


def _hooked_pair():
    """The same two-layer block in torch and in the engine, sharing weights."""
    def block(lib):
        class Block(lib.nn.Module):
            def __init__(self):
                super().__init__()
                self.a, self.b = lib.nn.Linear(3, 4), lib.nn.Linear(4, 2)

            def forward(self, x, y):
                return self.b(lib.tanh(self.a(x))) * y
        return Block()

    tb, eb = block(torch), block(flow)
    eb.load_state_dict({k: flow.tensor(v.detach().numpy()) for k, v in tb.state_dict().items()})
    return tb, eb


@pytest.mark.parametrize("x_needs_grad", [True, False])
def test_full_backward_hooks_match_torch(x_needs_grad):
    """register_full_backward_pre_hook sees grad_output and may replace it; the full backward hook
    sees (grad_input, grad_output), None for an input that needs no gradient, and may replace
    grad_input; a removed hook no longer runs."""
    results = []
    for lib, blk in zip((torch, flow), _hooked_pair()):
        seen = []

        def pre(m, grad_output):
            seen.append(("pre", [g.detach().numpy().copy() for g in grad_output]))
            return (grad_output[0] * 2,)

        def hook(m, grad_input, grad_output):
            seen.append(("hook", [None if g is None else g.detach().numpy().copy() for g in grad_input],
                         [g.detach().numpy().copy() for g in grad_output]))
            return (None if grad_input[0] is None else grad_input[0] * 3, grad_input[1])

        blk.register_full_backward_pre_hook(pre)
        handle = blk.register_full_backward_hook(hook)
        removed = blk.register_full_backward_hook(lambda *a: seen.append("removed"))
        removed.remove()
        x = lib.tensor(np.arange(6, dtype=np.float32).reshape(2, 3) / 5, requires_grad=x_needs_grad)
        y = lib.tensor(np.full((2, 2), 0.5, np.float32), requires_grad=True)
        blk(x, y).sum().backward()
        results.append((seen, None if x.grad is None else x.grad.numpy(), y.grad.numpy(),
                        blk.a.weight.grad.numpy()))
        handle.remove()
    (t_seen, *t_grads), (e_seen, *e_grads) = results
    assert [s[0] for s in e_seen] == [s[0] for s in t_seen] == ["pre", "hook"]
    for ts, es in zip(t_seen, e_seen):
        for tv, ev in zip(ts[1:], es[1:]):
            assert len(tv) == len(ev)
            for a, b in zip(tv, ev):
                assert (a is None) == (b is None)
                if a is not None:
                    np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7)
    for a, b in zip(t_grads, e_grads):
        assert (a is None) == (b is None)
        if a is not None:
            np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7)


def test_a_backward_hook_returning_the_wrong_count_is_an_error():
    lin = flow.nn.Linear(2, 2)
    lin.register_full_backward_hook(lambda m, gi, go: (gi[0], gi[0]))
    with pytest.raises(RuntimeError, match="backward hook returned an invalid number of grad_input: got 2, but "
                                           "expected 1"):
        lin(flow.randn(3, 2, requires_grad=True)).sum().backward()
    with pytest.warns(FutureWarning, match="register_backward_hook is deprecated"):
        flow.nn.Linear(2, 2).register_backward_hook(lambda *a: None)


def test_backward_hooks_with_namedtuple_dict_and_partly_used_outputs():
    """A namedtuple output keeps its type; when no gradient passes through the wrapped outputs (a
    dict output, an LSTM whose (h, c) alone is used) the full hook does not run, as in torch."""
    from collections import namedtuple

    Pair = namedtuple("Pair", "a b")

    class TwoHeads(flow.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = flow.nn.Linear(3, 2)

        def forward(self, x):
            y = self.lin(x)
            return Pair(y, y * 2)

    seen = []
    m = TwoHeads()
    m.register_full_backward_hook(lambda mod, gi, go: seen.append(len(go)))
    out = m(flow.randn(4, 3, requires_grad=True))
    assert isinstance(out, Pair)
    (out.a.sum() + out.b.sum()).backward()
    assert seen == [2]

    lstm = flow.nn.LSTM(3, 4, batch_first=True)
    lstm.register_full_backward_hook(lambda mod, gi, go: seen.append(go))
    x = flow.randn(2, 5, 3, requires_grad=True)
    _, (h, c) = lstm(x)
    h.sum().backward()
    assert seen == [2] and x.grad is not None
