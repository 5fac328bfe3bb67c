"""`import cupy` -> the strict CuPy double (this directory goes first on sys.path when
ENGINE_CUPY_DOUBLE=1; see tests/cupy_double/__init__.py)."""
import cupy_double

cupy_double.install()
