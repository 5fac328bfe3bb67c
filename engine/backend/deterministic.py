"""torch.use_deterministic_algorithms and its companions, with what they change in the engine.

The engine's CPU kernels are deterministic already: numpy's `ufunc.at` adds in index order, and
the threaded kernels split work by shape, never by thread count (docs/engine.md). On CUDA three
things depend on the order in which threads run:

* scatter-adds (`cupy.add.at`, atomics): the embedding gradient, `index_add`, `scatter_add`,
  `scatter_reduce` sum and mean, `index_put` with `accumulate=True`, the backward of `gather`
  / `index_select` / advanced indexing, an attention mask's gradient, and the weighted
  `bincount` (also max_pool2d's backward). In deterministic mode they go through
  engine.kernels.scatter_add's sorted runs: the bits of numpy's `add.at`, one order.
* indexed stores that name a target twice (`x[idx] = v`, `index_put`, `scatter`): in
  deterministic mode the last value of each target in the index's C order wins (numpy's order
  for C-ordered indices and values).
* flash attention's fused backward (engine.ops.attention.FLASH_BACKWARD = "fused"): in
  deterministic mode the split backward (dq and dkdv kernels, no atomics) runs instead.

So every op has a deterministic path, and none raises in deterministic mode outside a CUDA-graph
capture (`warn_only` is kept and read back). The sorted runs sort with CuPy, whose Thrust sort
synchronises the stream: a host wait per call, and none inside a CUDA graph capture (refused). cuBLAS gives the same bits
for the same call on the same GPU; the engine gives each cuBLAS handle its own workspace
(PyTorch's CUBLAS_WORKSPACE_CONFIG concern does not arise).

As torch, deterministic mode also fills `empty` tensors (`empty_like`, `new_empty`): NaN for
floating dtypes, the largest value for integers, True for bool, unless
`engine.utils.deterministic.fill_uninitialized_memory` is set to False.
"""
import builtins

import numpy as np

_state = {"enabled": False, "warn_only": False, "fill_uninitialized_memory": True}


def use_deterministic_algorithms(mode, *, warn_only=False):
    """As torch.use_deterministic_algorithms: deterministic versions of the operations that have
    nondeterministic ones (the module docstring lists them)."""
    if type(mode) is not bool:
        raise TypeError(f"use_deterministic_algorithms(): argument 'mode' (position 1) must be bool, "
                        f"not {type(mode).__name__}")
    if type(warn_only) is not bool:
        raise TypeError(f"use_deterministic_algorithms(): argument 'warn_only' must be bool, "
                        f"not {type(warn_only).__name__}")
    _state["enabled"], _state["warn_only"] = mode, warn_only


def are_deterministic_algorithms_enabled():
    return _state["enabled"]


def is_deterministic_algorithms_warn_only_enabled():
    return _state["warn_only"]


def set_deterministic_debug_mode(debug_mode):
    """0 / "default": off; 1 / "warn": on, warn only; 2 / "error": on (torch's interface)."""
    if not isinstance(debug_mode, (builtins.int, str)):
        raise TypeError(f"debug_mode must be str or int, but got {type(debug_mode)}")
    if isinstance(debug_mode, str):
        names = {"default": 0, "warn": 1, "error": 2}
        if debug_mode not in names:
            raise RuntimeError("invalid value of debug_mode, expected one of `default`, `warn`, `error`, "
                               f"but got {debug_mode}")
        debug_mode = names[debug_mode]
    if debug_mode not in (0, 1, 2):
        raise RuntimeError(f"invalid value of debug_mode, expected 0, 1, or 2, but got {debug_mode}")
    use_deterministic_algorithms(debug_mode != 0, warn_only=debug_mode == 1)


def get_deterministic_debug_mode():
    if not _state["enabled"]:
        return 0
    return 1 if _state["warn_only"] else 2


def fill_uninitialized(array):
    """`array`, a fresh uninitialised allocation (`empty`), filled as torch fills it in
    deterministic mode: NaN for floating dtypes, the largest integer, True; left as it is outside
    the mode or with fill_uninitialized_memory off."""
    if _state["enabled"] and _state["fill_uninitialized_memory"]:
        kind = array.dtype.kind
        array.fill(float("nan") if kind in "fV" else np.iinfo(array.dtype).max if kind in "iu" else True)  # V: bfloat16
    return array
