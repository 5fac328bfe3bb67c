# ruff: noqa -- LiBai's code, kept as it is.
# Copied unchanged from LiBai (https://github.com/Oneflow-Inc/libai, commit 9dcbe3b2):
# tests/config/,
# Apache-2.0; the only change is marked DELIBERATE DIFFERENCE. It proves LazyConfig/instantiate
# behave as LiBai's for configs written for LiBai.
# Copyright (c) Facebook, Inc. and its affiliates.
from libai.config import LazyConfig

# equivalent to relative import
dir1a_str, dir1a_dict = LazyConfig.load_rel("dir1_a.py", ("dir1a_str", "dir1a_dict"))

dir1b_str = dir1a_str + "_from_b"
dir1b_dict = dir1a_dict

# Every import is a reload: not modified by other config files
assert dir1a_dict.a == 1
