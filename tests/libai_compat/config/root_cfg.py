# ruff: noqa -- LiBai's code, kept as it is.
# Copied unchanged from LiBai (https://github.com/Oneflow-Inc/libai, commit 9dcbe3b2):
# tests/config/,
# Apache-2.0; the only change is marked DELIBERATE DIFFERENCE. It proves LazyConfig/instantiate
# behave as LiBai's for configs written for LiBai.
# Copyright (c) Facebook, Inc. and its affiliates.
from itertools import count

from libai.config import LazyCall

from .dir1.dir1_a import dir1a_dict, dir1a_str

dir1a_dict.a = "modified"

# modification above won't affect future imports
from .dir1.dir1_b import dir1b_dict, dir1b_str


lazyobj = LazyCall(count)(x=dir1a_str, y=dir1b_str)
