# ruff: noqa -- LiBai's code, kept as it is.
# Copied unchanged from LiBai (https://github.com/Oneflow-Inc/libai, commit 9dcbe3b2):
# configs/common/models/swin/swin_tiny_c24_patch4_window8_256.py,
# Copyright 2021 The OneFlow Authors, Apache License 2.0. Used by tests/libai_compat to prove that
# LiBai's own configs load here.
from libai.config import LazyCall
from libai.models import SwinTransformer
from .swin_tiny_patch4_window7_224 import cfg


cfg.img_size = 256
cfg.num_heads = [4, 8, 16, 32]
cfg.window_size = 8

model = LazyCall(SwinTransformer)(cfg=cfg)
