"""Run a test body on N MPI processes and fail the calling test with its output if it fails.

Per-rank test bodies live in tests/distributed/scripts/*.py: they assert, and any failure on
any rank aborts the whole job (engine.distributed.run installs the MPI_Abort hook), so a
broken collective shows up as a non-zero exit with the rank-tagged traceback, never a hang.

mpiexec is the one the `mpich` wheel installs next to the interpreter. It works here without
extra flags (hydra launches local ranks by fork; 8 ranks on 2 cores is fine); we still set
HYDRA_LAUNCHER=fork so that a CI box without ssh/network never tries a remote launcher.
"""
import os
import shutil
import signal
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")


def mpiexec():
    local = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.path.isfile(local) and os.access(local, os.X_OK):
        return local
    found = shutil.which("mpiexec")
    if not found:
        pytest.fail("mpiexec not found (install the `mpich` wheel: pip install mpich)")
    return found


def mpi_env(**extra):
    env = dict(os.environ)
    env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               ENGINE_NUM_THREADS="1", HYDRA_LAUNCHER="fork")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def gpu_env(nprocs, **extra):
    """The environment of an mpiexec job whose `nprocs` ranks each have one GPU of the CuPy double
    (and its NCCL over MPI); `extra` overrides."""
    from gpu_helper import double_env

    env = double_env()
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], ROOT])
    env.update(CUPY_DOUBLE_DEVICES=str(nprocs), PYTHONHASHSEED="0")
    env.update(extra)
    return mpi_env(**env)


def run_command(cmd, timeout=180, check=True, env=None):
    """Run `cmd` in its own session; on timeout kill that session. Returns (rc, stdout, stderr)."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env or mpi_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"timed out after {timeout}s: {' '.join(cmd)}\n--- stdout\n{out}\n--- stderr\n{err}")
    if check and proc.returncode != 0:
        pytest.fail(f"exit status {proc.returncode}: {' '.join(cmd)}\n--- stdout\n{out}\n--- stderr\n{err}")
    return proc.returncode, out, err


def run_mpi(nprocs, target, args=(), timeout=180, check=True, env=None):
    """Run `target` on `nprocs` ranks under `python -m engine.distributed.run`.

    `target` is a script path (absolute, or relative to tests/distributed/scripts) or
    "package.module:function" (imported and called on every rank).
    """
    if ":" in target and not target.endswith(".py"):
        mod, fn = target.split(":", 1)
        child = ["-c", f"import {mod} as _m; _m.{fn}()"]
    else:
        path = target if os.path.isabs(target) else os.path.join(SCRIPTS, target)
        child = [path]
    cmd = [mpiexec(), "-n", str(nprocs), sys.executable, "-m", "engine.distributed.run", *child, *map(str, args)]
    return run_command(cmd, timeout=timeout, check=check, env=env)
