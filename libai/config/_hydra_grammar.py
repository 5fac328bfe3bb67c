"""hydra's command-line override parser, loaded without the rest of hydra.

Importing `hydra.core.override_parser.overrides_parser` first runs hydra's package `__init__`,
which imports hydra's application framework (`hydra.main`, `compose`, structured configs,
`instantiate`): 0.2-0.3 s of every `tools/train_net.py` start (three times what the parser itself
costs), for a parser that uses none of it; the test suite alone starts about a thousand such
processes. So when nothing has imported hydra yet, the parser's modules are loaded under a
`hydra` package module whose `__init__` has not run. The first time anyone asks that module for a
name it does not hold yet (`hydra.main`, `hydra.compose`, `from hydra import initialize`, ...),
the `__init__` runs, in that same module, and the name is returned: `import hydra` elsewhere in
the process behaves as it always does. Should any of this fail (another hydra layout), the
modules loaded are dropped and the parser is imported the plain way.
"""
import importlib.util
import re
import sys
import types

__all__ = ["overrides_parser_class"]

_PARSER_MODULE = "hydra.core.override_parser.overrides_parser"


class _PackageBeforeInit(types.ModuleType):
    """The `hydra` package while its `__init__` has not run (see the module docstring)."""

    def __getattr__(self, name):  # called only for names missing from the module's __dict__
        if self.__dict__.get("_loading_parser"):  # `from hydra import version` in the parser's modules
            return importlib.import_module(f"{self.__name__}.{name}")
        run_init = self.__dict__.pop("_run_init", None)
        if run_init is None:  # ran already, or running: `from hydra import utils` in it imports the submodule
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        run_init()
        return getattr(self, name)


def _load_parser_without_package_init():
    spec = importlib.util.find_spec("hydra")
    package = importlib.util.module_from_spec(spec)
    with open(spec.origin, encoding="utf-8") as f:
        source = f.read()
    # hydra.version (imported by the parser) reads the package's __version__
    package.__version__ = re.search(r"""^__version__\s*=\s*["']([^"']+)["']""", source, re.M).group(1)

    def run_init():
        exec(compile(source, spec.origin, "exec"), package.__dict__)
        package.__class__ = types.ModuleType  # a plain package from now on

    package._run_init = run_init
    package.__class__ = _PackageBeforeInit
    sys.modules["hydra"] = package
    package._loading_parser = True
    try:
        return importlib.import_module(_PARSER_MODULE).OverridesParser
    except Exception:
        for name in [n for n in sys.modules if n == "hydra" or n.startswith("hydra.")]:
            del sys.modules[name]
        raise
    finally:
        del package._loading_parser


def overrides_parser_class():
    """hydra's `OverridesParser` class, without importing hydra's `__init__` when it can."""
    if _PARSER_MODULE in sys.modules or "hydra" in sys.modules:
        return importlib.import_module(_PARSER_MODULE).OverridesParser
    try:
        return _load_parser_without_package_init()
    except Exception:
        return importlib.import_module(_PARSER_MODULE).OverridesParser
