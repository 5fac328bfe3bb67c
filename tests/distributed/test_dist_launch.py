"""The launcher, the child wrapper, and what happens when a rank fails."""
import os
import sys
import time

import pytest

from mpi_helper import ROOT, SCRIPTS, mpi_env, run_command, run_mpi

LAUNCH = [sys.executable, "-m", "engine.distributed.launch"]


def test_dry_run_prints_mpiexec_command():
    rc, out, err = run_command(LAUNCH + ["--nproc-per-node", "4", "--dry-run", "train.py", "--lr", "0.1"])
    cmd = out.strip().split()
    assert cmd[0].endswith("mpiexec") and cmd[1:3] == ["-n", "4"]
    threads = str(max(1, len(os.sched_getaffinity(0)) // 4))
    text = " ".join(cmd)
    for var, val in [("OMP_NUM_THREADS", threads), ("OPENBLAS_NUM_THREADS", "1"),
                     ("MKL_NUM_THREADS", threads), ("ENGINE_NUM_THREADS", threads)]:
        assert f"-genv {var} {val}" in text
    assert text.endswith("-m engine.distributed.run train.py --lr 0.1")
    assert "-hosts" not in cmd


def test_dry_run_multi_node(tmp_path):
    rc, out, _ = run_command(LAUNCH + ["--nproc-per-node", "2", "--hosts", "h1,h2,h3", "--dry-run", "x.py"])
    cmd = out.split()
    assert cmd[1:3] == ["-n", "6"] and "-hosts h1,h2,h3 -ppn 2" in out
    hf = tmp_path / "hosts"
    hf.write_text("# cluster\nnodeA:4\nnodeB\n\n")
    rc, out, _ = run_command(LAUNCH + ["--nproc-per-node", "3", "--hostfile", str(hf), "--dry-run",
                                       "--mpi-args", "-launcher ssh", "x.py"])
    assert out.split()[1:3] == ["-n", "6"] and f"-f {hf} -ppn 3" in out and "-launcher ssh" in out


def test_missing_mpiexec_is_a_clear_error():
    rc, out, err = run_command(LAUNCH + ["--mpiexec", "/nonexistent/mpiexec", "--dry-run", "x.py"], check=False)
    assert rc == 2 and "not an executable" in err


def test_launch_runs_script_with_rank_env():
    rc, out, err = run_command(LAUNCH + ["--nproc-per-node", "2", os.path.join(SCRIPTS, "check_env.py"),
                                         "--flag", "value"], timeout=120)
    assert rc == 0
    assert "env OK rank=0 world=2" in out and "env OK rank=1 world=2" in out


def test_launch_threads_override():
    env = mpi_env(EXPECT_THREADS="3")
    rc, out, err = run_command(LAUNCH + ["--nproc-per-node", "2", "--threads-per-proc", "3",
                                         os.path.join(SCRIPTS, "check_env.py"), "--flag", "value"], env=env)
    assert out.count("threads=3") == 2


def test_launch_returns_nonzero_on_failure():
    rc, out, err = run_command(LAUNCH + ["--nproc-per-node", "2", os.path.join(SCRIPTS, "fail_rank1.py")],
                               timeout=60, check=False)
    assert rc != 0 and "deliberate failure on rank one" in err


@pytest.mark.parametrize("nprocs", [2, 4])
def test_exception_on_one_rank_aborts_job(nprocs):
    start = time.monotonic()
    rc, out, err = run_mpi(nprocs, "fail_rank1.py", ["raise"], timeout=60, check=False)
    elapsed = time.monotonic() - start
    assert rc != 0, (out, err)
    assert elapsed < 10, f"job took {elapsed:.1f}s to end after the failure"
    assert "[rank 1] Traceback" in err and "rank 1" in err
    assert "ValueError: deliberate failure on rank one" in err
    assert "passed the barrier" not in out


def test_sys_exit_on_one_rank_aborts_job():
    start = time.monotonic()
    rc, out, err = run_mpi(2, "fail_rank1.py", ["exit"], timeout=60, check=False)
    assert rc != 0 and time.monotonic() - start < 10
    assert "[rank 1] exited with status 3" in err


def test_a_killed_rank_is_named_by_the_launcher():
    """mpiexec reports only the pid of a rank killed by a signal (the out-of-memory killer's
    SIGKILL); the launcher lists which rank each pid was."""
    start = time.monotonic()
    rc, out, err = run_command(LAUNCH + ["--nproc-per-node", "2", os.path.join(SCRIPTS, "fail_rank1.py"), "sigkill"],
                               timeout=60, check=False)
    assert rc != 0 and time.monotonic() - start < 20, (rc, err[-2000:])
    import re

    killed = re.search(r"PID (\d+) RUNNING", out + err)  # mpiexec's report (on its stdout)
    assert killed, (out + err)[-2000:]
    assert re.search(rf"the ranks on this host were: rank 0 pid \d+, rank 1 pid {killed.group(1)}\b", err), err[-2000:]


def test_exception_in_thread_aborts_job():
    start = time.monotonic()
    rc, out, err = run_mpi(2, "fail_rank1.py", ["thread"], timeout=60, check=False)
    assert rc != 0 and time.monotonic() - start < 10
    assert "deliberate thread failure" in err and "[rank 1]" in err


def test_module_function_target():
    rc, out, err = run_mpi(2, "engine.distributed.comm:barrier")
    assert rc == 0


def test_comm_bandwidth_benchmark_smoke():
    """tools/benchmarks/comm_bandwidth.py keeps running (tiny sizes only)."""
    bench = os.path.join(ROOT, "tools", "benchmarks", "comm_bandwidth.py")
    rc, out, err = run_command(LAUNCH + ["--nproc-per-node", "2", bench, "--max-mb", "0.016"], timeout=120)
    assert "all_reduce" in out and "ag out=" in out and "16 KB" in out


def test_abort_waits_until_the_launcher_has_read_the_pipe():
    """The failing rank's traceback was lost under load when MPI_Abort beat mpiexec's reading of
    the pipe (a CI failure: empty stderr). The abort now waits for the pipe to be drained."""
    import threading

    from engine.distributed.comm import wait_for_output_forwarded

    r, w = os.pipe()
    try:
        os.write(w, b"[rank 1] Traceback ...\n" * 50)
        read_started = []

        def read():
            read_started.append(time.monotonic())
            assert len(os.read(r, 1 << 16)) == 23 * 50

        reader = threading.Timer(0.2, read)
        reader.start()
        wait_for_output_forwarded(fds=(w,), timeout=30)
        returned = time.monotonic()
        reader.join()
        assert read_started and returned >= read_started[0], "returned before the reader read the pipe"

        os.write(w, b"unread")  # nobody reads: it gives up at the timeout instead of hanging
        wait_for_output_forwarded(fds=(w,), timeout=0.1)
        assert os.read(r, 100) == b"unread"
    finally:
        os.close(r)
        os.close(w)
    f = os.open(os.devnull, os.O_WRONLY)  # not a pipe: nothing to wait for
    try:
        wait_for_output_forwarded(fds=(f,), timeout=30)
    finally:
        os.close(f)
