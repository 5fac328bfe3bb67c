"""Whether this test process has a real GPU behind the engine's CUDA backend."""
import os

from engine import backend

HERE = os.path.dirname(os.path.abspath(__file__))


def double_env():
    """The environment that makes `import cupy` the strict CuPy double in a launched process."""
    shim = os.path.join(HERE, "cupy_double", "shim")
    return {"ENGINE_CUPY_DOUBLE": "1", "PYTHONPATH": os.pathsep.join([shim, HERE])}


def real_cupy():
    """Real CuPy with at least one GPU, else None (the CuPy double is not real)."""
    try:
        cp = backend.cupy()
    except Exception:
        return None
    if "double" in getattr(cp, "__version__", "double"):
        return None
    try:
        return cp if cp.cuda.runtime.getDeviceCount() > 0 else None
    except Exception:
        return None
