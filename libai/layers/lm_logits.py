"""`LMLogits`: logits = hidden @ word_embeddings^T with the tied, vocab-split embedding table.

hidden [S(0), B] x table [B, S(0)] (its rows are the output features of a column-parallel
product) -> logits [S(0), S(-1)]: each tensor-parallel rank computes the logits of its own
vocabulary range and nothing is gathered; ParallelCrossEntropyLoss consumes them split."""
import engine as flow
import engine.nn as nn
import engine.nn.functional as F
from libai.utils import distributed as dist

from .utils import make_parameter, to_placement

__all__ = ["LMLogits"]

B = flow.sbp.broadcast
S = flow.sbp.split


class LMLogits(nn.Module):
    def __init__(self, vocab_size, bias=False, *, layer_idx=-1):
        super().__init__()
        self.vocab_size = int(vocab_size)
        self.layer_idx = layer_idx
        if bias:
            dist.check_tensor_parallel_divisible(vocab_size, "LMLogits: vocab_size (the padded vocab size)")
            self.bias = make_parameter((self.vocab_size,), None, dist.get_layer_placement(layer_idx),
                                       dist.get_nd_sbp([B, S(0)]))
        else:
            self.bias = None

    def forward(self, input, word_embeddings):
        placement = dist.get_layer_placement(self.layer_idx)
        input = to_placement(input, placement)
        if word_embeddings.placement != placement:  # tied table on the first stage, head on the last
            word_embeddings = word_embeddings.to_global(placement=placement, sbp=word_embeddings.sbp)
        if word_embeddings.shape[0] != self.vocab_size:
            raise ValueError(f"LMLogits: the embedding table has {word_embeddings.shape[0]} rows, "
                             f"expected vocab_size {self.vocab_size}")
        return F.linear(input, word_embeddings, self.bias)
