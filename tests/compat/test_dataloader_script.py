"""A torch training script fed by `DataLoader(dataset, batch_size, shuffle=True, num_workers=2,
collate_fn=...)`, run on the engine after only its import lines were changed.

tests/compat/torch_scripts/train_dataloader.py trains a small MLP for one epoch on Gaussian blobs
(made with numpy, so both libraries see the same points). Shuffling and the initial weights come
from each library's own generator, so the two runs cannot be compared loss for loss; what both
must show is the DataLoader's contract -- 16 batches of 32, every sample exactly once, in
shuffled order, fetched by both worker processes through the custom collate_fn -- and a model that
learned the task (4 well separated classes: the first loss is near ln 4, one epoch reaches over
95% accuracy). The same checks run on the original script under torch, so they are known to hold
for the reference.
"""
import os
import re

import pytest

from script_runner import copy_scripts, python

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_scripts")


@pytest.mark.parametrize("lib", ["engine", "torch"])
def test_dataloader_training_script(tmp_path, lib):
    copy_scripts(SCRIPTS, str(tmp_path), port=(lib == "engine"))
    with open(tmp_path / "train_dataloader.py") as f:
        imports = [line for line in f if re.match(r"(import|from) (torch|engine)\b", line)]
    assert any("engine.utils.data import" in line for line in imports) == (lib == "engine"), imports
    out = python("train_dataloader.py", cwd=str(tmp_path), timeout=120)
    assert re.search(r"^batches 16$", out, re.M), out
    assert re.search(r"^samples 512, unique 512, shuffled True$", out, re.M), out
    assert re.search(r"^workers \[0, 1\]$", out, re.M), out
    first, last = map(float, re.search(r"^first loss (\S+), last loss (\S+)$", out, re.M).groups())
    assert 0.8 < first < 3.0 and last < 0.25 * first, out
    accuracy = float(re.search(r"^accuracy (\S+)$", out, re.M).group(1))
    assert accuracy > 0.95, out
