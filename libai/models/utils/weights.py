"""Logical state dicts for models with sharded (global) parameters.

`Module.load_state_dict` copies a tensor into each parameter's local storage, which does not
fit a parameter split over tensor-parallel ranks. `load_logical_state_dict` takes *logical*
arrays (the whole tensors, as a checkpoint or a Hugging Face file holds them) and lays each
one out like the parameter it replaces (`flow.tensor(array, placement=p.placement,
sbp=p.sbp)`: every rank keeps its shard), so loading is layout independent.
"""
import numpy as np

import engine as flow
from engine.autograd.grad_mode import no_grad

__all__ = ["load_logical_state_dict", "logical_state_dict", "as_numpy"]


def as_numpy(v):
    """A tensor's (logical, for a global tensor: gathered, the same on every rank) value or an
    array-like as numpy."""
    if isinstance(v, flow.Tensor):
        v = v.detach().cpu().numpy()
    return np.asarray(v)


def _persistent_buffers(model):
    """(name, tensor) of the buffers a state dict holds: not None and not registered with
    persistent=False (those are derived, e.g. Swin's relative position index), as state_dict()."""
    for mod_name, mod in model.named_modules():
        for name, b in mod._buffers.items():
            if b is not None and name not in mod._non_persistent_buffers_set:
                yield (f"{mod_name}.{name}" if mod_name else name), b


def load_logical_state_dict(model, state_dict, strict=True):
    """Assign logical arrays (numpy or local tensors) to `model`'s parameters and buffers.
    Checks every key and shape first and raises one error listing all problems."""
    own = dict(model.named_parameters())
    own.update({k: v for k, v in _persistent_buffers(model)})
    missing = [k for k in own if k not in state_dict]
    unexpected = [k for k in state_dict if k not in own]
    errors = []
    for k, p in own.items():
        if k in state_dict:
            shape = tuple(np.shape(state_dict[k])) if not isinstance(state_dict[k], flow.Tensor) \
                else tuple(state_dict[k].shape)
            if shape != tuple(p.shape):
                errors.append(f"{k}: checkpoint {list(shape)} vs model {list(p.shape)}")
    if strict and (missing or unexpected):
        errors[:0] = ([f"missing keys: {missing}"] if missing else []) + \
                     ([f"unexpected keys: {unexpected}"] if unexpected else [])
    if errors:
        raise RuntimeError(f"load_logical_state_dict into {type(model).__name__}:\n  " + "\n  ".join(errors))
    with no_grad():
        for k, p in own.items():
            if k not in state_dict:
                continue
            arr = as_numpy(state_dict[k]).astype(np.dtype(p.dtype.np) if hasattr(p.dtype, "np") else np.float32,
                                                copy=False)
            if p._global is not None:
                new = flow.tensor(arr, dtype=p.dtype, placement=p.placement, sbp=p.sbp)
            else:
                new = flow.tensor(arr, dtype=p.dtype)
            p._data = new._data
            p._bump_version()
    return missing, unexpected


def logical_state_dict(model):
    """{name: numpy array} of the whole (gathered) parameters and buffers. Collective when the
    parameters are global: every rank must call it."""
    out = {}
    for k, v in model.state_dict().items():
        out[k] = as_numpy(v)
    return out
