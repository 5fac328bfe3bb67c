"""Recipe: an MLP classifier on generated Gaussian blobs (CPU, a few seconds; nothing downloaded).

    python tools/train_net.py --config-file configs/mlp_classifier.py [key=value ...]
"""
from omegaconf import OmegaConf

from libai.config import LazyCall, get_config
from libai.data import build_test_loader, build_train_loader
from libai.data.datasets import BlobsDataset
from libai.evaluation import ClsEvaluator
from libai.models.mlp_classifier import MLPClassifier

optim = get_config("common/optim.py").optim
train = get_config("common/train.py").train

model = LazyCall(MLPClassifier)(in_features=16, hidden_size=32, num_classes=4, num_layers=2)

dataloader = OmegaConf.create()
dataloader.train = LazyCall(build_train_loader)(
    dataset=LazyCall(BlobsDataset)(num_samples=4096, dim=16, num_classes=4, noise=2.0, seed=0),
)
dataloader.test = [
    LazyCall(build_test_loader)(
        dataset=LazyCall(BlobsDataset)(num_samples=256, dim=16, num_classes=4, noise=2.0, seed=1),
    )
]

optim.lr = 1e-2
optim.weight_decay = 0.01

train.update(
    output_dir="./output/mlp_classifier",
    train_micro_batch_size=64,
    global_batch_size=None,
    num_accumulation_steps=None,
    train_iter=300,
    warmup_ratio=0.1,
    log_period=50,
    test_micro_batch_size=64,
    input_placement_device="cpu",
    seed=7,
)
train.checkpointer.update(period=100, max_to_keep=3)
train.evaluation.update(
    enabled=True,
    evaluator=LazyCall(ClsEvaluator)(topk=(1, 2)),
    eval_period=100,
    eval_iter=100,
    eval_metric="Acc@1",
    eval_mode="max",
)
