"""Recipe: train a small Swin Transformer image classifier on CPU.

    python tools/train_net.py --config-file configs/swin_imagenet.py [key=value ...]

With no data configured it trains on the embedded default, scikit-learn's handwritten digits
(docs/vision.md), upscaled to 32x32: patches of 2 give a 16x16 map, windows of 4, two stages
(widths 32 and 64, heads 2 and 4, the second after a patch merging to 8x8). ClsEvaluator reports
top-1/top-5 accuracy on the test split (chance: 10%). Output in output/swin_imagenet/.

ImageNet-size settings (LiBai's Swin-T): img_size=224, patch_size=4, embed_dim=96,
depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24), window_size=7, drop_path_rate=0.2,
num_classes=1000, with the ImageNet transforms and Mixup of configs/vit_imagenet.py's docstring.

Unlike LiBai (data parallel only), Swin runs tensor parallel too, e.g. 2 x 2 on 4 processes:

    python -m engine.distributed.launch --nproc-per-node 4 tools/train_net.py \
        --config-file configs/swin_imagenet.py train.dist.data_parallel_size=2 train.dist.tensor_parallel_size=2
"""
from libai.config import LazyCall, get_config
from libai.models import SwinTransformer

_vit = get_config("vit_imagenet.py")  # the same data, evaluator, optimizer and schedule
dataloader, optim, train = _vit.dataloader, _vit.optim, _vit.train

model = LazyCall(SwinTransformer)(
    img_size=32, patch_size=2, in_chans=3, num_classes=10, embed_dim=32, depths=(2, 2), num_heads=(2, 4),
    window_size=4, mlp_ratio=4.0, drop_rate=0.0, attn_drop_rate=0.0, drop_path_rate=0.05,
)

train.output_dir = "./output/swin_imagenet"
