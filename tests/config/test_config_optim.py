"""libai.optim: parameter groups (no decay on biases / norm layers) and the shipped optim config."""
import numpy as np
import pytest

import engine as flow
from libai.config import get_config, instantiate
from libai.optim import build_optimizer, get_default_optimizer_params, is_norm_module


class RMSNorm(flow.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = flow.nn.Parameter(flow.ones(n))

    def forward(self, x):
        return x * self.weight


class Net(flow.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = flow.nn.Linear(4, 8)
        self.norm = flow.nn.LayerNorm(8)
        self.fc2 = flow.nn.Linear(8, 3)
        self.rms = RMSNorm(3)
        self.tied = self.fc1  # the same parameters reachable twice

    def forward(self, x):
        return self.rms(self.fc2(self.norm(self.fc1(x))))


def _groups_by_param(groups):
    out = {}
    for g in groups:
        for p in g["params"]:
            assert id(p) not in out, "a parameter appears in two groups"
            out[id(p)] = {k: v for k, v in g.items() if k != "params"}
    return out


def test_norm_detection():
    assert is_norm_module(flow.nn.LayerNorm(3))
    assert is_norm_module(RMSNorm(3))
    assert not is_norm_module(flow.nn.Linear(2, 2))


def test_default_groups_no_decay_on_bias_and_norm():
    model = Net()
    groups = get_default_optimizer_params(
        model, weight_decay_norm=0.0, weight_decay_bias=0.0, clip_grad_max_norm=1.0, clip_grad_norm_type=2.0
    )
    by_param = _groups_by_param(groups)
    params = list(model.parameters())
    assert len(by_param) == len(params) == 7  # deduplicated: tied module counted once
    zero = [model.fc1.bias, model.fc2.bias, model.norm.weight, model.norm.bias, model.rms.weight]
    for p in zero:
        assert by_param[id(p)]["weight_decay"] == 0.0
    for p in (model.fc1.weight, model.fc2.weight):
        assert "weight_decay" not in by_param[id(p)]  # the optimizer's default applies
    for hyper in by_param.values():
        assert hyper["clip_grad_max_norm"] == 1.0 and hyper["clip_grad_norm_type"] == 2.0
    assert len(groups) == 2  # merged by identical hyperparameters


def test_groups_options():
    model = Net()
    groups = get_default_optimizer_params(
        model, base_lr=0.5, weight_decay=0.1, overrides={"fc2.weight": {"lr": 0.01}}
    )
    by_param = _groups_by_param(groups)
    assert by_param[id(model.fc2.weight)] == {"lr": 0.01, "weight_decay": 0.1}
    assert by_param[id(model.norm.weight)] == {"lr": 0.5, "weight_decay": 0.1}  # no norm setting
    assert all("clip_grad_max_norm" not in h for h in by_param.values())
    model.fc1.weight.requires_grad_(False)
    ids = _groups_by_param(get_default_optimizer_params(model))
    assert id(model.fc1.weight) not in ids
    with pytest.raises(ValueError, match="model"):
        get_default_optimizer_params()
    with pytest.raises(ValueError, match="bias"):
        get_default_optimizer_params(model, weight_decay_bias=0.0, overrides={"bias": {"lr": 1}})


def _train_steps(optimizer, model, steps=3):
    x = flow.tensor(np.random.RandomState(0).randn(5, 4).astype(np.float32))
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = (model(x) ** 2).mean()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.item()))
    return losses


def test_shipped_optim_config_builds_adamw():
    cfg = get_config("common/optim.py")
    model = Net()
    cfg.optim.params.model = model  # LiBai's convention
    optimizer = instantiate(cfg.optim)
    assert isinstance(optimizer, flow.optim.AdamW)
    by_param = _groups_by_param(optimizer.param_groups)
    assert by_param[id(model.fc1.weight)]["weight_decay"] == 0.01
    assert by_param[id(model.fc1.bias)]["weight_decay"] == 0.0
    assert by_param[id(model.norm.weight)]["weight_decay"] == 0.0
    for g in optimizer.param_groups:
        assert g["lr"] == 1e-4 and tuple(g["betas"]) == (0.9, 0.999) and g["eps"] == 1e-8
        assert g["clip_grad_max_norm"] == 1.0 and g["clip_grad_norm_type"] == 2.0
    before = model.fc1.weight.detach().numpy().copy()
    losses = _train_steps(optimizer, model)
    assert not np.allclose(before, model.fc1.weight.detach().numpy())
    assert losses[-1] < losses[0]


def test_build_optimizer_leaves_config_untouched(tmp_path):
    from libai.config import LazyConfig

    cfg = get_config("common/optim.py")
    model = Net()
    optimizer = build_optimizer(cfg.optim, model)
    assert isinstance(optimizer, flow.optim.AdamW)
    assert "model" not in cfg.optim.params
    assert sum(len(g["params"]) for g in optimizer.param_groups) == 7
    LazyConfig.save(cfg, tmp_path / "c.yaml")  # still saveable
    loaded = LazyConfig.load(tmp_path / "c.yaml")
    assert loaded.optim._target_ == "engine.optim.AdamW"
    assert loaded.optim.params._target_ == "libai.optim.get_default_optimizer_params"
    opt2 = build_optimizer(loaded.optim, model)  # dotted-string targets from YAML work too
    assert isinstance(opt2, flow.optim.AdamW)
    assert len(opt2.param_groups) == len(optimizer.param_groups)


def test_build_optimizer_without_params_config():
    from libai.config import LazyCall

    model = Net()
    optimizer = build_optimizer(LazyCall(flow.optim.SGD)(lr=0.1), model)
    assert len(optimizer.param_groups) == 1 and len(optimizer.param_groups[0]["params"]) == 7


def test_a_clip_norm_that_is_not_positive_is_refused():
    """A negative max norm would flip every clipped gradient, 0 zero them: refused naming the key."""
    for bad in (-1.0, 0):
        with pytest.raises(ValueError, match=f"optim.params.clip_grad_max_norm must be positive .*got {bad}"):
            get_default_optimizer_params(Net(), clip_grad_max_norm=bad)
