"""`import cupy` -> the strict CuPy double (this directory goes first on sys.path when
ENGINE_CUPY_DOUBLE=1; see tests/cupy_double/__init__.py). The engine's direct cuBLAS calls get the
double's numpy model of cuBLAS (tests/cupy_double/cublas.py), as in the test processes."""
import cupy_double
from cupy_double.cublas import DoubleCublas
from engine.backend import cublas as _engine_cublas

cupy_double.install()
_engine_cublas.install_api(DoubleCublas())
