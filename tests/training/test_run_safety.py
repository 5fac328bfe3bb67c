"""Runs that never lose work (issue 10), end to end through tools/train_net.py in subprocesses:
resuming when `last_checkpoint` is missing or broken, refusing a fresh run on top of a previous
one, the output-dir lock, SIGINT/SIGTERM then --resume, and a SIGKILL loop. Each resumed run is
compared with one uninterrupted run, bit for bit: every metrics.json record except the timings,
and the final weights."""
import glob
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "tests", "training", "configs", "mlp_cls.py")
ITERS = 300
COMMON = [f"train.train_iter={ITERS}", "train.log_period=1", "train.checkpointer.period=25",
          "train.checkpointer.max_to_keep=3", "train.evaluation.eval_period=100"]
TIMINGS = ("time", "data_time", "eta_seconds")
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", ENGINE_NUM_THREADS="1", PYTHONHASHSEED="0")


def command(out, *args):
    return [sys.executable, os.path.join(ROOT, "tools", "train_net.py"), "--config-file", CONFIG,
            f"train.output_dir={out}", *COMMON, *args]


def run(out, *args, ok=True):
    proc = subprocess.run(command(out, *args), cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    if ok and proc.returncode != 0:
        raise AssertionError(f"train_net {args} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                             f"{proc.stderr[-3000:]}")
    return proc


def start(out, *args):
    return subprocess.Popen(command(out, *args), cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def records(out):
    with open(os.path.join(out, "metrics.json")) as f:
        return [json.loads(line) for line in f]


def comparable(out):
    """metrics.json without the timings: what must be equal bit for bit."""
    return [{k: v for k, v in r.items() if k not in TIMINGS} for r in records(out)]


def weights(out):
    import engine as flow

    return {k: v.numpy() for k, v in flow.load(os.path.join(out, "model_final", "model.safetensors")).items()}


def count_records(out):
    try:
        with open(os.path.join(out, "metrics.json")) as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def wait_for_records(out, n, proc, timeout=120):
    deadline = time.monotonic() + timeout
    while count_records(out) < n:
        if proc.poll() is not None:
            return False
        assert time.monotonic() < deadline, f"no {n} records in {timeout} s"
        time.sleep(0.005)
    return True


def saved_iteration(out, name=None):
    import engine as flow

    name = name or open(os.path.join(out, "last_checkpoint")).read().strip()
    return flow.load(os.path.join(out, name, "trainer_state.safetensors"))["iteration"]


def digests(out):
    """md5 of every file under `out` except the lock file (which each claimant rewrites) and
    log.txt (which records the refused attempt too)."""
    result = {}
    for path in sorted(glob.glob(os.path.join(out, "**"), recursive=True)):
        if os.path.isfile(path) and os.path.basename(path) not in (".lock", "log.txt"):
            with open(path, "rb") as f:
                result[os.path.relpath(path, out)] = hashlib.md5(f.read()).hexdigest()
    return result


def assert_same_run(out, ref):
    got, want = comparable(out), comparable(ref)
    iters = [r["iteration"] for r in got if "total_loss" in r]
    assert iters == list(range(ITERS)), "duplicate or missing iterations"
    assert got == want
    w, w_ref = weights(out), weights(ref)
    assert w.keys() == w_ref.keys() and all(np.array_equal(w[k], w_ref[k]) for k in w)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("safety") / "reference")
    run(out)
    return out


# ------------------------------------------------------------------ resume picks a valid checkpoint
def _missing(out):
    os.remove(os.path.join(out, "last_checkpoint"))


def _garbage(out):
    with open(os.path.join(out, "last_checkpoint"), "wb") as f:
        f.write(b"\x00\xffnot a checkpoint\n")


def _a_wrong_name(out):
    with open(os.path.join(out, "last_checkpoint"), "w") as f:
        f.write("model_00001")


def _names_a_deleted_checkpoint(out):
    shutil.rmtree(os.path.join(out, "model_0000129"))


def _newest_corrupted(out):
    path = os.path.join(out, "model_0000129", "optimizer.safetensors")
    data = bytearray(open(path, "rb").read())
    data[-5] ^= 0xFF
    open(path, "wb").write(bytes(data))


def _newest_trainer_state_truncated(out):
    # passed over already when the candidates are listed (its iteration cannot be read)
    with open(os.path.join(out, "model_0000129", "trainer_state.safetensors"), "r+b") as f:
        f.truncate(100)


@pytest.mark.parametrize("damage, resumed_at, reason", [
    (_missing, 129, "last_checkpoint does not exist"),
    (_garbage, 129, "last_checkpoint cannot be read"),
    (_a_wrong_name, 129, "names 'model_00001', which is not a checkpoint directory"),
    (_names_a_deleted_checkpoint, 124, "which is not a checkpoint directory"),
    (_newest_corrupted, 124, "optimizer.safetensors"),
    (_newest_trainer_state_truncated, 124, "model_0000129/trainer_state.safetensors"),
])
def test_resume_takes_the_newest_valid_checkpoint_when_last_checkpoint_is_missing_or_broken(
        tmp_path, reference, damage, resumed_at, reason):
    out = str(tmp_path / "run")
    run(out, "--stop-iter", "130")
    assert saved_iteration(out) == 129
    damage(out)
    proc = run(out, "--resume")
    assert reason in proc.stdout and f"model_{resumed_at:07d}" in proc.stdout, proc.stdout[-3000:]
    assert "last_checkpoint was not used" in proc.stdout
    assert f"continuing at iteration {resumed_at + 1}" in proc.stdout
    assert_same_run(out, reference)


def test_resume_without_a_valid_checkpoint_refuses_and_changes_nothing(tmp_path, reference):
    out = str(tmp_path / "run")
    run(out, "--stop-iter", "30")  # model_0000024 and model_0000029
    for name in ("model_0000024", "model_0000029"):
        with open(os.path.join(out, name, "model.safetensors"), "r+b") as f:
            f.truncate(100)
    before = digests(out)
    proc = run(out, "--resume", ok=False)
    assert proc.returncode != 0
    assert f"train.output_dir={out!r} holds a previous run" in proc.stderr
    assert "model_0000029/model.safetensors" in proc.stderr and "--overwrite-output-dir" in proc.stderr
    assert digests(out) == before
    # asked to start over: the broken run is deleted and the new one is the uninterrupted run
    proc = run(out, "--resume", "--overwrite-output-dir")
    assert "deleted" in proc.stdout and "starting from scratch" in proc.stdout
    assert_same_run(out, reference)


def test_resume_with_another_config_names_the_changed_keys(tmp_path):
    """A checkpoint of another model size does not load, and that is not damage: the error says
    which settings changed and does not lead with deleting the run."""
    out = str(tmp_path / "run")
    run(out, "--stop-iter", "30")
    before = digests(out)
    proc = run(out, "--resume", "model.hidden_size=16", ok=False)
    assert proc.returncode != 0
    assert "was saved with another config (model.hidden_size: 32 -> 16)" in proc.stderr, proc.stderr[-2000:]
    assert f"resume with the config it was saved with ({out}/" in proc.stderr
    assert digests(out) == before


def test_resume_in_an_empty_dir_starts_from_scratch(tmp_path, reference):
    out = str(tmp_path / "run")
    proc = run(out, "--resume")
    assert "holds no previous run; starting from scratch" in proc.stdout
    assert_same_run(out, reference)


# ------------------------------------------------------------------ a fresh run on top of an old one
def test_a_fresh_run_into_a_previous_run_refuses_and_changes_nothing(tmp_path, reference):
    out = str(tmp_path / "copy")
    shutil.copytree(reference, out)
    before = digests(out)
    proc = run(out, ok=False)
    assert proc.returncode != 0
    for words in (f"train.output_dir={out!r} holds a previous run", "metrics.json", "model_final",
                  "add --resume", "another train.output_dir", "--overwrite-output-dir"):
        assert words in proc.stderr, proc.stderr[-2000:]
    assert digests(out) == before
    # --overwrite-output-dir deletes the previous run first: no stale checkpoint or record survives
    with open(os.path.join(out, "metrics.json"), "a") as f:
        f.write('{"iteration": 999999, "total_loss": 0.0}\n')
    os.rename(os.path.join(out, "model_0000249"), os.path.join(out, "model_0001000"))
    proc = run(out, "train.dist.data_parallel_size=1", "--overwrite-output-dir")  # flags anywhere
    assert "--overwrite-output-dir: deleted the previous run" in proc.stdout
    assert not os.path.exists(os.path.join(out, "model_0001000"))
    assert_same_run(out, reference)


# ------------------------------------------------------------------ one run at a time
def test_a_second_run_into_a_busy_dir_is_refused_naming_the_holder(tmp_path):
    out = str(tmp_path / "busy")
    first = start(out, "train.train_iter=100000")
    try:
        assert wait_for_records(out, 30, first)  # model_0000024 is written
        second = run(out, "--resume", ok=False)
        assert second.returncode != 0
        assert f"train.output_dir={out!r} is in use by another run (pid {first.pid} " in second.stderr, \
            second.stderr[-2000:]
    finally:
        first.kill()  # SIGKILL: the lock dies with its holder
        first.wait()
    assert wait_for_no_lock_holder(out)
    proc = run(out, "--resume", "train.train_iter=10")  # the dead holder's lock is no obstacle
    assert proc.returncode == 0


def wait_for_no_lock_holder(out):
    import fcntl

    with open(os.path.join(out, ".lock")) as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises if still held
    return True


# ------------------------------------------------------------------ signals
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGINT, signal.SIGTERM])
def test_a_signal_then_resume_equals_the_uninterrupted_run(tmp_path, reference, sig):
    rng = random.Random()
    for attempt in range(5):  # the run may finish before the signal lands: try an earlier point
        out = str(tmp_path / f"run{attempt}")
        proc = start(out)
        if wait_for_records(out, rng.randrange(5, ITERS // (attempt + 2)), proc):
            proc.send_signal(sig)
        log, _ = proc.communicate(timeout=120)
        if proc.returncode == 128 + sig:
            break
        assert proc.returncode == 0, log[-3000:]
    else:
        pytest.fail("the run always finished before the signal")
    stopped = saved_iteration(out)
    assert f"Interrupted by {sig.name} after iteration {stopped}" in log
    # no record after the checkpoint; a signal that landed in the evaluation of that iteration
    # (train.evaluation.eval_period=100) holds its record back until the resumed run evaluates it
    held = "runs again when the run is resumed" in log
    assert max(r["iteration"] for r in records(out)) == stopped - held
    run(out, "--resume")
    assert_same_run(out, reference)


SIGNAL_TWICE_IN_A_STEP = """
import os, runpy, signal, sys
from libai.engine.default import DefaultTrainer

real_step, sig = DefaultTrainer.run_step, signal.Signals[os.environ["SIGNAL_TWICE"]]


def run_step(self):  # two stop signals during iteration 5 (each handled before the next is sent)
    if self.iter == 5:
        for _ in range(2):
            os.kill(os.getpid(), sig)
            sum(range(1000))  # a few bytecodes: the handler runs
    return real_step(self)


DefaultTrainer.run_step = run_step
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_second_signal_exits_with_128_plus_its_number(tmp_path, sig):
    """The second signal abandons the step: exit status 128 + its number (143, 130), one line on
    stderr instead of a KeyboardInterrupt traceback, and no checkpoint of that step."""
    out = str(tmp_path / "run")
    proc = subprocess.run([sys.executable, "-c", SIGNAL_TWICE_IN_A_STEP, *command(out)[1:]], cwd=ROOT,
                          env=dict(ENV, SIGNAL_TWICE=sig.name), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 128 + sig, proc.stderr[-3000:]
    assert f"second stop signal ({sig.name})" in proc.stderr and "Traceback" not in proc.stderr
    assert not os.path.exists(os.path.join(out, "model_0000005"))


def test_sigkill_at_random_points_then_resume_equals_the_uninterrupted_run(tmp_path, reference):
    """Killed four times (checkpoints every 10 iterations, so some kills land inside a save),
    resumed each time, then run to the end."""
    out = str(tmp_path / "run")
    rng = random.Random()
    period = "train.checkpointer.period=10"
    for kill in range(4):
        proc = start(out, *(["--resume"] if kill else []), period)
        already = count_records(out)
        # past iteration 9 (whose checkpoint follows its record): there is always a checkpoint
        wait_for_records(out, already + rng.randrange(15, 40), proc)
        time.sleep(rng.uniform(0, 0.05))
        proc.kill()
        proc.wait()
    run(out, "--resume", period)
    assert_same_run(out, reference)


KILL_MID_SAVE = """
import os, runpy, signal, sys
import engine

real_save = engine.save


def save(obj, path, *args, **kwargs):  # SIGKILL this process half-way through model_0000049
    if ".model_0000049.tmp" in path and path.endswith("optimizer.safetensors"):
        os.kill(os.getpid(), signal.SIGKILL)
    return real_save(obj, path, *args, **kwargs)


engine.save = save
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_a_kill_in_the_middle_of_a_checkpoint_save_then_resume_equals_the_uninterrupted_run(tmp_path, reference):
    out = str(tmp_path / "run")
    cmd = command(out)
    proc = subprocess.run([sys.executable, "-c", KILL_MID_SAVE, *cmd[1:]], cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert os.path.isdir(os.path.join(out, ".model_0000049.tmp"))  # the half-written checkpoint
    assert saved_iteration(out) == 24 and not os.path.exists(os.path.join(out, "model_0000049"))
    proc = run(out, "--resume")
    assert "continuing at iteration 25" in proc.stdout
    assert not [d for d in os.listdir(out) if d.endswith(".tmp")]
    assert_same_run(out, reference)
