"""GPT-2 model config (LiBai's configs/common/models/gpt.py).

`cfg` holds GPTModel's keys; `model` (alias `pretrain_model`, LiBai's name) is GPTForPreTraining
built from it. `vocab_size` is a placeholder: when the config has a `tokenization` section the
trainer replaces it with the tokenizer's padded size
(`tokenizer.padded_vocab_size(make_vocab_size_divisible_by, tensor_parallel_size)`).
"""
from omegaconf import DictConfig

from libai.config import LazyCall
from libai.models import GPTForPreTraining

cfg = dict(
    hidden_layers=6,
    vocab_size=30522,
    hidden_size=384,
    ffn_hidden_size=1536,
    num_attention_heads=12,
    max_seq_length=1024,
    embedding_dropout_prob=0.0,
    attention_dropout_prob=0.0,
    output_dropout_prob=0.0,
    layernorm_epsilon=1e-5,
    initializer_range=0.02,
    use_scaled_init_for_output_weights=True,
    bias_gelu_fusion=False,
    bias_dropout_fusion=False,
    scale_mask_softmax_fusion=False,
    apply_query_key_layer_scaling=False,
    apply_residual_post_layernorm=False,
    amp_enabled=False,
)

cfg = DictConfig(cfg)

model = LazyCall(GPTForPreTraining)(cfg=cfg)
pretrain_model = model
