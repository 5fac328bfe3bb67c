"""Signals to the launcher reach every rank, and nothing of the job outlives the launcher.

The ranks run scripts/signal_loop.py, which writes each rank's pid and its ancestors' (hydra
proxy, mpiexec) to files, so the test can check that every process of the job is gone.
"""
import os
import signal
import subprocess
import sys
import time

import pytest
from mpi_helper import ROOT, SCRIPTS, mpi_env, run_mpi

LAUNCH = [sys.executable, "-m", "engine.distributed.launch"]
SCRIPT = os.path.join(SCRIPTS, "signal_loop.py")
NPROCS = 2


def _wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def _alive(pid):
    """Running, not a zombie (PID 1 of a container may never reap the orphans)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _files(outdir, prefix):
    return {name.split(".", 1)[1]: (outdir / name).read_text()
            for name in os.listdir(outdir) if name.startswith(prefix + ".")}


class Job:
    """The launcher on NPROCS ranks of signal_loop.py, in its own session."""

    def __init__(self, tmp_path, log, mode, *launcher_args, env=None, preexec_fn=None):
        self.outdir = tmp_path / "out"
        self.outdir.mkdir()
        self.log = log
        self.proc = subprocess.Popen(
            LAUNCH + ["--nproc-per-node", str(NPROCS), *launcher_args, SCRIPT, str(self.outdir), mode],
            cwd=ROOT, env=env or mpi_env(), stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=preexec_fn)
        self.pids = set()

    def wait_started(self):
        """Every rank is in its loop; remember the pids of ranks, proxies and mpiexec."""
        _wait_for(lambda: len(_files(self.outdir, "pids")) == NPROCS or self.proc.poll() is not None,
                  120, "the ranks to start")
        assert self.proc.poll() is None, self.output()
        for text in _files(self.outdir, "pids").values():
            self.pids.update(int(p) for p in text.split())
        assert os.getpid() not in self.pids and len(self.pids) >= NPROCS + 2

    def signal(self, signum):
        os.kill(self.proc.pid, signum)

    def wait(self, timeout=60):
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the launcher did not end within {timeout}s\n{self.output()}")

    def assert_all_gone(self, timeout=20):
        _wait_for(lambda: not any(_alive(p) for p in self.pids), timeout,
                  f"the job's processes {sorted(p for p in self.pids if _alive(p))} to end")

    def output(self):
        self.log.seek(0)
        return self.log.read()

    def cleanup(self):
        for pid in [self.proc.pid, *self.pids]:
            if _alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.proc.wait()


@pytest.fixture
def job(tmp_path):
    """Starts one Job (the launcher's output in launcher.log) and kills what is left of it."""
    jobs = []
    with open(tmp_path / "launcher.log", "w+") as log:
        def start(mode, *launcher_args, **kw):
            jobs.append(Job(tmp_path, log, mode, *launcher_args, **kw))
            jobs[-1].wait_started()
            return jobs[-1]

        yield start
        for j in jobs:
            j.cleanup()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_reaches_every_rank_and_launcher_waits(job, signum):
    j = job("graceful")
    j.signal(signum)
    rc = j.wait()
    out = j.output()
    assert _files(j.outdir, "stopped") == {str(r): str(int(signum)) for r in range(NPROCS)}, out
    assert rc == 128 + signum, out
    assert "Abort" not in out and "exited with status" not in out, out
    j.assert_all_gone()


def test_a_signal_ignored_when_the_launcher_started_stays_ignored(job):
    """A launcher started with SIGINT ignored (a background job of a script, `nohup cmd &`) does
    not stop on SIGINT nor pass it to the ranks; SIGTERM still stops the job."""
    j = job("graceful", preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    j.signal(signal.SIGINT)
    time.sleep(3)  # a forwarded SIGINT stops graceful ranks within a step (milliseconds)
    assert j.proc.poll() is None and not _files(j.outdir, "stopped"), j.output()
    j.signal(signal.SIGTERM)
    rc = j.wait()
    assert _files(j.outdir, "stopped") == {str(r): str(int(signal.SIGTERM)) for r in range(NPROCS)}, j.output()
    assert rc == 128 + signal.SIGTERM, j.output()
    j.assert_all_gone()


def test_sigkill_of_launcher_leaves_nothing(job):
    j = job("graceful")
    j.signal(signal.SIGKILL)
    j.wait()
    j.assert_all_gone()


def test_rank_ignoring_sigterm_is_killed_after_kill_timeout(job):
    j = job("stubborn", "--kill-timeout", "2")
    j.signal(signal.SIGTERM)
    rc = j.wait()
    out = j.output()
    assert rc == 128 + signal.SIGKILL, out
    assert "still running 2s after the signal (--kill-timeout): killing it" in out, out
    j.assert_all_gone()


def test_second_signal_kills_at_once(job):
    j = job("stubborn", "--kill-timeout", "600")
    j.signal(signal.SIGTERM)
    _wait_for(lambda: len(_files(j.outdir, "got")) == NPROCS, 30, "every rank to get SIGTERM")
    j.signal(signal.SIGINT)
    assert j.wait() == 128 + signal.SIGKILL, j.output()
    j.assert_all_gone()


def test_unhandled_sigint_ends_the_job_without_tracebacks(job):
    j = job("plain")
    j.signal(signal.SIGINT)
    rc = j.wait()
    out = j.output()
    assert rc != 0 and "exited with status 130 (KeyboardInterrupt)" in out, out
    assert "Traceback" not in out, out
    j.assert_all_gone()


def test_lone_rank_stopping_still_aborts_the_job(tmp_path):
    """Exit status 143 on one rank while the others wait in a collective is a failure."""
    start = time.monotonic()
    rc, out, err = run_mpi(NPROCS, SCRIPT, [tmp_path, "lone"], timeout=60, check=False,
                           env=mpi_env(ENGINE_KILL_TIMEOUT="1"))
    assert rc != 0 and time.monotonic() - start < 30, (rc, out, err)
    assert "[rank 0] exited with status 143" in err, (rc, out, err)
