"""A small end-to-end config for the tests: the configs/mlp_classifier.py recipe, shrunk so
that a whole run (train, evaluate, checkpoint) takes a couple of seconds.

    python tools/train_net.py --config-file tests/training/configs/mlp_cls.py train.output_dir=/tmp/mlp
"""
from libai.config import get_config

_recipe = get_config("mlp_classifier.py")
model, dataloader, optim, train = _recipe.model, _recipe.dataloader, _recipe.optim, _recipe.train

dataloader.train.dataset.num_samples = 512

train.update(
    output_dir="./output/mlp_cls",
    train_micro_batch_size=16,
    train_iter=40,
    log_period=10,
)
train.checkpointer.update(period=20, max_to_keep=3)
train.evaluation.update(eval_period=20)
