# ruff: noqa -- LiBai's code, kept as it is.
# Copied unchanged from LiBai (https://github.com/Oneflow-Inc/libai, commit 9dcbe3b2):
# tests/config/,
# Apache-2.0; the only change is marked DELIBERATE DIFFERENCE. It proves LazyConfig/instantiate
# behave as LiBai's for configs written for LiBai.
# Copyright (c) Facebook, Inc. and its affiliates.
dir1a_str = "base_a_1"
dir1a_dict = {"a": 1, "b": 2}
