"""`instantiate`: turn a LazyCall config (a dict with `_target_`) into the object it describes.

A LazyCall node is any mapping (DictConfig or dict) with a `_target_` key; `_target_` is a callable
or a dotted import path ("engine.optim.AdamW"). Its other keys are the keyword arguments. Children
are instantiated first (depth first) unless the node sets `_recursive_=False`, in which case they are
passed to the target as they are (DictConfig / ListConfig, uninstantiated).

`_target_` may itself be a LazyCall node: it is instantiated first and the object it builds is
called (LiBai's "lazy target"). `instantiate(cfg, _recursive_=False)` switches the recursion off
for the top-level node, as `_recursive_=False` inside the node does.

Lists (ListConfig, list, tuple) are walked and come back as Python lists (tuples stay tuples and
namedtuples keep their type), so a target gets `betas=[0.9, 0.999]` rather than a ListConfig.
Mappings without `_target_` come back unchanged (the same DictConfig) when nothing inside them is
a LazyCall; otherwise as a plain dict of instantiated values.

Any failure while building a node is raised as `InstantiationError` naming the node's path in the
config (e.g. `optim.params`) and its target; the original exception is chained as `__cause__`.
"""
import importlib
import inspect
from collections import abc

from omegaconf import DictConfig, ListConfig, OmegaConf

__all__ = ["instantiate", "locate", "InstantiationError", "is_lazy_node"]

_RESERVED = ("_target_", "_recursive_")
UNSERIALIZABLE = "<unserializable "  # how LazyConfig.save writes a value YAML cannot hold


class InstantiationError(RuntimeError):
    """Building one config node failed; `path` is the node's dotted path, `target` its target."""

    def __init__(self, message, path="", target=None):
        super().__init__(message)
        self.path = path
        self.target = target


def is_lazy_node(node):
    """True for a mapping with a `_target_` key (what LazyCall produces)."""
    if isinstance(node, DictConfig):
        return not node._is_none() and not node._is_missing() and "_target_" in node
    return isinstance(node, abc.Mapping) and "_target_" in node


def _contains_lazy(node):
    if is_lazy_node(node):
        return True
    if isinstance(node, DictConfig):
        if node._is_none() or node._is_missing():
            return False
        return any(_contains_lazy(node._get_node(k)) for k in node.keys())
    if isinstance(node, ListConfig):
        if node._is_none() or node._is_missing():
            return False
        return any(_contains_lazy(node._get_node(i)) for i in range(len(node)))
    if isinstance(node, abc.Mapping):
        return any(_contains_lazy(v) for v in node.values())
    if isinstance(node, (list, tuple)):
        return any(_contains_lazy(v) for v in node)
    return False


def locate(path):
    """Import the object named by a dotted path ("pkg.module.Class.attr")."""
    if not isinstance(path, str) or not path or not all(p.isidentifier() for p in path.split(".")):
        raise ImportError(f"cannot locate {path!r}: not a dotted path of Python identifiers")
    parts = path.split(".")
    try:
        obj = importlib.import_module(parts[0])
    except ModuleNotFoundError as e:
        if e.name == parts[0]:
            raise ImportError(f"cannot locate {path!r}: no module named {parts[0]!r}") from e
        raise
    for i in range(1, len(parts)):
        part = parts[i]
        if inspect.ismodule(obj):
            modname = ".".join(parts[: i + 1])
            if not hasattr(obj, part):
                try:
                    importlib.import_module(modname)
                except ModuleNotFoundError as e:
                    if e.name != modname:
                        raise
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ImportError(
                f"cannot locate {path!r}: {'.'.join(parts[:i])!r} has no attribute {part!r}"
            ) from None
    return obj


def _target_name(target):
    if isinstance(target, str):
        return target
    mod = getattr(target, "__module__", None)
    qual = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    if qual is None:
        return repr(target)
    return f"{mod}.{qual}" if mod else qual


def _node_path(node):
    """The dotted path of an OmegaConf node inside its root config ("" for the root or non-nodes)."""
    parts = []
    try:
        while OmegaConf.is_config(node) and node._get_parent() is not None:
            parts.append(node._key())
            node = node._get_parent()
    except Exception:  # pragma: no cover - best effort only
        return ""
    return _join_path(*reversed(parts))


def _join_path(*parts):
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif p is not None and p != "":
            out = f"{out}.{p}" if out else str(p)
    return out


def _items(node):
    """(key, value) pairs of a mapping; for a DictConfig the values are resolved (interpolations)."""
    if isinstance(node, DictConfig):
        return [(k, node[k]) for k in node.keys()]
    return list(node.items())


def _display(path):
    return path if path else "<root>"


def _instantiate(node, path, overrides=None, recursive=None):
    if isinstance(node, ListConfig):
        if node._is_none():
            return None
        return [_instantiate(node[i], _join_path(path, i)) for i in range(len(node))]
    if isinstance(node, (list, tuple)):
        out = [_instantiate(v, _join_path(path, i)) for i, v in enumerate(node)]
        if isinstance(node, tuple):
            return type(node)(*out) if hasattr(node, "_fields") else tuple(out)  # namedtuples keep their type
        return out

    if is_lazy_node(node):
        try:
            items = _items(node)
        except Exception as e:
            raise InstantiationError(
                f"error reading config node '{_display(path)}': {type(e).__name__}: {e}", path
            ) from e
        raw = dict(items)
        target = raw.pop("_target_")
        node_recursive = raw.pop("_recursive_", True)
        recursive = node_recursive if recursive is None else recursive
        if not isinstance(recursive, bool):
            raise TypeError(f"config node '{_display(path)}': _recursive_ must be a bool, got {recursive!r}")
        if is_lazy_node(target):  # a lazy target: build the callable first
            target = _instantiate(target, _join_path(path, "_target_"))
        name = _target_name(target)
        overrides = overrides or {}
        kwargs = {}
        for k, v in raw.items():
            if isinstance(v, str) and v.startswith(UNSERIALIZABLE):
                raise InstantiationError(
                    f"config node '{_join_path(path, k)}' holds {v!r}: a value its saved config.yaml could not "
                    "hold (a function or object defined in a config file); run the original .py config, or "
                    "make the value importable (a function of a module) so that it saves as a dotted path",
                    _join_path(path, k), name if isinstance(name, str) else None)
            if k not in overrides:  # an overridden argument is never built from the config
                kwargs[k] = _instantiate(v, _join_path(path, k)) if recursive else v
        if overrides:
            for k, v in overrides.items():
                kwargs[k] = _instantiate(v, _join_path(path, k)) if recursive and OmegaConf.is_config(v) else v
        try:
            if isinstance(target, str):
                target = locate(target)
            if not callable(target):
                raise TypeError(f"_target_ {target!r} is not callable")
            return target(**kwargs)
        except InstantiationError:
            raise
        except Exception as e:
            raise InstantiationError(
                f"error instantiating config node '{_display(path)}' (_target_={name}): "
                f"{type(e).__name__}: {e}",
                path,
                name,
            ) from e

    if isinstance(node, abc.Mapping):
        if not _contains_lazy(node):
            return node
        return {k: _instantiate(v, _join_path(path, k)) for k, v in _items(node)}
    return node


def instantiate(cfg, *, _recursive_=None, **overrides):
    """Build the object a LazyCall config describes (recursively); see the module docstring.

    `overrides` replace (or add) keyword arguments of the top-level call; config values among
    them are instantiated, other values (e.g. a model) are passed as they are::

        optimizer = instantiate(cfg.optim, params=param_groups)

    `_recursive_=False` passes the top-level node's arguments to its target uninstantiated (as
    the node's own `_recursive_` key does); on a list, to each element's target.
    """
    if _recursive_ is not None and not isinstance(_recursive_, bool):
        raise TypeError(f"instantiate(cfg, _recursive_=...): must be a bool, got {_recursive_!r}")
    if overrides and not is_lazy_node(cfg):
        raise TypeError(
            "instantiate(cfg, **overrides): overrides need a LazyCall config (a mapping with "
            f"'_target_'), got {type(cfg).__name__}"
        )
    path = _node_path(cfg)
    if _recursive_ is not None and not is_lazy_node(cfg) and isinstance(cfg, (ListConfig, list, tuple)):
        items = [cfg[i] for i in range(len(cfg))]
        return [_instantiate(v, _join_path(path, i), recursive=_recursive_) for i, v in enumerate(items)]
    return _instantiate(cfg, path, overrides, recursive=_recursive_)
