"""Recipe: train a small Vision Transformer image classifier on CPU.

    python tools/train_net.py --config-file configs/vit_imagenet.py [key=value ...]

With no data configured it trains on the embedded default: scikit-learn's handwritten digits
(1,797 real 8x8 images of 0-9 that ship inside scikit-learn; 1,500 train, 297 test), upscaled to
32x32, so nothing is downloaded. ClsEvaluator reports top-1/top-5 accuracy on the test split
(chance: 10%). Logs, metrics.json, TensorBoard events and checkpoints go to output/vit_imagenet/.

ImageNet-size settings (LiBai's ViT-Tiny/16 at 224; `docs/vision.md` for your own folder or CIFAR):

    model: img_size=224, patch_size=16, embed_dim=192, depth=12, num_heads=3, drop_path_rate=0.1,
           num_classes=1000
    data:  ImageFolder(root=".../train", transform=Compose([RandomResizedCrop(224),
           RandomHorizontalFlip(), ToTensor(), Normalize(IMAGENET_MEAN, IMAGENET_STD)])) and
           Compose([Resize(256), CenterCrop(224), ToTensor(), Normalize(...)]) for the test split;
           mixup_func=Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=1000)
    train: train_micro_batch_size=128, train_epoch=300, optim.lr=5e-4 * global batch / 512

Parallel layouts run the same config, e.g. 2-way data x 2-way tensor parallel:

    python -m engine.distributed.launch --nproc-per-node 4 tools/train_net.py \
        --config-file configs/vit_imagenet.py train.dist.data_parallel_size=2 train.dist.tensor_parallel_size=2 \
        model.num_heads=4   # tensor parallelism splits the heads: 3 do not divide by 2
"""
from omegaconf import OmegaConf

from libai.config import LazyCall, get_config
from libai.data import build_image_test_loader, build_image_train_loader
from libai.data import transforms as T
from libai.data.datasets import DigitsDataset
from libai.evaluation import ClsEvaluator
from libai.models import VisionTransformer

optim = get_config("common/optim.py").optim
train = get_config("common/train.py").train

model = LazyCall(VisionTransformer)(
    img_size=32, patch_size=4, in_chans=3, embed_dim=96, depth=4, num_heads=3, mlp_ratio=4.0,
    drop_rate=0.0, attn_drop_rate=0.0, drop_path_rate=0.05, num_classes=10,
)

# digits are not mirror symmetric: no horizontal flip here (ImageNet recipes use one)
_MEAN, _STD = [0.5, 0.5, 0.5], [0.5, 0.5, 0.5]
train_aug = LazyCall(T.Compose)(transforms=[
    LazyCall(T.Resize)(size=36),
    LazyCall(T.RandomResizedCrop)(size=32, scale=(0.7, 1.0), ratio=(0.9, 1.1)),
    LazyCall(T.ToTensor)(),
    LazyCall(T.Normalize)(mean=_MEAN, std=_STD),
])
test_aug = LazyCall(T.Compose)(transforms=[
    LazyCall(T.Resize)(size=32),
    LazyCall(T.CenterCrop)(size=32),  # square batches from non-square images too (ImageFolder)
    LazyCall(T.ToTensor)(),
    LazyCall(T.Normalize)(mean=_MEAN, std=_STD),
])

dataloader = OmegaConf.create()
dataloader.train = LazyCall(build_image_train_loader)(
    dataset=[LazyCall(DigitsDataset)(train=True, transform=train_aug)],
    mixup_func=None,
)
dataloader.test = [
    LazyCall(build_image_test_loader)(dataset=LazyCall(DigitsDataset)(train=False, transform=test_aug)),
]

optim.lr = 1e-3
optim.weight_decay = 0.05

train.update(
    output_dir="./output/vit_imagenet",
    train_micro_batch_size=32,
    global_batch_size=None,
    num_accumulation_steps=None,
    test_micro_batch_size=64,
    train_iter=1000,
    warmup_ratio=0.1,
    log_period=20,
    input_placement_device="cpu",
    seed=42,
)
train.checkpointer.update(period=500, max_to_keep=2)
train.evaluation.update(
    enabled=True,
    evaluator=LazyCall(ClsEvaluator)(topk=(1, 5)),
    eval_period=500,
    eval_iter=100,
    eval_metric="Acc@1",
    eval_mode="max",
)
