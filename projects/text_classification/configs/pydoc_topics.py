"""The embedded default task, "pydoc topics": the chapter of Python's documentation a sentence
comes from, 4 classes, 60 labelled sentences each (nothing downloaded; the project's README):

    python tools/train_net.py --config-file configs/bert_pretrain.py
    python tools/train_net.py --config-file projects/text_classification/configs/pydoc_topics.py \
        train.load_weight=output/bert_pretrain/model_final
"""
from omegaconf import OmegaConf

from libai.config import LazyCall
from libai.data import build_nlp_test_loader, build_nlp_train_loader
from projects.text_classification.dataset.pydoc_topics import build_topic_dataset

from .base import model, optim, tokenization, train  # noqa: F401
from .task_loaders import MODEL_POSITIONS

task = OmegaConf.create(dict(max_seq_length=64))  # at most model.cfg.max_position_embeddings (checked)
model.num_labels = 4
dataloader = OmegaConf.create()
dataloader.train = LazyCall(build_nlp_train_loader)(
    dataset=[LazyCall(build_topic_dataset)(split="train", max_seq_length="${task.max_seq_length}",
                                           max_position_embeddings=MODEL_POSITIONS)],
)
dataloader.test = [
    LazyCall(build_nlp_test_loader)(dataset=LazyCall(build_topic_dataset)(
        split="dev", max_seq_length="${task.max_seq_length}", max_position_embeddings=MODEL_POSITIONS)),
]
train.output_dir = "./output/text_classification/pydoc_topics"
