"""Turning a config node into a model's keyword arguments, with named errors.

LiBai's model configs are plain dicts of constructor keys (`model.cfg`); a typo there must be an
error naming the key (and the nearest known ones), not a silently ignored value."""
import inspect
import numbers

from libai.config import ConfigKeyError, unknown_key_error

__all__ = ["kwargs_from_config", "check_positive_sizes"]


def kwargs_from_config(cls, cfg, required=()):
    """The keyword arguments of `cfg` (a config node or dict) for `cls.__init__`: only the keys
    it holds, so the defaults stay those of the signature. A key the signature does not take,
    or a `required` key that is missing or None, raises ConfigKeyError."""
    known = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    unknown = [k for k in cfg if k not in known]
    if unknown:
        schema = {"model": {"cfg": dict.fromkeys(known)}}
        raise ConfigKeyError(f"{cls.__name__}: " + "\n".join(str(unknown_key_error(f"model.cfg.{k}", schema))
                                                             for k in unknown))
    args = {k: cfg[k] for k in cfg}
    missing = [k for k in required if args.get(k) is None]
    if missing:
        raise ConfigKeyError(f"{cls.__name__} config is missing {missing}")
    return args


def check_positive_sizes(model_name, **sizes):
    """ValueError naming the key unless each of `sizes` (a key: an int, or a list of ints such as
    Swin's depths) is a positive integer: a zero would otherwise surface as a ZeroDivisionError
    or a reshape error somewhere inside the model or the data loader."""
    for key, value in sizes.items():
        values = [value] if isinstance(value, (numbers.Number, str)) else list(value)
        if not values or any(isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1 for v in values):
            what = "a positive integer" if isinstance(value, (numbers.Number, str)) else "positive integers"
            raise ValueError(f"{model_name}: {key} must be {what}, got {value!r}")
