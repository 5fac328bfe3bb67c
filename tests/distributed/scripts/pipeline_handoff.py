"""engine.distributed.pipeline on 4 ranks as 2 stages of a 2-rank mesh: a shard goes to the rank
at the same mesh coordinates with its SBP, the received leaf's gradient comes back and flows
into the sender's graph, stand-ins replace a tensor of another stage, and stage-local execution
refuses an op on a tensor this rank does not hold. With ENGINE_TEST_DEVICE=cuda the stages are
CUDA placements (one GPU per rank; the handoffs go over NCCL)."""
import os

import numpy as np

import engine as flow
from engine.distributed import pipeline
from engine.distributed import sbp as S

r = flow.env.get_rank()
assert flow.env.get_world_size() == 4
DEV = os.environ.get("ENGINE_TEST_DEVICE", "cpu")
stage0, stage1 = flow.placement(DEV, [0, 1]), flow.placement(DEV, [2, 3])
here = stage0 if r < 2 else stage1
rng = np.random.default_rng(3)
X = rng.standard_normal((4, 6)).astype(np.float32)
W = rng.standard_normal((6, 6)).astype(np.float32)

assert pipeline.peer(0, stage0, stage1) == 2 and pipeline.peer(3, stage1, stage0) == 1

# forward: stage 0 computes y = x @ w split on the batch and hands y over; stage 1 squares and sums it
if r < 2:
    w = flow.tensor(W, placement=stage0, sbp=S.broadcast, requires_grad=True)
    x = flow.tensor(X, placement=stage0, sbp=S.split(0))
    y = flow.matmul(x, w)
    reqs = pipeline.send(y, stage1, tag=5)
    g = pipeline.recv(stage1, stage0, tag=6)  # d(loss)/dy, split like y
    assert g.sbp == (S.split(0),) and tuple(g.shape) == (4, 6) and not g.requires_grad
    flow.autograd.backward([y], [g])
    for q in reqs:
        q.wait()
    grad_w = w.grad.to_global(sbp=S.broadcast).to_local().cpu().numpy()
    np.testing.assert_allclose(grad_w, X.T @ (2 * X @ W), rtol=1e-5, atol=1e-5)
else:
    y = pipeline.recv(stage0, stage1, tag=5)
    assert y.sbp == (S.split(0),) and tuple(y.shape) == (4, 6) and y.requires_grad and y.is_leaf
    np.testing.assert_allclose(y.detach().to_local().cpu().numpy(), np.split(X @ W, 2)[r - 2], rtol=1e-5)
    (y * y).sum().backward()
    for q in pipeline.send(y.grad, stage0, tag=6):
        q.wait()

# stand-ins: a stage-0 parameter used on stage 1 through its copy
p = flow.tensor(W, placement=stage0, sbp=S.broadcast, requires_grad=True)
if r >= 2:
    copy = flow.tensor(W * 2, placement=stage1, sbp=S.broadcast, requires_grad=True)
    with pipeline.stand_ins({p: copy}):
        moved = p.to_global(placement=stage1, sbp=S.broadcast)
    np.testing.assert_allclose(moved.detach().to_local().cpu().numpy(), W * 2)

# two stages trading two tensors each at once (a float and an int64 mask), the sends held to go
# with the receives (Megatron's crossing pairs; on GPUs one NCCL group: launched one by one, each
# stage's first send would wait for a receive queued behind the other's)
there = stage1 if r < 2 else stage0
a = flow.tensor(np.full((2, 3), r, np.float32), placement=here, sbp=S.split(0))
b = flow.tensor(np.full((4,), 10 + r, np.int64), placement=here, sbp=S.broadcast)
reqs = pipeline.send(a, there, tag=8, launch=False) + pipeline.send(b, there, tag=8, launch=False)
got_a, got_b = pipeline.recv_many(there, here, 2, tag=8)
pipeline.wait(reqs)
peer_r = pipeline.peer(r, here, there)
assert got_a.sbp == (S.split(0),) and got_b.dtype == flow.int64, (got_a.sbp, got_b.dtype)
assert np.all(got_a.to_local().cpu().numpy() == peer_r) and np.all(got_b.to_local().cpu().numpy() == 10 + peer_r)

# stage-local execution: an op on another stage's tensor is an error, not an empty result
other = flow.tensor(X, placement=stage1 if r < 2 else stage0, sbp=S.broadcast)
with pipeline.stage_local():
    try:
        other + 1
    except RuntimeError as e:
        assert "does not hold" in str(e) and "stage" in str(e), e
    else:
        raise AssertionError("stage_local did not refuse an op on another stage's tensor")
print(f"rank {r}: pipeline handoff ok")
