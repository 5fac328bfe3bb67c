"""libai.layers: the building blocks of the Transformer models, written on global tensors.

Every layer creates its parameters on `get_layer_placement(layer_idx)` with the SBP of its
parallel style (see docs/parallelism.md); the same code runs in one process and on any
data x tensor parallel layout.
"""
from .attention import AttnMaskType, MultiheadAttention
from .cross_entropy import ParallelCrossEntropyLoss
from .embedding import Embedding, VocabEmbedding
from .layer_norm import LayerNorm
from .linear import Linear, Linear1D
from .lm_logits import LMLogits
from .mlp import MLP
from .transformer_layer import TransformerLayer
from .utils import dropout, init_method_normal, make_parameter, scaled_init_method_normal
from .vision import DropPath, PatchEmbedding

__all__ = [
    "Linear", "Linear1D", "VocabEmbedding", "Embedding", "LayerNorm", "MultiheadAttention", "AttnMaskType",
    "MLP", "TransformerLayer", "LMLogits", "ParallelCrossEntropyLoss", "init_method_normal",
    "scaled_init_method_normal", "make_parameter", "dropout", "PatchEmbedding", "DropPath",
]
