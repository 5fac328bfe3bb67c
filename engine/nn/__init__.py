"""engine.nn: Module, Parameter, the layer classes, init and functional (F)."""
from ..tensor import Parameter
from . import functional  # noqa: F401
from . import init  # noqa: F401
from .module import Module
from .modules import *  # noqa: F401,F403
from .modules import __all__ as _modules_all
from . import utils  # noqa: F401
from . import parallel  # noqa: F401

__all__ = ["Parameter", "Module", "functional", "init", "utils"] + list(_modules_all)
from .graph import Graph, GraphConfig, GraphModule  # noqa: E402

__all__ += ["Graph", "GraphConfig", "GraphModule"]
