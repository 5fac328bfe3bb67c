"""GLUE STS-B (sentence pairs, a similarity score from 0 to 5): regression (one output, mean
squared error), evaluated by Pearson and Spearman correlation.

    python tools/train_net.py --config-file projects/text_classification/configs/glue_stsb.py \
        task.data_dir=data/glue/STS-B train.load_weight=output/bert_pretrain/model_final
"""
from omegaconf import OmegaConf

from libai.config import LazyCall
from libai.evaluation import RegEvaluator

from .base import model, optim, tokenization, train  # noqa: F401
from .task_loaders import task_dataloader

task = OmegaConf.create(dict(data_dir="./data/glue/STS-B", max_seq_length=128))  # task.data_dir=... on the command line
dataloader = task_dataloader("glue", "sts-b", "${task.data_dir}", "${task.max_seq_length}")
model.num_labels = 1
train.update(train_epoch=3, train_iter=0)  # 3 epochs of the task's data
train.evaluation.eval_period = 1000
train.output_dir = "./output/text_classification/stsb"
train.evaluation.update(evaluator=LazyCall(RegEvaluator)(), eval_metric="Pearson", eval_mode="max")
