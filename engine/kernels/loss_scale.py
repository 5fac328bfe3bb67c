"""The GradScaler's scale update (torch's `_amp_update_scale_`), on the host and on the device.

    next_scale(scale, tracker, found, growth, backoff, interval) -> (scale, tracker)
        the rule: after an inf/nan step the scale times `backoff` and the run of clean steps
        reset; after `interval` clean steps in a row the scale times `growth` (kept only when
        finite) and the run reset. The scale is a float32 value (as torch's scale tensor), each
        product taken in double and rounded once to float32.
    update_scale(scale, tracker, found, growth, backoff, interval) -> None
        the same rule in place on 0-d arrays (float32 scale, int32 tracker, float32 flag): on
        CUDA one single-thread launch (`engine_amp_update_scale`), so the scale of the next step
        is decided on the device and the host never waits for the flag.
"""
import numpy as np

from ..backend import xp_of
from . import _cuda

__all__ = ["next_scale", "update_scale", "update_scale_numpy", "update_scale_cuda", "KERNEL_NAME", "SOURCE"]

KERNEL_NAME = "engine_amp_update_scale"

SOURCE = r"""
extern "C" __global__ void engine_amp_update_scale(float* __restrict__ scale, int* __restrict__ tracker,
        const float* __restrict__ found, const double growth, const double backoff, const int interval) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    if (found[0] != 0.0f) {
        scale[0] = (float)((double)scale[0] * backoff);
        tracker[0] = 0;
        return;
    }
    const int clean = tracker[0] + 1;
    if (clean == interval) {
        const float grown = (float)((double)scale[0] * growth);
        if (grown - grown == 0.0f) scale[0] = grown;  // finite: an overflow keeps the scale
        tracker[0] = 0;
    } else {
        tracker[0] = clean;
    }
}
"""


def next_scale(scale, tracker, found, growth, backoff, interval):
    """(scale, tracker) after a step that found inf/nan (`found` true) or not; see the module doc."""
    scale = float(np.float32(scale))
    if found:
        return float(np.float32(scale * backoff)), 0
    clean = int(tracker) + 1
    if clean != interval:
        return scale, clean
    with np.errstate(over="ignore"):
        grown = np.float32(scale * growth)
    return (float(grown) if np.isfinite(grown) else scale), 0


def update_scale_numpy(scale, tracker, found, growth, backoff, interval):
    scale[...], tracker[...] = next_scale(scale, tracker, float(found) != 0.0, growth, backoff, interval)


def update_scale_cuda(scale, tracker, found, growth, backoff, interval):
    for a, dtype, what in ((scale, np.float32, "scale"), (tracker, np.int32, "tracker"), (found, np.float32, "found")):
        if a.dtype != dtype or a.size != 1:
            raise ValueError(f"update_scale: {what} must be one {np.dtype(dtype)}, got {a.size} x {a.dtype}")
    _cuda.raw_kernel(SOURCE, KERNEL_NAME)((1,), (32,), (scale, tracker, found, _cuda.f64(growth),
                                                        _cuda.f64(backoff), _cuda.i32(interval)))


def update_scale(scale, tracker, found, growth, backoff, interval):
    """The rule in place on 0-d arrays: one launch on CUDA, numpy otherwise."""
    if xp_of(scale) is not np:
        update_scale_cuda(scale, tracker, found, growth, backoff, interval)
    else:
        update_scale_numpy(scale, tracker, found, growth, backoff, interval)
