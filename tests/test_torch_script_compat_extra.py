"""Common PyTorch-script patterns, compared with torch 2.13 where a comparison is possible:
torch.accelerator and the math constants, autograd.grad(only_inputs=...), Variable and anomaly
detection, torch.load's map_location functions and dicts, checkpoints holding argparse.Namespace
/ sets / bytes, the optimizers' foreach / fused / capturable / differentiable switches and Adam's
decoupled_weight_decay, and torch tensors handed to engine ops."""
import argparse
import inspect
import warnings

import numpy as np
import pytest
import torch

import engine as flow
import engine.nn.functional as F
from engine import _torch_checkpoint as tc
from engine import optim

NO_CUDA = not flow.cuda.is_available()


# ---------------------------------------------------------------- 1. engine.accelerator, constants
def test_quickstart_device_line_and_constants():
    device = flow.accelerator.current_accelerator().type if flow.accelerator.is_available() else "cpu"
    assert device == ("cpu" if NO_CUDA else "cuda")
    assert (flow.pi, flow.e, flow.inf) == (torch.pi, torch.e, torch.inf)
    assert np.isnan(flow.nan) and np.isnan(torch.nan)


def test_accelerator_signatures_match_torch():
    for name in ("is_available", "current_accelerator", "device_count", "current_device_index", "set_device_index",
                 "set_device_idx", "synchronize", "device_index", "current_device_idx"):
        ours, theirs = inspect.signature(getattr(flow.accelerator, name)), inspect.signature(
            getattr(torch.accelerator, name))
        assert [(p.name, p.kind, p.default) for p in ours.parameters.values()] == \
               [(p.name, p.kind, p.default) for p in theirs.parameters.values()], name


@pytest.mark.skipif(not NO_CUDA or torch.accelerator.is_available(), reason="both without an accelerator")
def test_accelerator_without_one_matches_torch():
    assert flow.accelerator.is_available() is torch.accelerator.is_available() is False
    assert flow.accelerator.current_accelerator() is torch.accelerator.current_accelerator() is None
    assert flow.accelerator.current_accelerator(check_available=True) is None
    assert flow.accelerator.device_count() == torch.accelerator.device_count() == 0
    for call in (lambda m: m.current_device_index(), lambda m: m.set_device_index(0), lambda m: m.synchronize(),
                 lambda m: m.device_index(0).__enter__()):
        with pytest.raises(RuntimeError) as ours:
            call(flow.accelerator)
        with pytest.raises(RuntimeError) as theirs:
            call(torch.accelerator)
        assert str(ours.value) == str(theirs.value)
    with pytest.raises(ValueError, match="got:None"):
        flow.accelerator.set_device_index(None)
    with flow.accelerator.device_index(None), torch.accelerator.device_index(None):
        pass


def test_accelerator_follows_engine_cuda(monkeypatch):
    """The CUDA branch, with engine.cuda faked: two GPUs, the current one 0."""
    calls = []
    current = [0]
    monkeypatch.setattr(flow.cuda, "is_available", lambda: True)
    monkeypatch.setattr(flow.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(flow.cuda, "current_device", lambda: current[0])
    monkeypatch.setattr(flow.cuda, "set_device", lambda i: (calls.append(("set", i)), current.__setitem__(0, i)))
    monkeypatch.setattr(flow.cuda, "synchronize", lambda i=None: calls.append(("sync", i)))
    acc = flow.accelerator
    assert acc.is_available() and acc.device_count() == 2
    assert acc.current_accelerator().type == "cuda"
    assert acc.current_device_index() == 0
    with acc.device_index(1):
        assert acc.current_device_index() == 1
    assert acc.current_device_index() == 0
    acc.set_device_idx("cuda:1")
    acc.synchronize()
    acc.synchronize(flow.device("cuda", 0))
    assert calls == [("set", 1), ("set", 0), ("set", 1), ("sync", 1), ("sync", 0)]
    with pytest.raises(ValueError, match="accelerator"):
        acc.set_device_index("cpu")


# ---------------------------------------------------------------- 2. autograd
def _penalty(lib, x, **kw):
    out = (x ** 2).sum(1, keepdim=True)
    g = lib.autograd.grad(outputs=out, inputs=x, grad_outputs=lib.ones_like(out), create_graph=True,
                          retain_graph=True, **kw)[0]
    return ((g.norm(2, dim=1) - 1) ** 2).mean(), g


def test_grad_only_inputs_matches_torch():
    a = np.random.default_rng(0).standard_normal((4, 3))
    x, xt = flow.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    p, g = _penalty(flow, x, only_inputs=True)
    pt, gt = _penalty(torch, xt, only_inputs=True)
    np.testing.assert_allclose(g.detach().numpy(), gt.detach().numpy(), rtol=1e-12)
    p.backward(), pt.backward()
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-12)
    with pytest.warns(FutureWarning, match="only_inputs argument is deprecated"):
        _, g2 = _penalty(flow, flow.tensor(a, requires_grad=True), only_inputs=False)
    np.testing.assert_array_equal(g2.detach().numpy(), g.detach().numpy())
    with pytest.raises(NotImplementedError, match="is_grads_batched"):
        _penalty(flow, flow.tensor(a, requires_grad=True), is_grads_batched=True)
    names = list(inspect.signature(torch.autograd.grad).parameters)
    assert list(inspect.signature(flow.autograd.grad).parameters) == names


def test_variable_is_a_detached_leaf_as_in_torch():
    for lib in (flow, torch):
        t = lib.ones(2)
        v = lib.autograd.Variable(t, requires_grad=True)
        assert v is not t and v.requires_grad and v.is_leaf and not t.requires_grad
        assert isinstance(t, lib.autograd.Variable) and type(v) is type(t)
        v.detach()[0] = 5.0
        assert float(t[0]) == 5.0  # shares memory
        a = lib.ones(2, requires_grad=True)
        b = a * 2
        assert lib.autograd.Variable(b).grad_fn is None and not lib.autograd.Variable(b).requires_grad
        with pytest.raises(TypeError, match="Variable data has to be a tensor, but got list"):
            lib.autograd.Variable([1.0])
    assert not isinstance(np.ones(2), flow.autograd.Variable)


def _nan_backward(lib):
    x = lib.tensor([-1.0, 4.0], requires_grad=True)
    x.sqrt().sum().backward()
    return x


def test_detect_anomaly_names_the_backward_that_returned_nan():
    for lib, name in ((flow, "SqrtBackward"), (torch, "SqrtBackward0")):
        with pytest.warns(UserWarning, match="Anomaly Detection has been enabled"):
            mode = lib.autograd.detect_anomaly()
        with mode, pytest.warns(UserWarning, match=f"Error detected in {name}"):
            with pytest.raises(RuntimeError, match=f"Function '{name}' returned nan values in its 0th output."):
                _nan_backward(lib)
        with lib.autograd.set_detect_anomaly(True, check_nan=False):
            assert np.isnan(_nan_backward(lib).grad.numpy()[0])  # checks off: NaN passes
    assert np.isnan(_nan_backward(flow).grad.numpy()[0])  # mode off again
    assert not flow.autograd.is_anomaly_enabled()


def test_set_detect_anomaly_as_a_call_and_a_failing_backward_warns():
    flow.autograd.set_detect_anomaly(True)
    try:
        assert flow.autograd.is_anomaly_enabled() and flow.autograd.is_anomaly_check_nan_enabled()

        class Bad(flow.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 1

            @staticmethod
            def backward(ctx, g):
                raise ValueError("boom")

        x = flow.ones(2, requires_grad=True)
        y = Bad.apply(x)
        with pytest.warns(UserWarning, match="(?s)Error detected in BadBackward.*test_torch_script_compat_extra"):
            with pytest.raises(ValueError, match="boom"):
                y.sum().backward()
    finally:
        flow.autograd.set_detect_anomaly(False)
    assert not flow.autograd.is_anomaly_enabled()


# ---------------------------------------------------------------- 3. map_location
def _engine_file(tmp_path):
    p = tmp_path / "e.pt"
    flow.save({"a": flow.arange(4.0), "n": 3}, p)
    return p


def _torch_file(tmp_path, zip_format=True):
    p = tmp_path / f"t{zip_format}.pt"
    torch.save({"a": torch.arange(4.0), "n": 3}, p, _use_new_zipfile_serialization=zip_format)
    return p


@pytest.mark.parametrize("kind", ["engine", "torch_zip", "torch_legacy"])
def test_map_location_functions_and_dicts(tmp_path, kind):
    path = {"engine": lambda: _engine_file(tmp_path), "torch_zip": lambda: _torch_file(tmp_path),
            "torch_legacy": lambda: _torch_file(tmp_path, False)}[kind]()
    seen = []

    def record(storage, loc):
        seen.append((type(storage).__name__, loc, storage.device))
        return storage

    for ml in (lambda storage, loc: storage, lambda s, l: s.cpu(), lambda s, l: None, lambda s, l: s.to("cpu"),
               record, {"cuda:0": "cpu"}, {"cpu": "cpu"}, {}, "cpu", flow.device("cpu")):
        out = flow.load(path, map_location=ml)
        assert out["n"] == 3 and out["a"].device == flow.device("cpu")
        np.testing.assert_array_equal(out["a"].numpy(), np.arange(4.0, dtype=np.float32))
    assert seen == [("StorageStandIn", "cpu", flow.device("cpu"))]  # once per storage
    if kind != "engine":  # torch itself, on its own file
        assert torch.load(path, map_location=lambda storage, loc: storage)["a"].device.type == "cpu"
    for bad in (0, 1.5, ["cpu"]):
        with pytest.raises(TypeError, match=f"map_location of type {type(bad).__name__}"):
            flow.load(path, map_location=bad)
    with pytest.raises(TypeError, match="returned a str"):
        flow.load(path, map_location=lambda s, l: "cpu")
    if NO_CUDA:
        for ml in (lambda s, l: s.cuda(0), lambda s, l: s.cuda(), {"cpu": "cuda:0"}, "cuda"):
            with pytest.raises(RuntimeError, match="CUDA is not available"):
                flow.load(path, map_location=ml)


def test_placement_remaps_saved_cuda_locations():
    """What a file saved on a GPU meets: its tensors' location is 'cuda:N'."""
    assert tc.placement({"cuda:0": "cpu"})("cuda:0") == flow.device("cpu")
    assert tc.placement(lambda s, l: s.cpu())("cuda:1") == flow.device("cpu")
    assert tc.placement(lambda s, l: s)("cpu") == flow.device("cpu")
    assert tc.placement(None)("cuda:3") == flow.device("cpu")  # the engine's default: the CPU
    got = []
    tc.placement(lambda s, l: got.append((l, s.is_cuda, s.cuda(1).device.index)) or s.cpu())("cuda:0")
    assert got == [("cuda:0", True, 1)] or NO_CUDA and got == []
    if NO_CUDA:
        with pytest.raises(RuntimeError, match="'cuda:1'.*CUDA is not available"):
            tc.placement({"cuda:0": "cpu"})("cuda:1")  # unmapped: stays where it was saved, as torch


def test_engine_file_records_a_cuda_tensors_location(tmp_path, monkeypatch):
    """engine.save notes the device of a CUDA tensor ("dev"), which map_location dicts and
    functions see (a CUDA tensor faked on the CPU: its array stays a numpy one)."""
    from engine import serialization
    t = flow.arange(3.0)
    t._device = flow.device("cuda", 1)
    monkeypatch.setattr(serialization, "to_device", lambda a, d: a)
    p = tmp_path / "e"
    flow.save({"t": t, "c": flow.ones(1)}, p)
    seen = []
    out = flow.load(p, map_location=lambda s, l: seen.append(l) or s.cpu())
    assert sorted(seen) == ["cpu", "cuda:1"] and out["t"].device == flow.device("cpu")
    assert flow.load(p, map_location={"cuda:1": "cpu"})["t"].tolist() == [0.0, 1.0, 2.0]
    assert flow.load(p)["t"].device == flow.device("cpu")
    if NO_CUDA:
        with pytest.raises(RuntimeError, match="'cuda:1'.*CUDA is not available"):
            flow.load(p, map_location={"cuda:0": "cpu"})


# ---------------------------------------------------------------- 4. checkpoint values
def test_deit_checkpoint_with_args_round_trips(tmp_path):
    args = argparse.Namespace(lr=0.1, arch="resnet18", sizes=[1, 2], opt=None, tags={"a", "b"}, flags=frozenset({1}),
                              raw=b"\x00\xff", buf=bytearray(b"ab"), nested=argparse.Namespace(x=(1, 2)))
    sd = flow.nn.Linear(2, 2).state_dict()
    flow.save({"epoch": 1, "model": sd, "args": args, "set": {1, "x", (2, 3)}}, tmp_path / "ck.pt")
    back = flow.load(tmp_path / "ck.pt")
    assert back["args"] == args and type(back["args"]) is argparse.Namespace
    assert type(back["args"].flags) is frozenset and type(back["args"].buf) is bytearray
    assert back["set"] == {1, "x", (2, 3)} and back["epoch"] == 1
    for k, v in sd.items():
        np.testing.assert_array_equal(back["model"][k].numpy(), v.numpy())


def test_torch_written_namespace_loads(tmp_path):
    args = argparse.Namespace(lr=0.1, arch="vit", ids={1, 2}, b=b"x")
    for zip_format in (True, False):
        p = tmp_path / f"ns{zip_format}.pt"
        torch.save({"model": {"w": torch.ones(2)}, "args": args}, p, _use_new_zipfile_serialization=zip_format)
        back = flow.load(p)
        assert back["args"] == args and back["model"]["w"].numpy().tolist() == [1.0, 1.0]


def test_unsupported_values_still_refused(tmp_path):
    class NS(argparse.Namespace):
        pass

    for bad in (NS(a=1), {object()}, object()):
        with pytest.raises(TypeError, match="cannot save"):
            flow.save({"v": bad}, tmp_path / "x")


# ---------------------------------------------------------------- 5. optimizer switches
_OPTIMIZERS = {
    "SGD": dict(lr=0.1, momentum=0.9, weight_decay=0.01),
    "Adam": dict(lr=0.01, weight_decay=0.1),
    "AdamW": dict(lr=0.01, weight_decay=0.1),
    "RMSprop": dict(lr=0.01, momentum=0.5),
    "Adagrad": dict(lr=0.1),
    "Adadelta": dict(rho=0.8),
    "Adamax": dict(lr=0.01),
    "NAdam": dict(lr=0.01),
    "RAdam": dict(lr=0.01),
}
_SWITCHES = ("foreach", "fused", "capturable", "differentiable")


def _flags(name):
    params = inspect.signature(getattr(torch.optim, name)).parameters
    return [k for k in _SWITCHES if k in params]


def _run(lib, name, kw, steps=3):
    rng = np.random.default_rng(1)
    init = rng.standard_normal((3, 4)).astype(np.float32)
    p = (flow.nn.Parameter if lib is flow else torch.nn.Parameter)(lib.tensor(init))
    opt = getattr(lib.optim, name)([p], **kw)
    for _ in range(steps):
        p.grad = lib.tensor(rng.standard_normal((3, 4)).astype(np.float32))
        opt.step()
    return p.detach().numpy().copy(), opt


@pytest.mark.parametrize("name", list(_OPTIMIZERS))
def test_optimizer_switches_give_the_same_results(name):
    kw = _OPTIMIZERS[name]
    ref, _ = _run(flow, name, kw)
    torch_ref, _ = _run(torch, name, dict(kw, foreach=False))
    np.testing.assert_allclose(ref, torch_ref, rtol=1e-6, atol=1e-7)
    flags = _flags(name)
    for flag in flags:
        values = (None, True, False) if flag in ("foreach", "fused") else (True, False)
        if flag == "differentiable":
            values = (False,)
        for value in values:
            got, opt = _run(flow, name, dict(kw, **{flag: value}))
            np.testing.assert_array_equal(got, ref, err_msg=f"{name}({flag}={value})")
            assert opt.param_groups[0][flag] is value
    with pytest.raises(NotImplementedError, match="differentiable=True"):
        getattr(optim, name)([flow.nn.Parameter(flow.ones(2))], differentiable=True)
    with pytest.raises(TypeError, match="foreach"):
        getattr(optim, name)([flow.nn.Parameter(flow.ones(2))], foreach="yes")
    if "fused" in flags:
        with pytest.raises(RuntimeError, match="`fused` and `foreach` cannot be `True` together."):
            getattr(optim, name)([flow.nn.Parameter(flow.ones(2))], fused=True, foreach=True)
    # the signature is torch's (Adam/AdamW add OneFlow's do_bias_correction after amsgrad)
    ours = [(p.name, p.kind, p.default) for p in inspect.signature(getattr(optim, name)).parameters.values()
            if p.name != "do_bias_correction"]
    theirs = [(p.name, p.kind, p.default) for p in inspect.signature(getattr(torch.optim, name)).parameters.values()]
    assert ours == theirs


@pytest.mark.parametrize("amsgrad", [False, True])
def test_adam_decoupled_weight_decay_is_adamw(amsgrad):
    kw = dict(lr=0.01, weight_decay=0.1, amsgrad=amsgrad)
    adam, opt = _run(flow, "Adam", dict(kw, decoupled_weight_decay=True))
    adamw, _ = _run(flow, "AdamW", kw)
    theirs, topt = _run(torch, "Adam", dict(kw, decoupled_weight_decay=True, foreach=False))
    np.testing.assert_array_equal(adam, adamw)
    np.testing.assert_allclose(adam, theirs, rtol=1e-6, atol=1e-7)
    plain, _ = _run(flow, "Adam", kw)
    assert not np.array_equal(plain, adam)
    assert opt.param_groups[0]["decoupled_weight_decay"] is True


@pytest.mark.parametrize("name", list(_OPTIMIZERS))
def test_state_dicts_round_trip_with_torch(name):
    """torch's state dict (its switches included) loads into ours and ours into torch's, and both
    go on stepping alike."""
    kw = dict(_OPTIMIZERS[name], foreach=False)
    _, topt = _run(torch, name, kw)
    _, eopt = _run(flow, name, kw)
    tsd = topt.state_dict()
    conv = {"state": {k: {n: (flow.tensor(v.numpy()) if isinstance(v, torch.Tensor) else v) for n, v in st.items()}
                      for k, st in tsd["state"].items()},
            "param_groups": tsd["param_groups"]}
    eopt.load_state_dict(conv)
    assert {k: v for k, v in eopt.param_groups[0].items() if k != "params" and k != "do_bias_correction"} == \
           {k: v for k, v in tsd["param_groups"][0].items() if k != "params"}
    esd = eopt.state_dict()
    back = {"state": {k: {n: (torch.tensor(v.numpy()) if isinstance(v, flow.Tensor) else
                              torch.tensor(float(v)) if n in ("step", "mu_product") else v) for n, v in st.items()}
                      for k, st in esd["state"].items()},
            "param_groups": [{k: v for k, v in g.items() if k != "do_bias_correction"} for g in esd["param_groups"]]}
    topt.load_state_dict(back)
    assert topt.param_groups[0]["foreach"] is False


# ---------------------------------------------------------------- 6. torch tensors given to engine ops
@pytest.mark.parametrize("call", [
    lambda: flow.relu(torch.ones(2)),
    lambda: F.pad(torch.ones(1, 2), (1, 1)),
    lambda: flow.exp(torch.nn.Parameter(torch.ones(2))),
    lambda: flow.nn.ReLU()(torch.ones(2)),
], ids=["relu", "F.pad", "exp-Parameter", "nn.ReLU"])
def test_torch_tensor_given_to_an_engine_op(call):
    with pytest.raises(TypeError, match=r"torch\.Tensor.*engine\.tensor\(t\).*engine\.from_numpy"):
        call()


def test_non_tensor_input_is_a_type_error():
    with pytest.raises(TypeError, match="input 0 is a numpy.ndarray"):
        flow.relu(np.ones(2))
    assert flow.relu(flow.tensor(torch.ones(2).numpy())).tolist() == [1.0, 1.0]


def test_engine_never_imports_torch_for_this():
    import engine.ops.op as op
    src = inspect.getsource(op)
    assert "import torch" not in src and "from torch" not in src
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert op.foreign_tensor_error(np.ones(2), "x") is None
