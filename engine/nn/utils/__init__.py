"""engine.nn.utils: gradient clipping (clip_grad.py) and variable-length sequences (rnn.py)."""
from . import rnn  # noqa: F401
from .clip_grad import clip_grad_norm_, clip_grad_value_, clip_grads_with_norm_, get_total_norm  # noqa: F401
