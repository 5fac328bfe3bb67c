"""get_config, configurable, try_get_key, resolve_batch_sizes, default_argument_parser."""
import os

import pytest
from omegaconf import DictConfig, OmegaConf

from libai.config import (
    LazyConfig,
    configurable,
    default_argument_parser,
    get_config,
    get_config_root,
    instantiate,
    resolve_batch_sizes,
    try_get_key,
)


# ------------------------------------------------------------------ get_config
def test_get_config_train():
    cfg = get_config("common/train.py")
    train = cfg.train
    assert isinstance(train, DictConfig)
    assert train.output_dir == "./output" and train.train_micro_batch_size == 32
    assert train.global_batch_size is None and train.num_accumulation_steps is None
    assert train.train_iter == 10000 and train.train_epoch == 0 and train.warmup_ratio == 0
    assert train.start_iter == 0 and train.log_period == 20 and train.seed == 1234
    assert train.load_weight == "" and train.resume is False
    assert train.amp.enabled is False and train.activation_checkpoint.enabled is False
    assert train.zero_optimization == {"enabled": False, "stage": 1}
    assert train.checkpointer == {"period": 5000, "max_to_keep": 100, "save_model_after_n_epoch": None}
    assert train.test_micro_batch_size == 32
    ev = train.evaluation
    assert ev.enabled is True and ev.eval_period == 5000 and ev.eval_iter == 100000
    assert isinstance(ev.eval_iter, int)
    assert ev.eval_metric == "Acc@1" and ev.eval_mode == "max"
    assert ev.evaluator._target_ == "libai.evaluation.ClsEvaluator" and list(ev.evaluator.topk) == [1, 5]
    assert train.scheduler._target_ == "libai.scheduler.WarmupCosineLR"
    assert train.scheduler.warmup_factor == 0.001 and train.scheduler.alpha == 0.01
    assert train.scheduler.warmup_method == "linear"
    assert train.dist == {
        "data_parallel_size": 1,
        "tensor_parallel_size": 1,
        "pipeline_parallel_size": 1,
        "pipeline_num_layers": None,
        "custom_pipeline_stage_id": None,
        "pipeline_schedule": "1F1B",
        "device_type": None,
    }


def test_get_config_train_saves_and_overrides(tmp_path):
    cfg = get_config("common/train.py")
    LazyConfig.apply_overrides(cfg, ["train.train_iter=5", "train.dist.data_parallel_size=2"])
    LazyConfig.save(cfg, tmp_path / "config.yaml")
    loaded = LazyConfig.load(tmp_path / "config.yaml")
    assert loaded == cfg
    assert loaded.train.train_iter == 5


def test_get_config_optim():
    cfg = get_config("common/optim.py")
    optim = cfg.optim
    assert optim._target_.__name__ == "AdamW"
    assert optim.lr == 1e-4 and optim.weight_decay == 0.01 and list(optim.betas) == [0.9, 0.999]
    assert optim.eps == 1e-8
    assert optim.params._target_.__name__ == "get_default_optimizer_params"
    assert optim.params.clip_grad_max_norm == 1.0 and optim.params.clip_grad_norm_type == 2.0
    assert optim.params.weight_decay_norm == 0.0 and optim.params.weight_decay_bias == 0.0


def test_get_config_missing_lists_available():
    with pytest.raises(FileNotFoundError) as info:
        get_config("common/nope.py")
    msg = str(info.value)
    assert "common/nope.py" in msg and "common/train.py" in msg and "common/optim.py" in msg


def test_get_config_root_is_repo_configs():
    root = get_config_root()
    assert os.path.isfile(os.path.join(root, "common", "train.py"))


# ------------------------------------------------------------------ configurable
class Block:
    @configurable
    def __init__(self, hidden_size, dropout=0.0, bias=True):
        self.hidden_size, self.dropout, self.bias = hidden_size, dropout, bias

    @classmethod
    def from_config(cls, cfg):
        return {"hidden_size": cfg.hidden_size, "dropout": cfg.dropout}


class SubBlock(Block):
    pass


class WithExtra:
    @configurable
    def __init__(self, a, b=0):
        self.a, self.b = a, b

    @classmethod
    def from_config(cls, cfg, b=10):
        return {"a": cfg.a, "b": b}


class NoFromConfig:
    @configurable
    def __init__(self, a):
        self.a = a


@configurable(from_config=lambda cfg, scale=1: {"n": cfg.n * scale})
def build(n, offset=0):
    return n + offset


def test_configurable_class_both_ways():
    cfg = OmegaConf.create({"hidden_size": 8, "dropout": 0.1})
    b = Block(cfg)
    assert (b.hidden_size, b.dropout, b.bias) == (8, 0.1, True)
    b = Block(cfg, bias=False, dropout=0.5)  # extra keywords go to __init__
    assert (b.hidden_size, b.dropout, b.bias) == (8, 0.5, False)
    b = Block(cfg=cfg)
    assert b.hidden_size == 8
    b = Block(4, dropout=0.2)
    assert (b.hidden_size, b.dropout) == (4, 0.2)
    b = Block(hidden_size=2)
    assert b.hidden_size == 2
    assert SubBlock(cfg).hidden_size == 8
    assert Block.__init__.__name__ == "__init__"


def test_configurable_from_config_keyword_arguments():
    cfg = OmegaConf.create({"a": 1})
    assert WithExtra(cfg).b == 10
    assert WithExtra(cfg, b=3).b == 3
    assert WithExtra(a=2).b == 0


def test_configurable_function_both_ways():
    cfg = OmegaConf.create({"n": 3})
    assert build(cfg) == 3
    assert build(cfg, scale=2, offset=1) == 7
    assert build(5, offset=1) == 6
    assert build.from_config(cfg) == {"n": 3}


def test_configurable_with_lazycall():
    from libai.config import LazyCall

    cfg = OmegaConf.create({"hidden_size": 6, "dropout": 0.0})
    block = instantiate(LazyCall(Block)(cfg=cfg, bias=False))
    assert block.hidden_size == 6 and block.bias is False


def test_configurable_errors():
    with pytest.raises(TypeError, match="from_config"):
        NoFromConfig(OmegaConf.create({"a": 1}))
    with pytest.raises(TypeError):

        @configurable
        def not_init(a):
            return a

    @configurable(from_config=lambda c: {"a": 1})
    def f(a):
        return a

    with pytest.raises(TypeError, match="'cfg'"):
        f(OmegaConf.create({}))


# ------------------------------------------------------------------ try_get_key
def test_try_get_key():
    cfg = OmegaConf.create({"train": {"dist": {"tp": 2}, "none": None}})
    assert try_get_key(cfg, "train.dist.tp") == 2
    assert try_get_key(cfg, "train.missing", "train.dist.tp") == 2
    assert try_get_key(cfg, "train.missing", default=5) == 5
    assert try_get_key(cfg, "train.none", default=5) is None  # present, value None
    plain = {"train": {"dist": {"tp": 3}}}
    assert try_get_key(plain, "train.dist.tp") == 3
    assert try_get_key(plain, "train.x", default="d") == "d"


# ------------------------------------------------------------------ batch sizes
@pytest.mark.parametrize(
    "micro, glob, acc, dp, expected",
    [
        (4, None, None, 2, (4, 8, 1)),  # only micro: one accumulation step
        (4, None, 3, 2, (4, 24, 3)),  # micro + acc -> global
        (4, 32, None, 2, (4, 32, 4)),  # micro + global -> acc
        (None, 32, 2, 4, (4, 32, 2)),  # global + acc -> micro
        (None, 32, None, 4, (8, 32, 1)),  # only global: one accumulation step
        (4, 32, 4, 2, (4, 32, 4)),  # all three consistent
        (1, 1, 1, 1, (1, 1, 1)),
    ],
)
def test_resolve_batch_sizes(micro, glob, acc, dp, expected):
    train = OmegaConf.create(
        {"train_micro_batch_size": micro, "global_batch_size": glob, "num_accumulation_steps": acc}
    )
    out = resolve_batch_sizes(train, dp)
    assert tuple(out) == expected
    assert (train.train_micro_batch_size, train.global_batch_size, train.num_accumulation_steps) == expected
    assert out.global_batch_size == expected[1]


def test_resolve_batch_sizes_plain_dict_and_missing_keys():
    train = {"train_micro_batch_size": 2}
    resolve_batch_sizes(train, 3)
    assert train == {"train_micro_batch_size": 2, "global_batch_size": 6, "num_accumulation_steps": 1}


@pytest.mark.parametrize(
    "micro, glob, acc, dp, match",
    [
        (4, 30, 4, 2, "inconsistent"),  # 4*2*4 = 32 != 30
        (4, 30, None, 2, "divisible"),  # 30 % 8
        (None, 30, 4, 2, "divisible"),  # 30 % 8
        (None, 30, None, 4, "divisible"),
        (None, None, 4, 2, "set train"),
        (None, None, None, 1, "set train"),
        (0, None, None, 1, "positive"),
        (-2, None, None, 1, "positive"),
        (2.5, None, None, 1, "positive"),
        (True, None, None, 1, "positive"),
        (2, None, None, 0, "positive"),
    ],
)
def test_resolve_batch_sizes_errors(micro, glob, acc, dp, match):
    train = {"train_micro_batch_size": micro, "global_batch_size": glob, "num_accumulation_steps": acc}
    with pytest.raises(ValueError, match=match) as info:
        resolve_batch_sizes(train, dp)
    if match in ("inconsistent", "divisible"):
        msg = str(info.value)
        assert f"train_micro_batch_size={micro}" in msg and f"global_batch_size={glob}" in msg
        shown_acc = 1 if acc is None and (micro is None or glob is None) else acc  # defaulted
        assert f"num_accumulation_steps={shown_acc}" in msg and f"data_parallel_size={dp}" in msg
    assert train["train_micro_batch_size"] == micro  # untouched on error


def test_resolve_batch_sizes_on_shipped_train_config():
    train = get_config("common/train.py").train
    resolve_batch_sizes(train, 4)
    assert (train.global_batch_size, train.num_accumulation_steps) == (128, 1)


# ------------------------------------------------------------------ argument parser
def test_default_argument_parser():
    args = default_argument_parser().parse_args(
        ["--config-file", __file__, "--resume", "train.seed=1", "+a.b=2", "~train.amp"]
    )
    assert args.config_file == __file__ and args.resume and not args.eval_only
    assert args.opts == ["train.seed=1", "+a.b=2", "~train.amp"]


def test_flags_may_follow_or_split_the_overrides():
    args = default_argument_parser().parse_args(
        ["train.seed=1", "--config-file", __file__, "+a.b=2", "--resume", "~train.amp", "--overwrite-output-dir"])
    assert args.resume and args.overwrite_output_dir and args.config_file == __file__
    assert args.opts == ["train.seed=1", "+a.b=2", "~train.amp"]


@pytest.mark.parametrize("argv, message", [
    (["train.seed=1"], "--config-file is required"),
    (["--config-file", "no/such/recipe.py"], "--config-file 'no/such/recipe.py' does not exist"),
    (["--config-file", __file__, "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
])
def test_a_missing_config_file_or_unknown_flag_is_named(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        default_argument_parser().parse_args(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err
