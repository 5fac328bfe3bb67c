"""Model utilities: Hugging Face GPT-2 weight conversion and loading of logical state dicts
into models whose parameters are sharded global tensors; LiBai's GraphBase (the nn.Graph of graph mode)
and weight init names."""
from libai.layers.utils import init_method_normal, scaled_init_method_normal  # LiBai's weight_init names

from .hf_gpt2 import (
    HFConfigError, gpt_kwargs_from_hf_config, hf_config_from_gpt_kwargs, hf_to_libai_gpt2, libai_to_hf_gpt2,
    load_huggingface_gpt2, read_safetensors, write_safetensors,
)
from .graph_base import GraphBase
from .weights import load_logical_state_dict, logical_state_dict

__all__ = [
    "HFConfigError", "gpt_kwargs_from_hf_config", "hf_config_from_gpt_kwargs", "hf_to_libai_gpt2",
    "libai_to_hf_gpt2", "load_huggingface_gpt2", "read_safetensors", "write_safetensors",
    "load_logical_state_dict", "logical_state_dict", "GraphBase",
    "init_method_normal", "scaled_init_method_normal",
]
