#!/usr/bin/env python
"""Generate text with a GPT-2: a trained checkpoint of a recipe, or a Hugging Face folder.

    python tools/generate.py --checkpoint output/gpt2_pretrain/model_final --prompt "The if statement"
        [--max-new-tokens 50] [--greedy | --temperature 1.0 --top-k 0 --top-p 1.0] [--seed 0] [key=value ...]
    python tools/generate.py --config-file configs/gpt2_pretrain.py --checkpoint output/gpt2_pretrain/model_final \\
        --prompt "The if statement" [...]
    python tools/generate.py --hf-path HF_DIR --prompt "Hello" --greedy

--checkpoint DIR: the weights come from DIR (a checkpoint directory written by training, its
    model.safetensors, or a directory converted from HF by tools/convert_checkpoint.py). The model
    and the tokenizer are those of the config DIR carries (DIR/config.yaml, written with every
    checkpoint; for a training checkpoint without one, its output directory's config.yaml): its
    `model` section (GPTForPreTraining or GPTModel) and `tokenization.tokenizer`.
--config-file FILE: the recipe, for a checkpoint that carries no config (then `key=value`
    overrides of the sizes must repeat those it was trained with), and for the `train.dist`
    settings. When DIR carries a config, its `model` and `tokenization` sections replace the
    recipe's; an override of a size of the model (model.cfg.hidden_size=..., an integer key)
    that differs from the checkpoint's is an error naming the key.
The vocabulary size is the number of embedding rows in the checkpoint (the tokenizer's size
    padded for the tp size it was trained with; the default corpus's tokenizer when the config
    sets no files). `key=value` overrides apply as in train_net.py.
--hf-path: the model is built from HF_DIR's config.json + model.safetensors, the tokenizer from
    its vocab.json + merges.txt (or tokenizer.json); --config-file then only supplies a tokenizer
    when the folder has none.

Decoding is token by token with the KV cache: the prompt runs once, then each new token alone.
The next token is the argmax (--greedy, or --temperature 0), otherwise it is drawn with the
engine's multinomial from softmax(logits / temperature) restricted to the --top-k most likely
tokens and to the smallest set whose probability reaches --top-p. Defaults: --max-new-tokens 50,
--temperature 1.0, --top-k 0 (all tokens), --top-p 1.0 (off), --seed 0: plain sampling from the
model's distribution. Token ids that only pad the model's vocabulary (>= the tokenizer's size)
are never chosen. Generation stops after --max-new-tokens tokens, at the model's
max_seq_length, or at <|endoftext|> (unless --ignore-eos). Prints the prompt followed by the
generated text. Several processes (`python -m engine.distributed.launch --nproc-per-node N
tools/generate.py ... train.dist.tensor_parallel_size=N`) decode the same text with a
tensor-parallel model; rank 0 prints.
"""
import argparse
import copy
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import engine as flow  # noqa: E402
from libai.utils import distributed as dist  # noqa: E402
from libai.utils.checkpoint import is_model_size, model_setting_differences  # noqa: E402

logger = logging.getLogger("libai.tools.generate")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config-file", default="", metavar="FILE",
                   help="training config (model + tokenizer); default: the config the checkpoint carries")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", metavar="DIR", help="checkpoint directory (or model.safetensors)")
    src.add_argument("--hf-path", metavar="HF_DIR", help="Hugging Face GPT-2 folder")
    p.add_argument("--prompt", required=True, help="text to continue")
    p.add_argument("--max-new-tokens", type=int, default=50, help="tokens to generate at most (default 50)")
    p.add_argument("--temperature", type=float, default=1.0, help="divides the logits (default 1.0; 0: greedy)")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (default 0: all)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling threshold (default 1.0: off)")
    p.add_argument("--greedy", action="store_true", help="always take the most likely token")
    p.add_argument("--seed", type=int, default=0, help="seed of the engine's generator (sampling)")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at <|endoftext|>")
    p.add_argument("--print-ids", action="store_true", help="also print the token ids (prompt + generated)")
    p.add_argument("opts", nargs="*", default=None, help="config overrides key=value (anywhere on the line)")
    args = p.parse_intermixed_args(argv)
    try:
        check_sampling(args.temperature, args.top_k, args.top_p)
    except ValueError as e:
        p.error(str(e))
    if args.max_new_tokens < 0:
        p.error("need max_new_tokens >= 0")
    return args


# ------------------------------------------------------------------ building
def _load_cfg(args, ckpt_cfg=None):
    """The recipe (--config-file, or the checkpoint's own config `ckpt_cfg`) with the
    command-line overrides, its `train` section resolved (defaults of configs/common/train.py
    filled in, unknown keys refused). With both, the checkpoint's `model` and `tokenization`
    sections replace the recipe's."""
    from libai.config import LazyConfig, get_config, resolve_train_config

    if args.config_file:
        cfg = LazyConfig.load(args.config_file)
        if ckpt_cfg is not None:
            _adopt_checkpoint_config(cfg, ckpt_cfg, args)
    else:
        cfg = copy.deepcopy(ckpt_cfg)
        # only the model and its tokenizer: the training run's layout, data and output dir are not
        # this process's (train.dist.* overrides set the layout to decode with)
        for key in [k for k in cfg.keys() if k not in ("model", "tokenization")]:
            del cfg[key]
        cfg.train = get_config("common/train.py").train
    LazyConfig.apply_overrides(cfg, args.opts or [])
    if ckpt_cfg is not None:
        _check_sizes(cfg, ckpt_cfg, args)
    resolve_train_config(cfg)
    return cfg


_DROPOUT_KEYS = ("embedding_dropout_prob", "attention_dropout_prob", "output_dropout_prob")


def _adopt_checkpoint_config(cfg, ckpt_cfg, args):
    """Replace the recipe's `model` and `tokenization` with the checkpoint's (the sizes and the
    tokenizer it was trained with), warning about the model settings that differ."""
    differ = [f"{key}: {ours!r} -> {theirs!r}" for key, ours, theirs in model_setting_differences(cfg, ckpt_cfg)
              if key.rsplit(".", 1)[-1] not in _DROPOUT_KEYS]
    if differ:
        logger.warning(f"{args.checkpoint} was trained with another model than {args.config_file} says; its own "
                       f"config is used: {', '.join(differ)}")
    cfg.model = copy.deepcopy(ckpt_cfg.model)
    if "tokenization" in ckpt_cfg:
        cfg.tokenization = copy.deepcopy(ckpt_cfg.tokenization)


def _check_sizes(cfg, ckpt_cfg, args):
    """A command-line override that changes a size of the checkpoint's model (an integer key other
    than vocab_size, which the checkpoint's embedding decides) is an error naming the key."""
    for key, ours, theirs in model_setting_differences(cfg, ckpt_cfg):
        if is_model_size(theirs):
            raise ValueError(f"{key}={ours!r} does not match checkpoint {args.checkpoint}, trained with "
                             f"{key}={theirs!r} (its config.yaml): drop the override")


def build_from_config(args):
    """(GPTModel, tokenizer) from the checkpoint's config (or --config-file's) and its weights."""
    from libai.config import instantiate, try_get_key
    from libai.engine import DefaultTrainer
    from libai.utils.checkpoint import Checkpointer, load_checkpoint_config

    ckpt_cfg = load_checkpoint_config(args.checkpoint)
    if ckpt_cfg is None and not args.config_file:
        raise FileNotFoundError(f"{args.checkpoint} carries no config.yaml (a checkpoint written before checkpoints "
                                "carried their config, or a directory converted by an older convert_checkpoint.py): "
                                "pass --config-file with the config it was trained with")
    cfg = _load_cfg(args, ckpt_cfg)
    target = try_get_key(cfg, "model._target_", default=None)
    name = getattr(target, "__name__", str(target).rsplit(".", 1)[-1])
    if name not in ("GPTForPreTraining", "GPTModel"):
        raise ValueError(f"{args.config_file or args.checkpoint}: its model is {name}; tools/generate.py generates "
                         "text with GPT-2 (GPTForPreTraining or GPTModel) only")
    if "dataloader" in cfg:  # no data is read: only the tokenizer's default-corpus paths are filled in
        del cfg["dataloader"]
    dist.setup_dist_util(cfg.train.dist)
    tokenizer = DefaultTrainer.build_tokenizer(cfg)  # default corpus paths; model.cfg.vocab_size
    if tokenizer is None:
        raise KeyError(f"{args.config_file or args.checkpoint} has no `tokenization.tokenizer`"
                       + ("" if args.config_file else ": pass --config-file with one"))
    rows = _checkpoint_vocab_rows(args.checkpoint)
    if rows is not None and try_get_key(cfg, "model.cfg.vocab_size", default=None) is not None:
        # the checkpoint's padded vocabulary (the padding depends on the tp size it was trained with)
        if rows < len(tokenizer):
            raise ValueError(f"{args.checkpoint}: {rows} embedding rows for a tokenizer of {len(tokenizer)} tokens")
        dist.check_tensor_parallel_divisible(rows, f"the vocabulary of {args.checkpoint}")
        cfg.model.cfg.vocab_size = rows
    for key in _DROPOUT_KEYS:
        if try_get_key(cfg, f"model.cfg.{key}", default=None) is not None:
            cfg.model.cfg[key] = 0.0
    model = instantiate(cfg.model)
    Checkpointer(model, save_dir="").load(args.checkpoint, checkpointables=[])
    gpt = getattr(model, "GPT_model", model)
    return gpt, tokenizer


def _checkpoint_vocab_rows(path):
    """Rows of the token embedding stored in checkpoint `path` (None when not found)."""
    f = os.path.join(path, "model.safetensors") if os.path.isdir(path) else path
    if not os.path.isfile(f):
        return None
    sd = flow.load(f)
    for key in ("GPT_model.embeddings.token_embeddings.weight", "embeddings.token_embeddings.weight"):
        if key in sd:
            return int(sd[key].shape[0])
    return None


def build_from_hf(args):
    from libai.models import GPTModel
    from libai.tokenizer import GPT2Tokenizer

    cfg = None
    if args.config_file:
        cfg = _load_cfg(args)
        dist.setup_dist_util(cfg.train.dist)
    else:
        dist.setup_dist_util(None)
    model = GPTModel.from_huggingface(args.hf_path, embedding_dropout_prob=0.0, attention_dropout_prob=0.0,
                                      output_dropout_prob=0.0)
    try:
        tokenizer = GPT2Tokenizer.from_pretrained(args.hf_path)
    except FileNotFoundError:
        if cfg is None:
            raise FileNotFoundError(f"{args.hf_path} has no vocab.json + merges.txt (or tokenizer.json): pass "
                                    "--config-file with a `tokenization` section for the tokenizer")
        from libai.engine import DefaultTrainer

        tokenizer = DefaultTrainer.build_tokenizer(cfg)
    return model, tokenizer


# ------------------------------------------------------------------ decoding
def _model_input(ids):
    t = flow.tensor(np.asarray(ids, dtype=np.int64))
    if dist.get_world_size() > 1:
        B = flow.sbp.broadcast
        t = t.to_global(placement=dist.get_layer_placement(0), sbp=dist.get_nd_sbp([B, B]))
    return t


def _last_logits(logits):
    """The last position's logits as a local float32 tensor [batch, vocab] (gathered over tp)."""
    return flow.tensor(np.asarray(logits[:, -1].detach()._host(), dtype=np.float32))


def check_sampling(temperature, top_k, top_p):
    """ValueError naming the argument unless temperature >= 0, top_k >= 0 and 0 < top_p <= 1
    (written so that NaN fails each test, as HF's logits warpers refuse it)."""
    if not temperature >= 0:
        raise ValueError(f"need temperature >= 0 (0: greedy), got {temperature}")
    if not top_k >= 0:
        raise ValueError(f"need top_k >= 0 (0: every token), got {top_k}")
    if not 0 < top_p <= 1:
        raise ValueError(f"need 0 < top_p <= 1 (1: off), got {top_p}")


def choose_next(logits, greedy=False, temperature=1.0, top_k=0, top_p=1.0, allowed=None):
    """Next token ids [batch, 1] from last-position logits [batch, vocab] (a local tensor);
    `allowed`: only ids < allowed can be chosen."""
    check_sampling(temperature, top_k, top_p)
    neg_inf = float("-inf")
    vocab = logits.shape[-1]
    if allowed is not None and allowed < vocab:
        mask = flow.tensor((np.arange(vocab) >= allowed)[None, :])
        logits = logits.masked_fill(mask, neg_inf)
    if greedy or temperature == 0:
        return flow.argmax(logits, dim=-1, keepdim=True)
    logits = logits / float(temperature)
    if top_k and top_k < vocab:
        kth = flow.topk(logits, top_k, dim=-1)[0][:, -1:]
        logits = logits.masked_fill(logits < kth, neg_inf)
    if top_p < 1.0:
        sorted_logits, order = flow.sort(logits, dim=-1, descending=True)
        cum = flow.cumsum(flow.softmax(sorted_logits, dim=-1), dim=-1)
        # drop a token when the tokens before it already reach top_p (the most likely one stays)
        drop_sorted = (cum - flow.softmax(sorted_logits, dim=-1)) >= top_p
        drop = np.zeros(tuple(logits.shape), dtype=bool)
        np.put_along_axis(drop, order.numpy(), drop_sorted.numpy(), axis=-1)
        logits = logits.masked_fill(flow.tensor(drop), neg_inf)
    probs = flow.softmax(logits, dim=-1)
    return flow.multinomial(probs, 1)


def generate(model, prompt_ids, max_new_tokens, greedy=False, temperature=1.0, top_k=0, top_p=1.0,
             eos_id=None, allowed=None):
    """Token ids (prompt + generated, a list) decoded with the KV cache."""
    ids = [int(i) for i in prompt_ids]
    if not ids:
        raise ValueError("the prompt encodes to no tokens")
    max_len = getattr(getattr(model, "embeddings", None), "max_seq_length", None)
    model.eval()
    with flow.no_grad():
        logits, past = model(_model_input([ids]), use_cache=True)
        for _ in range(max_new_tokens):
            if max_len is not None and len(ids) >= max_len:
                break
            nxt = int(choose_next(_last_logits(logits), greedy, temperature, top_k, top_p, allowed).numpy()[0, 0])
            ids.append(nxt)
            if eos_id is not None and nxt == eos_id:
                break
            if max_len is not None and len(ids) >= max_len:
                break
            logits, past = model(_model_input([[nxt]]), past_key_values=past, use_cache=True)
    return ids


def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    model, tokenizer = build_from_hf(args) if args.hf_path else build_from_config(args)
    flow.manual_seed(args.seed)
    prompt_ids = tokenizer.encode(args.prompt, add_special_tokens=False)
    vocab = model.embeddings.token_embeddings.weight.shape[0]
    allowed = len(tokenizer) if len(tokenizer) < vocab else None
    ids = generate(model, prompt_ids, args.max_new_tokens, greedy=args.greedy, temperature=args.temperature,
                   top_k=args.top_k, top_p=args.top_p, eos_id=None if args.ignore_eos else tokenizer.eod,
                   allowed=allowed)
    text = tokenizer.decode(ids)
    if dist.is_main_process():
        if args.print_ids:
            print("ids:", " ".join(map(str, ids)))
        print(text)
    return ids


if __name__ == "__main__":
    main()
