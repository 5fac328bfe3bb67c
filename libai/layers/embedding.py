"""Embeddings on global tensors.

* `VocabEmbedding`: the token table [V, D] split on the vocabulary over the tensor-parallel
  ranks ([B, S(0)]); each rank looks up the ids in its own vocab range (zeros elsewhere), the
  result is a partial sum [S(0), P] that one all-reduce turns into the hidden layout
  [S(0), B]. Its weight is also the (tied) LM head, see LMLogits.
* `Embedding`: a replicated table ([B, B]), e.g. the position embedding.
"""
import engine as flow
import engine.nn as nn
import engine.nn.functional as F
from engine.autograd.grad_mode import no_grad
from libai.utils import distributed as dist

from .utils import hidden_sbp_for, make_parameter, settle, to_placement

__all__ = ["VocabEmbedding", "Embedding"]

B = flow.sbp.broadcast
S = flow.sbp.split


def _ids_to_global(ids, placement):
    if not isinstance(ids, flow.Tensor):
        ids = flow.tensor(ids)
    if ids._global is None:
        return to_placement(ids, placement, hidden_sbp_for(ids.shape))
    return to_placement(ids, placement)


class _EmbeddingBase(nn.Module):
    def __init__(self, num_embeddings, embedding_dim, padding_idx, init_method, sbp, layer_idx, dtype):
        super().__init__()
        self.num_embeddings = int(num_embeddings)
        self.embedding_dim = int(embedding_dim)
        if padding_idx is not None:
            if not -self.num_embeddings <= padding_idx < self.num_embeddings:
                raise ValueError(f"padding_idx {padding_idx} is out of range for {num_embeddings} embeddings")
            padding_idx %= self.num_embeddings
        self.padding_idx = padding_idx
        self.layer_idx = layer_idx
        placement = dist.get_layer_placement(layer_idx)
        init_method = init_method or nn.init.normal_

        def init_(t):
            init_method(t)
            if padding_idx is not None:
                with no_grad():
                    t[padding_idx] = 0.0
            return t

        self.weight = make_parameter((self.num_embeddings, self.embedding_dim), init_, placement,
                                     dist.get_nd_sbp(sbp), dtype)

    def extra_repr(self):
        s = f"num_embeddings={self.num_embeddings}, embedding_dim={self.embedding_dim}"
        return s + (f", padding_idx={self.padding_idx}" if self.padding_idx is not None else "")


class VocabEmbedding(_EmbeddingBase):
    """Token embedding split on the vocabulary over the tensor-parallel ranks (the vocabulary,
    already padded, must divide by tp)."""

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, init_method=nn.init.normal_,
                 *, layer_idx=0, dtype=None):
        dist.check_tensor_parallel_divisible(num_embeddings, "VocabEmbedding: num_embeddings (the padded vocab size)")
        super().__init__(num_embeddings, embedding_dim, padding_idx, init_method, [B, S(0)], layer_idx, dtype)

    def forward(self, input_ids):
        ids = _ids_to_global(input_ids, self.weight.placement)
        # ids [S(0), B] x table [B, S(0)] -> [S(0), P] (masked lookup) -> all-reduce -> [S(0), B]
        return settle(F.embedding(ids, self.weight, padding_idx=self.padding_idx))


class Embedding(_EmbeddingBase):
    """A replicated embedding table ([B, B]), e.g. positions."""

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, init_method=nn.init.normal_,
                 *, layer_idx=0, dtype=None):
        super().__init__(num_embeddings, embedding_dim, padding_idx, init_method, [B, B], layer_idx, dtype)

    def forward(self, input_ids):
        ids = _ids_to_global(input_ids, self.weight.placement)
        return F.embedding(ids, self.weight, padding_idx=self.padding_idx)
