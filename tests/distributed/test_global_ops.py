"""Every op accepts global tensors: the PyTorch parity matrix (tests/op_cases.py) on global inputs
with random SBPs (scripts/global_ops_matrix.py), one mpiexec launch per configuration:
all cases on 2 ranks, a seeded third of them on 4 ranks and on the 2x2 mesh, each on CPU and on CUDA
placements (one GPU per rank through the CuPy double and its NCCL). Plus the checks the
matrix cannot make (scripts/global_ops_extra.py): attention on batch-split data moves no bytes
forward and only the weight-gradient all-reduces backward; dropout draws per-shard masks."""
import re

import pytest

from mpi_helper import gpu_env, run_mpi


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("nprocs,mesh,fraction", [(2, "1d", 1), (4, "1d", 1 / 3), (4, "2x2", 1 / 3)],
                         ids=["2ranks-all", "4ranks-third", "2x2mesh-third"])
def test_op_matrix_on_global_inputs(nprocs, mesh, fraction, device):
    """On cuda: CUDA placements with one GPU per rank, the CuPy double's (and its NCCL)."""
    env = gpu_env(nprocs, ENGINE_TEST_DEVICE="cuda") if device == "cuda" else None
    rc, out, err = run_mpi(nprocs, "global_ops_matrix.py", args=(mesh, fraction), timeout=300, env=env)
    m = re.search(r"MATRIX \S+: ran (\d+) cases, (\d+) passed, (\d+) failed", out)
    assert m, out + err
    ran, passed, failed = map(int, m.groups())
    assert failed == 0 and passed == ran and ran > (700 if fraction == 1 else 150), out


@pytest.mark.parametrize("nprocs", [2, 4])
def test_attention_bytes_and_split_dropout(nprocs):
    rc, out, err = run_mpi(nprocs, "global_ops_extra.py", timeout=120)
    assert "attention bytes OK: forward 0 bytes" in out and "global ops extra OK" in out, out + err
