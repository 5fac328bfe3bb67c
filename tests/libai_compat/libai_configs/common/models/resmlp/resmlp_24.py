# ruff: noqa -- LiBai's code, kept as it is.
# Copied unchanged from LiBai (https://github.com/Oneflow-Inc/libai, commit 9dcbe3b2):
# configs/common/models/resmlp/resmlp_24.py,
# Copyright 2021 The OneFlow Authors, Apache License 2.0. Used by tests/libai_compat to prove that
# LiBai's own configs load here.
from libai.config import LazyCall
from libai.models import ResMLP

from .resmlp_12 import cfg


cfg.depth = 24
cfg.init_scale = 1e-5

model = LazyCall(ResMLP)(cfg=cfg)
