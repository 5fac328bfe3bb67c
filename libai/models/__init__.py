"""libai models: GPT-2 (`gpt_model`, on libai.layers) and `mlp_classifier`, a small model for
the trainer's tests and examples."""
from .gpt_model import GPTForPreTraining, GPTLoss, GPTModel  # noqa: E402

__all__ = ["GPTModel", "GPTForPreTraining", "GPTLoss"]
