"""engine.nn.utils: gradient clipping (written in clip_grad.py by the optimizer code)."""
try:
    from .clip_grad import clip_grad_norm_, clip_grad_value_  # noqa: F401
except ModuleNotFoundError as _e:  # tolerated only while clip_grad.py itself does not exist
    if _e.name != __name__ + ".clip_grad":
        raise
