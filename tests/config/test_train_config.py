"""resolve_train_config: cfg.train completed from configs/common/train.py once; unknown,
required and not-implemented keys refused with errors naming them."""
import logging
import os
import re

import pytest
from omegaconf import OmegaConf

from libai.config import ConfigKeyError, LazyCall, LazyConfig, get_config, resolve_train_config
from libai.config.train_config import NOT_IMPLEMENTED
from libai.evaluation import PPLEvaluator

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def recipe(*overrides):
    cfg = LazyConfig.load(os.path.join(ROOT, "configs", "mlp_classifier.py"))
    return LazyConfig.apply_overrides(cfg, list(overrides))


def test_missing_keys_take_the_common_defaults_and_set_keys_stay():
    cfg = recipe("~train.evaluation.eval_period", "~train.checkpointer", "~train.seed", "~train.amp")
    defaults = get_config("common/train.py").train
    train = resolve_train_config(cfg)
    assert train is cfg.train
    assert train.evaluation.eval_period == defaults.evaluation.eval_period == 5000
    assert train.checkpointer == defaults.checkpointer == {"period": 5000, "max_to_keep": 100,
                                                           "save_model_after_n_epoch": None}
    assert train.seed == 1234 and train.amp == {"enabled": False, "dtype": None}
    # what the recipe set is kept
    assert train.train_iter == 300 and train.evaluation.eval_iter == 100 and train.output_dir.endswith("mlp_classifier")
    assert set(train) == set(defaults)


def test_input_placement_device_defaults_to_cpu():
    cfg = recipe("~train.input_placement_device")
    assert resolve_train_config(cfg).input_placement_device == "cpu"
    assert get_config("common/train.py").train.input_placement_device == "cpu"
    with pytest.raises(ValueError, match="input_placement_device.*'gpu'"):
        resolve_train_config(recipe("train.input_placement_device=gpu"))


def test_resolving_twice_changes_nothing():
    cfg = recipe("~train.log_period")
    resolve_train_config(cfg)
    once = OmegaConf.to_container(cfg, resolve=False)
    resolve_train_config(cfg)
    assert OmegaConf.to_container(cfg, resolve=False) == once


def test_lazycall_nodes_are_taken_whole_not_merged_with_the_default():
    cfg = recipe()
    cfg.train.evaluation.evaluator = LazyCall(PPLEvaluator)()
    cfg.train.scheduler = LazyCall("libai.scheduler.WarmupMultiStepLR")(milestones=[10])
    train = resolve_train_config(cfg)
    assert set(train.evaluation.evaluator) == {"_target_"}  # no `topk` from ClsEvaluator's default
    assert set(train.scheduler) == {"_target_", "milestones"}  # no `alpha` from the cosine default


@pytest.mark.parametrize("key,suggested", [
    ("train.eval_perod", "train.evaluation.eval_period"),
    ("train.checkpointer.perod", "train.checkpointer.period"),
    ("train.dist.tensor_paralel_size", "train.dist.tensor_parallel_size"),
])
def test_unknown_key_is_an_error_naming_it_and_the_close_key(key, suggested):
    cfg = recipe(f"+{key}=3")
    with pytest.raises(ConfigKeyError) as info:
        resolve_train_config(cfg)
    msg = str(info.value)
    assert repr(key) in msg and repr(suggested) in msg and "did you mean" in msg


def test_every_unknown_key_is_named():
    with pytest.raises(ConfigKeyError) as info:
        resolve_train_config(recipe("+train.sed=1", "+train.evaluation.enable=false"))
    assert "'train.sed'" in str(info.value) and "'train.evaluation.enable'" in str(info.value)


def test_required_key_left_missing_is_an_error_naming_it():
    defaults = get_config("common/train.py").train
    defaults.output_dir = "???"  # a schema with a required key
    cfg = recipe("~train.output_dir")
    with pytest.raises(ConfigKeyError, match=r"required config key\(s\) not set: train\.output_dir"):
        resolve_train_config(cfg, defaults=defaults)
    cfg = recipe()
    cfg.train.evaluation.eval_metric = "???"  # left MISSING by the recipe itself
    with pytest.raises(ConfigKeyError, match=r"train\.evaluation\.eval_metric"):
        resolve_train_config(cfg)


def test_a_config_without_train_is_an_error():
    with pytest.raises(ConfigKeyError, match="no `train` section"):
        resolve_train_config(OmegaConf.create({"model": {}}))


NON_DEFAULT = {
    "nccl_fusion_threshold_mb": "32",
    "nccl_fusion_max_ops": "8", "consumed_train_samples": "64", "consumed_valid_samples": "64",
    "train_samples": "1000", "start_iter": "5",
}


def test_the_not_implemented_list_is_covered_here():
    assert set(NON_DEFAULT) == set(NOT_IMPLEMENTED)


@pytest.mark.parametrize("key", sorted(NON_DEFAULT))
def test_not_implemented_key_with_a_non_default_value_is_refused(key):
    with pytest.raises(NotImplementedError, match=rf"train\.{re.escape(key)}=.*is not implemented"):
        resolve_train_config(recipe(f"train.{key}={NON_DEFAULT[key]}"))


def test_libai_defaults_of_not_implemented_keys_are_accepted():
    train = resolve_train_config(recipe("train.amp.enabled=false", "train.rdma_enabled=false",
                                        "train.dist.pipeline_num_layers=4"))
    assert train.amp.enabled is False and train.rdma_enabled is False


def test_rdma_enabled_is_accepted_with_a_log_note(caplog):
    """LiBai's default rdma_enabled=True only picks OneFlow's transport: accepted, noted."""
    with caplog.at_level(logging.INFO, logger="libai.config.train_config"):
        train = resolve_train_config(recipe("train.rdma_enabled=true"))
    assert train.rdma_enabled is True and "train.rdma_enabled=True: no effect here" in caplog.text
    with pytest.raises(ValueError, match="train.rdma_enabled must be true or false, got 'yes'"):
        resolve_train_config(recipe("train.rdma_enabled=yes"))


def test_libai_whole_floats_become_integers_and_epoch_periods_are_checked():
    train = resolve_train_config(recipe("train.evaluation.eval_iter=1e5", "train.checkpointer.period=100.0"))
    assert train.evaluation.eval_iter == 100000 and isinstance(train.evaluation.eval_iter, int)
    assert train.checkpointer.period == 100 and isinstance(train.checkpointer.period, int)
    assert train.evaluation.eval_after_n_epoch is None and train.checkpointer.save_model_after_n_epoch is None
    with pytest.raises(ValueError, match="train.evaluation.eval_iter must be an integer >= 1 or None, got 2.5"):
        resolve_train_config(recipe("train.evaluation.eval_iter=2.5"))
    with pytest.raises(ValueError, match="train.evaluation.eval_after_n_epoch must be an integer >= 1 or None"):
        resolve_train_config(recipe("train.evaluation.eval_after_n_epoch=0"))


@pytest.mark.parametrize("override, message", [
    ("train.train_iter=abc", "train.train_iter must be an integer >= 0, got 'abc'"),
    ("train.train_iter=-3", "train.train_iter must be an integer >= 0, got -3"),
    ("train.test_micro_batch_size=0", "train.test_micro_batch_size must be an integer >= 1, got 0"),
    ("train.train_micro_batch_size=2.5", "train.train_micro_batch_size must be an integer >= 1 or None, got 2.5"),
    ("train.log_period=0", "train.log_period must be an integer >= 1, got 0"),
    ("train.warmup_ratio=1.5", "train.warmup_ratio must be a number in [0, 1), got 1.5"),
    ("train.evaluation.eval_iter=0", "train.evaluation.eval_iter must be an integer >= 1 or None, got 0"),
    ("train.evaluation.eval_mode=best", "train.evaluation.eval_mode must be 'max' or 'min', got 'best'"),
    ("train.checkpointer.period=often", "train.checkpointer.period must be an integer"),
    ("train.dist.tensor_parallel_size=0", "train.dist.tensor_parallel_size must be an integer >= 1, got 0"),
    ("train.resume=maybe", "train.resume must be true or false, got 'maybe'"),
    ("train.output_dir=''", "train.output_dir must be a non-empty path"),
    ("train.input_placement_device=tpu", "train.input_placement_device must be one of ('cpu', 'cuda'), got 'tpu'"),
    ("train.seed=1.5", "train.seed must be an integer (None or < 0: a seed is drawn at random and recorded) or None, "
                        "got 1.5"),
    ("train.dist.device_type=gpu", "train.dist.device_type must be one of ('cpu', 'cuda') or None, got 'gpu'"),
])
def test_a_value_of_the_wrong_type_or_range_is_named(override, message):
    with pytest.raises(ValueError) as e:
        resolve_train_config(recipe(override))
    assert message in str(e.value)


def test_every_plain_train_key_has_a_value_check_or_is_not_implemented():
    """A key added to configs/common/train.py gets a type check (VALUE_CHECKS) or a refusal."""
    from libai.config.train_config import VALUE_CHECKS

    defaults = OmegaConf.to_container(get_config("common/train.py").train, resolve=False)

    def leaves(node, prefix=""):
        for k, v in node.items():
            if isinstance(v, dict) and "_target_" not in v:
                yield from leaves(v, f"{prefix}{k}.")
            elif not (isinstance(v, dict) and "_target_" in v):
                yield prefix + k

    unchecked = [k for k in leaves(defaults) if k not in VALUE_CHECKS and k not in NOT_IMPLEMENTED]
    assert unchecked == []


def test_docs_list_every_not_implemented_key():
    with open(os.path.join(ROOT, "docs", "config.md")) as f:
        doc = f.read()
    section = doc[doc.index("### Not implemented"):]
    for key in NOT_IMPLEMENTED:
        assert f"`{key}`" in section, key


def test_engine_and_tools_read_train_keys_without_inline_defaults():
    """The rule this module exists for: train keys are read as plain cfg.train.x."""
    files = [os.path.join(ROOT, "libai", "engine", f) for f in os.listdir(os.path.join(ROOT, "libai", "engine"))]
    files += [os.path.join(ROOT, "tools", f) for f in ("train_net.py", "generate.py", "convert_checkpoint.py")]
    for path in files:
        if path.endswith(".py"):
            with open(path) as f:
                src = f.read()
            assert not re.search(r"try_get_key\([^)]*[\"']train\.", src), path


def test_a_vocabulary_padding_that_is_not_positive_is_refused():
    from libai.config import LazyConfig
    from libai.engine import DefaultTrainer

    cfg = LazyConfig.load(os.path.join(ROOT, "configs", "gpt2_pretrain.py"))
    for bad in (0, -128):
        LazyConfig.apply_overrides(cfg, [f"tokenization.make_vocab_size_divisible_by={bad}"])
        with pytest.raises(ValueError, match=f"make_vocab_size_divisible_by must be a positive integer .*got {bad}"):
            DefaultTrainer.build_tokenizer(cfg)
