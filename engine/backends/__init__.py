"""engine.backends: torch.backends' switches, so that scripts which set them run unchanged.

What each switch does in the engine:

* `cuda.matmul.allow_tf32` and `engine.set_float32_matmul_precision` (one setting, as in
  torch: allow_tf32 is True exactly when the precision is not 'highest'): honoured on CUDA,
  where they select CuPy's compute type for float32 matrix products (TF32 for 'high' and
  'medium', IEEE float32 for 'highest'; TF32 needs compute capability 8.0, CuPy warns below).
  Before CuPy is loaded the choice goes to the CUPY_TF32 variable CuPy reads at its first
  float32 product. No effect on the CPU, where numpy's float32 products are always IEEE float32.
* `cuda.matmul.allow_fp16_reduced_precision_reduction` / `allow_bf16_...`: stored; cuBLAS'
  choice in CuPy is not exposed.
* `cudnn.enabled / benchmark / deterministic / allow_tf32`: stored and read back only: the
  engine runs no cuDNN kernel (`cudnn.is_available()` is False). Its own kernels are
  deterministic (fixed reduction orders) but for CuPy's atomic scatter-adds and the opt-in
  fused flash-attention backward, which `engine.use_deterministic_algorithms(True)` replaces
  (engine/backend/deterministic.py); `cudnn.deterministic` does not.
* `cuda.enable_flash_sdp(False)`: honoured by the fused attention core on CUDA, which then never
  runs the flash-attention kernels (engine.ops.attention.FLASH_SDP_ENABLED; on by default, as
  in torch; FLASH_ATTENTION_ON_GPU is the engine's own switch, set from ENGINE_FLASH_ATTENTION).
  `enable_mem_efficient_sdp / enable_math_sdp / enable_cudnn_sdp` and all `*_enabled()`: stored and read back; `scaled_dot_product_attention`
  has one kernel, used whatever they say.
* `mps.is_available()` / `is_built()`: False. `mkldnn.is_available()`: whether oneDNN, which
  runs the engine's CPU convolutions (engine.backend.onednn), loaded; `mkldnn.enabled`:
  honoured (False: the numpy convolution kernels). `mkl.is_available()`: whether the engine's
  MKL backend (engine.backend.mkl) is in use: honoured.

Flags check their values as torch does: a bool flag set to anything else raises RuntimeError,
and an unknown name raises AttributeError, so a typo is never silently a no-op.
`import engine.backends.cudnn as cudnn` works as well (the flag modules are in sys.modules).
"""
import importlib
import importlib.util
import os
import sys
import types
import warnings

import numpy as np

from .. import backend as _backend
from ..backend import cublas as _cublas
from ..backend import mkl as _mkl
from ..backend import onednn as _onednn
from ..ops import attention as _attention

__all__ = ["cuda", "cudnn", "mps", "mkldnn", "mkl", "set_float32_matmul_precision",
           "get_float32_matmul_precision"]

_PRECISIONS = ("highest", "high", "medium")
_precision = ["highest"]
# CuPy's compute types (cupy/_core/_routines_linalg.pxd)
_COMPUTE_TYPE_DEFAULT, _COMPUTE_TYPE_TF32 = 1, 7


def set_float32_matmul_precision(precision):
    """'highest' (IEEE float32), 'high' or 'medium' (TF32 on CUDA); see the module docstring."""
    if not isinstance(precision, str):
        raise RuntimeError(f"set_float32_matmul_precision expects a str, but got {type(precision).__name__}")
    if precision not in _PRECISIONS:
        warnings.warn(f"{precision} is not one of 'highest', 'high', or 'medium'; the current "
                      "set_float32_matmul_precision call has no effect.", UserWarning, stacklevel=2)
        return
    _precision[0] = precision
    _apply_to_cupy()


def get_float32_matmul_precision():
    return _precision[0]


def _apply_to_cupy():
    """Make CuPy's float32 matmul compute type follow the precision."""
    tf32 = _precision[0] != "highest"
    _cublas.set_tf32(tf32)
    if _backend._cupy is None:
        os.environ["CUPY_TF32"] = "1" if tf32 else "0"
        return
    linalg = importlib.import_module("cupy._core._routines_linalg")
    linalg.set_compute_type(np.float32, _COMPUTE_TYPE_TF32 if tf32 else _COMPUTE_TYPE_DEFAULT)


class _Flags(types.ModuleType):
    """A namespace of typed switches (torch's PropModule): bool flags refuse other values with
    RuntimeError, unknown names with AttributeError."""

    _flags = {}  # name -> default

    def __init__(self, name, doc=None, register=True):
        super().__init__(name, doc or type(self).__doc__)
        object.__setattr__(self, "_values", dict(self._flags))
        if register:
            sys.modules[name] = self

    def _get(self, name):
        return self._values[name]

    def _set(self, name, value):
        self._values[name] = value

    def __getattr__(self, name):  # reached only for names not found the ordinary way
        raise AttributeError(f"Unknown attribute {name}")

    def __getattribute__(self, name):
        if name in type(self)._flags:
            return type(self)._get(self, name)
        return super().__getattribute__(name)

    def __setattr__(self, name, value):
        if name in type(self)._flags:
            if not isinstance(value, bool):
                raise RuntimeError(f"{self.__name__}.{name} expects a bool, but got {type(value).__name__}")
            self._set(name, value)
        elif name.startswith("__"):  # module machinery (__spec__, __loader__, ...)
            object.__setattr__(self, name, value)
        else:
            raise AttributeError(f"Unknown attribute {name}")


def _check_bool(fn_name, value):
    if not isinstance(value, bool):
        raise RuntimeError(f"{fn_name} expects a bool, but got {type(value).__name__}")


class _CublasFlags(_Flags):
    """torch.backends.cuda.matmul: allow_tf32 is set_float32_matmul_precision in another form; the
    reduced-precision-reduction flags take a bool or (allow_reduced_precision[, allow_splitk])."""

    _flags = {"allow_tf32": False}
    _reductions = {"allow_fp16_reduced_precision_reduction": True, "allow_bf16_reduced_precision_reduction": True}

    def __init__(self, name, register=False):
        super().__init__(name, register=register)
        self._values.update(self._reductions)

    def _get(self, name):
        return _precision[0] != "highest"  # allow_tf32, the only _flags entry

    def _set(self, name, value):
        set_float32_matmul_precision("high" if value else "highest")

    def __getattr__(self, name):
        if name in type(self)._reductions:
            return self._values[name]
        raise AttributeError(f"Unknown attribute {name}")

    def __setattr__(self, name, value):
        if name not in type(self)._reductions:
            return super().__setattr__(name, value)
        parts = tuple(value) if isinstance(value, (list, tuple)) else (value,)
        if not isinstance(value, (bool, list, tuple)) or not 1 <= len(parts) <= 2:
            raise TypeError(f"{name} expects a bool or a tuple/list of bools, but got {type(value)!r}")
        for part, which in zip(parts, ("allow_reduced_precision", "allow_splitk")):
            if not isinstance(part, bool):
                raise TypeError(f"{name} expects a bool for {which}, but got {type(part)!r}")
        if parts[0] and len(parts) == 2 and not parts[1]:
            raise RuntimeError("allow_splitk=False is not supported when reduced precision reductions are enabled")
        self._values[name] = parts[0]


class _CudaBackend(_Flags):
    """torch.backends.cuda: matmul flags and the scaled-dot-product-attention kernel choices."""

    _flags = {}

    def __init__(self, name):
        super().__init__(name)
        object.__setattr__(self, "matmul", _CublasFlags(name + ".matmul"))
        # the flash switch lives in engine.ops.attention (FLASH_SDP_ENABLED), which honours it
        object.__setattr__(self, "_sdp", {"mem_efficient": True, "math": True, "cudnn": True})

    def is_built(self):
        """Whether CuPy (the engine's CUDA backend) is installed."""
        return importlib.util.find_spec("cupy") is not None

    def _enable(self, kind, enabled):
        _check_bool(f"enable_{kind}_sdp", enabled)
        self._sdp[kind] = enabled

    def enable_flash_sdp(self, enabled):
        _check_bool("enable_flash_sdp", enabled)
        _attention.FLASH_SDP_ENABLED = enabled

    def flash_sdp_enabled(self):
        return _attention.FLASH_SDP_ENABLED

    def enable_mem_efficient_sdp(self, enabled):
        self._enable("mem_efficient", enabled)

    def mem_efficient_sdp_enabled(self):
        return self._sdp["mem_efficient"]

    def enable_math_sdp(self, enabled):
        self._enable("math", enabled)

    def math_sdp_enabled(self):
        return self._sdp["math"]

    def enable_cudnn_sdp(self, enabled):
        self._enable("cudnn", enabled)

    def cudnn_sdp_enabled(self):
        return self._sdp["cudnn"]


class _CudnnBackend(_Flags):
    """torch.backends.cudnn: stored switches; the engine runs no cuDNN kernel."""

    _flags = {"enabled": True, "benchmark": False, "deterministic": False, "allow_tf32": True}

    def is_available(self):
        return False

    def version(self):
        return None


class _MpsBackend(_Flags):
    """torch.backends.mps: Apple's GPUs are not an engine device."""

    def is_available(self):
        return False

    def is_built(self):
        return False


class _MkldnnBackend(_Flags):
    """torch.backends.mkldnn: oneDNN runs the engine's CPU convolutions (engine.backend.onednn)
    when it loaded; `enabled = False` sends them to the numpy kernels, as PyTorch's native ones."""

    _flags = {"enabled": True}

    def _get(self, name):
        return _onednn.enabled

    def _set(self, name, value):
        _onednn.enabled = value

    def is_available(self):
        return _onednn.available()


class _MklBackend(_Flags):
    """torch.backends.mkl: whether the engine's MKL backend (engine.backend.mkl) is in use."""

    def is_available(self):
        return _mkl.available()


cuda = _CudaBackend(__name__ + ".cuda")
cudnn = _CudnnBackend(__name__ + ".cudnn")
mps = _MpsBackend(__name__ + ".mps")
mkldnn = _MkldnnBackend(__name__ + ".mkldnn")
mkl = _MklBackend(__name__ + ".mkl")
