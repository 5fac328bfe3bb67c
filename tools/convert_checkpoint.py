#!/usr/bin/env python
"""Convert GPT-2, BERT and ViT weights between Hugging Face folders and libai checkpoints.

    python tools/convert_checkpoint.py --from-hf HF_DIR --to CKPT_DIR
        HF_DIR: config.json + model.safetensors; the family comes from config.json's model_type:
          gpt2: GPT2LMHeadModel / GPT2Model -> GPTForPreTraining state dict ("GPT_model.*" keys)
          bert: BertForPreTraining -> BertForPreTraining ("bert.*", "cls_head.*" keys),
                BertForSequenceClassification -> BertForSequenceClassification ("bert.*",
                "classifier.*"), BertModel -> BertModel (no prefix)
          vit:  ViTForImageClassification / ViTModel -> VisionTransformer (no prefix)
        CKPT_DIR/model.safetensors   logical tensors, loadable by libai.utils.checkpoint.Checkpointer
                                     and libai.models.utils.load_logical_state_dict
        CKPT_DIR/gpt_config.json, bert_config.json or vit_config.json   the model's keyword arguments
        CKPT_DIR/hf_config.json      the original HF config (kept for the way back)

    python tools/convert_checkpoint.py --from-libai CKPT_DIR [--config CFG] --to-hf HF_DIR
        CKPT_DIR: a checkpoint directory (or its model.safetensors); the family comes from its keys.
        CFG: a LazyConfig .py/.yaml whose `model.cfg` (or `model`) has the model's keys, or a
             .json of its kwargs; default CKPT_DIR/<family>_config.json.
        HF_DIR/config.json + HF_DIR/model.safetensors, readable by transformers'
        GPT2LMHeadModel / BertForPreTraining / BertForSequenceClassification / BertModel /
        ViTForImageClassification.

Only numpy work: no model is built, so any size converts in one process.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

GPT_CONFIG = "gpt_config.json"
BERT_CONFIG = "bert_config.json"
VIT_CONFIG = "vit_config.json"
HF_CONFIG = "hf_config.json"
MODEL_FILE = "model.safetensors"
PREFIX = "GPT_model."
BERT_ARCHITECTURES = {"pretraining": "BertForPreTraining", "classification": "BertForSequenceClassification",
                      None: "BertModel"}


def _hf_gpt2_to_libai(hf_cfg, hf_sd, path):
    from libai.models.utils.hf_gpt2 import gpt_kwargs_from_hf_config, hf_to_libai_gpt2

    kwargs = gpt_kwargs_from_hf_config(hf_cfg)
    sd = hf_to_libai_gpt2(hf_sd, kwargs["hidden_layers"], kwargs["num_attention_heads"], path=path)
    return {PREFIX + k: v for k, v in sd.items()}, kwargs, GPT_CONFIG


def _hf_bert_to_libai(hf_cfg, hf_sd, path):
    from libai.models.utils.hf_bert import bert_head_of, bert_kwargs_from_hf_config, hf_to_libai_bert

    kwargs = bert_kwargs_from_hf_config(hf_cfg)
    head = bert_head_of(hf_sd)
    sd = hf_to_libai_bert(hf_sd, kwargs, path=path, prefix="" if head is None else "bert.")
    if head == "pretraining":
        kwargs["add_binary_head"] = "cls_head.seq_relationship.weight" in sd
    return sd, kwargs, BERT_CONFIG


def _hf_vit_to_libai(hf_cfg, hf_sd, path):
    from libai.models.utils.hf_vit import hf_to_libai_vit, vit_kwargs_from_hf_config

    kwargs = vit_kwargs_from_hf_config(hf_cfg)
    sd = hf_to_libai_vit(hf_sd, kwargs, path=path)
    if "head.weight" not in sd:
        kwargs["num_classes"] = 0  # a backbone (ViTModel): no head
    return sd, kwargs, VIT_CONFIG


def hf_to_libai(hf_dir, ckpt_dir):
    import engine as flow
    from libai.models.utils.hf_gpt2 import HFConfigError, read_hf_folder

    hf_cfg, hf_sd = read_hf_folder(hf_dir)
    family = hf_cfg.get("model_type", "gpt2")
    converters = {"gpt2": _hf_gpt2_to_libai, "bert": _hf_bert_to_libai, "vit": _hf_vit_to_libai}
    if family not in converters:
        raise HFConfigError(f"{hf_dir}/config.json: model_type={family!r}; convertible: {sorted(converters)}")
    sd, kwargs, config_name = converters[family](hf_cfg, hf_sd, os.path.join(hf_dir, MODEL_FILE))
    os.makedirs(ckpt_dir, exist_ok=True)
    flow.save(sd, os.path.join(ckpt_dir, MODEL_FILE))
    with open(os.path.join(ckpt_dir, config_name), "w") as f:
        json.dump(kwargs, f, indent=2)
    with open(os.path.join(ckpt_dir, HF_CONFIG), "w") as f:
        json.dump(hf_cfg, f, indent=2)
    return ckpt_dir


def _kwargs_from_config(path, model_cls):
    if path.endswith(".json"):
        with open(path) as f:
            node = json.load(f)
    else:
        from libai.config import LazyConfig, try_get_key

        node = try_get_key(LazyConfig.load(path), "model.cfg", "model", default=None)
        if node is None:
            raise KeyError(f"{path}: no `model.cfg` or `model` with {model_cls.__name__}'s keys")
    # BERT's pretraining-head keys (add_binary_head) sit beside BertModel's; the heads a checkpoint
    # has are read from its tensors. A LazyCall `model` node also holds its target, and a loss
    # function is no part of the weights.
    skip = set(getattr(model_cls, "pretraining_keys", ())) | {"_target_", "loss_func"}
    node = {k: node[k] for k in node if k not in skip}
    return model_cls.from_config(node)


def _family_of(sd, model_file):
    if any(k.startswith(PREFIX) or k.startswith("embeddings.token_embeddings.") for k in sd):
        return "gpt2"
    if any(k.startswith("bert.") or k.startswith("embeddings.word_embeddings.") for k in sd):
        return "bert"
    if "patch_embed.weight" in sd and "cls_token" in sd:
        return "vit"
    raise KeyError(f"{model_file}: neither a GPT-2 (GPT_model.*), a BERT (bert.*) nor a ViT (patch_embed.*) state dict "
                   f"(keys {sorted(sd)[:6]}...)")


def libai_to_hf(ckpt, hf_dir, config=None):
    import engine as flow
    from libai.models import BertModel, GPTModel, VisionTransformer
    from libai.models.utils.hf_bert import hf_config_from_bert_kwargs, libai_to_hf_bert
    from libai.models.utils.hf_gpt2 import hf_config_from_gpt_kwargs, libai_to_hf_gpt2, write_safetensors

    ckpt_dir = ckpt if os.path.isdir(ckpt) else os.path.dirname(ckpt)
    model_file = os.path.join(ckpt, MODEL_FILE) if os.path.isdir(ckpt) else ckpt
    if not os.path.isfile(model_file):
        raise FileNotFoundError(f"{model_file} not found")
    sd = flow.load(model_file)
    sd = {k: (v.numpy() if hasattr(v, "numpy") else np.asarray(v)) for k, v in sd.items()}
    family = _family_of(sd, model_file)
    config_name, model_cls = {"gpt2": (GPT_CONFIG, GPTModel), "bert": (BERT_CONFIG, BertModel),
                              "vit": (VIT_CONFIG, VisionTransformer)}[family]
    if config is None:
        config = os.path.join(ckpt_dir, config_name)
        if not os.path.isfile(config):
            raise FileNotFoundError(f"{config} not found: pass --config (the training config or a JSON of "
                                    f"{model_cls.__name__} kwargs)")
    kwargs = _kwargs_from_config(config, model_cls)
    base = None
    if os.path.isfile(os.path.join(ckpt_dir, HF_CONFIG)):
        with open(os.path.join(ckpt_dir, HF_CONFIG)) as f:
            base = json.load(f)
    # the vocabulary is the checkpoint's (a recipe's model.cfg.vocab_size is a placeholder that the
    # trainer replaces with the tokenizer's padded size)
    for key in (PREFIX + "embeddings.token_embeddings.weight", "embeddings.token_embeddings.weight",
                "bert.embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight"):
        if key in sd:
            kwargs["vocab_size"] = int(sd[key].shape[0])
            break
    if family == "gpt2":
        hf_sd = libai_to_hf_gpt2(sd, kwargs["hidden_layers"], kwargs["num_attention_heads"])
        hf_cfg = hf_config_from_gpt_kwargs(kwargs, base)
    elif family == "vit":
        from libai.models.utils.hf_vit import hf_config_from_vit_kwargs, libai_to_hf_vit

        if "head.weight" in sd:
            kwargs["num_classes"] = int(sd["head.weight"].shape[0])
        hf_sd = libai_to_hf_vit(sd, kwargs)
        hf_cfg = hf_config_from_vit_kwargs(kwargs)
    else:
        head = "pretraining" if "cls_head.lm_logits.bias" in sd else (
            "classification" if "classifier.weight" in sd else None)
        bare = not any(k.startswith("bert.") for k in sd)
        hf_sd = libai_to_hf_bert(sd, kwargs, prefix="" if bare else "bert.")
        num_labels = int(sd["classifier.weight"].shape[0]) if head == "classification" else None
        hf_cfg = hf_config_from_bert_kwargs(kwargs, base, BERT_ARCHITECTURES[head], num_labels)
    os.makedirs(hf_dir, exist_ok=True)
    write_safetensors(hf_sd, os.path.join(hf_dir, MODEL_FILE))
    with open(os.path.join(hf_dir, "config.json"), "w") as f:
        json.dump(hf_cfg, f, indent=2)
    return hf_dir


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--from-hf", metavar="HF_DIR")
    src.add_argument("--from-libai", metavar="CKPT_DIR")
    p.add_argument("--to", metavar="CKPT_DIR", help="output checkpoint directory (with --from-hf)")
    p.add_argument("--to-hf", metavar="HF_DIR", help="output Hugging Face folder (with --from-libai)")
    p.add_argument("--config", help="config of the libai model (with --from-libai)")
    args = p.parse_args(argv)
    if args.from_hf:
        if not args.to:
            p.error("--from-hf needs --to CKPT_DIR")
        out = hf_to_libai(args.from_hf, args.to)
    else:
        if not args.to_hf:
            p.error("--from-libai needs --to-hf HF_DIR")
        out = libai_to_hf(args.from_libai, args.to_hf, args.config)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
