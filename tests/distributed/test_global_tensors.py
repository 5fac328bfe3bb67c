"""Global tensors (placement + SBP) for real on 2 and 4 MPI processes: boxing matrix and
conversions across placements, collectives and bytes per conversion, errors, creation
consistency, local <-> global casts, grad_sbp and deferred gradient sync.

Each configuration is one mpiexec launch that runs many checks (scripts/global_*.py)."""
import pytest

from mpi_helper import run_mpi


@pytest.mark.parametrize("nprocs", [2, 4])
def test_boxing_matrix_values_and_grads(nprocs):
    _, out, _ = run_mpi(nprocs, "global_boxing.py")
    assert f"global boxing OK on {nprocs} ranks" in out


def test_boxing_collectives_and_bytes():
    _, out, _ = run_mpi(4, "global_boxing_bytes.py")
    assert "global boxing bytes OK on 4 ranks" in out


def test_errors():
    _, out, _ = run_mpi(4, "global_errors.py")
    assert "global errors OK on 4 ranks" in out


@pytest.mark.parametrize("nprocs", [2, 4])
def test_creation_consistency(nprocs):
    _, out, _ = run_mpi(nprocs, "global_creation.py")
    assert f"global creation OK on {nprocs} ranks" in out


@pytest.mark.parametrize("nprocs", [2, 4])
def test_casts_grad_sbp_and_deferred_sync(nprocs):
    _, out, _ = run_mpi(nprocs, "global_grads.py")
    assert f"global grads OK on {nprocs} ranks" in out


def test_single_process_global_tensors():
    """World size 1 in this very process: a placement of one rank, every SBP is trivial."""
    import numpy as np

    import engine as flow
    from engine.distributed import sbp as S

    p = flow.placement("cpu", [0])
    A = np.arange(12, dtype=np.float32).reshape(3, 4)
    x = flow.tensor(A, placement=p, sbp=S.split(0), requires_grad=True)
    for s in (S.broadcast, S.split(1), S.partial_sum):
        y = x.to_global(sbp=s)
        assert y.sbp == (s,) and np.array_equal(y.detach().numpy(), A)
    (x.to_global(sbp=S.partial_sum) * 2).sum().backward()
    assert np.array_equal(x.grad.numpy(), np.full_like(A, 2))
    with pytest.raises(RuntimeError, match="already local"):
        flow.ones(2).to_local()
