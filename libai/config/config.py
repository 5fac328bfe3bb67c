"""`configurable` (cfg-or-kwargs constructors), `try_get_key`, `get_config` (shipped configs)."""
import functools
import inspect
import os
from collections import abc

from omegaconf import DictConfig, OmegaConf

__all__ = ["configurable", "try_get_key", "get_config", "get_config_root"]


def configurable(init_func=None, *, from_config=None):
    """Let a class (on `__init__`) or a function accept a config node in place of its arguments.

    Usage 1, on `__init__` of a class that defines a `from_config(cls, cfg, ...)` classmethod::

        class Block:
            @configurable
            def __init__(self, hidden_size, dropout=0.0): ...

            @classmethod
            def from_config(cls, cfg):
                return {"hidden_size": cfg.hidden_size, "dropout": cfg.dropout}

        Block(hidden_size=8)          # plain keyword arguments
        Block(cfg)                    # from_config(cfg) gives the arguments
        Block(cfg, dropout=0.5)       # extra keywords override / complete them

    Usage 2, on a function, with `from_config` given to the decorator::

        @configurable(from_config=lambda cfg: {"n": cfg.n})
        def build(n, scale=1.0): ...

    A call counts as "with a config" when the first positional argument or the keyword `cfg` is
    a DictConfig. Keywords that `from_config` does not accept are forwarded to the wrapped
    callable (unless `from_config` takes **kwargs, then it gets them all).
    """
    if init_func is not None:
        if not (inspect.isfunction(init_func) and from_config is None and init_func.__name__ == "__init__"):
            raise TypeError(
                "@configurable without arguments decorates a class's __init__; for a function use "
                "@configurable(from_config=...)"
            )

        @functools.wraps(init_func)
        def wrapped(self, *args, **kwargs):
            from_config_func = getattr(type(self), "from_config", None)
            if from_config_func is None or not inspect.ismethod(from_config_func):
                raise TypeError(
                    f"class {type(self).__name__} uses @configurable and must define a "
                    "'from_config' classmethod"
                )
            if _called_with_cfg(*args, **kwargs):
                init_func(self, **_args_from_config(from_config_func, *args, **kwargs))
            else:
                init_func(self, *args, **kwargs)

        return wrapped

    if from_config is None:
        return configurable  # @configurable() == @configurable
    if not callable(from_config):
        raise TypeError("configurable(from_config=...) needs a callable taking 'cfg' first")

    def decorator(func):
        @functools.wraps(func)
        def wrapped(*args, **kwargs):
            if _called_with_cfg(*args, **kwargs):
                return func(**_args_from_config(from_config, *args, **kwargs))
            return func(*args, **kwargs)

        wrapped.from_config = from_config
        return wrapped

    return decorator


def _called_with_cfg(*args, **kwargs):
    if args and isinstance(args[0], DictConfig):
        return True
    return isinstance(kwargs.get("cfg"), DictConfig)


def _args_from_config(from_config_func, *args, **kwargs):
    sig = inspect.signature(from_config_func)
    params = list(sig.parameters.values())
    if not params or params[0].name != "cfg":
        name = getattr(from_config_func, "__qualname__", repr(from_config_func))
        raise TypeError(f"{name} must take 'cfg' as its first argument")
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        ret = from_config_func(*args, **kwargs)
    else:
        accepted = set(sig.parameters)
        extra = {k: kwargs.pop(k) for k in list(kwargs) if k not in accepted}
        ret = from_config_func(*args, **kwargs)
        if not isinstance(ret, abc.Mapping):
            raise TypeError(f"from_config must return a dict of arguments, got {type(ret).__name__}")
        ret = dict(ret)
        ret.update(extra)
    return dict(ret)


def try_get_key(cfg, *keys, default=None):
    """The value of the first of `keys` (dotted paths) present in `cfg`, else `default`.

    Works on DictConfig (OmegaConf.select) and on plain nested dicts / objects.
    """
    for key in keys:
        if OmegaConf.is_config(cfg):
            sentinel = object()
            value = OmegaConf.select(cfg, key, default=sentinel, throw_on_missing=False)
            if value is not sentinel:
                return value
            continue
        node, found = cfg, True
        for part in str(key).split("."):
            if isinstance(node, abc.Mapping) and part in node:
                node = node[part]
            elif not isinstance(node, abc.Mapping) and hasattr(node, part):
                node = getattr(node, part)
            else:
                found = False
                break
        if found:
            return node
    return default


def get_config_root():
    """The repository's top-level `configs/` directory (next to the `libai` package)."""
    here = os.path.dirname(os.path.abspath(__file__))  # .../libai/config
    return os.path.join(os.path.dirname(os.path.dirname(here)), "configs")


def _available_configs(root):
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__")))
        for f in sorted(filenames):
            if f.endswith((".py", ".yaml", ".yml")) and f != "__init__.py":
                found.append(os.path.relpath(os.path.join(dirpath, f), root).replace(os.sep, "/"))
    return found


def get_config(config_path):
    """Load a config shipped with the project, e.g. `get_config("common/train.py")`.

    `config_path` is relative to the repository's top-level `configs/` directory.
    """
    from .lazy import LazyConfig

    root = get_config_root()
    path = os.path.join(root, os.fspath(config_path))
    if not os.path.isfile(path):
        available = _available_configs(root) if os.path.isdir(root) else []
        listing = "\n  ".join(available) if available else "(none)"
        raise FileNotFoundError(
            f"{config_path!r} is not a config shipped with libai (looked for {path}).\n"
            f"Available configs under {root}:\n  {listing}"
        )
    return LazyConfig.load(path)
