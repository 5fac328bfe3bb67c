"""TransformerLayer and a 2-layer GPT (logits, vocab-parallel loss, every gradient) on
dp=2, tp=2 and dp=2 x tp=2 (and tp=4) under mpiexec, against the single-process run.
Bodies: scripts/gpt_parallel.py."""
import os
import sys

import numpy as np
import pytest

from mpi_helper import SCRIPTS, gpu_env, run_mpi


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    sys.path.insert(0, SCRIPTS)
    import gpt_parallel
    from libai.utils import distributed as dist

    dist._reset_dist_util()
    try:
        out = gpt_parallel.compute()
    finally:
        dist._reset_dist_util()
    path = os.path.join(str(tmp_path_factory.mktemp("gpt_ref")), "ref.npz")
    np.savez(path, **out)
    return path


@pytest.mark.parametrize("nprocs,dp,tp", [(2, 1, 2), (2, 2, 1), (4, 2, 2), (4, 1, 4)])
def test_gpt_parallel_matches_single_process(reference, nprocs, dp, tp):
    rc, out, err = run_mpi(nprocs, "gpt_parallel.py", [reference, dp, tp], timeout=300)
    assert f"gpt_parallel OK dp={dp} tp={tp} on cpu" in out, out + err
    print(out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def gpu_reference(tmp_path_factory):
    """The one-process results on one GPU (the CuPy double): the CUDA path's own numerics (its
    products and kernels sum in another order than the CPU's: up to 1e-5 relative apart)."""
    path = os.path.join(str(tmp_path_factory.mktemp("gpt_gpu_ref")), "ref.npz")
    run_mpi(1, "gpt_parallel.py", ["--write", path, "cuda"], env=gpu_env(1))
    return path


@pytest.mark.parametrize("nprocs,dp,tp", [(2, 1, 2), (4, 2, 2)])
def test_gpt_parallel_on_gpus_matches_one_gpu(gpu_reference, nprocs, dp, tp):
    """The same layers on CUDA placements, one GPU per rank (the CuPy double and its NCCL)."""
    rc, out, err = run_mpi(nprocs, "gpt_parallel.py", [gpu_reference, dp, tp, "cuda"], timeout=300,
                           env=gpu_env(nprocs))
    assert f"gpt_parallel OK dp={dp} tp={tp} on cuda" in out, out + err
    print(out.strip().splitlines()[-1])


def test_divisibility_errors_name_the_sizes():
    from libai.layers import Linear, MultiheadAttention, VocabEmbedding
    from libai.utils import distributed as dist

    dist._DIST_UTIL = dist.DistributedTopology(tensor_parallel_size=2, world_size=2, rank=0)
    try:
        with pytest.raises(ValueError, match=r"num_attention_heads \(3\).*tensor_parallel_size \(2\)"):
            MultiheadAttention(48, 3)
        with pytest.raises(ValueError, match=r"out_features \(5\).*tensor_parallel_size \(2\)"):
            Linear(4, 5, parallel="col")
        with pytest.raises(ValueError, match=r"in_features \(5\)"):
            Linear(5, 4, parallel="row")
        with pytest.raises(ValueError, match=r"vocab size\) \(101\)"):
            VocabEmbedding(101, 8)
    finally:
        dist._reset_dist_util()
    with pytest.raises(ValueError, match=r"world size 4 is not divisible by tensor_parallel_size \* "
                                         r"pipeline_parallel_size = 3 \* 1"):
        dist.DistributedTopology(tensor_parallel_size=3, world_size=4, rank=0)
