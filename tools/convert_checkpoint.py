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
        CKPT_DIR/config.yaml         the model's config as a training checkpoint carries it: `model`
                                     (LazyCall of the libai class with its keys) and, when HF_DIR has
                                     tokenizer files, `tokenization.tokenizer` (GPT2Tokenizer /
                                     BertTokenizer of the files copied beside it,
                                     make_vocab_size_divisible_by 1), so that
                                     `tools/generate.py --checkpoint CKPT_DIR` needs nothing else
        CKPT_DIR/vocab.json + merges.txt (+ tokenizer.json), or vocab.txt: HF_DIR's tokenizer files
        CKPT_DIR/gpt_config.json, bert_config.json or vit_config.json   the model's keyword arguments
        CKPT_DIR/hf_config.json      the original HF config (kept for the way back)

    python tools/convert_checkpoint.py --from-libai CKPT_DIR [--config CFG] --to-hf HF_DIR
        CKPT_DIR: a checkpoint directory (or its model.safetensors); the family comes from its keys.
        The model's keys and tokenizer: the config the checkpoint carries (CKPT_DIR/config.yaml,
             written with every checkpoint; for an older training checkpoint its output directory's
             config.yaml), else CKPT_DIR/<family>_config.json (model keys only).
        CFG: a LazyConfig .py/.yaml whose `model.cfg` (or `model`) has the model's keys (and whose
             `tokenization.tokenizer` is the tokenizer), or a .json of its kwargs: for a checkpoint
             that carries no config. When the checkpoint carries one, its model keys and tokenizer
             are used (a warning names the keys of CFG that differ).
        HF_DIR/config.json + HF_DIR/model.safetensors, readable by transformers'
        GPT2LMHeadModel / BertForPreTraining / BertForSequenceClassification / BertModel /
        ViTForImageClassification. With a tokenizer (GPT-2, BERT):
          - the vocabulary is the tokenizer's: the embedding rows (and BERT's MLM bias) that only
            pad it to a multiple of make_vocab_size_divisible_by * tp are dropped, and
            config.json's vocab_size is len(tokenizer);
          - the tokenizer files: GPT-2 vocab.json, merges.txt, tokenizer.json; BERT vocab.txt;
            with tokenizer_config.json (GPT2TokenizerFast / BertTokenizerFast.from_pretrained);
          - GPT-2's config.json and generation_config.json: bos_token_id / eos_token_id the
            tokenizer's <|endoftext|> id; BERT's pad_token_id the tokenizer's [PAD] id.
        Without one the padded vocabulary is kept, no tokenizer file is written, and a bos/eos id
        outside the vocabulary (GPT-2's default 50256) is set to null; a warning says so.

Only numpy work: no model is built, so any size converts in one process.
"""
import argparse
import json
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

logger = logging.getLogger("libai.tools.convert_checkpoint")

GPT_CONFIG = "gpt_config.json"
BERT_CONFIG = "bert_config.json"
VIT_CONFIG = "vit_config.json"
HF_CONFIG = "hf_config.json"
MODEL_FILE = "model.safetensors"
PREFIX = "GPT_model."
BERT_ARCHITECTURES = {"pretraining": "BertForPreTraining", "classification": "BertForSequenceClassification",
                      None: "BertModel"}
# the state dict entries with one row per vocabulary token, by family
VOCAB_ROWS = {"gpt2": (PREFIX + "embeddings.token_embeddings.weight", "embeddings.token_embeddings.weight"),
              "bert": ("bert.embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight",
                       "cls_head.lm_logits.bias"),
              "vit": ()}
ENDOFTEXT = "<|endoftext|>"


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
    if not any(k.endswith("pooler.dense.weight") for k in sd):  # BertForMaskedLM, BertModel without pooler
        kwargs["add_pooling_layer"] = False
    return sd, kwargs, BERT_CONFIG


def _hf_vit_to_libai(hf_cfg, hf_sd, path):
    from libai.models.utils.hf_vit import hf_to_libai_vit, vit_kwargs_from_hf_config

    kwargs = vit_kwargs_from_hf_config(hf_cfg)
    sd = hf_to_libai_vit(hf_sd, kwargs, path=path)
    if "head.weight" not in sd:
        kwargs["num_classes"] = 0  # a backbone (ViTModel): no head
    return sd, kwargs, VIT_CONFIG


def _model_node(family, kwargs, sd):
    """The `model` section (a LazyCall node) of the libai model that `sd` is the state dict of."""
    from omegaconf import DictConfig

    from libai.config import LazyCall

    if family == "gpt2":
        from libai.models import GPTForPreTraining

        return LazyCall(GPTForPreTraining)(cfg=DictConfig(dict(kwargs)))
    if family == "vit":
        from libai.models import VisionTransformer

        return LazyCall(VisionTransformer)(**kwargs)
    from libai.models import BertForPreTraining, BertForSequenceClassification, BertModel

    if "classifier.weight" in sd:
        return LazyCall(BertForSequenceClassification)(cfg=DictConfig(dict(kwargs)),
                                                       num_labels=int(np.asarray(sd["classifier.weight"]).shape[0]))
    if any(k.startswith("cls_head.") for k in sd):
        return LazyCall(BertForPreTraining)(cfg=DictConfig(dict(kwargs)))
    return LazyCall(BertModel)(cfg=DictConfig(dict(kwargs)))


def _read_json(path):
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        value = json.load(f)
    return value if isinstance(value, dict) else {}


def _copy_atomic(src, dst):
    from engine.serialization import atomic_write

    with open(src, "rb") as f:
        atomic_write(dst, [f.read()])


def _copy_hf_tokenizer(hf_dir, ckpt_dir, family):
    """The `tokenization` section for the tokenizer files of HF folder `hf_dir` (copied into
    `ckpt_dir`), or None when the folder has none (or the family has no tokenizer)."""
    from libai.config import LazyCall

    tok_cfg = _read_json(os.path.join(hf_dir, "tokenizer_config.json"))
    if family == "gpt2":
        from libai.tokenizer import GPT2Tokenizer as cls

        sets = [("vocab.json", "merges.txt"), ("tokenizer.json",)]
        keys = {"vocab.json": "vocab_file", "merges.txt": "merges_file", "tokenizer.json": "tokenizer_file"}
        options = {k: bool(tok_cfg[k]) for k in ("add_prefix_space", "add_bos_token") if k in tok_cfg
                   and tok_cfg[k] is not None}
    elif family == "bert":
        from libai.tokenizer import BertTokenizer as cls

        sets = [("vocab.txt",), ("tokenizer.json",)]
        keys = {"vocab.txt": "vocab_file", "tokenizer.json": "tokenizer_file"}
        options = {k: tok_cfg[k] for k in ("do_lower_case", "strip_accents", "tokenize_chinese_chars")
                   if k in tok_cfg}
    else:
        return None
    names = next((names for names in sets if all(os.path.isfile(os.path.join(hf_dir, n)) for n in names)), None)
    if names is None:
        return None
    files = {}
    for n in names:
        _copy_atomic(os.path.join(hf_dir, n), os.path.join(ckpt_dir, n))
        files[keys[n]] = os.path.abspath(os.path.join(ckpt_dir, n))
    # an unpadded vocabulary: make_vocab_size_divisible_by 1 (the HF model's rows are its own)
    return {"tokenizer": LazyCall(cls)(**files, **options), "make_vocab_size_divisible_by": 1}


def hf_to_libai(hf_dir, ckpt_dir):
    import engine as flow
    from libai.models.utils.hf_gpt2 import HFConfigError, read_hf_folder
    from libai.utils.checkpoint import write_checkpoint_config

    hf_cfg, hf_sd = read_hf_folder(hf_dir)
    family = hf_cfg.get("model_type", "gpt2")
    converters = {"gpt2": _hf_gpt2_to_libai, "bert": _hf_bert_to_libai, "vit": _hf_vit_to_libai}
    if family not in converters:
        raise HFConfigError(f"{hf_dir}/config.json: model_type={family!r}; convertible: {sorted(converters)}")
    sd, kwargs, config_name = converters[family](hf_cfg, hf_sd, os.path.join(hf_dir, MODEL_FILE))
    os.makedirs(ckpt_dir, exist_ok=True)
    flow.save(sd, os.path.join(ckpt_dir, MODEL_FILE))
    for name, value in ((config_name, kwargs), (HF_CONFIG, hf_cfg)):
        _write_json(os.path.join(ckpt_dir, name), value)
    cfg = {"model": _model_node(family, kwargs, sd)}
    tokenization = _copy_hf_tokenizer(hf_dir, ckpt_dir, family)
    if tokenization is not None:
        cfg["tokenization"] = tokenization
    write_checkpoint_config(cfg, ckpt_dir)  # last: a directory with config.yaml is complete
    return ckpt_dir


def _write_json(path, value):
    from engine.serialization import atomic_write

    atomic_write(path, [json.dumps(value, indent=2).encode("utf-8")])


# ------------------------------------------------------------------ libai -> HF
def _config_node(cfg, where):
    """The model keys of config `cfg` (model.cfg, or the `model` node's arguments) as a dict."""
    from omegaconf import OmegaConf

    from libai.config import try_get_key

    node = try_get_key(cfg, "model.cfg", "model", default=None)
    if node is None:
        raise KeyError(f"{where}: no `model.cfg` or `model` with the model's keys")
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node)


def _load_config(path):
    """(config or None, model keys) of --config `path` (a LazyConfig .py/.yaml, or a .json of kwargs)."""
    if path.endswith(".json"):
        with open(path) as f:
            return None, json.load(f)
    from libai.config import LazyConfig

    cfg = LazyConfig.load(path)
    return cfg, _config_node(cfg, path)


def _kwargs_from_node(node, model_cls):
    # BERT's pretraining-head keys (add_binary_head) sit beside BertModel's; the heads a checkpoint
    # has are read from its tensors. A LazyCall `model` node also holds its target, and a loss
    # function is no part of the weights (nor are the arguments of a wrapper: BERT's num_labels).
    skip = set(getattr(model_cls, "pretraining_keys", ())) | {"_target_", "loss_func", "num_labels",
                                                              "classifier_dropout"}
    node = {k: node[k] for k in node if k not in skip}
    return model_cls.from_config(node)


def _kwargs_from_config(path, model_cls):
    return _kwargs_from_node(_load_config(path)[1], model_cls)


def _checkpoint_wins(given, theirs, config, ckpt_config):
    """The checkpoint's model keys over --config's (the sizes it was trained with; vocab_size is
    decided by its embedding), with a warning naming the keys that differ."""
    differ = [f"{k}: {given[k]!r} -> {v!r}" for k, v in theirs.items()
              if k in given and given[k] != v and k != "vocab_size" and not isinstance(v, (dict, list))]
    if differ:
        logger.warning(f"{config} differs from the config the checkpoint carries ({ckpt_config}); the checkpoint's "
                       f"is used: {', '.join(differ)}")
    merged = dict(given)
    merged.update(theirs)
    return merged


def _family_of(sd, model_file):
    if any(k.startswith(PREFIX) or k.startswith("embeddings.token_embeddings.") for k in sd):
        return "gpt2"
    if any(k.startswith("bert.") or k.startswith("embeddings.word_embeddings.") for k in sd):
        return "bert"
    if "patch_embed.weight" in sd and "cls_token" in sd:
        return "vit"
    raise KeyError(f"{model_file}: neither a GPT-2 (GPT_model.*), a BERT (bert.*) nor a ViT (patch_embed.*) state dict "
                   f"(keys {sorted(sd)[:6]}...)")


def _tokenizer_of(cfg, family, where):
    """The tokenizer of config `cfg`'s `tokenization.tokenizer` (paths left at None: the default
    corpus's, as in training), or None when it has none or one of another family."""
    from libai.config import instantiate, try_get_key

    if cfg is None or family not in ("gpt2", "bert") or try_get_key(cfg, "tokenization.tokenizer") is None:
        return None
    from libai.data.corpus import apply_default_corpus
    from libai.tokenizer import BertTokenizer, GPT2Tokenizer

    apply_default_corpus(cfg)
    tokenizer = instantiate(cfg.tokenization.tokenizer)
    expected = GPT2Tokenizer if family == "gpt2" else BertTokenizer
    if not isinstance(tokenizer, expected):
        logger.warning(f"{where}: tokenization.tokenizer is a {type(tokenizer).__name__}, not the "
                       f"{expected.__name__} of a {family} model: no tokenizer is exported")
        return None
    return tokenizer


def _unpad_vocabulary(sd, family, tokenizer, model_file):
    """Drop the rows past len(tokenizer) (the padding of the vocabulary) from the vocabulary-sized
    entries of `sd`; returns the vocabulary size."""
    keys = [k for k in VOCAB_ROWS[family] if k in sd]
    rows = int(sd[keys[0]].shape[0])
    if tokenizer is None:
        return rows
    real = len(tokenizer)
    if real > rows:
        raise ValueError(f"{model_file}: {rows} vocabulary rows for a tokenizer of {real} tokens: the tokenizer "
                         "is not the one the model was trained with")
    for k in keys:
        sd[k] = np.ascontiguousarray(sd[k][:real])
    return real


def _gpt2_token_ids(hf_cfg, tokenizer):
    """config.json's bos/eos ids: the tokenizer's <|endoftext|> (its bos/eos tokens); without a
    tokenizer, an id outside the vocabulary (GPT2Config's default 50256) becomes null."""
    if tokenizer is not None:
        eot = tokenizer.convert_tokens_to_ids(ENDOFTEXT) if ENDOFTEXT in tokenizer.get_vocab() else None
        bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else eot
        eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else eot
        hf_cfg["bos_token_id"], hf_cfg["eos_token_id"] = bos, eos
        return
    for key in ("bos_token_id", "eos_token_id"):
        value = hf_cfg.get(key, 50256)
        if value is not None and (not isinstance(value, int) or not 0 <= value < hf_cfg["vocab_size"]):
            logger.warning(f"no tokenizer: config.json's {key} is null ({value!r} is outside the vocabulary of "
                           f"{hf_cfg['vocab_size']})")
            value = None
        hf_cfg[key] = value


def _write_tokenizer(tokenizer, family, hf_dir, hf_cfg):
    """The tokenizer files transformers' GPT2TokenizerFast / BertTokenizerFast read."""
    if family == "gpt2":
        tokenizer.save_pretrained(hf_dir)  # vocab.json, merges.txt, tokenizer.json
        tok_cfg = dict(tokenizer_class="GPT2Tokenizer", add_prefix_space=tokenizer.add_prefix_space,
                       add_bos_token=tokenizer.add_bos_token, model_max_length=int(hf_cfg["n_positions"]),
                       errors="replace")
        special = ("bos_token", "eos_token", "unk_token", "pad_token")
    else:
        # vocab.txt only: transformers builds [CLS] ... [SEP] around it itself (the tokenizer.json
        # written here has no post-processor: the special tokens are added by BertTokenizer)
        tokenizer.save_vocabulary(hf_dir)
        tok_cfg = dict(tokenizer_class="BertTokenizer", do_lower_case=tokenizer.do_lower_case,
                       strip_accents=tokenizer.strip_accents, tokenize_chinese_chars=tokenizer.tokenize_chinese_chars,
                       model_max_length=int(hf_cfg["max_position_embeddings"]))
        special = ("unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
    for key in special:
        value = getattr(tokenizer, key, None)
        if value is not None:
            tok_cfg[key] = value
    if tokenizer.additional_special_tokens:
        tok_cfg["additional_special_tokens"] = list(tokenizer.additional_special_tokens)
    _write_json(os.path.join(hf_dir, "tokenizer_config.json"), tok_cfg)


def libai_to_hf(ckpt, hf_dir, config=None):
    import engine as flow
    from libai.models import BertModel, GPTModel, VisionTransformer
    from libai.models.utils.hf_bert import hf_config_from_bert_kwargs, libai_to_hf_bert
    from libai.models.utils.hf_gpt2 import hf_config_from_gpt_kwargs, libai_to_hf_gpt2, write_safetensors
    from libai.utils.checkpoint import checkpoint_config_file, load_checkpoint_config

    ckpt_dir = ckpt if os.path.isdir(ckpt) else os.path.dirname(ckpt)
    model_file = os.path.join(ckpt, MODEL_FILE) if os.path.isdir(ckpt) else ckpt
    if not os.path.isfile(model_file):
        raise FileNotFoundError(f"{model_file} not found")
    sd = flow.load(model_file)
    sd = {k: (v.numpy() if hasattr(v, "numpy") else np.asarray(v)) for k, v in sd.items()}
    family = _family_of(sd, model_file)
    config_name, model_cls = {"gpt2": (GPT_CONFIG, GPTModel), "bert": (BERT_CONFIG, BertModel),
                              "vit": (VIT_CONFIG, VisionTransformer)}[family]
    ckpt_cfg = load_checkpoint_config(ckpt)
    ckpt_cfg_file = checkpoint_config_file(ckpt)
    if config is not None:
        given_cfg, node = _load_config(config)
        if ckpt_cfg is not None:
            node = _checkpoint_wins(node, _config_node(ckpt_cfg, ckpt_cfg_file), config, ckpt_cfg_file)
        tokenizer = _tokenizer_of(ckpt_cfg if ckpt_cfg is not None and "tokenization" in ckpt_cfg else given_cfg,
                                  family, ckpt_cfg_file if ckpt_cfg is not None else config)
    elif ckpt_cfg is not None:
        node = _config_node(ckpt_cfg, ckpt_cfg_file)
        tokenizer = _tokenizer_of(ckpt_cfg, family, ckpt_cfg_file)
    else:
        json_file = os.path.join(ckpt_dir, config_name)
        if not os.path.isfile(json_file):
            raise FileNotFoundError(f"{ckpt_dir} has neither config.yaml nor {config_name}: pass --config (the "
                                    f"training config or a JSON of {model_cls.__name__} kwargs)")
        node, tokenizer = _load_config(json_file)[1], None
    kwargs = _kwargs_from_node(node, model_cls)
    base = _read_json(os.path.join(ckpt_dir, HF_CONFIG)) or None
    if family in ("gpt2", "bert"):
        if tokenizer is None:
            logger.warning(f"{ckpt}: no tokenizer (the checkpoint carries no config.yaml with a "
                           "`tokenization.tokenizer`, nor does --config): the vocabulary keeps its padding rows and "
                           "no tokenizer file is written")
        # the vocabulary is the tokenizer's (the checkpoint's rows without their padding; a recipe's
        # model.cfg.vocab_size is a placeholder that the trainer replaces with the padded size)
        kwargs["vocab_size"] = _unpad_vocabulary(sd, family, tokenizer, model_file)
    if family == "gpt2":
        hf_sd = libai_to_hf_gpt2(sd, kwargs["hidden_layers"], kwargs["num_attention_heads"])
        hf_cfg = hf_config_from_gpt_kwargs(kwargs, base)
        _gpt2_token_ids(hf_cfg, tokenizer)
    elif family == "vit":
        from libai.models.utils.hf_vit import hf_config_from_vit_kwargs, libai_to_hf_vit

        if "head.weight" in sd:
            kwargs["num_classes"] = int(sd["head.weight"].shape[0])
        hf_sd = libai_to_hf_vit(sd, kwargs)
        hf_cfg = hf_config_from_vit_kwargs(kwargs, base)
    else:
        head = "pretraining" if "cls_head.lm_logits.bias" in sd else (
            "classification" if "classifier.weight" in sd else None)
        bare = not any(k.startswith("bert.") for k in sd)
        hf_sd = libai_to_hf_bert(sd, kwargs, prefix="" if bare else "bert.")
        num_labels = int(sd["classifier.weight"].shape[0]) if head == "classification" else None
        hf_cfg = hf_config_from_bert_kwargs(kwargs, base, BERT_ARCHITECTURES[head], num_labels)
        if tokenizer is not None and tokenizer.pad_token_id is not None:
            hf_cfg["pad_token_id"] = int(tokenizer.pad_token_id)
    os.makedirs(hf_dir, exist_ok=True)
    write_safetensors(hf_sd, os.path.join(hf_dir, MODEL_FILE))
    _write_json(os.path.join(hf_dir, "config.json"), hf_cfg)
    if family == "gpt2":
        _write_json(os.path.join(hf_dir, "generation_config.json"),
                    {k: hf_cfg[k] for k in ("bos_token_id", "eos_token_id") if hf_cfg.get(k) is not None})
    if tokenizer is not None:
        _write_tokenizer(tokenizer, family, hf_dir, hf_cfg)
    return hf_dir


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--from-hf", metavar="HF_DIR")
    src.add_argument("--from-libai", metavar="CKPT_DIR")
    p.add_argument("--to", metavar="CKPT_DIR", help="output checkpoint directory (with --from-hf)")
    p.add_argument("--to-hf", metavar="HF_DIR", help="output Hugging Face folder (with --from-libai)")
    p.add_argument("--config", help="config of the libai model (with --from-libai; default: the one the "
                   "checkpoint carries)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
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
