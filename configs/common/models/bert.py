"""BERT model config (LiBai's configs/common/models/bert.py; sizes of BERT-base).

`cfg` holds BertModel's keys (libai/models/bert_model.py) plus `add_binary_head`, read by
BertForPreTraining; `model` (alias `pretrain_model`) is BertForPreTraining built from it.
`vocab_size` is a placeholder: when the config has a `tokenization` section the trainer replaces
it with the tokenizer's padded size.

`layernorm_position="post"` is the original BERT (and HuggingFace's) layout; "pre" is LiBai's and
Megatron's (with `apply_residual_post_layernorm=True` it computes the post-LN network, see
docs/bert.md).
"""
from omegaconf import DictConfig

from libai.config import LazyCall
from libai.models import BertForPreTraining

cfg = dict(
    vocab_size=30522,
    hidden_size=768,
    hidden_layers=12,
    num_attention_heads=12,
    intermediate_size=3072,
    hidden_dropout_prob=0.1,
    attention_probs_dropout_prob=0.1,
    max_position_embeddings=512,
    num_tokentypes=2,
    add_pooling_layer=True,
    initializer_range=0.02,
    layernorm_eps=1e-12,
    layernorm_position="post",
    apply_residual_post_layernorm=False,
    bias_gelu_fusion=False,
    bias_dropout_fusion=False,
    scale_mask_softmax_fusion=False,
    apply_query_key_layer_scaling=False,
    add_binary_head=True,
    amp_enabled=False,
)

cfg = DictConfig(cfg)

model = LazyCall(BertForPreTraining)(cfg=cfg)
pretrain_model = model
