"""Tensor parallelism on global tensors, run for real under mpiexec: vocab-parallel embedding
and cross-entropy (vs PyTorch, with a check that the logits are never gathered) on 2 and 4
ranks, and a Megatron MLP (dp x tp on a 2x2 mesh) trained with SGD, with and without gradient
accumulation (no_grad_sync + sync_grads), and with LAMB + clip_grad_norm_ (norms of sharded
tensors), against the single-process engine run. Bodies: scripts/tensor_parallel.py."""
import pytest

from mpi_helper import run_mpi


@pytest.mark.parametrize("nprocs", [2, 4])
def test_vocab_parallel_embedding_and_cross_entropy(nprocs):
    rc, out, err = run_mpi(nprocs, "tensor_parallel.py", ["embedding", "ce"])
    assert f"embedding OK on {nprocs} ranks" in out
    assert f"cross_entropy OK on {nprocs} ranks" in out


def test_megatron_mlp_2x2_mesh():
    rc, out, err = run_mpi(4, "tensor_parallel.py", ["mlp"])
    for what in ("micro=1)", "micro=2)", "micro=1 LAMB+clip)"):
        assert f"mlp OK ({what}" in out, what


def test_parallel_kernels_on_local_tensors():
    """The masked kernels on plain tensors: a shard's lookups sum to the full lookup."""
    import numpy as np
    import torch

    import engine as flow
    from engine.ops.indexing import VocabParallelEmbedding
    from engine.ops.loss import TargetGather

    rng = np.random.default_rng(0)
    W = rng.standard_normal((11, 3)).astype(np.float32)
    ids = rng.integers(0, 11, size=(4, 5))
    ids[0, :3] = 7
    total = 0
    grads = []
    for start, stop in ((0, 3), (3, 6), (6, 9), (9, 11)):
        w = flow.tensor(W[start:stop], requires_grad=True)
        out = VocabParallelEmbedding.apply(flow.tensor(ids), w, padding_idx=7, start=start, stop=stop)
        out.sum().backward()
        total = total + out.detach().numpy()
        grads.append(w.grad.numpy())
    tw = torch.tensor(W, requires_grad=True)
    torch.nn.functional.embedding(torch.tensor(ids), tw, padding_idx=7).sum().backward()
    assert np.allclose(total, W[ids])
    assert np.allclose(np.concatenate(grads), tw.grad.numpy())

    X = rng.standard_normal((6, 10)).astype(np.float32)
    T = np.array([0, 4, 9, -100, 5, 3])
    parts = 0
    for start in (0, 5):
        x = flow.tensor(X[:, start:start + 5], requires_grad=True)
        v = TargetGather.apply(x, flow.tensor(T), axis=1, start=start)
        (v * flow.tensor(np.arange(6, dtype=np.float32))).sum().backward()
        parts = parts + v.detach().numpy()
        g = np.zeros((6, 10), np.float32)
        ok = (T >= start) & (T < start + 5)
        g[np.arange(6)[ok], T[ok]] = np.arange(6, dtype=np.float32)[ok]
        assert np.allclose(x.grad.numpy(), g[:, start:start + 5])
    ok = T >= 0
    assert np.allclose(parts[ok], X[np.arange(6)[ok], T[ok]]) and (parts[~ok] == 0).all()
