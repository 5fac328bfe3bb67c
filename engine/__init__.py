"""engine: a tensor and autograd engine with a PyTorch-like API (`import engine as flow`).

numpy computes on the CPU, CuPy on CUDA devices; global tensors (placement + SBP) extend the same
API to many processes (engine.distributed).
"""
import math as _math
import operator

from . import backend
from .backend import parallel as _parallel
from .backend import device, is_cuda_available
from .backend.dtypes import (
    dtype, bool_ as bool, uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64,
    half, float, double, short, int, long, set_default_dtype, get_default_dtype, promote_types,
)
from .backend.random import Generator, default_generator, manual_seed, seed, initial_seed, get_rng_state, set_rng_state
from .tensor import Tensor, Size
from . import autograd
from .autograd import no_grad, enable_grad, set_grad_enabled, is_grad_enabled, inference_mode
from . import ops
from .ops.conversion import (  # noqa: F401
    finfo, iinfo, FloatTensor, DoubleTensor, HalfTensor, BFloat16Tensor, LongTensor, IntTensor, ShortTensor,
    CharTensor, ByteTensor, BoolTensor,
)
from .ops.creation import *  # noqa: F401,F403
from .ops.elementwise import *  # noqa: F401,F403
from .ops.unary import *  # noqa: F401,F403
from .ops.comparison import *  # noqa: F401,F403
from .ops.logical import *  # noqa: F401,F403
from .ops.reduction import *  # noqa: F401,F403
from .ops.shape import *  # noqa: F401,F403
from .ops.indexing import *  # noqa: F401,F403
from .ops.linalg import *  # noqa: F401,F403
from .ops.softmax import *  # noqa: F401,F403
from .ops.normalization import *  # noqa: F401,F403
from .ops.dropout import *  # noqa: F401,F403
from .ops.loss import *  # noqa: F401,F403
from .ops.conv import *  # noqa: F401,F403
from .ops.random_ops import *  # noqa: F401,F403
from . import nn, optim, utils, amp  # noqa: E402
from .amp import autocast, clear_autocast_cache, is_autocast_cache_enabled  # noqa: E402
from . import distributed  # noqa: E402
from .distributed import placement, sbp  # noqa: E402

env = comm = distributed  # OneFlow's names: flow.env.get_rank(), flow.comm.all_reduce(...)
from .serialization import save, load  # noqa: E402


from . import cuda  # noqa: E402,F401
from . import accelerator  # noqa: E402,F401
from . import backends  # noqa: E402,F401
from .backends import set_float32_matmul_precision, get_float32_matmul_precision  # noqa: E402,F401
from .backend.deterministic import (  # noqa: E402,F401
    use_deterministic_algorithms, are_deterministic_algorithms_enabled,
    is_deterministic_algorithms_warn_only_enabled, set_deterministic_debug_mode, get_deterministic_debug_mode)

_COMPILE_MODES = ("default", "lite", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")
_COMPILE_BACKENDS = ("inductor", "eager", "aot_eager", "aot_eager_decomp_partition", "cudagraphs", "openxla",
                     "tvm", "onnxrt", "tensorrt", "torch_tensorrt", "ipex")


def compile(model=None, *, fullgraph=False, dynamic=None, backend="inductor", mode=None, options=None, name=None,
            disable=False, recompile_limit=None, isolate_recompiles=False, shapes_spec=None):
    """torch.compile's signature, returning a graph-backed callable (engine.nn.graph.Compiled, or
    for a Module an OptimizedModule wrapping it as torch's does):
    calls that need no gradient are traced once per input signature and replayed as an nn.Graph;
    calls autograd must record run eagerly. `disable=True` returns `model` itself.

    torch.compile's options only tune how a graph is compiled, never what the model computes, so
    they are accepted as hints and change nothing; they are checked as torch checks them (an
    unknown mode or backend name raises). `@engine.compile` and `@engine.compile(mode=...)` work
    as decorators.
    """
    if mode is not None and options is not None:
        raise RuntimeError("Either mode or options can be specified, but both can't be specified at the same time.")
    if mode is not None and mode not in _COMPILE_MODES:
        raise RuntimeError(f"Unrecognized mode={mode}, should be one of: {', '.join(_COMPILE_MODES)}")
    if isinstance(backend, str) and backend not in _COMPILE_BACKENDS:
        raise RuntimeError(f"Invalid backend: {backend!r}, expected one of {', '.join(_COMPILE_BACKENDS)} "
                           "or a callable")
    if model is None:
        def decorate(fn):
            return compile(fn, fullgraph=fullgraph, dynamic=dynamic, backend=backend, mode=mode, options=options,
                           name=name, disable=disable, recompile_limit=recompile_limit,
                           isolate_recompiles=isolate_recompiles, shapes_spec=shapes_spec)
        return decorate
    if not callable(model):
        raise AssertionError(f"A callable function is expected, but {type(model)} is provided.")
    if disable:
        return model
    from .nn.graph import Compiled, OptimizedModule
    from .nn.module import Module

    return OptimizedModule(model) if isinstance(model, Module) else Compiled(model)


def set_num_threads(n):
    """Threads of the engine's CPU kernels (the ENGINE_NUM_THREADS setting), as torch.set_num_threads."""
    try:
        n = operator.index(n)  # a Python or numpy integer
    except TypeError:
        raise RuntimeError(f"set_num_threads expects an int, but got {type(n).__name__}") from None
    if n <= 0:
        raise RuntimeError("set_num_threads expects a positive integer")
    _parallel.set_num_threads(n)


def get_num_threads():
    return _parallel.get_num_threads()


def is_tensor(obj):
    return isinstance(obj, Tensor)


def numel(t):
    return t.numel()


from . import distributions  # noqa: E402,F401
from . import linalg  # noqa: E402,F401

pi, e, inf, nan = _math.pi, _math.e, _math.inf, _math.nan  # torch.pi, torch.e, torch.inf, torch.nan

__version__ = "0.1.0"
