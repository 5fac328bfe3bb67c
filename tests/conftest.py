"""Test-wide settings: one BLAS thread per test process (pytest-xdist runs two on 2 cores) and a
fixed seed per test so failures reproduce."""
import os

for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")

# The suite starts Python again about a thousand times (tools/train_net.py runs, mpiexec ranks,
# pytest in a subprocess). With PYTHONDONTWRITEBYTECODE set (as on the CI machines) each of them
# would compile the project's ~200 modules anew: ~0.7 s of a tiny 1-iteration training run's
# 1.8 s. Their bytecode goes to a cache outside the checkout instead, shared by all of them.
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None):
    import tempfile

    os.environ.setdefault("PYTHONPYCACHEPREFIX", os.path.join(tempfile.gettempdir(), f"engine-pycache-{os.getuid()}"))

import signal  # noqa: E402

import pytest  # noqa: E402

# A suite started in the background by a non-interactive shell (`pytest ... &`) inherits SIGINT
# ignored, and so would every launcher a test starts: the launcher honours an inherited SIG_IGN
# on purpose (tests/distributed/test_launch_signals.py), so the tests that send SIGINT to a job
# would wait for nothing. A handler here, unlike SIG_IGN, is reset to the default in children.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# The compiled CPU kernels (engine.backend.jit, numba) cost ~1.7 s to load in every process,
# even from a warm cache (numba's import and its CPU target's registries): more than all the
# steps of a tiny training run, and the suite starts about a thousand of them. So the processes
# the suite starts run the numpy kernels (ENGINE_JIT=0), unless the user set ENGINE_JIT for the
# whole run or a test asks for the compiled ones (ENGINE_JIT=1 in the child's environment).
# This process, and the pytest-xdist workers and nested pytest runs that inherit the variable
# below, keep the user's setting, so the in-process tests compare both kinds of kernel.
_USER_JIT = "ENGINE_TEST_USER_JIT"  # the user's ENGINE_JIT ("" when unset), kept for the workers
os.environ.setdefault(_USER_JIT, os.environ.get("ENGINE_JIT", ""))
if os.environ[_USER_JIT]:
    os.environ["ENGINE_JIT"] = os.environ[_USER_JIT]
else:
    os.environ.pop("ENGINE_JIT", None)

import engine as flow  # noqa: E402  (engine.backend.jit reads ENGINE_JIT here, once)

if not os.environ[_USER_JIT]:
    os.environ["ENGINE_JIT"] = "0"  # for the processes tests start


@pytest.fixture(autouse=True)
def _seed():
    flow.manual_seed(0)
    yield


# ------------------------------------------------------------------ the CuPy double
# ENGINE_CUPY_DOUBLE=1 makes `import cupy` the strict CuPy double for the whole run (and for the
# processes tests launch): with ENGINE_TEST_DEVICE=cuda the device-aware tests then run the CUDA
# path on CPU. Without it, the fixture below swaps the double in for single tests.
_DOUBLE_SHIM = os.path.join(os.path.dirname(__file__), "cupy_double", "shim")
if os.environ.get("ENGINE_CUPY_DOUBLE") == "1":
    import sys  # noqa: E402

    sys.path.insert(0, _DOUBLE_SHIM)
    _inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([_DOUBLE_SHIM, os.path.dirname(__file__)] + _inherited)


@pytest.fixture
def cuda_double():
    """The engine's CUDA backend is the strict CuPy double for this test; yields the double
    (`cuda_double._double.stats` counts launches and host syncs)."""
    import cupy_double
    from engine import backend

    from cupy_double.cublas import DoubleCublas
    from engine.backend import cublas

    saved_modules = cupy_double.install()
    saved = backend._cupy
    backend._cupy = cupy_double
    saved_api = cublas.install_api(DoubleCublas())
    cupy_double._double.stats.reset()
    try:
        yield cupy_double
    finally:
        backend._cupy = saved
        cublas.restore_api(saved_api)
        cupy_double.uninstall(saved_modules)


@pytest.fixture
def cuda_layers(cuda_double):
    """cuda_double, with libai's layer placements on "cuda" for the test."""
    from libai.utils import distributed as dist
    dist.set_device_type("cuda")
    try:
        yield cuda_double
    finally:
        dist.set_device_type("cpu")


def pytest_sessionfinish(session):
    """With ENGINE_CUPY_DOUBLE=1 and CUPY_DOUBLE_REPORT=<file>: the double's launch count of the
    run, written to the file (so a caller can tell the CUDA path really ran)."""
    report = os.environ.get("CUPY_DOUBLE_REPORT")
    if report and os.environ.get("ENGINE_CUPY_DOUBLE") == "1":
        import cupy_double
        import cuda_on_cpu
        with open(report, "w") as f:  # with CUPY_DOUBLE_RUN_SOURCES=1, also the launches run from source
            f.write(str(cupy_double._double.stats.launches))
            if cupy_double._double.RUN_SOURCES:
                f.write(f" {cuda_on_cpu.LAUNCHES[0]}")


# ------------------------------------------------------------------ scheduling
@pytest.hookimpl(optionalhook=True)  # (a hook of pytest-xdist, absent under -p no:xdist)
def pytest_xdist_make_scheduler(config, log):
    """Work stealing for xdist's default distribution ("load"; other --dist modes are kept): an
    idle worker takes half of the busiest one's queue. "load" sends each worker long runs of
    consecutive tests up front, so the longest tests, first in the order (below), all went to
    one worker, which then ran alone for its last ~10 minutes (docs/testing.md)."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import WorkStealingScheduling

    return WorkStealingScheduling(config, log)


def pytest_collection_modifyitems(session, config, items):
    """The longest tests first (tests/longest_first.py)."""
    from longest_first import LONGEST_FIRST

    rank = {nodeid: i for i, nodeid in enumerate(LONGEST_FIRST)}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def key(item):  # node ids relative to the repository, wherever pytest was started
        path = os.path.relpath(str(item.path), root).replace(os.sep, "/")
        return rank.get(path + "::" + item.name, len(rank))

    items.sort(key=key)  # stable: every other test keeps its place
