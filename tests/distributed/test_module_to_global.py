"""Issue 17: OneFlow's Module.to_global(placement, sbp) / Module.to_local() (scripts/module_to_global.py),
in this process (world size 1) and on 2 MPI ranks."""
import os
import runpy

from mpi_helper import SCRIPTS, run_mpi


def test_module_to_global_single_process(capsys):
    runpy.run_path(os.path.join(SCRIPTS, "module_to_global.py"), run_name="__main__")
    assert "module to_global OK on 1 ranks" in capsys.readouterr().out


def test_module_to_global_two_ranks():
    _, out, _ = run_mpi(2, "module_to_global.py")
    assert "module to_global OK on 2 ranks" in out
