"""Who may write into `train.output_dir`, and what a run finds there when it starts.

A training run owns its output directory: it writes checkpoints, `last_checkpoint`,
`metrics.json`, TensorBoard events and `config.yaml` there and prunes old checkpoints. Three
rules keep two runs from destroying each other's work:

* **One writer at a time.** `lock_output_dir` takes an exclusive `flock` on `output_dir/.lock`
  for the life of the process (or until `release_output_dir`). The kernel drops the lock when
  its holder dies, however it dies (SIGKILL included), so a lock left by a dead process never
  blocks; the file's content (pid, host, start time, command) only names a live holder in the
  error a second run gets. Re-entrant within one process.
* **A fresh run does not start on top of an old one.** `check_previous_run` refuses a training
  run without `--resume` when the directory holds a previous run (a checkpoint, the
  `last_checkpoint` pointer or `metrics.json`), naming the ways forward: `--resume`, another
  `train.output_dir`, or `--overwrite-output-dir`, which deletes exactly those artifacts first.
* **The directory must be usable**: a path that is a file or cannot be written is an error
  naming `train.output_dir`, before anything else happens.

Only rank 0 touches the file system here; its verdict is broadcast, so every rank raises the
same error (no rank is left waiting in a collective).
"""
import datetime
import fcntl
import json
import os
import shutil
import socket
import sys

from . import distributed as dist

__all__ = ["OutputDirError", "OutputDirLocked", "lock_output_dir", "release_output_dir", "check_writable",
           "previous_run_artifacts", "describe", "check_previous_run", "prepare_output_dir"]

LOCK_FILE = ".lock"
METRICS_FILE = "metrics.json"
LAST_CHECKPOINT = "last_checkpoint"
CHECKPOINT_MARKER = "model.safetensors"  # a directory holding one is a checkpoint


class OutputDirError(RuntimeError):
    """train.output_dir cannot be used for this run (the message says why and what to do)."""


class OutputDirLocked(OutputDirError):
    """Another live process is writing into train.output_dir."""


_held = {}  # realpath -> open file object holding the flock


def _holder(path):
    try:
        with open(path) as f:
            info = json.load(f)
        return (f"pid {info.get('pid')} on {info.get('host')}, started {info.get('started')}: "
                f"{info.get('command')}")
    except (OSError, ValueError):
        return "a process that has not written its pid yet"


def lock_output_dir(output_dir):
    """Take the exclusive lock on `output_dir` (created if needed) for this process; raises
    OutputDirLocked naming the holder when another live process has it."""
    key = os.path.realpath(output_dir)
    if key in _held:
        return
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, LOCK_FILE)
    f = open(path, "a+")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        raise OutputDirLocked(
            f"train.output_dir={output_dir!r} is in use by another run ({_holder(path)}). Wait for it to "
            f"end, or give this run another train.output_dir") from None
    f.seek(0)
    f.truncate()
    json.dump({"pid": os.getpid(), "host": socket.gethostname(),
               "started": datetime.datetime.now().isoformat(timespec="seconds"),
               "command": " ".join(sys.argv)}, f)
    f.flush()
    _held[key] = f


def release_output_dir(output_dir=None):
    """Release this process' lock on `output_dir` (all of its locks with no argument)."""
    keys = list(_held) if output_dir is None else [os.path.realpath(output_dir)]
    for key in keys:
        f = _held.pop(key, None)
        if f is not None:
            f.close()  # closing the descriptor drops the flock


def check_writable(output_dir):
    """OutputDirError naming train.output_dir unless it is (or can be made) a writable directory."""
    if not output_dir:
        raise OutputDirError("train.output_dir is empty: set it to the directory this run writes into")
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise OutputDirError(f"train.output_dir={output_dir!r} is a file, not a directory: choose another path")
    try:
        os.makedirs(output_dir, exist_ok=True)
    except OSError as e:
        raise OutputDirError(f"train.output_dir={output_dir!r} cannot be created: {e.strerror}") from None
    if not os.access(output_dir, os.W_OK | os.X_OK):
        raise OutputDirError(f"train.output_dir={output_dir!r} is not writable by this user: choose another path "
                             "or fix its permissions")


def previous_run_artifacts(output_dir):
    """Names of what a previous training run left in `output_dir`: checkpoint directories, the
    `last_checkpoint` pointer, `metrics.json` and TensorBoard event files (sorted)."""
    if not os.path.isdir(output_dir):
        return []
    found = []
    for name in sorted(os.listdir(output_dir)):
        path = os.path.join(output_dir, name)
        if name.startswith("."):
            continue
        if (os.path.isfile(os.path.join(path, CHECKPOINT_MARKER)) or name in (LAST_CHECKPOINT, METRICS_FILE)
                or name.startswith("events.out.tfevents.")):
            found.append(name)
    return found


def describe(artifacts, limit=8):
    """`previous_run_artifacts` for a message: TensorBoard event files counted, not named."""
    events = [a for a in artifacts if a.startswith("events.out.tfevents.")]
    shown = [a for a in artifacts if a not in events]
    more = len(shown) - limit
    text = ", ".join(shown[:limit]) + (f" and {more} more" if more > 0 else "")
    if events:
        text += f"{', ' if shown else ''}{len(events)} TensorBoard event file(s)"
    return text


def check_previous_run(output_dir, *, resume, overwrite):
    """The start of a training run in `output_dir`: without `resume` a previous run there is an
    error, unless `overwrite`, which deletes its artifacts (logged). Returns the deleted names."""
    found = previous_run_artifacts(output_dir)
    if not found or resume:
        return []
    if not overwrite:
        raise OutputDirError(
            f"train.output_dir={output_dir!r} holds a previous run ({describe(found)}). To continue it, add --resume; "
            f"to keep it and start a new run, set another train.output_dir; to delete it and start over, "
            f"add --overwrite-output-dir")
    for name in found:
        path = os.path.join(output_dir, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
    return found


def prepare_output_dir(output_dir, *, resume=False, overwrite=False, training=True):
    """Every rank: rank 0 checks that `output_dir` is writable, takes its lock and (for a
    training run) applies `check_previous_run`; the outcome is broadcast so that all ranks
    raise the same OutputDirError. Returns the names deleted by `overwrite`."""
    outcome = None
    if dist.is_main_process():
        try:
            check_writable(output_dir)
            lock_output_dir(output_dir)
            deleted = check_previous_run(output_dir, resume=resume, overwrite=overwrite) if training else []
            outcome = ("ok", deleted)
        except OutputDirError as e:
            outcome = (type(e).__name__, str(e))
    kind, detail = dist.broadcast_object(outcome)
    if kind == "ok":
        return detail
    raise (OutputDirLocked if kind == "OutputDirLocked" else OutputDirError)(detail)
