"""`import cupy` -> the strict CuPy double (this directory goes first on sys.path when
ENGINE_CUPY_DOUBLE=1; see tests/cupy_double/__init__.py). The engine's direct cuBLAS calls get the
double's numpy model of cuBLAS (tests/cupy_double/cublas.py), as in the test processes."""
import cupy_double
from cupy_double.cublas import DoubleCublas
from engine.backend import cublas as _engine_cublas

cupy_double.install()
_engine_cublas.install_api(DoubleCublas())


def _report_at_exit():
    """CUPY_DOUBLE_REPORT=DIR: each process writes DIR/<pid>.json at exit with its launches per
    name (so a test of a launched job can see what ran on the double GPUs, NCCL calls included)."""
    import atexit
    import json
    import os

    where = os.environ.get("CUPY_DOUBLE_REPORT")
    if not where:
        return

    def write():
        stats = cupy_double._double.stats
        with open(os.path.join(where, f"{os.getpid()}.json"), "w") as f:
            json.dump({"rank": os.environ.get("RANK"), "launches": stats.launches, "by_name": dict(stats.by_name)}, f)
    atexit.register(write)


_report_at_exit()
