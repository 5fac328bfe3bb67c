"""`import oneflow as flow` for LiBai configs and code, on this project's engine.

LiBai's configs and user code say `import oneflow as flow`; here the tensor library is `engine`
(the same PyTorch/OneFlow-like API). This package makes that import work when OneFlow itself is
not installed: `oneflow` is a module holding `engine`'s names (`flow.nn.Linear`, `flow.optim.AdamW`,
`flow.placement`, `flow.sbp.split(0)`, `flow.env.get_rank()`, ...), and every `oneflow.X` module
path is an alias of `engine.X` (`from oneflow.nn import functional as F`, `import oneflow.optim`):
the very same module objects, so `flow.Tensor is engine.Tensor`.

A real OneFlow always wins. When this package is imported it first looks along sys.path (minus the
directory that holds this package) for another `oneflow` that is not such a shim; if there is one,
that OneFlow is loaded in place of this module (it replaces `sys.modules["oneflow"]`, so the
importer gets it) and nothing here is used. With an editable install the shim is reached only
through setuptools' editable finder, which Python consults after the ordinary sys.path search, so
an installed OneFlow is found first anyway. See docs/migrating.md.
"""
import importlib.machinery
import importlib.util
import os
import sys

_SHIM_MARKER = "_engine_alias.py"  # a `oneflow` package holding this file is a shim, not OneFlow


def _find_real_oneflow():
    """The spec of a `oneflow` on sys.path other than this shim (or another copy of it), or None."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for entry in list(sys.path):
        if not isinstance(entry, str):
            continue
        try:
            if os.path.abspath(entry or os.getcwd()) == here:
                continue
            spec = importlib.machinery.PathFinder.find_spec("oneflow", [entry])
        except (ImportError, OSError, ValueError):
            continue
        if spec is None:
            continue
        if spec.origin is None or not spec.has_location:
            continue  # a namespace portion (a directory named oneflow without __init__.py): not OneFlow
        locations = list(spec.submodule_search_locations or [])
        if any(os.path.isfile(os.path.join(d, _SHIM_MARKER)) for d in locations):
            continue  # another copy of this shim (e.g. a source checkout beside an install)
        return spec
    return None


def _load_real_oneflow(spec):
    module = importlib.util.module_from_spec(spec)
    sys.modules["oneflow"] = module  # the importer receives sys.modules["oneflow"]
    spec.loader.exec_module(module)
    return module


_real_spec = _find_real_oneflow()
if _real_spec is not None:
    _load_real_oneflow(_real_spec)
else:
    from ._engine_alias import install as _install

    _install(globals())
    del _install
del _real_spec
