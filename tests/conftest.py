"""Test-wide settings: one BLAS thread per test process (pytest-xdist runs two on 2 cores) and a
fixed seed per test so failures reproduce."""
import os

for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")

import pytest  # noqa: E402

import engine as flow  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    flow.manual_seed(0)
    yield
