# ruff: noqa -- LiBai's code, kept as it is.
# Copied unchanged from LiBai (https://github.com/Oneflow-Inc/libai, commit 9dcbe3b2):
# configs/common/models/swinv2/swinv2_tiny_patch4_window8_256.py,
# Copyright 2021 The OneFlow Authors, Apache License 2.0. Used by tests/libai_compat to prove that
# LiBai's own configs load here.
from omegaconf import DictConfig
from libai.config import LazyCall
from libai.models import SwinTransformerV2

cfg = dict(
    img_size=256,
    patch_size=4,
    in_chans=3,
    num_classes=1000,
    embed_dim=96,
    depths=[2, 2, 6, 2],
    num_heads=[3, 6, 12, 24],
    window_size=8,
    mlp_ratio=4.0,
    qkv_bias=True,
    drop_rate=0.0,
    drop_path_rate=0.2,
    ape=False,
    patch_norm=True,
    pretrained_window_sizes=[0, 0, 0, 0],
    loss_func=None,
)

cfg = DictConfig(cfg)

model = LazyCall(SwinTransformerV2)(cfg=cfg)
