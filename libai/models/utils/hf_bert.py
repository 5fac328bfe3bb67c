"""HuggingFace BERT <-> libai BERT: configs, weight layouts, loading a folder.

Weight mapping (HF name, without the "bert." prefix -> BertModel name) for the post-LN layout:

    embeddings.word_embeddings.weight          embeddings.word_embeddings.weight   (tied MLM decoder)
    embeddings.position_embeddings.weight      embeddings.position_embeddings.weight
    embeddings.token_type_embeddings.weight    embeddings.tokentype_embeddings.weight
    embeddings.LayerNorm.*                     embeddings.embedding_layernorm.*
    encoder.layer.{i}.attention.self.{query,key,value}.*   encoders.{i}.self_attention.query_key_value.*  (fused)
    encoder.layer.{i}.attention.output.dense.*             encoders.{i}.self_attention.dense.*
    encoder.layer.{i}.attention.output.LayerNorm.*         encoders.{i}.input_layernorm.*
    encoder.layer.{i}.intermediate.dense.*                 encoders.{i}.mlp.dense_h_to_4h.*
    encoder.layer.{i}.output.dense.*                       encoders.{i}.mlp.dense_4h_to_h.*
    encoder.layer.{i}.output.LayerNorm.*                   encoders.{i}.post_attention_layernorm.*
    pooler.dense.*                                         pooler.dense.*

Heads: cls.predictions.transform.dense / .LayerNorm -> cls_head.dense / cls_head.layernorm,
cls.predictions.bias -> cls_head.lm_logits.bias, cls.seq_relationship -> cls_head.seq_relationship
(BertForPreTraining); classifier -> classifier (BertForSequenceClassification).

The pre-LN layout with apply_residual_post_layernorm=True computes the same network with every
LayerNorm one place later (libai.models.bert_model): the embedding LayerNorm is layer 0's
input_layernorm, attention.output.LayerNorm of layer i its post_attention_layernorm, and
output.LayerNorm of layer i the input_layernorm of layer i+1 (the final_layernorm after the last).
A pre-LN model without apply_residual_post_layernorm has no HuggingFace equivalent.

The fused query_key_value rows are ordered [heads, 3, head_size] so that a tensor-parallel shard
holds whole heads with their q, k and v (as GPT-2's, libai.models.utils.hf_gpt2).
"""
import logging
import os

import numpy as np

from .hf_gpt2 import WEIGHTS_FILE, HFConfigError, read_hf_folder, take_new_classifier

__all__ = ["bert_kwargs_from_hf_config", "hf_config_from_bert_kwargs", "hf_to_libai_bert", "libai_to_hf_bert",
           "load_huggingface_bert", "bert_head_of"]

# HF config keys whose non-default value BertModel cannot reproduce
_UNSUPPORTED = {"is_decoder": False, "add_cross_attention": False, "position_embedding_type": "absolute",
                "tie_word_embeddings": True}
_RESIDUAL_POST_KEY = "apply_residual_post_layernorm"


def bert_kwargs_from_hf_config(hf):
    """BertModel keyword arguments from a HF BERT config dict; HFConfigError naming the key for
    settings BertModel cannot reproduce."""
    model_type = hf.get("model_type", "bert")
    if model_type != "bert":
        raise HFConfigError(f"unsupported config: model_type={model_type!r} (only 'bert')")
    for key, ok in _UNSUPPORTED.items():
        if key in hf and hf[key] is not None and hf[key] != ok:
            raise HFConfigError(f"unsupported config: {key}={hf[key]!r} (BertModel supports {key}={ok!r})")
    act = hf.get("hidden_act", "gelu")
    if act != "gelu":
        raise HFConfigError(f"unsupported config: hidden_act={act!r} (BertModel uses the exact GELU, 'gelu')")
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"):
        if key not in hf:
            raise HFConfigError(f"config is missing {key!r}")
    hidden = int(hf["hidden_size"])
    return dict(
        vocab_size=int(hf["vocab_size"]),
        hidden_size=hidden,
        hidden_layers=int(hf["num_hidden_layers"]),
        num_attention_heads=int(hf["num_attention_heads"]),
        intermediate_size=int(hf.get("intermediate_size", 4 * hidden)),
        hidden_dropout_prob=float(hf.get("hidden_dropout_prob", 0.1)),
        attention_probs_dropout_prob=float(hf.get("attention_probs_dropout_prob", 0.1)),
        max_position_embeddings=int(hf.get("max_position_embeddings", 512)),
        num_tokentypes=int(hf.get("type_vocab_size", 2)),
        initializer_range=float(hf.get("initializer_range", 0.02)),
        layernorm_eps=float(hf.get("layer_norm_eps", 1e-12)),
        # HF's word embedding has padding_idx=pad_token_id: that row gets no lookup gradient
        pad_token_id=None if hf.get("pad_token_id", 0) is None else int(hf.get("pad_token_id", 0)),
    )


def hf_config_from_bert_kwargs(kw, base=None, architecture="BertForPreTraining", num_labels=None):
    """A HF BERT config dict for BertModel kwargs `kw` (`base`: an original HF config whose other
    entries, e.g. token ids or label names, are kept)."""
    cfg = dict(base or {})
    hidden = int(kw["hidden_size"])
    cfg.update(
        model_type="bert", architectures=[architecture], vocab_size=int(kw["vocab_size"]), hidden_size=hidden,
        num_hidden_layers=int(kw["hidden_layers"]), num_attention_heads=int(kw["num_attention_heads"]),
        intermediate_size=int(kw.get("intermediate_size") or 4 * hidden), hidden_act="gelu",
        hidden_dropout_prob=float(kw.get("hidden_dropout_prob", 0.1)),
        attention_probs_dropout_prob=float(kw.get("attention_probs_dropout_prob", 0.1)),
        max_position_embeddings=int(kw.get("max_position_embeddings", 512)),
        type_vocab_size=int(kw.get("num_tokentypes", 2)), initializer_range=float(kw.get("initializer_range", 0.02)),
        layer_norm_eps=float(kw.get("layernorm_eps", 1e-12)), position_embedding_type="absolute",
        tie_word_embeddings=True,
    )
    if kw.get("pad_token_id") is not None:
        cfg["pad_token_id"] = int(kw["pad_token_id"])
    cfg.setdefault("pad_token_id", 0)
    if num_labels is not None:
        cfg["num_labels"] = int(num_labels)
        if "id2label" not in cfg or len(cfg["id2label"]) != int(num_labels):
            cfg["id2label"] = {str(i): f"LABEL_{i}" for i in range(int(num_labels))}
            cfg["label2id"] = {v: int(k) for k, v in cfg["id2label"].items()}
        if int(num_labels) == 1:
            cfg["problem_type"] = "regression"
    return cfg


# ------------------------------------------------------------------ weight layouts
def qkv_hf_to_libai(q, k, v, num_heads):
    """HF query/key/value weights [h, h] ([out, in]) or biases [h] -> the fused libai
    query_key_value rows [heads, 3, head_size] (weight [3h, h], bias [3h])."""
    d = q.shape[0] // num_heads
    stacked = np.stack([t.reshape(num_heads, d, *t.shape[1:]) for t in (q, k, v)], axis=1)  # [heads, 3, d, ...]
    return np.ascontiguousarray(stacked.reshape(3 * q.shape[0], *q.shape[1:]))


def qkv_libai_to_hf(w, num_heads):
    """The inverse of qkv_hf_to_libai: (q, k, v)."""
    h = w.shape[0] // 3
    d = h // num_heads
    parts = w.reshape(num_heads, 3, d, *w.shape[1:])
    return tuple(np.ascontiguousarray(parts[:, j].reshape(h, *w.shape[1:])) for j in range(3))


def _layernorm_names(num_layers, layernorm_position):
    """HF LayerNorm name -> libai LayerNorm name (without .weight/.bias)."""
    if layernorm_position == "post":
        names = {"embeddings.LayerNorm": "embeddings.embedding_layernorm"}
        for i in range(num_layers):
            names[f"encoder.layer.{i}.attention.output.LayerNorm"] = f"encoders.{i}.input_layernorm"
            names[f"encoder.layer.{i}.output.LayerNorm"] = f"encoders.{i}.post_attention_layernorm"
        return names
    names = {"embeddings.LayerNorm": "encoders.0.input_layernorm"}
    for i in range(num_layers):
        names[f"encoder.layer.{i}.attention.output.LayerNorm"] = f"encoders.{i}.post_attention_layernorm"
        names[f"encoder.layer.{i}.output.LayerNorm"] = (f"encoders.{i + 1}.input_layernorm" if i + 1 < num_layers
                                                        else "final_layernorm")
    return names


_LINEARS = [  # (HF suffix, libai suffix)
    ("attention.output.dense", "self_attention.dense"),
    ("intermediate.dense", "mlp.dense_h_to_4h"),
    ("output.dense", "mlp.dense_4h_to_h"),
]
_HEAD_MAP = {  # HF name -> libai name (BertForPreTraining / BertForSequenceClassification)
    "cls.predictions.transform.dense.weight": "cls_head.dense.weight",
    "cls.predictions.transform.dense.bias": "cls_head.dense.bias",
    "cls.predictions.transform.LayerNorm.weight": "cls_head.layernorm.weight",
    "cls.predictions.transform.LayerNorm.bias": "cls_head.layernorm.bias",
    "cls.predictions.bias": "cls_head.lm_logits.bias",
    "cls.seq_relationship.weight": "cls_head.seq_relationship.weight",
    "cls.seq_relationship.bias": "cls_head.seq_relationship.bias",
    "classifier.weight": "classifier.weight",
    "classifier.bias": "classifier.bias",
}


def _check_layout(kw):
    position = kw.get("layernorm_position", "post")
    if position == "pre" and not kw.get(_RESIDUAL_POST_KEY, False):
        raise HFConfigError("a pre-LN BERT without apply_residual_post_layernorm has no HuggingFace equivalent "
                            "(use layernorm_position='post', or 'pre' with apply_residual_post_layernorm=True)")
    return position


def _normalise_hf_names(hf_sd):
    """Drop the 'bert.' prefix; old checkpoints' LayerNorm.gamma/beta become weight/bias."""
    out = {}
    for k, v in hf_sd.items():
        if k.endswith("position_ids"):
            continue
        k = k[len("bert."):] if k.startswith("bert.") else k
        k = k.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        out[k] = v
    return out


def bert_head_of(hf_sd):
    """"pretraining", "classification" or None: which head the HF state dict carries."""
    names = _normalise_hf_names(hf_sd)
    if any(k.startswith("cls.predictions.") for k in names):
        return "pretraining"
    if "classifier.weight" in names:
        return "classification"
    return None


def hf_to_libai_bert(hf_sd, kw, path="<state dict>", prefix="bert."):
    """{HF name: array} -> {libai name: logical array}: the encoder under `prefix` ("bert." for
    the wrappers, "" for a bare BertModel) and the heads the file holds (`cls_head.*`,
    `classifier.*`; an MLM decoder equal to the word embeddings is dropped: they are tied)."""
    sd = {k: np.asarray(v, dtype=np.float32) for k, v in _normalise_hf_names(hf_sd).items()}
    num_layers, num_heads = int(kw["hidden_layers"]), int(kw["num_attention_heads"])
    position = _check_layout(kw)

    def take(name):
        if name not in sd:
            raise KeyError(f"{path}: missing tensor {name!r} (have {sorted(sd)[:8]}...)")
        return sd.pop(name)

    out = {"embeddings.word_embeddings.weight": take("embeddings.word_embeddings.weight"),
           "embeddings.position_embeddings.weight": take("embeddings.position_embeddings.weight")}
    if int(kw.get("num_tokentypes", 2)) > 0:
        out["embeddings.tokentype_embeddings.weight"] = take("embeddings.token_type_embeddings.weight")
    for hf_name, name in _layernorm_names(num_layers, position).items():
        out[name + ".weight"] = take(hf_name + ".weight")
        out[name + ".bias"] = take(hf_name + ".bias")
    for i in range(num_layers):
        src, dst = f"encoder.layer.{i}.", f"encoders.{i}."
        for part in ("weight", "bias"):
            q, k, v = (take(f"{src}attention.self.{n}.{part}") for n in ("query", "key", "value"))
            out[f"{dst}self_attention.query_key_value.{part}"] = qkv_hf_to_libai(q, k, v, num_heads)
            for hf_suffix, suffix in _LINEARS:
                out[f"{dst}{suffix}.{part}"] = take(f"{src}{hf_suffix}.{part}")
    if "pooler.dense.weight" in sd:
        out["pooler.dense.weight"], out["pooler.dense.bias"] = take("pooler.dense.weight"), take("pooler.dense.bias")
    out = {prefix + k: v for k, v in out.items()}
    decoder = sd.pop("cls.predictions.decoder.weight", None)
    if decoder is not None and not np.array_equal(decoder, out[prefix + "embeddings.word_embeddings.weight"]):
        raise HFConfigError(f"{path}: cls.predictions.decoder.weight differs from the word embeddings; "
                            "BertForPreTraining ties them")
    decoder_bias = sd.pop("cls.predictions.decoder.bias", None)
    if decoder_bias is not None and "cls.predictions.bias" in sd \
            and not np.array_equal(decoder_bias, sd["cls.predictions.bias"]):
        raise HFConfigError(f"{path}: cls.predictions.decoder.bias differs from cls.predictions.bias")
    for hf_name, name in _HEAD_MAP.items():
        if hf_name in sd:
            out[name] = sd.pop(hf_name)
    if sd:
        raise KeyError(f"{path}: tensors not used by BERT: {sorted(sd)}")
    return out


def libai_to_hf_bert(sd, kw, prefix="bert."):
    """{libai name: logical array} (BertModel, or a wrapper's state dict with "bert." keys) ->
    {HF name: array} with HF's "bert." prefix and the heads present (the tied decoder weight is
    left out, as save_pretrained writes it)."""
    sd = {k: np.asarray(v) for k, v in sd.items()}
    enc = {k[len("bert."):]: v for k, v in sd.items() if k.startswith("bert.")} or dict(sd)
    num_layers, num_heads = int(kw["hidden_layers"]), int(kw["num_attention_heads"])
    position = _check_layout(kw)
    out = {"embeddings.word_embeddings.weight": enc["embeddings.word_embeddings.weight"],
           "embeddings.position_embeddings.weight": enc["embeddings.position_embeddings.weight"]}
    if "embeddings.tokentype_embeddings.weight" in enc:
        out["embeddings.token_type_embeddings.weight"] = enc["embeddings.tokentype_embeddings.weight"]
    for hf_name, name in _layernorm_names(num_layers, position).items():
        out[hf_name + ".weight"] = enc[name + ".weight"]
        out[hf_name + ".bias"] = enc[name + ".bias"]
    for i in range(num_layers):
        src, dst = f"encoders.{i}.", f"encoder.layer.{i}."
        for part in ("weight", "bias"):
            qkv = qkv_libai_to_hf(enc[f"{src}self_attention.query_key_value.{part}"], num_heads)
            for n, t in zip(("query", "key", "value"), qkv):
                out[f"{dst}attention.self.{n}.{part}"] = t
            for hf_suffix, suffix in _LINEARS:
                out[f"{dst}{hf_suffix}.{part}"] = enc[f"{src}{suffix}.{part}"]
    if "pooler.dense.weight" in enc:
        out["pooler.dense.weight"], out["pooler.dense.bias"] = enc["pooler.dense.weight"], enc["pooler.dense.bias"]
    out = {prefix + k: v for k, v in out.items()}
    for hf_name, name in _HEAD_MAP.items():
        if name in sd:
            out[hf_name] = sd[name]
    if "cls_head.lm_logits.bias" in sd:
        out["cls.predictions.decoder.bias"] = sd["cls_head.lm_logits.bias"]
    return out


# ------------------------------------------------------------------ loading a folder
def _num_labels(hf_cfg, overrides):
    """The classifier's width: the override, else the folder's."""
    if "num_labels" in overrides:
        return int(overrides["num_labels"])
    if "num_labels" in hf_cfg:
        return int(hf_cfg["num_labels"])
    return len(hf_cfg.get("id2label") or {0: 0, 1: 1})


def load_huggingface_bert(model_cls, path, **overrides):
    """Build `model_cls` (BertModel, BertForPreTraining or BertForSequenceClassification) from a HF
    BERT folder and load its weights (laid out on each parameter's placement/SBP). A
    BertForSequenceClassification from a folder without a classifier (a pretrained BERT) keeps
    its freshly initialised classifier, and so does `num_labels=N` for a folder classifying
    another number of labels with `ignore_mismatched_sizes=True` (HF's flag); other missing
    tensors are errors."""
    from .weights import load_logical_state_dict

    overrides = dict(overrides)
    ignore_mismatched_sizes = overrides.pop("ignore_mismatched_sizes", False)
    hf_cfg, hf_sd = read_hf_folder(path)
    kwargs = bert_kwargs_from_hf_config(hf_cfg)
    head = bert_head_of(hf_sd)
    weights = os.path.join(path, WEIGHTS_FILE)
    target = getattr(model_cls, "hf_head", None)  # which head the model class has (None: BertModel)
    if target == "classification":
        overrides["num_labels"] = _num_labels(hf_cfg, overrides)
        overrides.setdefault("problem_type", hf_cfg.get("problem_type"))  # the loss HF trains it with
        if "classifier_dropout" not in overrides and hf_cfg.get("classifier_dropout") is not None:
            overrides["classifier_dropout"] = float(hf_cfg["classifier_dropout"])
    elif target == "pretraining":
        if head != "pretraining":
            raise HFConfigError(f"{weights}: no pretraining heads (cls.predictions.*) to load into "
                                "BertForPreTraining; load it with BertModel or BertForSequenceClassification")
        kwargs["add_binary_head"] = "cls.seq_relationship.weight" in _normalise_hf_names(hf_sd)
    has_pooler = "pooler.dense.weight" in _normalise_hf_names(hf_sd)
    if not has_pooler and target != "classification":  # BertForMaskedLM, BertModel(add_pooling_layer=False)
        kwargs["add_pooling_layer"] = False
    kwargs.update(overrides)
    model = model_cls(**kwargs)
    sd = hf_to_libai_bert(hf_sd, kwargs, path=weights, prefix="" if target is None else "bert.")
    own = dict(model.named_parameters())
    dropped = sorted(k for k in sd if k not in own and (k.startswith(("cls_head.", "classifier."))))
    for k in dropped:  # heads the target model does not have (e.g. BertModel from a pretraining file)
        sd.pop(k)
    if dropped:
        logging.getLogger(__name__).info(f"{weights}: heads not used by {model_cls.__name__}: {dropped}")
    fresh = []  # what the folder lacks (or, for a new task, has for other labels): newly initialised, as HF does
    if target == "classification":
        fresh += take_new_classifier(model, sd, ("classifier.weight", "classifier.bias"), weights,
                                     ignore_mismatched_sizes)
        if not has_pooler:
            fresh += take_new_classifier(model, sd, ("bert.pooler.dense.weight", "bert.pooler.dense.bias"), weights,
                                         False)
    for module in sorted({k.rsplit(".", 1)[0] for k in fresh}):
        logging.getLogger(__name__).info(f"{weights}: {model_cls.__name__}.{module} is newly initialised (fine-tune "
                                         "it): the folder has none, or (ignore_mismatched_sizes) one for other labels")
    load_logical_state_dict(model, sd)
    model.hf_config = hf_cfg
    return model
