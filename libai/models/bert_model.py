"""BERT on libai.layers (global tensors: one code path for 1 rank and any dp x tp layout).

    BertModel:  word (vocab-parallel) + position + token-type embeddings
                -> [post-LN: LayerNorm] -> dropout
                -> N TransformerLayers (bidirectional, padding mask)
                -> [pre-LN: final LayerNorm]
                -> sequence output [batch, seq, hidden]; pooler: tanh(dense(sequence[:, 0]))
    BertForPreTraining: BertModel + MLM head (dense -> GELU -> LayerNorm -> logits against the
                tied word embeddings plus its own bias, split on the vocabulary over tp) + binary
                head (sentence order / next sentence) on the pooled output, and BertLoss.
    BertForSequenceClassification: BertModel + dropout + a classifier on the pooled output
                (cross-entropy; mean squared error when num_labels == 1, i.e. regression).

Layer-norm position:
  * "post" (default): the original BERT and HuggingFace's layout, h = LN(x + f(x)), with a
    LayerNorm on the embeddings; HuggingFace weights load directly.
  * "pre": LiBai's and Megatron's layout, h = x + f(LN(x)), with a final LayerNorm. With
    `apply_residual_post_layernorm=True` the residuals start from the normalised values, and
    this layout computes exactly the post-LN network when each LayerNorm moves one place
    forward (the embedding LayerNorm becomes layer 0's input LayerNorm, layer i's output
    LayerNorm layer i+1's, the last one the final LayerNorm): the HuggingFace converter maps
    weights into that form too (libai.models.utils.hf_bert).

The attention mask is [batch, seq] with 1 for tokens and 0 for padding (HuggingFace's
`attention_mask`; LiBai's name too). Masked-LM labels follow the dataset (libai.data.datasets.
BertDataset): `lm_labels` is the original token at masked positions and `loss_mask` 1 there;
without `loss_mask` the positions with a negative label (-1, or HuggingFace's -100) are ignored.
"""
import numpy as np

import engine as flow
import engine.nn as nn
import engine.nn.functional as F
from libai.config import configurable
from libai.layers import (
    Embedding, LayerNorm, Linear, LMLogits, ParallelCrossEntropyLoss, TransformerLayer, VocabEmbedding, dropout,
    init_method_normal, scaled_init_method_normal,
)
from libai.layers.utils import settle, to_placement
from libai.utils import distributed as dist

from .utils.classification import check_problem_type, classification_loss
from .utils.model_config import check_positive_sizes, kwargs_from_config
from .utils.pipeline import PipelineStep
from .utils.weights import as_numpy

__all__ = ["BertModel", "BertForPreTraining", "BertForSequenceClassification", "BertEmbeddings", "BertLoss",
           "BertPooler", "BertPreTrainingHeads", "masked_positions"]

B = flow.sbp.broadcast
_REQUIRED_KEYS = ("vocab_size", "hidden_size", "hidden_layers", "num_attention_heads")
LAYERNORM_POSITIONS = ("post", "pre")
PRETRAINING_KEYS = ("add_binary_head",)  # in LiBai's model.cfg beside BertModel's keys (BertForPreTraining's)


class BertEmbeddings(nn.Module):
    def __init__(self, vocab_size, hidden_size, max_position_embeddings, num_tokentypes, init_method,
                 embedding_dropout_prob, layernorm_eps=None, pad_token_id=None):
        super().__init__()
        self.max_position_embeddings = int(max_position_embeddings)
        # pad_token_id: the row that gets no lookup gradient (HF's padding_idx); None: every row
        # learns from its lookups (LiBai, Megatron)
        self.word_embeddings = VocabEmbedding(vocab_size, hidden_size, padding_idx=pad_token_id,
                                              init_method=init_method, layer_idx=0)
        self.position_embeddings = Embedding(max_position_embeddings, hidden_size, init_method=init_method,
                                             layer_idx=0)
        self.tokentype_embeddings = (Embedding(num_tokentypes, hidden_size, init_method=init_method, layer_idx=0)
                                     if num_tokentypes > 0 else None)
        # post-LN BERT normalises the embeddings; pre-LN leaves that to layer 0's input LayerNorm
        self.embedding_layernorm = (LayerNorm(hidden_size, eps=layernorm_eps, layer_idx=0)
                                    if layernorm_eps is not None else None)
        self.embedding_dropout_prob = float(embedding_dropout_prob)

    def forward(self, input_ids, tokentype_ids=None):
        seq = input_ids.shape[-1]
        if seq > self.max_position_embeddings:
            raise ValueError(f"BERT: sequence length {seq} exceeds max_position_embeddings "
                             f"{self.max_position_embeddings}")
        placement = self.position_embeddings.weight.placement
        position_ids = flow.arange(seq, placement=placement, sbp=[B] * placement.ndim).view(1, seq)
        x = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)  # [b, s, h]
        if self.tokentype_embeddings is not None:
            if tokentype_ids is None:
                tokentype_ids = flow.zeros(*input_ids.shape, dtype=flow.int64, placement=placement,
                                           sbp=[B] * placement.ndim)
            x = x + self.tokentype_embeddings(tokentype_ids)
        elif tokentype_ids is not None:
            raise ValueError("BERT: tokentype_ids given but the model has num_tokentypes=0")
        if self.embedding_layernorm is not None:
            x = self.embedding_layernorm(x)
        return dropout(x, self.embedding_dropout_prob, self.training)


class BertPooler(nn.Module):
    """tanh(dense(hidden of the first token, [CLS])): the sentence representation."""

    def __init__(self, hidden_size, init_method):
        super().__init__()
        self.dense = Linear(hidden_size, hidden_size, parallel="data", init_method=init_method, layer_idx=-1)

    def forward(self, hidden_states):
        first = hidden_states[:, 0]  # [b, h]
        return flow.tanh(self.dense(first))


class BertModel(nn.Module):
    """Returns `(sequence_output [b, s, h], pooled_output [b, h] or None)` (see the module docstring)."""

    pretraining_keys = PRETRAINING_KEYS  # config keys of the pretraining heads, not of BertModel

    @configurable
    def __init__(self, vocab_size, hidden_size, hidden_layers, num_attention_heads, intermediate_size=None,
                 hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, max_position_embeddings=512,
                 num_tokentypes=2, add_pooling_layer=True, initializer_range=0.02, layernorm_eps=1e-12,
                 layernorm_position="post", apply_residual_post_layernorm=False, bias_gelu_fusion=False,
                 bias_dropout_fusion=False, scale_mask_softmax_fusion=False, apply_query_key_layer_scaling=False,
                 amp_enabled=False, pad_token_id=None):
        super().__init__()
        if layernorm_position not in LAYERNORM_POSITIONS:
            raise ValueError(f"BertModel: layernorm_position must be one of {LAYERNORM_POSITIONS}, "
                             f"got {layernorm_position!r}")
        if layernorm_position == "post" and apply_residual_post_layernorm:
            raise ValueError("BertModel: apply_residual_post_layernorm applies to layernorm_position='pre' "
                             "(a post-LN residual already starts after the LayerNorm)")
        if amp_enabled:  # a LiBai key: only its default is accepted (docs/config.md)
            raise NotImplementedError("BertModel: amp_enabled=True (LiBai's graph-mode cast of the embeddings) is not "
                                      "implemented; mixed precision here is train.amp.enabled=True (autocast around "
                                      "the whole model, docs/parallelism.md)")
        intermediate_size = 4 * hidden_size if intermediate_size is None else intermediate_size
        check_positive_sizes("BertModel", vocab_size=vocab_size, hidden_size=hidden_size, hidden_layers=hidden_layers,
                             num_attention_heads=num_attention_heads, intermediate_size=intermediate_size,
                             max_position_embeddings=max_position_embeddings)
        dist.check_tensor_parallel_divisible(vocab_size, "BertModel: vocab_size (pad it to a multiple of tp)")
        dist.check_tensor_parallel_divisible(hidden_size, "BertModel: hidden_size")
        dist.check_tensor_parallel_divisible(intermediate_size, "BertModel: intermediate_size")
        dist.check_tensor_parallel_divisible(num_attention_heads, "BertModel: num_attention_heads")
        self.config = dict(
            vocab_size=vocab_size, hidden_size=hidden_size, hidden_layers=hidden_layers,
            num_attention_heads=num_attention_heads, intermediate_size=intermediate_size,
            hidden_dropout_prob=hidden_dropout_prob, attention_probs_dropout_prob=attention_probs_dropout_prob,
            max_position_embeddings=max_position_embeddings, num_tokentypes=num_tokentypes,
            add_pooling_layer=add_pooling_layer, initializer_range=initializer_range, layernorm_eps=layernorm_eps,
            layernorm_position=layernorm_position, apply_residual_post_layernorm=apply_residual_post_layernorm,
            pad_token_id=pad_token_id)
        self.layernorm_position = layernorm_position
        init_method = init_method_normal(initializer_range)
        output_init = scaled_init_method_normal(initializer_range, hidden_layers)
        post = layernorm_position == "post"
        self.embeddings = BertEmbeddings(vocab_size, hidden_size, max_position_embeddings, num_tokentypes,
                                         init_method, hidden_dropout_prob, layernorm_eps if post else None,
                                         pad_token_id)
        self.encoders = nn.ModuleList([
            TransformerLayer(
                hidden_size, intermediate_size, num_attention_heads,
                attention_dropout_prob=attention_probs_dropout_prob, output_dropout_prob=hidden_dropout_prob,
                layernorm_epsilon=layernorm_eps, init_method=init_method, output_layer_init_method=output_init,
                bias_gelu_fusion=bias_gelu_fusion, bias_dropout_fusion=bias_dropout_fusion,
                scale_mask_softmax_fusion=scale_mask_softmax_fusion,
                apply_query_key_layer_scaling=apply_query_key_layer_scaling,
                apply_residual_post_layernorm=apply_residual_post_layernorm, attn_mask_type="padding",
                layer_idx=i, layernorm_position=layernorm_position, activation="gelu")
            for i in range(hidden_layers)
        ])
        self.final_layernorm = None if post else LayerNorm(hidden_size, eps=layernorm_eps, layer_idx=-1)
        self.pooler = BertPooler(hidden_size, init_method) if add_pooling_layer else None

    @classmethod
    def from_config(cls, cfg):
        """BertModel's keyword arguments from `cfg` (model.cfg); an unknown or missing required
        key is an error naming it."""
        return kwargs_from_config(cls, cfg, _REQUIRED_KEYS)

    @classmethod
    def from_huggingface(cls, path, **overrides):
        """A BertModel with the weights of the HuggingFace BERT folder `path` (config.json +
        model.safetensors); `overrides` replace config values (e.g. dropout probabilities)."""
        from .utils.hf_bert import load_huggingface_bert

        return load_huggingface_bert(cls, path, **overrides)

    def forward(self, input_ids, attention_mask=None, tokentype_ids=None):
        x = self.embeddings(input_ids, tokentype_ids)  # [b, s, h]
        for layer in self.encoders:
            x = layer(x, attention_mask)
        return self._final(x)

    def _final(self, x):
        """(sequence_output, pooled_output) from the last encoder's output."""
        if self.final_layernorm is not None:
            x = self.final_layernorm(x)
        pooled = self.pooler(x) if self.pooler is not None else None
        return x, pooled

    def pipeline_steps(self, head):
        """The forward above as pipeline steps (libai.engine.pipeline) ending in
        `head(sequence_output, pooled_output, batch)`, the model's outputs."""
        def embed(carry, batch):
            return {"hidden": self.embeddings(batch["input_ids"], batch.get("tokentype_ids"))}  # [b, s, h]

        def encoder_step(layer):
            return lambda carry, batch: {"hidden": layer(carry["hidden"], batch.get("attention_mask"))}

        def final(carry, batch):
            return head(*self._final(carry["hidden"]), batch)

        encoders = [PipelineStep(layer.layer_idx, encoder_step(layer)) for layer in self.encoders]
        return [PipelineStep(0, embed), *encoders, PipelineStep(-1, final)]

    @property
    def word_embeddings_weight(self):
        return self.embeddings.word_embeddings.weight


class BertPreTrainingHeads(nn.Module):
    """MLM logits [b, s, vocab] (split on the vocabulary over tp) and binary logits [b, 2]."""

    def __init__(self, vocab_size, hidden_size, init_method, layernorm_eps, add_binary_head):
        super().__init__()
        self.dense = Linear(hidden_size, hidden_size, parallel="data", init_method=init_method, layer_idx=-1)
        self.layernorm = LayerNorm(hidden_size, eps=layernorm_eps, layer_idx=-1)
        self.lm_logits = LMLogits(vocab_size, bias=True)
        self.seq_relationship = (Linear(hidden_size, 2, parallel="data", init_method=init_method, layer_idx=-1)
                                 if add_binary_head else None)

    def forward(self, sequence_output, pooled_output, word_embeddings, positions=None):
        """`positions` (int64 [b, k]): score only these positions of each row (the masked ones)."""
        if positions is not None:
            b, k, hidden = positions.shape[0], positions.shape[1], sequence_output.shape[-1]
            index = to_placement(positions, sequence_output.placement) if sequence_output._global is not None \
                else positions
            sequence_output = flow.gather(sequence_output, 1, index.view(b, k, 1).expand(b, k, hidden))  # [b, k, h]
        h = self.layernorm(F.gelu(self.dense(sequence_output)))
        prediction_scores = self.lm_logits(h, word_embeddings)
        binary = self.seq_relationship(pooled_output) if self.seq_relationship is not None else None
        return prediction_scores, binary


def masked_positions(lm_labels, loss_mask=None):
    """(positions int64 [b, k], valid int64 [b, k]): the masked positions of each row, padded to
    the largest count k of the (whole) batch with position 0 and valid 0. Scoring only these,
    as the original BERT does (`gather_indexes`), gives the same loss and gradients as scoring
    every position and saves most of the vocabulary projection."""
    keep = as_numpy(loss_mask) != 0 if loss_mask is not None else as_numpy(lm_labels) >= 0
    keep = keep.reshape(keep.shape[0], -1)
    k = max(int(keep.sum(axis=1).max(initial=0)), 1)
    positions = np.zeros((keep.shape[0], k), dtype=np.int64)
    valid = np.zeros((keep.shape[0], k), dtype=np.int64)
    for row, mask in enumerate(keep):
        where = np.flatnonzero(mask)
        positions[row, :len(where)] = where
        valid[row, :len(where)] = 1
    return positions, valid


def _masked_mean(values, mask):
    """sum(values * mask) / sum(mask) over the whole (global) batch."""
    mask = mask.to(values.dtype)
    return settle(settle((values * mask).sum()) / settle(mask.sum()))


class BertLoss(nn.Module):
    """Masked-LM loss (mean over the masked tokens, vocab-parallel cross-entropy) and the binary
    head's cross-entropy; `total_loss` is their sum (HuggingFace's `loss`)."""

    def __init__(self, add_binary_head=True):
        super().__init__()
        self.add_binary_head = add_binary_head
        self.lm_loss = ParallelCrossEntropyLoss(ignore_index=-1, reduction="none")

    def forward(self, prediction_scores, lm_labels, loss_mask=None, binary_logits=None, ns_labels=None):
        placement = prediction_scores.placement
        lm_labels = to_placement(lm_labels, placement)
        keep = (lm_labels >= 0) if loss_mask is None else (to_placement(loss_mask, placement) != 0)
        keep = keep.to(flow.int64)
        # -1 (ignored) wherever the loss mask is 0, so any label there (-1, -100, a token) is inert
        targets = lm_labels.to(flow.int64) * keep + (keep - 1)
        per_token = self.lm_loss(prediction_scores, targets)  # [b, s]
        losses = {"lm_loss": _masked_mean(per_token, keep)}
        if self.add_binary_head and binary_logits is not None and ns_labels is not None:
            ns_labels = to_placement(ns_labels, binary_logits.placement).to(flow.int64)
            losses["sop_loss"] = settle(F.cross_entropy(binary_logits, ns_labels.view(-1)))
            with flow.no_grad():
                hits = (binary_logits.argmax(dim=-1) == ns_labels.view(-1)).to(flow.float32)
                sop_acc = settle(settle(hits.sum()) / hits.shape[0])
        losses = {"total_loss": sum(losses.values()), **losses}
        if "sop_loss" in losses:
            losses["sop_acc"] = sop_acc  # logged, not optimised (the trainer backpropagates total_loss)
        return losses


def _bert_kwargs(cls_name, cfg, kwargs):
    """(BertModel's keyword arguments, {pretraining key: value}) of a config node and/or keyword
    arguments; an unknown key is an error naming it."""
    merged = {k: cfg[k] for k in cfg} if cfg is not None else {}
    merged.update(kwargs)
    if not merged:
        raise TypeError(f"{cls_name} needs a config node (cfg) or BertModel's keyword arguments")
    pretraining = {k: merged.pop(k) for k in PRETRAINING_KEYS if k in merged}
    return BertModel.from_config(merged), pretraining


class BertForPreTraining(nn.Module):
    """BertModel + pretraining heads + BertLoss. `BertForPreTraining(cfg)` (a config node with
    BertModel's keys, `add_binary_head` among them) or `BertForPreTraining(**bert_kwargs)`.

    Training returns {"total_loss", "lm_loss", "sop_loss", "sop_acc"} (the binary-head entries
    with add_binary_head), the MLM head run on the masked positions only (`masked_positions`);
    eval returns {"prediction_scores" [b, s, vocab],
    "seq_relationship_score" [b, 2]} plus the losses when labels are given."""

    hf_head = "pretraining"  # the HuggingFace head its weights come with (libai.models.utils.hf_bert)

    def __init__(self, cfg=None, **kwargs):
        super().__init__()
        args, pretraining = _bert_kwargs(type(self).__name__, cfg, kwargs)
        add_binary_head = bool(pretraining.get("add_binary_head", True))
        if add_binary_head and args.get("add_pooling_layer") is False:
            raise ValueError("BertForPreTraining: add_binary_head=True needs add_pooling_layer=True "
                             "(the binary head reads the pooled [CLS] output)")
        self.bert = BertModel(**args)
        c = self.bert.config
        self.cls_head = BertPreTrainingHeads(c["vocab_size"], c["hidden_size"], init_method_normal(
            c["initializer_range"]), c["layernorm_eps"], add_binary_head)
        self.loss_func = BertLoss(add_binary_head)

    @classmethod
    def from_huggingface(cls, path, **overrides):
        """BertForPreTraining with the weights of a HuggingFace `BertForPreTraining` folder."""
        from .utils.hf_bert import load_huggingface_bert

        return load_huggingface_bert(cls, path, **overrides)

    def forward(self, input_ids, attention_mask=None, tokentype_ids=None, ns_labels=None, lm_labels=None,
                loss_mask=None):
        sequence_output, pooled = self.bert(input_ids, attention_mask, tokentype_ids)
        return self._heads(sequence_output, pooled, ns_labels, lm_labels, loss_mask)

    def pipeline_steps(self):
        """Pipeline parallelism (libai.engine.pipeline): BertModel's steps, then the heads."""
        return self.bert.pipeline_steps(lambda seq, pooled, batch: self._heads(
            seq, pooled, batch.get("ns_labels"), batch.get("lm_labels"), batch.get("loss_mask")))

    def pipeline_tied_parameters(self):
        """The word embedding (first stage) is also the MLM head's weight (last stage)."""
        return [(self.bert.word_embeddings_weight, -1)]

    def _heads(self, sequence_output, pooled, ns_labels, lm_labels, loss_mask):
        if self.training and lm_labels is not None and not (flow.nn.graph.is_tracing()
                                                             or flow.cuda.is_current_stream_capturing()):
            # score the masked positions only (the loss reads nothing else); eval scores every
            # position, and so do graph mode and a CUDA graph capture, whose shapes cannot depend
            # on the mask's count
            positions, valid = masked_positions(lm_labels, loss_mask)
            prediction_scores, binary = self.cls_head(sequence_output, pooled, self.bert.word_embeddings_weight,
                                                      flow.tensor(positions))
            targets = np.take_along_axis(as_numpy(lm_labels).reshape(valid.shape[0], -1), positions, axis=1)
            return self.loss_func(prediction_scores, flow.tensor(np.where(valid == 1, targets, -1)),
                                  flow.tensor(valid), binary, ns_labels)
        prediction_scores, binary = self.cls_head(sequence_output, pooled, self.bert.word_embeddings_weight)
        outputs = {}
        if lm_labels is not None:
            outputs = self.loss_func(prediction_scores, lm_labels, loss_mask, binary, ns_labels)
            if self.training:  # graph mode: the losses, as the masked-positions path returns
                return outputs
        outputs["prediction_scores"] = prediction_scores
        if binary is not None:
            outputs["seq_relationship_score"] = binary
        return outputs


class BertForSequenceClassification(nn.Module):
    """BertModel + dropout + classifier on the pooled output. The loss is HuggingFace's for
    `problem_type` (libai.models.utils.classification); with None, as HF infers it: `num_labels
    == 1` is regression (mean squared error against float labels), integer labels the
    cross-entropy over num_labels classes, float labels [b, num_labels] the multi-label binary
    cross-entropy. Training returns {"loss"}; eval {"prediction_scores": logits [b, num_labels]
    ([b] for one output)} plus "loss" when labels are given."""

    hf_head = "classification"

    def __init__(self, cfg=None, num_labels=2, classifier_dropout=None, problem_type=None, **kwargs):
        super().__init__()
        check_problem_type(type(self).__name__, problem_type)
        self.problem_type = problem_type
        args, pretraining = _bert_kwargs(type(self).__name__, cfg, kwargs)
        if pretraining:
            raise ValueError(f"BertForSequenceClassification: {sorted(pretraining)} configure pretraining heads, "
                             "which the classifier does not have; remove them from model.cfg")
        if args.get("add_pooling_layer") is False:
            raise ValueError("BertForSequenceClassification needs add_pooling_layer=True (it classifies the pooled "
                             "[CLS] output)")
        if int(num_labels) < 1:
            raise ValueError(f"BertForSequenceClassification: num_labels must be >= 1, got {num_labels}")
        self.num_labels = int(num_labels)
        self.bert = BertModel(**args)
        c = self.bert.config
        self.classifier_dropout = float(c["hidden_dropout_prob"] if classifier_dropout is None else classifier_dropout)
        self.classifier = Linear(c["hidden_size"], self.num_labels, parallel="data",
                                 init_method=init_method_normal(c["initializer_range"]), layer_idx=-1)

    @classmethod
    def from_huggingface(cls, path, **overrides):
        """BertForSequenceClassification from a HuggingFace folder: a fine-tuned
        `BertForSequenceClassification` (its classifier and num_labels) or a pretrained BERT
        (a new classifier, initialised; give `num_labels`)."""
        from .utils.hf_bert import load_huggingface_bert

        return load_huggingface_bert(cls, path, **overrides)

    def forward(self, input_ids, attention_mask=None, tokentype_ids=None, labels=None):
        _, pooled = self.bert(input_ids, attention_mask, tokentype_ids)
        return self._classify(pooled, labels)

    def pipeline_steps(self):
        """Pipeline parallelism (libai.engine.pipeline): BertModel's steps, then the classifier."""
        return self.bert.pipeline_steps(lambda seq, pooled, batch: self._classify(pooled, batch.get("labels")))

    def _classify(self, pooled, labels):
        logits = self.classifier(dropout(pooled, self.classifier_dropout, self.training))  # [b, num_labels]
        outputs = {}
        if labels is not None:
            outputs["loss"] = settle(classification_loss(logits, labels, self.problem_type))
            if self.training:
                return outputs
        outputs["prediction_scores"] = logits.view(-1) if self.num_labels == 1 else logits  # [b] for one output
        return outputs
