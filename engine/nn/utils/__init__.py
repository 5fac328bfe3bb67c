"""engine.nn.utils: gradient clipping (clip_grad.py)."""
from .clip_grad import clip_grad_norm_, clip_grad_value_, clip_grads_with_norm_, get_total_norm  # noqa: F401
