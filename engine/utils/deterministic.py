"""engine.utils.deterministic, as torch.utils.deterministic: `fill_uninitialized_memory`, whether
`empty` tensors are filled (NaN, the largest integer, True) while
engine.use_deterministic_algorithms(True) is on (engine/backend/deterministic.py). True by
default; only a bool is accepted."""
import sys
import types

from ..backend import deterministic as _deterministic


class _Deterministic(types.ModuleType):
    @property
    def fill_uninitialized_memory(self):
        return _deterministic._state["fill_uninitialized_memory"]

    @fill_uninitialized_memory.setter
    def fill_uninitialized_memory(self, mode):
        if type(mode) is not bool:
            raise RuntimeError(f"expected a bool, but got {type(mode).__name__}")
        _deterministic._state["fill_uninitialized_memory"] = mode


sys.modules[__name__].__class__ = _Deterministic
