"""engine.nn.utils: gradient clipping (clip_grad.py), variable-length sequences (rnn.py), parameters
as one vector (convert_parameters.py)."""
from . import rnn  # noqa: F401
from .clip_grad import clip_grad_norm_, clip_grad_value_, clip_grads_with_norm_, get_total_norm  # noqa: F401
from .convert_parameters import parameters_to_vector, vector_to_parameters  # noqa: F401
