# ruff: noqa -- LiBai's code, kept as it is.
# Copied unchanged from LiBai (https://github.com/Oneflow-Inc/libai, commit 9dcbe3b2):
# configs/common/models/swin/swin_base_patch4_window7_224.py,
# Copyright 2021 The OneFlow Authors, Apache License 2.0. Used by tests/libai_compat to prove that
# LiBai's own configs load here.
from libai.config import LazyCall
from libai.models import SwinTransformer

from .swin_tiny_patch4_window7_224 import cfg


cfg.embed_dim = 128
cfg.depths = [2, 2, 18, 2]
cfg.num_heads = [4, 8, 16, 32]
cfg.drop_path_rate = 0.5

model = LazyCall(SwinTransformer)(cfg=cfg)
