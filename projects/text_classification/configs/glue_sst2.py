"""GLUE SST-2 (single sentences, 2 labels): data_dir holds the GLUE distribution's train.tsv and
dev.tsv.

    python tools/train_net.py --config-file projects/text_classification/configs/glue_sst2.py \
        task.data_dir=data/glue/SST-2 train.load_weight=output/bert_pretrain/model_final
"""
from omegaconf import OmegaConf

from .base import model, optim, tokenization, train  # noqa: F401
from .task_loaders import task_dataloader

task = OmegaConf.create(dict(data_dir="./data/glue/SST-2", max_seq_length=128))  # task.data_dir=... on the command line
dataloader = task_dataloader("glue", "sst-2", "${task.data_dir}", "${task.max_seq_length}")
model.num_labels = 2
train.update(train_epoch=3, train_iter=0)  # 3 epochs of the task's data
train.evaluation.eval_period = 1000
train.output_dir = "./output/text_classification/sst2"
