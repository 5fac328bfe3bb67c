"""`resolve_train_config`: the `train` section checked and completed once, against
configs/common/train.py, so that the rest of the code reads plain `cfg.train.x`.

configs/common/train.py is the single place where a default of a `train` key is written; the
trainer, `default_setup` and the tools carry no fallback values of their own. Resolution:

1. fills every key the recipe left out with its default (a LazyCall node such as `scheduler`
   or `evaluation.evaluator` is taken whole, never merged key by key with the default's);
2. refuses keys that configs/common/train.py does not have (typos such as
   `train.eval_perod`), naming them and their closest known keys, as overrides do;
3. refuses a value left at OmegaConf's MISSING (`"???"`): a required key, named;
4. refuses a non-default value of a LiBai key that is not implemented here (NOT_IMPLEMENTED)
   with NotImplementedError; the defaults are accepted, so LiBai configs load; a LiBai key that
   only chooses OneFlow's transport (NO_EFFECT: rdma_enabled) takes any value, noted in the log;
5. turns a whole float where an integer is expected into that integer (LiBai writes
   `eval_iter=1e5`), then checks the type and range of every plain value (VALUE_CHECKS):
   `train.train_iter=abc` or `train.test_micro_batch_size=0` is a ValueError naming the key and
   what it must be, before anything is built.

It is idempotent and changes `cfg.train` in place. See docs/config.md.
"""
import logging
from numbers import Integral, Real

from omegaconf import DictConfig, OmegaConf

from .config import get_config
from .lazy import ConfigKeyError, unknown_key_error

__all__ = ["resolve_train_config", "NOT_IMPLEMENTED", "NO_EFFECT", "VALUE_CHECKS"]

# LiBai `train` keys not implemented here: a value other than configs/common/train.py's default
# would be silently ignored (pipeline_parallel_size > 1 would fail deep inside the model), so it
# is refused. docs/config.md has the same list.
NOT_IMPLEMENTED = {
    "nccl_fusion_threshold_mb": "OneFlow's NCCL fusion of collectives",
    "nccl_fusion_max_ops": "OneFlow's NCCL fusion of collectives",
    "consumed_train_samples": "starting from a sample count (a resume restores the data position "
                              "from the checkpoint)",
    "consumed_valid_samples": "starting from a validation sample count",
    "train_samples": "sizing the training by samples (use train_iter or train_epoch)",
    "start_iter": "starting at a chosen iteration (--resume continues after the checkpoint's)",
}

# LiBai `train` keys whose value changes how OneFlow moves data, never the results: any value of
# the right type is accepted and a non-default one is noted in the log.
NO_EFFECT = {
    "rdma_enabled": "OneFlow's RDMA transport between pipeline stages; the engine's collectives go over MPI or "
                    "NCCL (which use RDMA where the fabric has it)",
}

INPUT_PLACEMENT_DEVICES = ("cpu", "cuda")


def _is_int(v):
    return isinstance(v, Integral) and not isinstance(v, bool)


def _int_at_least(low):
    return (lambda v: _is_int(v) and v >= low), f"an integer >= {low}"


def _optional(check):
    test, what = check
    return (lambda v: v is None or test(v)), f"{what} or None"


_POSITIVE = _int_at_least(1)
_COUNT = _int_at_least(0)
_INT = (_is_int, "an integer")
_BOOL = (lambda v: isinstance(v, bool), "true or false")
_STR = (lambda v: isinstance(v, str), "a string")

# The type and range of each plain `train` value (LazyCall nodes and NOT_IMPLEMENTED keys are
# not listed). A value outside is a ValueError naming the key before anything is built.
VALUE_CHECKS = {
    "output_dir": ((lambda v: isinstance(v, str) and v != ""), "a non-empty path"),
    "train_micro_batch_size": _optional(_POSITIVE),
    "global_batch_size": _optional(_POSITIVE),
    "num_accumulation_steps": _optional(_POSITIVE),
    "train_iter": _COUNT,
    "train_epoch": _COUNT,
    "warmup_ratio": ((lambda v: isinstance(v, Real) and not isinstance(v, bool) and 0 <= v < 1),
                     "a number in [0, 1)"),
    "resume": _BOOL,
    "overwrite_output_dir": _BOOL,
    "checkpointer.period": (_INT[0], "an integer (<= 0 disables checkpoints)"),
    "checkpointer.max_to_keep": _optional((_INT[0], "an integer (<= 0 keeps every checkpoint)")),
    "test_micro_batch_size": _POSITIVE,
    "evaluation.enabled": _BOOL,
    "evaluation.eval_period": (_INT[0], "an integer (<= 0: evaluate only after the last iteration)"),
    "evaluation.eval_iter": _optional(_POSITIVE),
    "evaluation.eval_after_n_epoch": _optional(_POSITIVE),
    "checkpointer.save_model_after_n_epoch": _optional(_POSITIVE),
    "rdma_enabled": _BOOL,
    "evaluation.eval_metric": _STR,
    "evaluation.eval_mode": ((lambda v: v in ("max", "min")), "'max' or 'min'"),
    "load_weight": _optional(_STR),
    "log_period": _POSITIVE,
    "dist.data_parallel_size": _optional(_POSITIVE),  # None: inferred from the world size
    "dist.tensor_parallel_size": _POSITIVE,
    "dist.pipeline_num_layers": _optional(_POSITIVE),
    "dist.custom_pipeline_stage_id": _optional(
        ((lambda v: isinstance(v, (list, tuple)) and all(_is_int(x) and x >= 0 for x in v)),
         "a list of stage ids (integers >= 0)")),
    "dist.pipeline_parallel_size": _POSITIVE,
    "activation_checkpoint.enabled": _BOOL,
    "graph.enabled": _BOOL,
    "graph.debug": _INT,
    "cuda_graph.enabled": _BOOL,
    "cuda_graph.warmup_iters": _COUNT,
    "amp.enabled": _BOOL,
    "amp.dtype": ((lambda v: v in (None, "float16", "bfloat16")), "'float16', 'bfloat16' or None"),
    "zero_optimization.enabled": _BOOL,
    "zero_optimization.stage": ((lambda v: v in (1, 2, 3) and not isinstance(v, bool)), "1, 2 or 3"),
    "dist.pipeline_schedule": ((lambda v: v in ("1F1B", "GPipe")), "'1F1B' or 'GPipe'"),
    "dist.device_type": _optional(((lambda v: v in INPUT_PLACEMENT_DEVICES), f"one of {INPUT_PLACEMENT_DEVICES}")),
    "input_placement_device": ((lambda v: v in INPUT_PLACEMENT_DEVICES), f"one of {INPUT_PLACEMENT_DEVICES}"),
    "seed": _optional((_INT[0], "an integer (None or < 0: a seed is drawn at random and recorded)")),
}


def _is_section(value):
    """A plain group of keys (amp, dist, ...), as opposed to a LazyCall node or a value."""
    return isinstance(value, dict) and "_target_" not in value


def _fill_defaults(node, given, defaults, prefix, unknown):
    """Add to `node` (a DictConfig; `given` is its plain view) the keys of `defaults` it lacks,
    recursing into sections; collect the dotted keys of `given` that `defaults` lacks."""
    unknown.extend(prefix + k for k in given if k not in defaults)
    for key, default in defaults.items():
        if key not in given:
            node[key] = default
        elif _is_section(given[key]) and _is_section(default):
            _fill_defaults(node[key], given[key], default, f"{prefix}{key}.", unknown)


def _missing_keys(value, prefix):
    if isinstance(value, dict):
        return [m for k, v in value.items() for m in _missing_keys(v, f"{prefix}.{k}")]
    if isinstance(value, list):
        return [m for i, v in enumerate(value) for m in _missing_keys(v, f"{prefix}.{i}")]
    return [prefix] if isinstance(value, str) and value == "???" else []


def _check_not_implemented(train, defaults):
    refused = []
    for key, feature in NOT_IMPLEMENTED.items():
        value, default = OmegaConf.select(train, key), OmegaConf.select(defaults, key)
        if value != default:
            refused.append(f"train.{key}={value!r}: {feature} is not implemented (only the default "
                           f"{default!r} is accepted)")
    if refused:
        raise NotImplementedError("; ".join(refused) + " -- see docs/config.md")


def _integral_floats_to_int(train):
    """LiBai's configs write counts as floats (`eval_iter=1e5`): a whole float where an integer
    is expected becomes that integer."""
    for key, (test, _) in VALUE_CHECKS.items():
        value = OmegaConf.select(train, key, default=None)
        if isinstance(value, float) and value.is_integer() and not test(value) and test(int(value)):
            OmegaConf.update(train, key, int(value), merge=False)


def _note_no_effect(train, defaults):
    for key, note in NO_EFFECT.items():
        value = OmegaConf.select(train, key)
        if value != OmegaConf.select(defaults, key):
            logging.getLogger(__name__).info(f"train.{key}={value!r}: no effect here ({note})")


def _check_values(train):
    errors = []
    for key, (test, what) in VALUE_CHECKS.items():
        value = OmegaConf.select(train, key, default=None)
        if isinstance(value, DictConfig) or OmegaConf.is_list(value):
            value = OmegaConf.to_container(value, resolve=True)
        if not test(value):
            errors.append(f"train.{key} must be {what}, got {value!r}")
    if errors:
        raise ValueError("; ".join(errors) + " (docs/config.md lists every train key)")


def resolve_train_config(cfg, defaults=None):
    """Check and complete `cfg.train` in place (see the module docstring); returns it.

    `defaults`: the `train` node to resolve against (default: configs/common/train.py's), for
    projects whose train section has keys of their own. Raises ConfigKeyError for a missing
    `train` section, unknown or required keys, NotImplementedError for a non-default value of
    a NOT_IMPLEMENTED key, ValueError for a value of the wrong type or range (VALUE_CHECKS).
    """
    if "train" not in cfg or not isinstance(cfg.train, DictConfig):
        raise ConfigKeyError("the config has no `train` section: start from configs/common/train.py "
                             "(`train = get_config(\"common/train.py\").train`)")
    train = cfg.train
    if defaults is None:
        defaults = get_config("common/train.py").train
    plain_defaults = OmegaConf.to_container(defaults, resolve=False)
    unknown = []
    _fill_defaults(train, OmegaConf.to_container(train, resolve=False), plain_defaults, "", unknown)
    if unknown:
        schema = {"train": plain_defaults}
        raise ConfigKeyError("\n".join(
            str(unknown_key_error(f"train.{k}", schema, " (the train keys are those of configs/common/train.py, "
                                                         "docs/config.md)"))
            for k in unknown))
    missing = _missing_keys(OmegaConf.to_container(train, resolve=False), "train")
    if missing:
        raise ConfigKeyError(f"required config key(s) not set: {', '.join(missing)} (set them in the recipe or "
                             f"on the command line, e.g. {missing[0]}=...)")
    _check_not_implemented(train, defaults)
    _integral_floats_to_int(train)
    _check_values(train)
    _note_no_effect(train, defaults)
    return train
