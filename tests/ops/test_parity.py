"""Every registered OpCase: forward+backward parity with PyTorch, and a float64 finite-difference
gradient check. Cases live in tests/ops/cases_<family>.py as `CASES = [OpCase(...), ...]`."""
import pytest

from harness import gradcheck, run_parity
from op_cases import ALL_CASES

PARITY = [pytest.param(c, id=c.id) for c in ALL_CASES]
GRADCHECK = [pytest.param(c, id=c.id) for c in ALL_CASES if c.backward and c.gradcheck]


@pytest.mark.parametrize("case", PARITY)
def test_parity_with_torch(case):
    run_parity(case, seed=0)
    run_parity(case, seed=1)


@pytest.mark.parametrize("case", GRADCHECK)
def test_finite_difference_gradients(case):
    gradcheck(case)
