"""tools/convert_checkpoint.py for BERT and ViT with the config a checkpoint carries: a BERT
converted from Hugging Face keeps its tokenizer (vocab.txt) in the checkpoint, and its export
has the tokenizer's vocabulary (padding rows and MLM bias dropped), vocab.txt and
tokenizer_config.json, the tokenizer's pad id, loads in transformers without a warning and
scores the same; a trained ViT checkpoint exports with no --config."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONVERT = os.path.join(ROOT, "tools", "convert_checkpoint.py")
sys.path[:0] = [os.path.join(ROOT, "tests", "vision"), os.path.join(ROOT, "tests", "gpt2")]

TEXT, PAIR = "The for statement is used to iterate", "a second sentence"

def _run(*cmd):
    r = subprocess.run([sys.executable, *cmd], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout, r.stderr


def test_bert_export_has_the_tokenizer_vocabulary_and_files(tmp_path):
    torch = pytest.importorskip("torch")
    from transformers import BertConfig, BertForPreTraining

    from libai.data.corpus import default_bert_corpus
    from libai.tokenizer import BertTokenizer
    from libai.utils.checkpoint import load_checkpoint_config

    corpus = default_bert_corpus()
    tok = BertTokenizer(vocab_file=corpus["vocab_file"])
    tokens = len(tok)
    padded = -(-tokens // 128) * 128
    assert padded > tokens
    src = tmp_path / "hf"
    torch.manual_seed(0)
    hf = BertForPreTraining(BertConfig(vocab_size=padded, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                       intermediate_size=64, max_position_embeddings=64)).eval()
    hf.save_pretrained(str(src))
    shutil.copy(corpus["vocab_file"], src / "vocab.txt")
    (src / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))

    ckpt = tmp_path / "ckpt"
    _run(CONVERT, "--from-hf", str(src), "--to", str(ckpt))
    cfg = load_checkpoint_config(str(ckpt))
    assert cfg.model._target_.endswith("BertForPreTraining") and cfg.model.cfg.vocab_size == padded
    assert cfg.tokenization.tokenizer.vocab_file == str(ckpt / "vocab.txt")
    assert os.path.isfile(ckpt / "vocab.txt")

    back = tmp_path / "back"
    _run(CONVERT, "--from-libai", str(ckpt), "--to-hf", str(back))
    for name in ("vocab.txt", "tokenizer_config.json", "config.json", "model.safetensors"):
        assert os.path.isfile(back / name), name
    hf_cfg = json.loads((back / "config.json").read_text())
    assert hf_cfg["vocab_size"] == tokens and hf_cfg["pad_token_id"] == tok.pad_token_id
    from test_gpt2_checkpoint_config import hf_load

    ids, got, stderr = hf_load(str(back), tmp_path, "BertForPreTraining", "BertTokenizerFast", (TEXT, PAIR))
    assert "warn" not in stderr.lower() and "token_id" not in stderr, stderr
    ours = tok(TEXT, PAIR)
    assert ids == ours["input_ids"]
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([ids]), token_type_ids=torch.tensor([ours["token_type_ids"]])).prediction_logits
    assert got.shape == (1, len(ids), tokens)
    np.testing.assert_allclose(got, ref.numpy()[..., :tokens], rtol=0, atol=1e-5)  # a matmul of another width


def test_trained_vit_checkpoint_exports_without_config(tmp_path):
    pytest.importorskip("torch")
    from transformers import ViTForImageClassification
    from vision_helpers import VIT_TINY, train_vit

    out = str(tmp_path / "run")
    train_vit(f"train.output_dir={out}", *VIT_TINY, "train.train_iter=2", "train.evaluation.enabled=False")
    assert os.path.isfile(os.path.join(out, "model_final", "config.yaml"))
    _run(CONVERT, "--from-libai", os.path.join(out, "model_final"), "--to-hf", str(tmp_path / "hf"))
    hf = ViTForImageClassification.from_pretrained(str(tmp_path / "hf"))
    assert (hf.config.hidden_size, hf.config.num_hidden_layers, hf.config.num_labels) == (48, 2, 10)
