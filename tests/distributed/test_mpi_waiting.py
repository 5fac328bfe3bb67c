"""Ranks waiting in MPI sleep instead of spinning a core (engine.distributed.waiting): with more
ranks than cores the waiting ones would otherwise take the cores from the ones computing. Rank 0
sleeps before each call while 2 other ranks wait in it: buffer collectives, point-to-point and
the pickled calls."""
import re

import pytest

from mpi_helper import mpi_env, run_mpi

DELAY = 0.5


def cpu_per_wait(out):
    got = {int(r): float(v) for r, v in re.findall(r"rank (\d+): most CPU time in one wait ([\d.]+) s", out)}
    assert sorted(got) == [0, 1, 2], out
    return got


def test_waiting_ranks_sleep():
    _, out, _ = run_mpi(3, "waiting.py", args=[DELAY])
    waits = cpu_per_wait(out)
    # a wait costs its Test calls and the yields of its first 10 ms (~0.02 s of CPU alone);
    # spinning costs the whole delay
    assert max(waits[1], waits[2]) < 0.1 * DELAY, out


def test_engine_mpi_wait_spin_keeps_mpi_blocking_calls():
    """ENGINE_MPI_WAIT=spin: MPI's own blocking calls, which poll (here: the waiting ranks spend
    about the delay in CPU time), with the same results."""
    _, out, _ = run_mpi(3, "waiting.py", args=[DELAY], env=mpi_env(ENGINE_MPI_WAIT="spin"))
    waits = cpu_per_wait(out)
    # about the whole delay on an idle machine; less where other jobs take the cores (MPICH
    # yields in its polling loop), but still well above a sleeping wait's ~0.04 of it
    assert min(waits[1], waits[2]) > 0.2 * DELAY, out


def test_engine_mpi_wait_names_a_bad_value():
    rc, out, err = run_mpi(2, "waiting.py", args=[0.0], env=mpi_env(ENGINE_MPI_WAIT="busy"), check=False)
    assert rc != 0 and "ENGINE_MPI_WAIT must be 'sleep' or 'spin', got 'busy'" in out + err
