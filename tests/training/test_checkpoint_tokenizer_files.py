"""A checkpoint carries its config (config.yaml) and copies of the tokenizer files that config
names, so that it keeps working once moved to another machine: the configured paths are gone
there, and load_checkpoint_config finds the copies beside config.yaml."""
import os
import shutil

from omegaconf import OmegaConf

import engine as flow
from libai.utils.checkpoint import Checkpointer, load_checkpoint_config


def test_a_moved_checkpoint_finds_its_tokenizer_files(tmp_path):
    tok_dir = tmp_path / "tok"
    tok_dir.mkdir()
    (tok_dir / "vocab.json").write_text('{"a": 0}', encoding="utf-8")
    (tok_dir / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    cfg = OmegaConf.create({"model": {"cfg": {"hidden_size": 4}},
                            "tokenization": {"tokenizer": {"vocab_file": str(tok_dir / "vocab.json"),
                                                           "merges_file": str(tok_dir / "merges.txt"),
                                                           "tokenizer_file": None}}})
    Checkpointer(flow.nn.Linear(4, 4), str(tmp_path / "run"), config=cfg).save("model_final")
    ckpt = tmp_path / "run" / "model_final"
    assert (ckpt / "vocab.json").read_text(encoding="utf-8") == '{"a": 0}'
    assert (ckpt / "merges.txt").is_file() and (ckpt / "config.yaml").is_file()

    moved = tmp_path / "elsewhere" / "model_final"
    shutil.copytree(ckpt, moved)
    shutil.rmtree(tok_dir)
    shutil.rmtree(tmp_path / "run")
    loaded = load_checkpoint_config(str(moved))
    assert loaded.tokenization.tokenizer.vocab_file == os.path.join(str(moved), "vocab.json")
    assert loaded.tokenization.tokenizer.merges_file == os.path.join(str(moved), "merges.txt")
    assert loaded.model.cfg.hidden_size == 4
