"""GLUE MNLI (sentence pairs, 3 labels), evaluated on both dev sets (dev_matched.tsv and
dev_mismatched.tsv): the matched set's accuracy is `Acc@1` (the validation set, which picks
model_best), the mismatched set's `test/Acc@1`.

    python tools/train_net.py --config-file projects/text_classification/configs/glue_mnli.py \
        task.data_dir=data/glue/MNLI train.load_weight=output/bert_pretrain/model_final
"""
from omegaconf import OmegaConf

from .base import model, optim, tokenization, train  # noqa: F401
from .task_loaders import task_dataloader

task = OmegaConf.create(dict(data_dir="./data/glue/MNLI", max_seq_length=128))  # task.data_dir=... on the command line
dataloader = task_dataloader("glue", "mnli", "${task.data_dir}", "${task.max_seq_length}")
model.num_labels = 3
train.update(train_epoch=3, train_iter=0)  # 3 epochs of the task's data
train.evaluation.eval_period = 1000
train.output_dir = "./output/text_classification/mnli"
