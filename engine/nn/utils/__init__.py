"""engine.nn.utils: gradient clipping (clip_grad.py), variable-length sequences (rnn.py), parameters
as one vector (convert_parameters.py), weight and spectral norm (weight_norm.py, spectral_norm.py),
parametrizations (parametrize.py, parametrizations.py)."""
from . import parametrizations, parametrize, rnn  # noqa: F401
from .clip_grad import clip_grad_norm_, clip_grad_value_, clip_grads_with_norm_, get_total_norm  # noqa: F401
from .convert_parameters import parameters_to_vector, vector_to_parameters  # noqa: F401
from .spectral_norm import remove_spectral_norm, spectral_norm  # noqa: F401
from .weight_norm import remove_weight_norm, weight_norm  # noqa: F401
