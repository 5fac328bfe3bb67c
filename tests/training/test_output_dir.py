"""libai.utils.output_dir: the lock, the previous-run guard and the usability checks, in process
(the end-to-end behaviour through tools/train_net.py is in test_run_safety.py)."""
import os
import subprocess
import sys

import pytest

from libai.utils.output_dir import (OutputDirError, check_previous_run, lock_output_dir,
                                    prepare_output_dir, previous_run_artifacts, release_output_dir)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TRY_LOCK = """
import sys
from libai.utils.output_dir import OutputDirLocked, lock_output_dir
try:
    lock_output_dir(sys.argv[1])
except OutputDirLocked as e:
    print(e)
    sys.exit(3)
"""


def try_lock_elsewhere(path):
    return subprocess.run([sys.executable, "-c", TRY_LOCK, path], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


def test_the_lock_excludes_other_processes_names_the_holder_and_is_released(tmp_path):
    out = str(tmp_path / "out")
    lock_output_dir(out)
    try:
        lock_output_dir(out)  # re-entrant in the holding process
        other = try_lock_elsewhere(out)
        assert other.returncode == 3, other.stderr
        assert f"is in use by another run (pid {os.getpid()} on " in other.stdout
    finally:
        release_output_dir(out)
    assert try_lock_elsewhere(out).returncode == 0  # released: another process may take it


def test_a_lock_left_by_a_dead_process_is_no_obstacle(tmp_path):
    out = str(tmp_path / "out")
    assert try_lock_elsewhere(out).returncode == 0  # that process took the lock and exited
    assert "pid" in open(os.path.join(out, ".lock")).read()  # its stale record is still there
    lock_output_dir(out)
    release_output_dir(out)


def test_an_output_dir_that_is_a_file_or_cannot_be_created_is_named(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(OutputDirError, match=f"train.output_dir='{afile}' is a file, not a directory"):
        prepare_output_dir(str(afile))
    below = str(afile / "sub")
    with pytest.raises(OutputDirError, match=f"train.output_dir='{below}' cannot be created"):
        prepare_output_dir(below)


def test_an_unwritable_output_dir_is_named(tmp_path, monkeypatch):
    out = str(tmp_path / "ro")
    os.makedirs(out)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if p == out else real_access(p, mode))
    with pytest.raises(OutputDirError, match=f"train.output_dir='{out}' is not writable"):
        prepare_output_dir(out)


def test_previous_run_guard_and_overwrite_delete_only_run_artifacts(tmp_path):
    out = str(tmp_path / "out")
    os.makedirs(os.path.join(out, "model_0000004"))
    open(os.path.join(out, "model_0000004", "model.safetensors"), "w").close()
    os.makedirs(os.path.join(out, "notes"))  # not a checkpoint: never touched
    for name in ("metrics.json", "last_checkpoint", "events.out.tfevents.1.host", "config.yaml", "log.txt"):
        open(os.path.join(out, name), "w").close()
    found = previous_run_artifacts(out)
    assert found == ["events.out.tfevents.1.host", "last_checkpoint", "metrics.json", "model_0000004"]
    assert check_previous_run(out, resume=True, overwrite=False) == []
    with pytest.raises(OutputDirError, match="holds a previous run \\(last_checkpoint, metrics.json, model_0000004, "
                                             "1 TensorBoard event file\\(s\\)\\)"):
        check_previous_run(out, resume=False, overwrite=False)
    assert check_previous_run(out, resume=False, overwrite=True) == found
    assert sorted(os.listdir(out)) == ["config.yaml", "log.txt", "notes"]
