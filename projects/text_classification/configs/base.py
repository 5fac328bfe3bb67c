"""Shared by the project's task configs: the BERT of configs/bert_pretrain.py with a
classification head, its tokenizer (the default corpus's vocab.txt unless set), AdamW and a short
fine-tuning schedule. A task config sets `dataloader`, `model.num_labels` and the evaluator.

Fine-tune from this project's pretraining (the model sizes must be the pretraining run's):
    train.load_weight=output/bert_pretrain/model_final
or from a HuggingFace BERT folder (its vocab.txt, sizes and weights):
    model.cfg=null model.hf_path=FOLDER tokenization.tokenizer.vocab_file=FOLDER/vocab.txt
"""
from libai.config import LazyCall, get_config
from libai.evaluation import ClsEvaluator
from projects.text_classification.modeling import build_classifier

_pretrain = get_config("bert_pretrain.py")
tokenization = _pretrain.tokenization
optim = _pretrain.optim
train = _pretrain.train

_cfg = _pretrain.model.cfg  # '_': not a config key of its own (model.cfg is)
_cfg.update(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
_cfg.pop("add_binary_head")  # a pretraining head's key: the classifier refuses it
model = LazyCall(build_classifier)(cfg=_cfg, num_labels=2, hf_path=None, classifier_dropout=None)

optim.lr = 2e-4
optim.weight_decay = 0.01

# a short fine-tuning, as BERT's (a few epochs): 60 steps of 32 are 8 epochs of the default task;
# the GLUE/CLUE configs count 3 epochs of their data instead (train.train_epoch)
train.update(
    output_dir="./output/text_classification",
    load_weight="",  # output/bert_pretrain/model_final: our pretraining (see the docstring)
    train_micro_batch_size=32,
    test_micro_batch_size=64,
    train_iter=60,
    warmup_ratio=0.1,
    log_period=10,
)
train.checkpointer.update(period=1000, max_to_keep=1)
train.evaluation.update(
    enabled=True,
    evaluator=LazyCall(ClsEvaluator)(topk=(1,)),
    eval_period=30,
    eval_iter=None,  # the whole dev set
    eval_metric="Acc@1",
    eval_mode="max",
)
