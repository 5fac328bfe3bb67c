"""The batch-size rule: global = micro x data_parallel_size x accumulation steps."""
from collections import namedtuple
from numbers import Integral

__all__ = ["resolve_batch_sizes", "BatchSizes"]

BatchSizes = namedtuple("BatchSizes", ["train_micro_batch_size", "global_batch_size", "num_accumulation_steps"])

_KEYS = BatchSizes._fields


def _get(cfg, key):
    return cfg.get(key, None) if hasattr(cfg, "get") else getattr(cfg, key, None)


def _set(cfg, key, value):
    try:
        cfg[key] = value
    except TypeError:
        setattr(cfg, key, value)


def _check_positive_int(name, value):
    if value is None:
        return None
    if isinstance(value, bool) or not (
        isinstance(value, Integral) or (isinstance(value, float) and value.is_integer())
    ):
        raise ValueError(f"train.{name} must be a positive integer or None, got {value!r}")
    value = int(value)
    if value <= 0:
        raise ValueError(f"train.{name} must be a positive integer or None, got {value}")
    return value


def resolve_batch_sizes(train_cfg, data_parallel_size):
    """Fill in the missing batch-size keys of `train_cfg` in place and check consistency.

        global_batch_size = train_micro_batch_size * data_parallel_size * num_accumulation_steps

    Any two of the three determine the third. With only `train_micro_batch_size` (or only
    `global_batch_size`), `num_accumulation_steps` defaults to 1. Raises ValueError, naming the
    three values and the data-parallel size, when they disagree or do not divide evenly.
    Returns `BatchSizes(train_micro_batch_size, global_batch_size, num_accumulation_steps)`.
    """
    dp = _check_positive_int("data_parallel_size", data_parallel_size)
    if dp is None:
        raise ValueError("data_parallel_size must be a positive integer, got None")
    micro, glob, acc = (_check_positive_int(k, _get(train_cfg, k)) for k in _KEYS)

    def describe():
        return (
            f"train_micro_batch_size={micro}, global_batch_size={glob}, "
            f"num_accumulation_steps={acc}, data_parallel_size={dp}"
        )

    if micro is None and glob is None:
        raise ValueError(
            f"set train.train_micro_batch_size or train.global_batch_size (got {describe()})"
        )
    if micro is None or glob is None:
        acc = 1 if acc is None else acc
        if micro is None:
            if glob % (dp * acc) != 0:
                raise ValueError(
                    f"global_batch_size must be divisible by data_parallel_size * "
                    f"num_accumulation_steps = {dp * acc} ({describe()})"
                )
            micro = glob // (dp * acc)
        else:
            glob = micro * dp * acc
    elif acc is None:
        if glob % (micro * dp) != 0:
            raise ValueError(
                f"global_batch_size must be divisible by train_micro_batch_size * data_parallel_size "
                f"= {micro * dp} ({describe()})"
            )
        acc = glob // (micro * dp)
    elif glob != micro * dp * acc:
        raise ValueError(
            f"inconsistent batch sizes: global_batch_size must equal train_micro_batch_size * "
            f"data_parallel_size * num_accumulation_steps = {micro * dp * acc} ({describe()})"
        )
    for k, v in zip(_KEYS, (micro, glob, acc)):
        _set(train_cfg, k, v)
    return BatchSizes(micro, glob, acc)
