"""Files the documented commands read, written into the doc test's working directory before the
block that needs them (`<!-- test: setup NAME -->`): a user's text files, small HuggingFace model
folders (transformers, the test-only oracle, writes them), GLUE-layout data. Nothing is
downloaded; the folders are tiny stand-ins for the real ones the docs name."""
import json
import os
import shutil

from doc_commands import TINY_GPT2


def _write(path, text):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def corpus(workdir):
    """corpus.jsonl ({"text": ...} per line: the default corpus's topics) and more.txt (plain text)."""
    from libai.data.corpus import default_corpus_documents

    docs = default_corpus_documents()
    _write(os.path.join(workdir, "corpus.jsonl"), "".join(json.dumps({"text": d}) + "\n" for d in docs))
    _write(os.path.join(workdir, "more.txt"), "\n".join(d.replace("\n", " ") for d in docs[:10]) + "\n")


def bert_vocab(workdir):
    """vocab.txt: the default corpus's WordPiece vocabulary."""
    from libai.data.corpus import default_bert_corpus

    shutil.copy(default_bert_corpus()["vocab_file"], os.path.join(workdir, "vocab.txt"))


def hf_gpt2(workdir):
    """gpt2-folder/: a tiny GPT2LMHeadModel (doc_commands.TINY_GPT2's sizes) with the tokenizer
    the document trained (tok/vocab.json, tok/merges.txt)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = os.path.join(workdir, "gpt2-folder")
    vocab = json.load(open(os.path.join(workdir, "tok", "vocab.json"), encoding="utf-8"))
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=len(vocab), n_positions=TINY_GPT2["max_seq_length"], n_embd=TINY_GPT2["hidden_size"],
                     n_layer=TINY_GPT2["hidden_layers"], n_head=TINY_GPT2["num_attention_heads"],
                     n_inner=TINY_GPT2["ffn_hidden_size"], bos_token_id=vocab["<|endoftext|>"],
                     eos_token_id=vocab["<|endoftext|>"])
    GPT2LMHeadModel(cfg).save_pretrained(folder)
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(os.path.join(workdir, "tok", name), os.path.join(folder, name))


def _tiny_bert_config(vocab_size, **extra):
    from transformers import BertConfig

    return BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=128, **extra)


def _hf_bert(folder, cls_name):
    import torch
    import transformers
    from libai.data.corpus import default_bert_corpus

    vocab_file = default_bert_corpus()["vocab_file"]
    vocab_size = sum(1 for _ in open(vocab_file, encoding="utf-8"))
    torch.manual_seed(0)
    getattr(transformers, cls_name)(_tiny_bert_config(vocab_size)).save_pretrained(folder)
    shutil.copy(vocab_file, os.path.join(folder, "vocab.txt"))


def hf_bert(workdir):
    """bert-folder/: a tiny BertForPreTraining with the default corpus's vocab.txt."""
    _hf_bert(os.path.join(workdir, "bert-folder"), "BertForPreTraining")


def hf_bert_base_uncased(workdir):
    """bert-base-uncased/: the same tiny stand-in under the name the fine-tuning example uses."""
    _hf_bert(os.path.join(workdir, "bert-base-uncased"), "BertForPreTraining")


def hf_vit(workdir):
    """vit-folder/: a tiny ViTForImageClassification."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    cfg = ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, num_labels=10)
    ViTForImageClassification(cfg).save_pretrained(os.path.join(workdir, "vit-folder"))


def glue(workdir):
    """data/glue/MNLI and data/glue/SST-2 in GLUE's layouts (two global batches of rows each)."""
    import pathlib
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "projects"))
    from test_text_classification_configs import glue_files

    root = pathlib.Path(workdir) / "data" / "glue"
    for task in ("MNLI", "SST-2"):
        glue_files(root, task, n=64)

