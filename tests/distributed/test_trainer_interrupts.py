"""Interrupted data-parallel training jobs under the launcher, resumed to the uninterrupted
2-process run's metrics and weights bit for bit:

* stopped by SIGTERM (what `timeout`, `docker stop` and schedulers send) or SIGINT: every rank
  finishes the same iteration, the checkpoint is written, the launcher returns 128 + the
  signal and no process is left;
* resumed when the newest checkpoint is readable on one rank only (rank 1's RNG file is
  corrupted): both ranks pass over it together and resume from the previous one."""
import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from mpi_helper import ROOT, mpi_env

CONFIG = os.path.join(ROOT, "tests", "training", "configs", "mlp_cls.py")
ITERS = 200
COMMON = [f"train.train_iter={ITERS}", "train.log_period=1", "train.checkpointer.period=20",
          "train.evaluation.eval_period=100", "train.dist.data_parallel_size=2"]
TIMINGS = ("time", "data_time", "eta_seconds")


def launch(out, *args):
    cmd = [sys.executable, "-m", "engine.distributed.launch", "--nproc-per-node", "2", "--threads-per-proc", "1",
           os.path.join(ROOT, "tools", "train_net.py"), "--config-file", CONFIG, f"train.output_dir={out}",
           *COMMON, *args]
    return subprocess.Popen(cmd, cwd=ROOT, env=mpi_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def finish(proc, timeout=240):
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    return proc.returncode, out


def records(out):
    try:
        with open(os.path.join(out, "metrics.json")) as f:
            return [json.loads(line) for line in f]
    except OSError:
        return []


def comparable(out):
    return [{k: v for k, v in r.items() if k not in TIMINGS} for r in records(out)]


def weights(out):
    import engine as flow

    return {k: v.numpy() for k, v in flow.load(os.path.join(out, "model_final", "model.safetensors")).items()}


def saved_iteration(out):
    import engine as flow

    name = open(os.path.join(out, "last_checkpoint")).read().strip()
    return flow.load(os.path.join(out, name, "trainer_state.safetensors"))["iteration"]


def job_processes(out):
    """Pids of the live processes (mpiexec, ranks) whose command line names this job's
    output dir."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if fields[0] != "Z" and f"train.output_dir={out}".encode() in cmdline:
            found.append(int(entry))
    return found


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("dp2") / "reference")
    code, log = finish(launch(out))
    assert code == 0, log[-3000:]
    return out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_launcher_stops_every_rank_at_one_iteration_and_resume_is_exact(tmp_path, reference, sig):
    for attempt in range(4):  # the run may finish before the signal lands: try an earlier point
        out = str(tmp_path / f"run{attempt}")
        proc = launch(out)
        target = random.randrange(25, ITERS // (attempt + 2))
        while len(records(out)) < target and proc.poll() is None:
            time.sleep(0.01)
        proc.send_signal(sig)
        code, log = finish(proc)
        if code == 128 + sig:
            break
        assert code == 0, log[-3000:]
    else:
        pytest.fail("the run always finished before the signal")
    stopped = saved_iteration(out)
    assert f"Interrupted by {sig.name} after iteration {stopped}" in log, log[-3000:]
    # a signal during the evaluation of the stopped iteration leaves that iteration's record to
    # the resumed run (EvalHook: the evaluation runs again first); else it is written
    eval_cut = f"the evaluation of iteration {stopped} runs again when the run is resumed" in log
    assert max(r["iteration"] for r in records(out)) == (stopped - 1 if eval_cut else stopped)
    assert os.path.isfile(os.path.join(out, f"model_{stopped:07d}", "rng_state_rank1.safetensors"))
    deadline = time.monotonic() + 20
    while job_processes(out) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert job_processes(out) == []

    code, log = finish(launch(out, "--resume"))
    assert code == 0, log[-3000:]
    assert comparable(out) == comparable(reference)
    w, w_ref = weights(out), weights(reference)
    assert all(np.array_equal(w[k], w_ref[k]) for k in w_ref)


def test_a_checkpoint_that_only_one_rank_can_load_is_passed_over_by_both(tmp_path, reference):
    out = str(tmp_path / "run")
    code, log = finish(launch(out, "--stop-iter", "50"))  # checkpoints 19, 39 and 49
    assert code == 0, log[-3000:]
    path = os.path.join(out, "model_0000049", "rng_state_rank1.safetensors")
    data = bytearray(open(path, "rb").read())
    data[-4] ^= 0xFF
    open(path, "wb").write(bytes(data))
    code, log = finish(launch(out, "--resume"))
    assert code == 0, log[-3000:]
    assert "model_0000049: failed to load on another rank" in log  # rank 0 read it; rank 1 could not
    assert "continuing at iteration 40" in log
    assert comparable(out) == comparable(reference)
    w, w_ref = weights(out), weights(reference)
    assert all(np.array_equal(w[k], w_ref[k]) for k in w_ref)
