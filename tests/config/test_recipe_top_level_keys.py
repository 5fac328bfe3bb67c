"""Issue 17: a recipe's config (and so output_dir/config.yaml) holds only its config sections.

A module-level loop variable or helper (`for ds in dataloader.train.dataset: ...`) is a DictConfig
too, so LazyConfig.load kept it as a top-level key and save_config wrote a stray `ds:` section.
"""
import glob
import os

import pytest
from omegaconf import OmegaConf

from libai.config import LazyConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# LiBai's top-level sections; `task` is the text_classification recipes' interpolation root
# (task.data_dir=...), train_aug/test_aug the image recipes' transforms (LiBai's names, docs/vision.md)
SECTIONS = {"model", "dataloader", "optim", "train", "tokenization", "graph", "task", "train_aug", "test_aug"}
# component files, not recipes: their top-level names are the values recipes take from them
NOT_RECIPES = {"task_loaders.py"}

RECIPES = sorted(
    p for p in glob.glob(os.path.join(ROOT, "configs", "*.py")) + glob.glob(os.path.join(ROOT, "projects", "*",
                                                                                          "configs", "*.py"))
    if os.path.basename(p) not in NOT_RECIPES
)


def test_recipes_found():
    names = {os.path.relpath(p, ROOT) for p in RECIPES}
    assert {"configs/gpt2_pretrain.py", "configs/bert_pretrain.py",
            "projects/text_classification/configs/base.py"} <= names


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: os.path.relpath(p, ROOT))
def test_recipe_has_only_config_sections(path):
    cfg = LazyConfig.load(path)
    stray = set(cfg.keys()) - SECTIONS
    assert not stray, f"{os.path.relpath(path, ROOT)} leaks module-level names into its config: {sorted(stray)}"


@pytest.mark.parametrize("name", ["gpt2_pretrain.py", "bert_pretrain.py"])
def test_saved_config_has_no_loop_variable(tmp_path, name):
    cfg = LazyConfig.load(os.path.join(ROOT, "configs", name))
    out = LazyConfig.save(cfg, tmp_path / "config.yaml")
    saved = OmegaConf.load(out)
    assert set(saved.keys()) == {"model", "tokenization", "dataloader", "optim", "train"}
    assert "\nds:" not in "\n" + open(out, encoding="utf-8").read()
    # what the loop did is still there: each train dataset follows the model's sequence length
    key = "seq_length" if name.startswith("gpt2") else "max_seq_length"
    datasets = OmegaConf.to_container(saved, resolve=False)["dataloader"]["train"]["dataset"]
    assert datasets and all(str(ds[key]).startswith("${model.cfg.") for ds in datasets)
