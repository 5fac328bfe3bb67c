"""LazyConfig: Python (or YAML) config files whose values are plain data plus LazyCall nodes.

    from libai.config import LazyCall
    from .common.train import train            # relative imports work by file path
    optim = LazyCall(flow.optim.AdamW)(lr=1e-4)  # a DictConfig {"_target_": AdamW, "lr": 1e-4}

`LazyConfig.load(path)` executes such a file and returns its top-level dicts as one DictConfig;
`LazyConfig.save(cfg, path)` writes YAML (targets as dotted strings) that `load` reads back;
`LazyConfig.apply_overrides(cfg, ["optim.lr=1e-3", "+train.new=1", "~train.amp"])` applies
command-line overrides parsed by hydra's override grammar. See docs/config.md.
"""
import builtins
import dataclasses
import difflib
import enum
import inspect
import os
import re
import types
import uuid
import warnings
from collections import abc
from contextlib import contextmanager

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ValidationError

from .instantiate import UNSERIALIZABLE, locate
from .pyformat import config_to_py

__all__ = ["LazyCall", "LazyConfig", "ConfigKeyError"]

_CFG_PACKAGE = "libai._cfg_loader"
_FLAGS = {"allow_objects": True}


class LazyCall:
    """`LazyCall(target)(**kwargs)` records a call as a config instead of making it.

    The result is a DictConfig `{"_target_": target, **kwargs}`; `instantiate` makes the call later.
    `target` is a callable (class or function), a dotted import path string, or a LazyCall node
    whose instantiation gives the callable (a "lazy target", as in LiBai). A dataclass is stored as
    its import path: OmegaConf would turn the class itself into a structured config.
    """

    def __init__(self, target):
        if not (callable(target) or isinstance(target, (str, abc.Mapping))):
            raise TypeError(
                f"LazyCall target must be a callable, a dotted-path string or a LazyCall node, got {target!r}"
            )
        if isinstance(target, str) and not target:
            raise ValueError("LazyCall target must not be an empty string")
        if isinstance(target, abc.Mapping) and "_target_" not in target:
            raise TypeError(f"LazyCall target given as a mapping must be a LazyCall node (with '_target_'), "
                            f"got {target!r}")
        self._target = target

    def __call__(self, **kwargs):
        if "_target_" in kwargs:
            raise TypeError("LazyCall(...)(**kwargs): '_target_' is reserved")
        target = self._target
        if dataclasses.is_dataclass(target) and isinstance(target, type):
            path = _callable_to_string(target)
            if path is None:
                raise TypeError(
                    f"LazyCall({target.__qualname__}): a dataclass target is stored as its import path (OmegaConf "
                    "turns a dataclass type into a config), but this one cannot be imported by name; define it "
                    "at module level"
                )
            target = path
        try:
            return DictConfig(content={"_target_": target, **kwargs}, flags=dict(_FLAGS))
        except ValidationError:
            # OmegaConf cannot hold some types as values (e.g. `dict`); their import path works
            path = None if isinstance(target, str) else _callable_to_string(target)
            if path is None:
                raise
            return DictConfig(content={"_target_": path, **kwargs}, flags=dict(_FLAGS))

    def __repr__(self):
        return f"LazyCall({self._target!r})"


# ---------------------------------------------------------------------------------------------
# loading python config files: relative imports are resolved by file path
# ---------------------------------------------------------------------------------------------
def _package_name(filename):
    # a unique, import-safe pseudo package for each loaded file
    stem = re.sub(r"\W", "_", os.path.splitext(os.path.basename(filename))[0])
    return f"{_CFG_PACKAGE}.{stem}_{uuid.uuid4().hex[:8]}"


def _cast_to_config(obj):
    if isinstance(obj, dict):
        return DictConfig(obj, flags=dict(_FLAGS))
    return obj


def _exec_config_file(filename, namespace):
    with open(filename, encoding="utf-8") as f:
        source = f.read()
    code = compile(source, filename, "exec")
    exec(code, namespace)


def _load_config_module(filename):
    """Execute a config file as a fresh module object (never cached: every import is a new copy)."""
    name = _package_name(filename)
    module = types.ModuleType(name)
    module.__file__ = filename
    module.__package__ = name
    _exec_config_file(filename, module.__dict__)
    for k, v in list(module.__dict__.items()):
        if not k.startswith("_"):
            module.__dict__[k] = _cast_to_config(v)
    return module


def _load_config_dir(dirname, fromlist, origin):
    """`from .common import train`: a stand-in package whose attributes are the named files/dirs."""
    init = os.path.join(dirname, "__init__.py")
    if os.path.isfile(init):
        module = _load_config_module(init)
    else:
        module = types.ModuleType(_package_name(dirname))
        module.__file__ = dirname
    for item in fromlist or ():
        if item == "*" or hasattr(module, item):
            continue
        path = os.path.join(dirname, item)
        if os.path.isfile(path + ".py"):
            setattr(module, item, _load_config_module(path + ".py"))
        elif os.path.isdir(path):
            setattr(module, item, _load_config_dir(path, (), origin))
        else:
            raise ImportError(
                f"cannot import {item!r} in config file {origin}: neither {path}.py nor the "
                f"directory {path} exists"
            )
    return module


def _relative_import(origin, name, level, fromlist):
    base = os.path.dirname(os.path.abspath(origin))
    for _ in range(level - 1):
        base = os.path.dirname(base)
    target = os.path.join(base, *name.split(".")) if name else base
    shown = "." * level + (name or "")
    if name and os.path.isfile(target + ".py"):
        return _load_config_module(target + ".py")
    if os.path.isdir(target):
        return _load_config_dir(target, fromlist, origin)
    raise ImportError(
        f"cannot import {shown!r} in config file {origin}: {target}.py does not exist "
        "(relative imports in config files are resolved by file path)"
    )


@contextmanager
def _patch_import():
    """While config files execute, relative imports inside them load sibling config files."""
    old_import = builtins.__import__

    def new_import(name, globals=None, locals=None, fromlist=(), level=0):
        if (
            level > 0
            and globals is not None
            and str(globals.get("__package__") or "").startswith(_CFG_PACKAGE)
            and globals.get("__file__")
        ):
            return _relative_import(globals["__file__"], name, level, fromlist)
        return old_import(name, globals, locals, fromlist, level)

    builtins.__import__ = new_import
    try:
        yield
    finally:
        builtins.__import__ = old_import


# ---------------------------------------------------------------------------------------------
# serialisation helpers
# ---------------------------------------------------------------------------------------------
_PRIMITIVES = (str, int, float, bool, type(None))

# (repr of a plain config, its YAML): a training run writes the same config at its start and into
# every checkpoint, and building the YAML through OmegaConf nodes takes 30-70 ms; the repr keeps
# 1, 1.0 and True apart, and the keys' order, as the YAML does
_last_yaml = (None, None)


def plain_to_yaml(plain):
    """The YAML `LazyConfig.save` writes for `plain` (a `LazyConfig.to_plain` result)."""
    global _last_yaml
    key = repr(plain)
    if _last_yaml[0] != key:
        _last_yaml = (key, OmegaConf.to_yaml(OmegaConf.create(plain), resolve=False))
    return _last_yaml[1]


def _callable_to_string(obj):
    """A dotted path that `locate` maps back to `obj`, shortest first; None if there is none."""
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not module or not qualname or "<" in qualname:
        return None
    mod_parts = module.split(".")
    # prefer the shortest public path, e.g. engine.optim.AdamW over engine.optim.adam.AdamW
    for i in range(1, len(mod_parts) + 1):
        candidate = ".".join(mod_parts[:i] + [qualname])
        try:
            found = locate(candidate)
        except Exception:
            continue
        if found is obj or found == obj:
            return candidate
    return None


def _to_plain(node, path, problems, convert_callables=True):
    """A YAML-ready copy of a (to_container'ed) config; records unserialisable values."""
    if OmegaConf.is_config(node):  # a LazyCall node or list inside a plain-dict root
        node = OmegaConf.to_container(node, resolve=False)
    if isinstance(node, abc.Mapping):
        return {k: _to_plain(v, f"{path}.{k}" if path else str(k), problems) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [_to_plain(v, f"{path}[{i}]", problems) for i, v in enumerate(node)]
    if isinstance(node, _PRIMITIVES):
        return node
    if isinstance(node, enum.Enum):
        return node.name
    if hasattr(node, "item") and type(node).__module__ == "numpy" and getattr(node, "ndim", 1) == 0:
        return node.item()  # numpy scalars
    if callable(node) and (inspect.isclass(node) or inspect.isroutine(node) or hasattr(node, "__qualname__")):
        s = _callable_to_string(node)
        if s is not None:
            if not path.endswith("_target_"):
                problems.append((path, node, f"stored as the string {s!r}"))
            return s
    problems.append((path, node, None))
    return f"{UNSERIALIZABLE}{type(node).__name__}: {node!r}>"


def _flat_keys(node, prefix=""):
    """All dotted keys of a to_container'ed config, intermediate nodes included."""
    out = []
    if isinstance(node, abc.Mapping):
        for k, v in node.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            out.append(key)
            out.extend(_flat_keys(v, key))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            key = f"{prefix}.{i}" if prefix else str(i)
            out.append(key)
            out.extend(_flat_keys(v, key))
    return out


_MISSING = object()


def _lookup(container, parts):
    """Walk a to_container'ed config; returns (parent, last_key, value or _MISSING, failed_prefix)."""
    node = container
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, abc.Mapping):
            if part not in node:
                return None, part, _MISSING, None
            child = node[part]
        elif isinstance(node, list):
            if not re.fullmatch(r"-?\d+", part) or not -len(node) <= int(part) < len(node):
                return None, part, _MISSING, None
            child = node[int(part)]
        else:
            return None, part, _MISSING, ".".join(parts[:i])
        if last:
            return node, part, child, None
        node = child
    return None, None, container, None  # pragma: no cover


def _close_keys(key, all_keys):
    matches = difflib.get_close_matches(key, all_keys, n=3, cutoff=0.7)
    if not matches:  # try by last component, e.g. "train.lr" -> "optim.lr"
        last = key.split(".")[-1]
        lasts = [k for k in all_keys if difflib.get_close_matches(last, [k.split(".")[-1]], n=1, cutoff=0.8)]
        matches = lasts[:3]
    return matches


def unknown_key_error(key, container, note=""):
    """ConfigKeyError for `key` (dotted) missing from `container` (a to_container'ed config),
    naming the closest keys of `container`; `note` ends the message."""
    close = _close_keys(key, _flat_keys(container))
    hint = f"; did you mean {', '.join(repr(m) for m in close)}?" if close else ""
    return ConfigKeyError(f"config key {key!r} does not exist{hint}{note}")


class ConfigKeyError(KeyError):
    """A KeyError about config keys (unknown key in an override, ...) with a readable message."""

    # KeyError's str() is the repr of its argument; keep the message readable
    def __str__(self):
        return str(self.args[0]) if self.args else ""


class LazyConfig:
    """Load, save and override LazyConfig files (static methods only)."""

    @staticmethod
    def load(filename, keys=None):
        """Load a `.py` (executed; relative imports resolved by file path) or `.yaml` config.

        Returns a DictConfig of the file's top-level dicts (names not starting with "_"); with
        `keys` ("name" or a tuple of names) only those values (a tuple for a tuple of keys).
        """
        filename = os.fspath(filename)
        if not os.path.isfile(filename):
            raise FileNotFoundError(f"config file {filename!r} does not exist")
        ext = os.path.splitext(filename)[1].lower()
        if ext == ".py":
            namespace = {
                "__file__": os.path.abspath(filename),
                "__package__": _package_name(filename),
                "__name__": _package_name(filename),
            }
            with _patch_import():
                _exec_config_file(filename, namespace)
            content = {
                name: value
                for name, value in namespace.items()
                if isinstance(value, (DictConfig, ListConfig, dict)) and not name.startswith("_")
            }
            cfg = DictConfig(content, flags=dict(_FLAGS))
        elif ext in (".yaml", ".yml"):
            loaded = OmegaConf.load(filename)
            if not isinstance(loaded, DictConfig):
                raise ValueError(f"config file {filename!r} must contain a mapping at the top level")
            cfg = DictConfig(OmegaConf.to_container(loaded, resolve=False), flags=dict(_FLAGS))
        else:
            raise ValueError(f"unsupported config file {filename!r}: expected .py, .yaml or .yml")

        if keys is None:
            return cfg
        # with keys, any top-level name of a .py file is returned (a str, a number, ...), as LiBai
        source = namespace if ext == ".py" else cfg
        if isinstance(keys, str):
            return LazyConfig._get_key(source, keys, filename)
        return tuple(LazyConfig._get_key(source, k, filename) for k in keys)

    @staticmethod
    def _get_key(source, key, filename):
        if key not in source:
            names = [k for k in source.keys() if not str(k).startswith("__")]
            close = difflib.get_close_matches(key, names)
            hint = f"; did you mean {close}?" if close else ""
            raise ConfigKeyError(f"config file {filename!r} has no top-level key {key!r}{hint}")
        return _cast_to_config(source[key])

    @staticmethod
    def load_rel(filename, keys=None):
        """`load`, with `filename` relative to the file of the caller (for use inside configs)."""
        caller = inspect.stack()[1].filename
        return LazyConfig.load(os.path.join(os.path.dirname(caller), filename), keys)

    @staticmethod
    def to_plain(cfg, strict=False):
        """The config as plain Python containers ready for YAML: callables become dotted paths.

        Unserialisable values raise ValueError when `strict`, else they are replaced by a
        descriptive string and a warning names their keys.
        """
        if OmegaConf.is_config(cfg):
            container = OmegaConf.to_container(cfg, resolve=False)
        else:
            container = cfg
        problems = []
        plain = _to_plain(container, "", problems)
        bad = [(p, v) for p, v, note in problems if note is None]
        notes = [(p, note) for p, v, note in problems if note is not None]
        if bad:
            listing = "; ".join(f"{p or '<root>'} = {v!r} ({type(v).__name__})" for p, v in bad)
            msg = f"config values that cannot be saved as YAML: {listing}"
            if strict:
                raise ValueError(msg)
            warnings.warn(msg + " -- they are written as descriptive strings", RuntimeWarning, stacklevel=3)
        if notes:
            listing = "; ".join(f"{p}: {n}" for p, n in notes)
            warnings.warn(
                f"non-target callables in the config are saved as dotted strings and load back as "
                f"strings: {listing}",
                RuntimeWarning,
                stacklevel=3,
            )
        return plain

    @staticmethod
    def save(cfg, filename, strict=False):
        """Write `cfg` as YAML that `LazyConfig.load` reads back (targets as dotted strings).

        Interpolations ("${...}") are kept unresolved. Values with no YAML form raise ValueError
        when `strict`; otherwise a RuntimeWarning names them and they are saved as strings.
        """
        plain = LazyConfig.to_plain(cfg, strict=strict)
        text = plain_to_yaml(plain)
        filename = os.fspath(filename)
        dirname = os.path.dirname(filename)
        if dirname:
            os.makedirs(dirname, exist_ok=True)
        with open(filename, "w", encoding="utf-8") as f:
            f.write(text)
        return filename

    @staticmethod
    def apply_overrides(cfg, overrides):
        """Apply command-line overrides (hydra's grammar) to `cfg` in place and return it.

        - `a.b=value`: set an existing key; values are typed (1, 1.5, true, null, [1,2], 'a b')
        - `+a.b=value`: add a key that does not exist yet (KeyError if it does)
        - `++a.b=value`: set, adding the key if needed
        - `~a.b` (or `~a.b=value`, checked against the current value): delete a key
        Unknown keys raise KeyError naming the closest existing keys; malformed overrides raise
        ValueError.
        """
        from hydra.core.override_parser.overrides_parser import OverridesParser

        if isinstance(overrides, str):
            overrides = [overrides]
        overrides = list(overrides or [])
        for o in overrides:
            if not isinstance(o, str):
                raise TypeError(f"overrides must be strings like 'key=value', got {o!r}")
        if not overrides:
            return cfg
        parser = OverridesParser.create()
        for raw in overrides:
            try:
                (o,) = parser.parse_overrides([raw])
            except Exception as e:
                msg = str(e).strip()
                key = raw.split("=", 1)[0]
                hint = ""
                if re.search(r"\[\d+\]", key):  # Python's list index: dataset[0].data_prefix
                    dotted = re.sub(r"\[(\d+)\]", r".\1", key) + raw[len(key):]
                    hint = f"; a list element is written with a dot: {dotted!r}"
                raise ValueError(
                    f"malformed override {raw!r}: {msg}\n(expected key=value, +key=value, "
                    f"++key=value or ~key{hint})"
                ) from None
            LazyConfig._apply_one(cfg, o, raw)
        return cfg

    @staticmethod
    def _apply_one(cfg, o, raw):
        key = o.key_or_group
        if o.package is not None:
            raise ValueError(f"override {raw!r}: '@package' overrides are not supported")
        if o.is_sweep_override():
            raise ValueError(f"override {raw!r}: sweeps (a,b / range / choice) are not supported")
        value = o.value()
        parts = key.split(".")
        if not all(parts):
            raise ValueError(f"malformed override {raw!r}: empty key or key part in {key!r}")
        container = OmegaConf.to_container(cfg, resolve=False)
        parent, last, current, not_config = _lookup(container, parts)
        if not_config is not None:
            bad = _lookup(container, not_config.split("."))[2]
            raise ConfigKeyError(
                f"override {raw!r}: {not_config!r} is not a config node (its value has type "
                f"{type(bad).__name__}), so it has no key {parts[len(not_config.split('.'))]!r}"
            )
        exists = current is not _MISSING

        if o.is_delete():
            if not exists:
                raise unknown_key_error(key, container)
            if value is not None and value != current:
                raise ValueError(
                    f"override {raw!r}: cannot delete {key!r}, its value is {current!r}, not {value!r}"
                )
            node = OmegaConf.select(cfg, ".".join(parts[:-1]), throw_on_missing=False) if len(parts) > 1 else cfg
            if isinstance(node, ListConfig):
                node.pop(int(last))
            else:
                node.pop(last)
            return
        if o.is_add() and exists:
            raise ConfigKeyError(
                f"override {raw!r}: key {key!r} already exists (value {current!r}); use "
                f"{key}=... to change it or ++{key}=... to set it either way"
            )
        if not exists and not (o.is_add() or o.is_force_add()):
            raise unknown_key_error(key, container, " (use +key=value to add a new key)")
        OmegaConf.update(cfg, key, value, merge=True)

    @staticmethod
    def to_py(cfg, prefix="cfg."):
        """LiBai's readable Python-like pseudo code of `cfg` (libai.config.pyformat), e.g.

            cfg.optim = engine.optim.AdamW(lr=0.001, weight_decay=0.01)
            cfg.train.train_iter = 100

        Interpolations are resolved; keys are sorted. Meant for reading (a LazyCall node is
        shown as a call of its target), not for executing.
        """
        container = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else cfg
        return config_to_py(container, prefix, _target_to_string)


def _target_to_string(target):
    """A target's import path for to_py: the shortest that locates it, else module.qualname."""
    path = _callable_to_string(target)
    if path is not None:
        return path
    module, qualname = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    return f"{module}.{qualname}" if module and qualname else repr(target)
