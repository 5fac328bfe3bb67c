"""CLUE AFQMC (Chinese sentence pairs, 2 labels; JSON lines train.json / dev.json), accuracy and F1.
A Chinese task needs a Chinese vocabulary, e.g. a HuggingFace Chinese BERT:

    python tools/train_net.py --config-file projects/text_classification/configs/clue_afqmc.py \
        task.data_dir=data/clue/afqmc model.cfg=null model.hf_path=bert-base-chinese \
        tokenization.tokenizer.vocab_file=bert-base-chinese/vocab.txt
"""
from omegaconf import OmegaConf

from libai.config import LazyCall
from libai.evaluation import ClsEvaluator

from .base import model, optim, tokenization, train  # noqa: F401
from .task_loaders import task_dataloader

task = OmegaConf.create(dict(data_dir="./data/clue/afqmc", max_seq_length=128))  # task.data_dir=... on the command line
dataloader = task_dataloader("clue", "afqmc", "${task.data_dir}", "${task.max_seq_length}")
model.num_labels = 2
train.update(train_epoch=3, train_iter=0)  # 3 epochs of the task's data
train.evaluation.eval_period = 1000
train.output_dir = "./output/text_classification/afqmc"
train.evaluation.update(evaluator=LazyCall(ClsEvaluator)(topk=(1,), f1="binary"))
