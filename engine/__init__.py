"""engine: a tensor and autograd engine with a PyTorch-like API (`import engine as flow`).

numpy computes on the CPU, CuPy on CUDA devices; global tensors (placement + SBP) extend the same
API to many processes (engine.distributed).
"""
from . import backend
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
from .amp import autocast  # noqa: E402
from . import distributed  # noqa: E402
from .distributed import placement, sbp  # noqa: E402

env = comm = distributed  # OneFlow's names: flow.env.get_rank(), flow.comm.all_reduce(...)
from .serialization import save, load  # noqa: E402


class cuda:
    """`engine.cuda.is_available()` and friends, as in torch.cuda."""

    is_available = staticmethod(is_cuda_available)

    @staticmethod
    def device_count():
        return backend.cupy().cuda.runtime.getDeviceCount() if is_cuda_available() else 0

    @staticmethod
    def synchronize():
        if is_cuda_available():
            backend.cupy().cuda.Device().synchronize()

    @staticmethod
    def manual_seed(s):
        manual_seed(s)

    manual_seed_all = manual_seed


def is_tensor(obj):
    return isinstance(obj, Tensor)


def numel(t):
    return t.numel()


__version__ = "0.1.0"
