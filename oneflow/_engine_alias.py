"""The `oneflow` shim's body: `engine`'s names in the `oneflow` module and `oneflow.X` module
paths aliased to `engine.X` (see oneflow/__init__.py for why and when it is used)."""
import importlib
import importlib.abc
import importlib.util
import sys
import types

import engine

__all__ = ["install", "resolve"]

SHIM_FLAG = "__libai_engine_shim__"


def resolve(rest):
    """The engine module that `oneflow.<rest>` names: the module `engine.<rest>`, else an attribute
    path of engine that is a module (`oneflow.env` is `engine.env`, i.e. engine.distributed);
    None if there is none."""
    name = "engine." + rest
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        parts = name.split(".")
        if e.name not in {".".join(parts[: i + 1]) for i in range(len(parts))}:
            raise  # the engine module exists but one of its own imports failed
    obj = engine
    for part in rest.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj if isinstance(obj, types.ModuleType) else None


class _AliasLoader(importlib.abc.Loader):
    """Hands the existing engine module to the import system under the `oneflow.X` name."""

    def __init__(self, module):
        self.module = module
        self.original_spec = getattr(module, "__spec__", None)

    def create_module(self, spec):
        return self.module

    def exec_module(self, module):
        # the import system stamped our alias spec on the module: give engine's back
        module.__spec__ = self.original_spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    """`oneflow.X...` -> `engine.X...` while `oneflow` is the shim (first on sys.meta_path, so that
    the path finder never loads engine's files a second time under another name)."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith("oneflow."):
            return None
        shim = sys.modules.get("oneflow")
        if shim is None or not getattr(shim, SHIM_FLAG, False):
            return None
        rest = fullname[len("oneflow."):]
        if rest.startswith("_"):
            return None  # the shim's own files
        module = resolve(rest)
        if module is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(module))


def _missing(name):
    raise AttributeError(
        f"module 'oneflow' (this project's shim over `engine`; OneFlow is not installed) has no attribute "
        f"{name!r}: engine does not implement it"
    )


def install(namespace):
    """Fill the `oneflow` module's namespace and register the module aliases."""
    for key, value in vars(engine).items():
        if not key.startswith("__"):
            namespace[key] = value
    namespace[SHIM_FLAG] = True
    namespace["__version__"] = engine.__version__

    def __getattr__(name):  # names engine gains later (e.g. set by other modules)
        if hasattr(engine, name):
            return getattr(engine, name)
        _missing(name)

    namespace["__getattr__"] = __getattr__
    namespace["__dir__"] = lambda: sorted(set(namespace) | set(dir(engine)))
    for name, module in list(sys.modules.items()):
        if name.startswith("engine.") and module is not None:
            sys.modules.setdefault("oneflow" + name[len("engine"):], module)
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())
