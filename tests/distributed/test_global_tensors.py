"""Global tensors (placement + SBP) for real on 2 and 4 MPI processes: boxing matrix and
conversions across placements, collectives and bytes per conversion, errors, creation
consistency, local <-> global casts, grad_sbp and deferred gradient sync.

Each configuration is one mpiexec launch that runs many checks (scripts/global_*.py)."""
import pytest

from mpi_helper import gpu_env, run_mpi


@pytest.mark.parametrize("nprocs", [2, 4])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_boxing_matrix_values_and_grads(nprocs, device):
    """On cuda: one GPU per rank, the CuPy double's (its NCCL over MPI under the engine's)."""
    _, out, _ = run_mpi(nprocs, "global_boxing.py", [device], env=gpu_env(nprocs) if device == "cuda" else None)
    assert f"global boxing OK on {nprocs} ranks ({device})" in out


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


@pytest.mark.parametrize("ranks", [[0], [[0]]], ids=["mesh-1", "mesh-1x1"])
def test_one_rank_ops_equal_local_ops(ranks):
    """Ops on a one-rank placement (the short path every one-process LiBai model takes) give
    the local ops' values and gradients bit for bit, with broadcast outputs, for inputs of any
    SBP, absent optional inputs, several outputs and gradients that arrive with another SBP."""
    import numpy as np

    import engine as flow
    import engine.nn.functional as F
    from engine.distributed import sbp as S

    p = flow.placement("cpu", ranks)
    nd = len(p.hierarchy)
    rng = np.random.default_rng(0)
    A = rng.standard_normal((3, 5)).astype(np.float32)
    B = rng.standard_normal((5,)).astype(np.float32)
    W = rng.standard_normal((5, 4)).astype(np.float32)

    def run(make):
        a, b, w = make(A, S.split(0)), make(B, S.broadcast), make(W, S.split(1))
        y = F.layer_norm(a + b, (5,), weight=b, bias=None)  # bias absent: a None input
        values, idx = (y @ w).max(dim=1)  # two outputs, one of them integer
        z = (values.softmax(0) * idx.float()).sum() + (y * a).mean()
        z.backward()
        return [t.numpy() for t in (y.detach(), values.detach(), idx, z.detach(), a.grad, b.grad, w.grad)], (y, idx, a)

    local, _ = run(lambda v, s: flow.tensor(v, requires_grad=True))
    one_rank, (y, idx, a) = run(lambda v, s: flow.tensor(v, placement=p, sbp=(s,) * nd, requires_grad=True))
    for lv, gv in zip(local, one_rank):
        assert lv.dtype == gv.dtype and np.array_equal(lv, gv)
    assert y.is_global and y.sbp == (S.broadcast,) * nd and y.placement == p and idx.dtype == flow.int64
    assert a.grad.is_global and a.grad.sbp == (S.split(0),) * nd  # the leaf's own layout

    # a gradient arriving partial-sum (another op's output layout) is whole on one rank
    x = flow.tensor(A, placement=p, sbp=(S.broadcast,) * nd, requires_grad=True)
    (x * 3).to_global(sbp=(S.partial_sum,) * nd).sum().backward()
    assert np.array_equal(x.grad.numpy(), np.full_like(A, 3))


def test_dispatch_reuses_decisions_only_for_the_same_call():
    _, out, _ = run_mpi(2, "dispatch_decisions.py")
    assert "dispatch decisions OK on 2 ranks" in out
