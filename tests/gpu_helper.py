"""Whether this test process has a real GPU behind the engine's CUDA backend."""
from engine import backend


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
