"""Anomaly detection (torch.autograd.detect_anomaly / set_detect_anomaly).

While it is on, every recorded node keeps the stack of the forward call that made it, and a
backward that fails -- or, with `check_nan`, returns a gradient holding NaN (torch's
"Function 'SqrtBackward' returned nan values in its 0th output.") -- warns with that forward
traceback ("Error detected in SqrtBackward. Traceback of forward call that caused the error:")
before the error goes on, as torch does. Like torch's, the mode is process-wide, not per thread.
"""
import traceback
import warnings

from ..backend import xp_of

__all__ = ["detect_anomaly", "set_detect_anomaly", "is_anomaly_enabled", "is_anomaly_check_nan_enabled"]


class _Mode:
    enabled = False
    check_nan = True


mode = _Mode()


def is_anomaly_enabled():
    return mode.enabled


def is_anomaly_check_nan_enabled():
    return mode.check_nan


def _set(enabled, check_nan):
    mode.enabled, mode.check_nan = bool(enabled), bool(check_nan)


class detect_anomaly:
    """Context manager turning anomaly detection on inside (with torch's warning), restoring the
    previous mode after."""

    def __init__(self, check_nan=True):
        self.prev = (mode.enabled, mode.check_nan)
        self.check_nan = check_nan
        warnings.warn("Anomaly Detection has been enabled. This mode will increase the runtime and should only be "
                      "enabled for debugging.", stacklevel=2)

    def __enter__(self):
        _set(True, self.check_nan)

    def __exit__(self, *exc):
        _set(*self.prev)
        return False


class set_detect_anomaly:
    """Set anomaly detection on or off now; as a context manager, restore the previous mode after."""

    def __init__(self, mode_, check_nan=True):
        self.prev = (mode.enabled, mode.check_nan)
        _set(mode_, check_nan)

    def __enter__(self):
        pass

    def __exit__(self, *exc):
        _set(*self.prev)
        return False


def forward_trace():
    """The forward stack to keep on a node being recorded (without this call and Node.__init__)."""
    return traceback.format_stack()[:-2]


def check_outputs(name, grads):
    """Raise torch's RuntimeError when a gradient `name` returned holds NaN (check_nan on)."""
    if not mode.check_nan:
        return
    for i, g in enumerate(grads):
        data = getattr(g, "_data", None)
        if data is not None and data.dtype.kind in "fc" and bool(xp_of(data).isnan(data).any()):
            raise RuntimeError(f"Function '{name}' returned nan values in its {i}th output.")


def report(name, trace):
    """Warn that backward `name` failed, with the forward traceback kept for it."""
    where = "".join(trace) if trace else "  (no forward traceback: the node was recorded before anomaly mode)\n"
    warnings.warn(f"Error detected in {name}. Traceback of forward call that caused the error:\n{where}",
                  stacklevel=4)
