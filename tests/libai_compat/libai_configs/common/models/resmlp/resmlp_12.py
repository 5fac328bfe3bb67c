# ruff: noqa -- LiBai's code, kept as it is.
# Copied unchanged from LiBai (https://github.com/Oneflow-Inc/libai, commit 9dcbe3b2):
# configs/common/models/resmlp/resmlp_12.py,
# Copyright 2021 The OneFlow Authors, Apache License 2.0. Used by tests/libai_compat to prove that
# LiBai's own configs load here.
from omegaconf import DictConfig
from libai.config import LazyCall
from libai.models import ResMLP


cfg = dict(
    img_size=224,
    patch_size=16,
    in_chans=3,
    embed_dim=384,
    depth=12,
    drop_rate=0.0,
    drop_path_rate=0.05,
    init_scale=0.1,
    num_classes=1000,
    loss_func=None,
)

cfg = DictConfig(cfg)

model = LazyCall(ResMLP)(cfg=cfg)
