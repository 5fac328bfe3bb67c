"""Helpers shared by the layers: initialisers, parameter creation on a layer's placement,
moving inputs onto a placement, settling partial sums and layout-independent dropout.

Every parameter is created from its *logical* value: each rank draws the whole tensor with the
same generator state and keeps its shard (the engine's random global creation works the same
way), so a model built with the same seed has the same weights on 1 rank and on any dp x tp
layout. That is what makes the tensor-parallel parity tests possible.
"""
import logging
import math

import engine as flow
import engine.nn as nn
from engine.autograd.grad_mode import no_grad
from engine.utils.checkpoint import checkpoint
from libai.utils import distributed as dist

__all__ = [
    "init_method_normal", "scaled_init_method_normal", "make_parameter", "to_placement",
    "settle", "dropout", "hidden_sbp_for", "split_on_dp", "note_kernel_flags", "Recomputable",
    "set_activation_checkpointing",
]

B = flow.sbp.broadcast
S = flow.sbp.split

# LiBai's flags that only choose how a value is computed, never which value: accepted, with one
# log line per flag and process saying what runs instead (docs/config.md)
KERNEL_FLAGS = {
    "bias_gelu_fusion": "on CUDA placements the MLP's first Linear leaves its bias to one fused bias + GeLU "
                        "kernel; on the CPU the bias stays in the matmul; same values",
    "bias_dropout_fusion": "on CUDA placements the MLP's bias, dropout and residual add run as one fused kernel "
                           "(dropping the same elements as the separate ops); attention's output and the CPU "
                           "run them as separate ops",
    "scale_mask_softmax_fusion": "the attention core always fuses scale, mask and softmax (one kernel on CUDA); "
                                 "the flag changes nothing",
    "apply_query_key_layer_scaling": "a float16 overflow guard; in float32 the scores are the same, so it "
                                     "changes nothing",
}
_noted = set()


def note_kernel_flags(**flags):
    """Log once per process, for each KERNEL_FLAGS flag given as True, what runs instead."""
    for name, value in flags.items():
        if value and name not in _noted:
            _noted.add(name)
            logging.getLogger("libai.layers").info(f"{name}=True: {KERNEL_FLAGS[name]}")


def init_method_normal(sigma, mean=0.0):
    """An init method filling a tensor with N(mean, sigma^2) (as LiBai's)."""

    def init_(tensor):
        return nn.init.normal_(tensor, mean=mean, std=sigma)

    return init_


def scaled_init_method_normal(sigma, num_layers, mean=0.0):
    """N(mean, (sigma / sqrt(2 * num_layers))^2): GPT-2 / Megatron's init of the output
    projections that feed the residual stream."""
    std = sigma / math.sqrt(2.0 * num_layers)

    def init_(tensor):
        return nn.init.normal_(tensor, mean=mean, std=std)

    return init_


def make_parameter(shape, init_method, placement, sbp, dtype=None):
    """A Parameter of logical `shape` on (placement, sbp) whose value is `init_method` applied
    to the whole logical tensor (drawn identically on every rank, then sliced to the shard).
    `init_method` is any in-place initialiser (engine.nn.init.*, init_method_normal(...)) or
    a number (a constant fill). The draw is on the CPU generator whatever the placement's device,
    so a model starts from the same weights on CPU and GPU and in every layout."""
    dtype = dtype or flow.float32
    with no_grad():
        logical = flow.empty(*shape, dtype=dtype, device="cpu")
        if init_method is None:
            nn.init.zeros_(logical)
        elif isinstance(init_method, (int, float)):
            nn.init.constant_(logical, float(init_method))
        else:
            init_method(logical)
        value = flow.tensor(logical.numpy(), dtype=dtype, placement=placement, sbp=sbp)
    return nn.Parameter(value)


def split_on_dp(shape, axis=0):
    """Whether `shape[axis]` can be split over the data-parallel ranks."""
    dp = dist.get_data_parallel_size()
    return dp > 1 and len(shape) > axis and shape[axis] % dp == 0


def hidden_sbp_for(shape):
    """The activation SBP [S(0), B] for a tensor of `shape`, with B on the data-parallel axis
    when its batch does not divide over dp (e.g. a generation step with batch 1)."""
    dp_sbp = S(0) if split_on_dp(shape) else B
    return dist.get_nd_sbp([dp_sbp, B])


def to_placement(x, placement, sbp=None):
    """`x` as a global tensor on `placement`.

    A local tensor is read as the *whole* logical value, identical on every rank (a batch or a
    mask built the same way everywhere), then laid out as `sbp` (default: [S(0), B] on the
    mesh, batch split over dp); a global tensor is moved to `placement` (pipeline stages) and,
    when `sbp` is given, boxed to it."""
    if not isinstance(x, flow.Tensor):
        x = flow.tensor(x)
    if x._global is None:
        x = x.to_global(placement=placement, sbp=[B] * placement.ndim)
        target = tuple(sbp) if sbp is not None else tuple(hidden_sbp_for(x.shape))
        if tuple(x.sbp) != target:
            x = x.to_global(sbp=target)
        return x
    if x.placement != placement:
        x = x.to_global(placement=placement, sbp=sbp if sbp is not None else x.sbp)
    elif sbp is not None and tuple(x.sbp) != tuple(sbp):
        x = x.to_global(sbp=sbp)
    return x


def settle(x):
    """Finish pending reductions: every partial-sum mesh axis becomes broadcast (all-reduce)."""
    if x._global is None or not any(s.is_partial for s in x.sbp):
        return x
    return x.to_global(sbp=[B if s.is_partial else s for s in x.sbp])


def dropout(x, p, training=True):
    """Dropout with a mask that does not depend on the layout: for a global tensor the mask
    is drawn as a logical tensor (the engine's global `rand`, the same draws on every rank)
    and split like `x`, so 1 rank and N ranks drop the same elements. Local tensors use the
    engine's dropout."""
    if not training or p == 0.0:
        return x
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if x._global is None:
        return flow.nn.functional.dropout(x, p, training=True)
    x = settle(x)
    keep = flow.rand(*x.shape, placement=x.placement, sbp=x.sbp) >= p
    scale = 0.0 if p >= 1.0 else 1.0 / (1.0 - p)
    return x * (keep.to(x.dtype) * scale)


class Recomputable:
    """Mixin for a layer whose forward can be recomputed in backward instead of keeping its
    activations (train.activation_checkpoint.enabled, as LiBai's per-TransformerLayer setting):
    with `activation_checkpointing` set, a training call with autograd on goes through
    `engine.utils.checkpoint.checkpoint` (same values, gradients and dropout masks)."""

    activation_checkpointing = False

    def __call__(self, *args, **kwargs):
        if self.activation_checkpointing and self.training and flow.is_grad_enabled():
            return checkpoint(super().__call__, *args, **kwargs)
        return super().__call__(*args, **kwargs)


def set_activation_checkpointing(model, enabled=True):
    """Turn activation checkpointing on (or off) for every Recomputable layer of `model`
    (TransformerLayer, SwinBlock); returns how many layers there are."""
    layers = [m for m in model.modules() if isinstance(m, Recomputable)]
    for m in layers:
        m.activation_checkpointing = bool(enabled)
    return len(layers)
