# ruff: noqa -- LiBai's code, kept as it is.
# Copied unchanged from LiBai (https://github.com/Oneflow-Inc/libai, commit 9dcbe3b2):
# configs/common/models/vit/vit_large_patch16_224.py,
# Copyright 2021 The OneFlow Authors, Apache License 2.0. Used by tests/libai_compat to prove that
# LiBai's own configs load here.
from libai.config import LazyCall
from libai.models import VisionTransformer

from .vit_tiny_patch16_224 import cfg


cfg.patch_size = 16
cfg.embed_dim = 1024
cfg.depth = 24
cfg.num_heads = 16

model = LazyCall(VisionTransformer)(cfg=cfg)
