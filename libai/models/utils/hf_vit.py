"""HuggingFace ViT <-> libai VisionTransformer: config, weight names, loading a folder.

    HF (prefix "vit.")                                      VisionTransformer
    embeddings.cls_token                                    cls_token
    embeddings.position_embeddings                          pos_embed
    embeddings.patch_embeddings.projection.{weight,bias}    patch_embed.{weight,bias}
    encoder.layer.{i}.layernorm_before.*                    blocks.{i}.input_layernorm.*
    encoder.layer.{i}.attention.attention.{query,key,value}.*   blocks.{i}.self_attention.query_key_value.*
    encoder.layer.{i}.attention.output.dense.*              blocks.{i}.self_attention.dense.*
    encoder.layer.{i}.layernorm_after.*                     blocks.{i}.post_attention_layernorm.*
    encoder.layer.{i}.intermediate.dense.*                  blocks.{i}.mlp.dense_h_to_4h.*
    encoder.layer.{i}.output.dense.*                        blocks.{i}.mlp.dense_4h_to_h.*
    layernorm.*                                             norm.*
    classifier.* (ViTForImageClassification)                head.*

transformers 5 names the same tensors `layers.{i}.attention.{q,k,v,o}_proj` and `mlp.fc1/fc2` in
memory; both spellings are read. The fused query_key_value rows are [heads, 3, head_size]
(libai.models.utils.hf_bert.qkv_hf_to_libai).
"""
import logging
import os
import re

import numpy as np

from .hf_bert import qkv_hf_to_libai, qkv_libai_to_hf
from .hf_gpt2 import WEIGHTS_FILE, HFConfigError, read_hf_folder, take_new_classifier

__all__ = ["vit_kwargs_from_hf_config", "hf_config_from_vit_kwargs", "hf_to_libai_vit", "libai_to_hf_vit",
           "load_huggingface_vit", "load_huggingface_classifier"]

_NEW_NAMES = [  # transformers 5 in-memory names -> the file names above
    (r"^layers\.(\d+)\.attention\.q_proj\.", r"encoder.layer.\1.attention.attention.query."),
    (r"^layers\.(\d+)\.attention\.k_proj\.", r"encoder.layer.\1.attention.attention.key."),
    (r"^layers\.(\d+)\.attention\.v_proj\.", r"encoder.layer.\1.attention.attention.value."),
    (r"^layers\.(\d+)\.attention\.o_proj\.", r"encoder.layer.\1.attention.output.dense."),
    (r"^layers\.(\d+)\.mlp\.fc1\.", r"encoder.layer.\1.intermediate.dense."),
    (r"^layers\.(\d+)\.mlp\.fc2\.", r"encoder.layer.\1.output.dense."),
    (r"^layers\.(\d+)\.", r"encoder.layer.\1."),
]


def vit_kwargs_from_hf_config(hf):
    """VisionTransformer keyword arguments from a HF ViT config dict; HFConfigError naming the key
    for settings it cannot reproduce."""
    if hf.get("model_type", "vit") != "vit":
        raise HFConfigError(f"unsupported config: model_type={hf.get('model_type')!r} (only 'vit')")
    if hf.get("hidden_act", "gelu") != "gelu":
        raise HFConfigError(f"unsupported config: hidden_act={hf['hidden_act']!r} (the exact GELU, 'gelu')")
    if not hf.get("qkv_bias", True):
        raise HFConfigError("unsupported config: qkv_bias=False (the query/key/value projections have biases)")
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "image_size", "patch_size"):
        if key not in hf:
            raise HFConfigError(f"config is missing {key!r}")
    hidden = int(hf["hidden_size"])
    inter = int(hf.get("intermediate_size", 4 * hidden))
    num_classes = hf_num_classes(hf)
    image, patch = hf_size(hf, "image_size"), hf_size(hf, "patch_size")
    pairs = zip(*((s, s) if isinstance(s, int) else s for s in (image, patch)))
    if any(i % p for i, p in pairs):
        raise HFConfigError(f"unsupported config: image_size={hf['image_size']!r} is not a multiple of "
                            f"patch_size={hf['patch_size']!r} (ViT has no patch padding)")
    return dict(img_size=image, patch_size=patch,
                in_chans=int(hf.get("num_channels", 3)), embed_dim=hidden, depth=int(hf["num_hidden_layers"]),
                num_heads=int(hf["num_attention_heads"]), mlp_ratio=exact_ratio(inter, hidden),
                drop_rate=float(hf.get("hidden_dropout_prob", 0.0)),
                attn_drop_rate=float(hf.get("attention_probs_dropout_prob", 0.0)),
                layernorm_epsilon=float(hf.get("layer_norm_eps", 1e-12)),
                initializer_range=float(hf.get("initializer_range", 0.02)),
                num_classes=num_classes, **hf_problem_type(hf))


def hf_num_classes(hf):
    """The classifier width of a HF image-classification config (its labels, else num_labels)."""
    return len(hf.get("id2label") or {}) or int(hf.get("num_labels", 2))


def hf_problem_type(hf):
    """{"problem_type": ...} when the HF config names the loss it trains with, else {} (the
    model's default, None: inferred from the labels)."""
    return {"problem_type": hf["problem_type"]} if hf.get("problem_type") is not None else {}


def hf_size(hf, key, default=None):
    """An image or patch size of a HF vision config: an int, or [height, width] (a tuple; an int
    when both are equal); anything else is an HFConfigError naming the key."""
    value = hf.get(key, default)
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) and v > 0 for v in value):
        return int(value[0]) if value[0] == value[1] else (int(value[0]), int(value[1]))
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    raise HFConfigError(f"unsupported config: {key}={value!r} (a positive int or [height, width])")


def exact_ratio(width, dim):
    """`width / dim` nudged up by the last bits it needs for `int(dim * ratio) == width`, the width
    the models compute from mlp_ratio (61 / 56 * 56 is 60.99999999999999 in floating point)."""
    ratio = width / dim
    while int(dim * ratio) < width:
        ratio = float(np.nextafter(ratio, np.inf))
    return ratio


def _config_size(size):
    return int(size) if isinstance(size, int) else [int(v) for v in size]


def hf_config_from_vit_kwargs(kw, base=None):
    """A HF ViT config dict for VisionTransformer kwargs `kw` (`base`: an original HF config whose
    other entries, e.g. label names, encoder_stride or problem_type, are kept)."""
    cfg = dict(base or {})
    hidden = int(kw["embed_dim"])
    num_classes = int(kw.get("num_classes", 1000))
    cfg.update({"model_type": "vit", "hidden_size": hidden, "num_hidden_layers": int(kw["depth"]),
                "num_attention_heads": int(kw["num_heads"]), "intermediate_size": int(hidden * kw.get("mlp_ratio", 4.0)),
                "hidden_act": "gelu", "hidden_dropout_prob": float(kw.get("drop_rate", 0.0)),
                "attention_probs_dropout_prob": float(kw.get("attn_drop_rate", 0.0)),
                "layer_norm_eps": float(kw.get("layernorm_epsilon", 1e-6)), "image_size": _config_size(kw["img_size"]),
                "patch_size": _config_size(kw["patch_size"]), "num_channels": int(kw.get("in_chans", 3)),
                "qkv_bias": True, "initializer_range": float(kw.get("initializer_range", 0.02))})
    cfg.setdefault("architectures", ["ViTForImageClassification"])
    if "id2label" not in cfg or len(cfg["id2label"]) != num_classes:
        cfg["id2label"] = {str(i): f"LABEL_{i}" for i in range(num_classes)}
        cfg["label2id"] = {v: int(k) for k, v in cfg["id2label"].items()}
    return cfg


def _normalise(hf_sd):
    out = {}
    for k, v in hf_sd.items():
        k = k[len("vit."):] if k.startswith("vit.") else k
        for pat, rep in _NEW_NAMES:
            k, n = re.subn(pat, rep, k)
            if n:
                break
        out[k] = np.asarray(v)
    return out


class TensorReader:
    """The tensors of a HF state dict, taken by name: a missing one is an error naming it and the
    file, and `refuse_unused` errs on tensors the model has no place for (ViT and Swin)."""

    def __init__(self, sd, path):
        self.sd, self.path, self.used = sd, path, set()

    def __contains__(self, name):
        return name in self.sd

    def __call__(self, name):
        if name not in self.sd:
            raise HFConfigError(f"{self.path}: missing tensor {name!r}")
        self.used.add(name)
        return self.sd[name]

    def refuse_unused(self, model_name, ignore):
        unused = sorted(k for k in self.sd if k not in self.used and not ignore(k))
        if unused:
            raise HFConfigError(f"{self.path}: tensors {model_name} does not have: {unused[:8]}")


def hf_to_libai_vit(hf_sd, kw, path="<state dict>"):
    """{libai name: array} from a HF ViT state dict (with or without the "vit." prefix)."""
    take = TensorReader(_normalise(hf_sd), path)

    heads = int(kw["num_heads"])
    out = {"cls_token": take("embeddings.cls_token"), "pos_embed": take("embeddings.position_embeddings"),
           "patch_embed.weight": take("embeddings.patch_embeddings.projection.weight"),
           "patch_embed.bias": take("embeddings.patch_embeddings.projection.bias"),
           "norm.weight": take("layernorm.weight"), "norm.bias": take("layernorm.bias")}
    for i in range(int(kw["depth"])):
        hf, lb = f"encoder.layer.{i}.", f"blocks.{i}."
        for part in ("weight", "bias"):
            out[f"{lb}input_layernorm.{part}"] = take(f"{hf}layernorm_before.{part}")
            out[f"{lb}post_attention_layernorm.{part}"] = take(f"{hf}layernorm_after.{part}")
            out[f"{lb}self_attention.query_key_value.{part}"] = qkv_hf_to_libai(
                *(take(f"{hf}attention.attention.{n}.{part}") for n in ("query", "key", "value")), heads)
            out[f"{lb}self_attention.dense.{part}"] = take(f"{hf}attention.output.dense.{part}")
            out[f"{lb}mlp.dense_h_to_4h.{part}"] = take(f"{hf}intermediate.dense.{part}")
            out[f"{lb}mlp.dense_4h_to_h.{part}"] = take(f"{hf}output.dense.{part}")
    if "classifier.weight" in take:
        out["head.weight"], out["head.bias"] = take("classifier.weight"), take("classifier.bias")
    pooler = sorted(k for k in take.sd if k.startswith("pooler."))
    if pooler:  # ViTModel's tanh pooler: ViTForImageClassification does not use it either
        logging.getLogger(__name__).warning(
            f"{path}: {pooler} (ViTModel's pooler) are not part of VisionTransformer, which classifies the "
            "normalised cls token as ViTForImageClassification does: not loaded, and not written back to HF")
    take.refuse_unused("VisionTransformer", ignore=lambda k: k.startswith("pooler."))
    return out


def libai_to_hf_vit(sd, kw):
    """The inverse of hf_to_libai_vit: a HF `ViTForImageClassification` state dict."""
    heads = int(kw["num_heads"])
    hf = {"vit.embeddings.cls_token": sd["cls_token"], "vit.embeddings.position_embeddings": sd["pos_embed"],
          "vit.embeddings.patch_embeddings.projection.weight": sd["patch_embed.weight"],
          "vit.embeddings.patch_embeddings.projection.bias": sd["patch_embed.bias"],
          "vit.layernorm.weight": sd["norm.weight"], "vit.layernorm.bias": sd["norm.bias"]}
    for i in range(int(kw["depth"])):
        h, lb = f"vit.encoder.layer.{i}.", f"blocks.{i}."
        for part in ("weight", "bias"):
            hf[f"{h}layernorm_before.{part}"] = sd[f"{lb}input_layernorm.{part}"]
            hf[f"{h}layernorm_after.{part}"] = sd[f"{lb}post_attention_layernorm.{part}"]
            q, k, v = qkv_libai_to_hf(np.asarray(sd[f"{lb}self_attention.query_key_value.{part}"]), heads)
            hf[f"{h}attention.attention.query.{part}"] = q
            hf[f"{h}attention.attention.key.{part}"] = k
            hf[f"{h}attention.attention.value.{part}"] = v
            hf[f"{h}attention.output.dense.{part}"] = sd[f"{lb}self_attention.dense.{part}"]
            hf[f"{h}intermediate.dense.{part}"] = sd[f"{lb}mlp.dense_h_to_4h.{part}"]
            hf[f"{h}output.dense.{part}"] = sd[f"{lb}mlp.dense_4h_to_h.{part}"]
    if "head.weight" in sd:
        hf["classifier.weight"], hf["classifier.bias"] = sd["head.weight"], sd["head.bias"]
    return {k: np.ascontiguousarray(np.asarray(v)) for k, v in hf.items()}


def load_huggingface_classifier(model_cls, path, kwargs_from_hf, hf_to_libai, **overrides):
    """Build `model_cls` from a HF image-classification folder and load its weights (each on its
    parameter's placement/SBP). A folder without a classifier (a backbone) keeps the new head's
    initial weights, and so does `num_classes=N` for a folder classifying another number of
    classes with `ignore_mismatched_sizes=True` (HF's flag). Shared by ViT and Swin."""
    from .weights import load_logical_state_dict

    overrides = dict(overrides)
    ignore_mismatched_sizes = overrides.pop("ignore_mismatched_sizes", False)
    hf_cfg, hf_sd = read_hf_folder(path)
    kwargs = kwargs_from_hf(hf_cfg)
    kwargs.update(overrides)
    model = model_cls(**kwargs)
    weights = os.path.join(path, WEIGHTS_FILE)
    sd = hf_to_libai(hf_sd, kwargs, path=weights)
    take_new_classifier(model, sd, ("head.weight", "head.bias"), weights, ignore_mismatched_sizes)
    load_logical_state_dict(model, sd)
    model.hf_config = hf_cfg
    return model


def load_huggingface_vit(model_cls, path, **overrides):
    """`model_cls` (VisionTransformer) from a HF ViT folder (ViTForImageClassification or ViTModel)."""
    return load_huggingface_classifier(model_cls, path, vit_kwargs_from_hf_config, hf_to_libai_vit, **overrides)
