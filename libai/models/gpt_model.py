"""GPT-2 on libai.layers (global tensors: one code path for 1 rank and any dp x tp layout).

    GPTModel:  token (vocab-parallel) + position embeddings -> dropout -> N pre-LN
               TransformerLayers (causal) -> final LayerNorm -> tied LM head -> logits
               [batch, seq, vocab], split on the vocabulary over tensor-parallel ranks.
    GPTForPreTraining: GPTModel + GPTLoss (vocab-parallel cross-entropy, mean over the labels
               that are not -100). Training: {"lm_loss": loss}; eval: {"prediction_scores":
               logits} plus "lm_loss" when labels are given (for PPLEvaluator).

Labels are aligned with the inputs (labels[:, i] is the token that follows input_ids[:, i];
the datasets shift them), so GPTLoss does not shift.

KV cache (generation): `GPTModel.forward(input_ids, past_key_values=None, use_cache=True)`
returns `(logits, presents)`, presents a tuple with one `(k, v)` per layer (local tensors, each
[batch, heads, total_len, head_size] on one process, this rank's shard otherwise). Feed the
next token(s) with `past_key_values=presents`; positions continue from the cached length.
Decoding loop (greedy / top-k / top-p are choices on `logits[:, -1]`):

    logits, past = model(prompt_ids, use_cache=True)
    for _ in range(n):
        next_id = pick(logits[:, -1])                    # [batch, 1]
        logits, past = model(next_id, past_key_values=past, use_cache=True)

`GPTModel.from_huggingface(path, **overrides)` builds a model from a Hugging Face GPT-2 folder
(see libai.models.utils.hf_gpt2).
"""
import engine as flow
import engine.nn as nn
from libai.config import configurable
from libai.layers import (
    Embedding, LayerNorm, LMLogits, ParallelCrossEntropyLoss, TransformerLayer, VocabEmbedding,
    dropout, init_method_normal, scaled_init_method_normal,
)
from libai.layers.utils import to_placement
from libai.utils import distributed as dist

from .utils.model_config import check_positive_sizes, kwargs_from_config
from .utils.pipeline import PipelineStep

__all__ = ["GPTModel", "GPTForPreTraining", "GPTLoss", "GPTEmbedding", "Transformer"]

B = flow.sbp.broadcast
# GPTModel's keys without a default (num_attention_heads has None in the signature only because
# ffn_hidden_size, optional, comes before it)
_REQUIRED_KEYS = ("hidden_layers", "vocab_size", "hidden_size", "num_attention_heads")


class GPTEmbedding(nn.Module):
    def __init__(self, vocab_size, hidden_size, max_seq_length, init_method=nn.init.normal_,
                 embedding_dropout_prob=0.0):
        super().__init__()
        self.max_seq_length = int(max_seq_length)
        self.token_embeddings = VocabEmbedding(vocab_size, hidden_size, init_method=init_method, layer_idx=0)
        self.position_embeddings = Embedding(max_seq_length, hidden_size, init_method=init_method, layer_idx=0)
        self.embedding_dropout_prob = float(embedding_dropout_prob)

    def forward(self, input_ids, past_length=0, position_ids=None):
        seq = input_ids.shape[-1]
        if past_length + seq > self.max_seq_length:
            raise ValueError(f"GPT: sequence length {past_length + seq} (past {past_length} + new {seq}) exceeds "
                             f"max_seq_length {self.max_seq_length}")
        placement = self.position_embeddings.weight.placement
        if position_ids is None:
            position_ids = flow.arange(past_length, past_length + seq, placement=placement,
                                       sbp=[B] * placement.ndim).view(1, seq)
        else:  # HF's position_ids: a left-padded batch counts its positions from each row's first token
            if tuple(position_ids.shape[-1:]) != (seq,):
                raise ValueError(f"GPT: position_ids of shape {list(position_ids.shape)} for input_ids of shape "
                                 f"{list(input_ids.shape)}")
            position_ids = to_placement(position_ids, placement, [B] * placement.ndim)
        x = self.token_embeddings(input_ids) + self.position_embeddings(position_ids)
        return dropout(x, self.embedding_dropout_prob, self.training)


class Transformer(nn.Module):
    """The stack of layers and the final LayerNorm (on the last stage)."""

    def __init__(self, hidden_layers, hidden_size, ffn_hidden_size, num_attention_heads, attention_dropout_prob=0.0,
                 output_dropout_prob=0.0, layernorm_epsilon=1e-5, init_method=nn.init.xavier_normal_,
                 output_layer_init_method=None, bias_gelu_fusion=False, bias_dropout_fusion=False,
                 scale_mask_softmax_fusion=False, apply_query_key_layer_scaling=False,
                 apply_residual_post_layernorm=False):
        super().__init__()
        self.layers = nn.ModuleList([
            TransformerLayer(
                hidden_size, ffn_hidden_size, num_attention_heads, attention_dropout_prob=attention_dropout_prob,
                output_dropout_prob=output_dropout_prob, layernorm_epsilon=layernorm_epsilon,
                init_method=init_method, output_layer_init_method=output_layer_init_method,
                bias_gelu_fusion=bias_gelu_fusion, bias_dropout_fusion=bias_dropout_fusion,
                scale_mask_softmax_fusion=scale_mask_softmax_fusion,
                apply_query_key_layer_scaling=apply_query_key_layer_scaling,
                apply_residual_post_layernorm=apply_residual_post_layernorm, attn_mask_type="causal", layer_idx=i)
            for i in range(hidden_layers)
        ])
        # its output feeds only the LM head's product (GPTModel.forward): in the autocast dtype
        self.layernorm_f = LayerNorm(hidden_size, eps=layernorm_epsilon, layer_idx=-1, autocast_output=True)

    def forward(self, hidden_states, attention_mask=None, past_key_values=None, use_cache=False):
        presents = []
        for i, layer in enumerate(self.layers):
            past = None if past_key_values is None else past_key_values[i]
            out = layer(hidden_states, attention_mask, past_key_value=past, use_cache=use_cache)
            if use_cache:
                out, present = out
                presents.append(present)
            hidden_states = out
        hidden_states = self.layernorm_f(hidden_states)
        return (hidden_states, tuple(presents)) if use_cache else hidden_states


class GPTModel(nn.Module):
    """GPT-2 returning logits [batch, seq, vocab_size] (see the module docstring)."""

    @configurable
    def __init__(self, hidden_layers, vocab_size, hidden_size, ffn_hidden_size=None, num_attention_heads=None,
                 max_seq_length=1024, embedding_dropout_prob=0.0, attention_dropout_prob=0.0,
                 output_dropout_prob=0.0, layernorm_epsilon=1e-5, initializer_range=0.02,
                 use_scaled_init_for_output_weights=True, bias_gelu_fusion=False, bias_dropout_fusion=False,
                 scale_mask_softmax_fusion=False, apply_query_key_layer_scaling=False,
                 apply_residual_post_layernorm=False, amp_enabled=False):
        super().__init__()
        if num_attention_heads is None:
            raise ValueError("GPTModel: num_attention_heads is required")
        if amp_enabled:  # a LiBai key: only its default is accepted (docs/config.md)
            raise NotImplementedError("GPTModel: amp_enabled=True (LiBai's graph-mode cast of the embeddings) is not "
                                      "implemented; mixed precision here is train.amp.enabled=True (autocast around "
                                      "the whole model, docs/parallelism.md)")
        ffn_hidden_size = 4 * hidden_size if ffn_hidden_size is None else ffn_hidden_size
        check_positive_sizes("GPTModel", hidden_layers=hidden_layers, vocab_size=vocab_size, hidden_size=hidden_size,
                             ffn_hidden_size=ffn_hidden_size, num_attention_heads=num_attention_heads,
                             max_seq_length=max_seq_length)
        dist.check_tensor_parallel_divisible(vocab_size, "GPTModel: vocab_size (pad it to a multiple of tp)")
        dist.check_tensor_parallel_divisible(hidden_size, "GPTModel: hidden_size")
        dist.check_tensor_parallel_divisible(ffn_hidden_size, "GPTModel: ffn_hidden_size")
        dist.check_tensor_parallel_divisible(num_attention_heads, "GPTModel: num_attention_heads")
        self.config = dict(
            hidden_layers=hidden_layers, vocab_size=vocab_size, hidden_size=hidden_size,
            ffn_hidden_size=ffn_hidden_size, num_attention_heads=num_attention_heads, max_seq_length=max_seq_length,
            embedding_dropout_prob=embedding_dropout_prob, attention_dropout_prob=attention_dropout_prob,
            output_dropout_prob=output_dropout_prob, layernorm_epsilon=layernorm_epsilon,
            initializer_range=initializer_range, use_scaled_init_for_output_weights=use_scaled_init_for_output_weights,
            apply_residual_post_layernorm=apply_residual_post_layernorm)
        init_method = init_method_normal(initializer_range)
        output_init = (scaled_init_method_normal(initializer_range, hidden_layers)
                       if use_scaled_init_for_output_weights else init_method)
        self.embeddings = GPTEmbedding(vocab_size, hidden_size, max_seq_length, init_method, embedding_dropout_prob)
        self.transformer = Transformer(
            hidden_layers, hidden_size, ffn_hidden_size, num_attention_heads,
            attention_dropout_prob=attention_dropout_prob, output_dropout_prob=output_dropout_prob,
            layernorm_epsilon=layernorm_epsilon, init_method=init_method, output_layer_init_method=output_init,
            bias_gelu_fusion=bias_gelu_fusion, bias_dropout_fusion=bias_dropout_fusion,
            scale_mask_softmax_fusion=scale_mask_softmax_fusion,
            apply_query_key_layer_scaling=apply_query_key_layer_scaling,
            apply_residual_post_layernorm=apply_residual_post_layernorm)
        self.lm_head = LMLogits(vocab_size, bias=False)

    @classmethod
    def from_config(cls, cfg):
        """The keyword arguments of `cfg` (a config node or dict with GPTModel's keys); an unknown
        or missing required key is an error naming it (libai.models.utils.kwargs_from_config)."""
        return kwargs_from_config(cls, cfg, _REQUIRED_KEYS)

    @classmethod
    def from_huggingface(cls, path, **overrides):
        """A GPTModel with the weights of the Hugging Face GPT-2 folder `path` (config.json +
        model.safetensors); `overrides` replace config values (e.g. dropout probabilities)."""
        from .utils.hf_gpt2 import load_huggingface_gpt2

        return load_huggingface_gpt2(cls, path, **overrides)

    def forward(self, input_ids, past_key_values=None, use_cache=False, attention_mask=None, position_ids=None):
        """Logits [batch, seq, vocab] (and the KV cache with `use_cache`). `position_ids` [batch or
        1, seq], as HF's GPT2Model takes them, overrides the positions past_length, ... (a
        left-padded batch: HF's generate passes attention_mask.cumsum(-1) - 1)."""
        past_length = 0
        if past_key_values is not None:
            if len(past_key_values) != len(self.transformer.layers):
                raise ValueError(f"GPTModel: past_key_values has {len(past_key_values)} entries for "
                                 f"{len(self.transformer.layers)} layers")
            past_length = past_key_values[0][0].shape[2]
        x = self.embeddings(input_ids, past_length, position_ids)
        out = self.transformer(x, attention_mask, past_key_values=past_key_values, use_cache=use_cache)
        hidden, presents = out if use_cache else (out, None)
        logits = self.lm_head(hidden, self.embeddings.token_embeddings.weight)
        return (logits, presents) if use_cache else logits


class GPTLoss(nn.Module):
    """Mean vocab-parallel cross-entropy over the labels that are not `ignore_index`."""

    def __init__(self, ignore_index=-100):
        super().__init__()
        self.lm_loss = ParallelCrossEntropyLoss(ignore_index=ignore_index, reduction="mean")

    def forward(self, logits, lm_labels):
        return {"lm_loss": self.lm_loss(logits, lm_labels)}


class GPTForPreTraining(nn.Module):
    """GPTModel + GPTLoss. `GPTForPreTraining(cfg)` (a config node with GPTModel's keys) or
    `GPTForPreTraining(**gpt_kwargs)`."""

    def __init__(self, cfg=None, **kwargs):
        super().__init__()
        if cfg is not None:
            args = GPTModel.from_config(cfg)
            args.update(kwargs)
        else:
            args = kwargs
        self.GPT_model = GPTModel(**args)
        self.loss_func = GPTLoss()

    def forward(self, input_ids, labels=None):
        return self._outputs(self.GPT_model(input_ids), labels)

    def _outputs(self, logits, labels):
        if labels is not None:
            losses = self.loss_func(logits, labels)
            if self.training:
                return losses
            return {"prediction_scores": logits, **losses}
        return {"prediction_scores": logits}

    # ---- pipeline parallelism (libai.engine.pipeline): the forward above, cut into stage steps
    def pipeline_steps(self):
        gpt = self.GPT_model

        def embed(carry, batch):
            return {"hidden": gpt.embeddings(batch["input_ids"])}  # [b, s, h]

        def layer_step(layer):
            return lambda carry, batch: {"hidden": layer(carry["hidden"])}

        def head(carry, batch):
            hidden = gpt.transformer.layernorm_f(carry["hidden"])
            logits = gpt.lm_head(hidden, gpt.embeddings.token_embeddings.weight)  # [b, s, vocab]
            return self._outputs(logits, batch.get("labels"))

        layers = [PipelineStep(layer.layer_idx, layer_step(layer)) for layer in gpt.transformer.layers]
        return [PipelineStep(0, embed), *layers, PipelineStep(-1, head)]

    def pipeline_tied_parameters(self):
        """The word embedding (first stage) is also the LM head's weight (last stage)."""
        return [(self.GPT_model.embeddings.token_embeddings.weight, -1)]
