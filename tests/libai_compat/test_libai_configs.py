"""LiBai's own configs/common/* (copied unchanged into libai_configs/common) load with LazyConfig;
the model configs build our models with LiBai's keys; the files naming what this project does not
have (RoBERTa, T5, ResMLP, Swin V2, flowvision's image pipelines) fail with an ImportError naming
the missing piece."""
import glob
import os

import pytest
from omegaconf import DictConfig

import engine
from libai.config import LazyConfig, instantiate, resolve_train_config
from libai.models import GPTForPreTraining, GPTModel, SwinTransformer, VisionTransformer

HERE = os.path.dirname(os.path.abspath(__file__))
COMMON = os.path.join(HERE, "libai_configs", "common")
FILES = sorted(os.path.relpath(f, COMMON) for f in glob.glob(os.path.join(COMMON, "**", "*.py"), recursive=True))

# file -> the message of the ImportError it raises (a documented difference, docs/migrating.md)
NOT_HERE = {
    "data/cifar100.py": "No module named 'flowvision'",
    "data/imagenet.py": "No module named 'flowvision'",
    "data/roberta_dataset.py": "libai.data.datasets.RobertaDataset (LiBai's) is not implemented",
    "data/t5_dataset.py": "libai.data.datasets.T5Dataset (LiBai's) is not implemented",
    "models/roberta.py": "libai.models.RobertaModel (LiBai's) is not implemented",
    "models/t5.py": "libai.models.T5Model (LiBai's) is not implemented",
}
NOT_HERE.update({f: "libai.models.ResMLP (LiBai's) is not implemented"
                 for f in FILES if f.startswith("models/resmlp/")})
NOT_HERE.update({f: "libai.models.SwinTransformerV2 (LiBai's) is not implemented"
                 for f in FILES if f.startswith("models/swinv2/")})


def load(name):
    return LazyConfig.load(os.path.join(COMMON, name))


def test_every_libai_common_file_is_here():
    assert len(FILES) == 40 and "train.py" in FILES and "models/vit/vit_tiny_patch16_224.py" in FILES


@pytest.mark.parametrize("name", [f for f in FILES if f not in NOT_HERE])
def test_libai_config_loads(name):
    cfg = load(name)
    assert isinstance(cfg, DictConfig) and len(cfg) > 0
    LazyConfig.to_py(cfg)  # every value has a printable form


@pytest.mark.parametrize("name", sorted(NOT_HERE))
def test_libai_config_of_a_missing_piece_names_it(name):
    with pytest.raises(ImportError, match=NOT_HERE[name].replace("(", r"\(").replace(")", r"\)")):
        load(name)


def test_train_optim_and_graph_values():
    train = load("train.py").train
    assert train.rdma_enabled is True and train.evaluation.eval_iter == 1e5
    cfg = DictConfig({"train": train}, flags={"allow_objects": True})
    resolved = resolve_train_config(cfg)  # LiBai's defaults are accepted as they are
    assert resolved.evaluation.eval_iter == 100000 and resolved.checkpointer.save_model_after_n_epoch is None
    optim = load("optim.py").optim
    assert optim._target_ is engine.optim.AdamW and optim.do_bias_correction is True
    graph = load("models/graph.py").graph
    assert graph.enabled is True
    from libai.models.mlp_classifier import MLPClassifier
    from libai.models.utils import GraphBase

    graph.train_graph.model = MLPClassifier(in_features=4, hidden_size=8, num_classes=3)
    built = instantiate(graph.train_graph)
    assert isinstance(built, GraphBase) and built.is_train and isinstance(built, engine.nn.Graph)


@pytest.mark.parametrize("name, key, cls", [
    ("models/gpt.py", "pretrain_model", GPTForPreTraining),
    ("models/gpt.py", "gpt_model", GPTModel),
    ("models/vit/vit_tiny_patch16_224.py", "model", VisionTransformer),
    ("models/swin/swin_tiny_patch4_window7_224.py", "model", SwinTransformer),
])
def test_libai_model_configs_build_our_models(name, key, cls):
    model = instantiate(load(name)[key])
    assert type(model) is cls


def test_libai_bert_pretrain_config_builds_bert():
    from libai.models import BertForPreTraining

    node = load("models/bert.py").pretrain_model
    node.cfg.update(hidden_layers=1, hidden_size=64, intermediate_size=128, num_attention_heads=2, vocab_size=512)
    assert type(instantiate(node)) is BertForPreTraining
