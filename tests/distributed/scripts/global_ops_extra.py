"""Global-tensor checks that the parity matrix cannot make (run on 2 or 4 ranks, 1-D placement).

1. Byte efficiency of GPT-style attention on batch-split (S(0)) data with broadcast weights:
   linear -> reshape -> permute -> matmul -> scale -> masked_fill -> softmax -> matmul ->
   permute -> reshape -> linear. comm.stats must show a forward that moves zero bytes (every
   op keeps the batch split) and a backward whose only collectives are the all-reduces of the
   weight gradients. Values and gradients are checked against PyTorch.
2. Dropout on split data: each rank draws the mask of its own shard (rules.DropoutRule): values
   are 0 or x/(1-p), the kept fraction is about 1-p, shards get different masks, the gradient
   is the upstream gradient times the mask. (Not bitwise equal to a single-process run.)
"""
import numpy as np
import torch

import engine as flow
from engine.distributed import comm
from engine.distributed import sbp as SBP

F = flow.nn.functional
rank, world = comm.get_rank(), comm.get_world_size()
pl = flow.placement("cpu", list(range(world)))
B, S0 = SBP.broadcast, SBP.split(0)
rng = np.random.default_rng(0)

# ------------------------------------------------------------------ 1. attention bytes
Bt, T, C, H = 2 * world, 8, 16, 4
D = C // H
X = rng.standard_normal((Bt, T, C)).astype(np.float32)
Ws = {n: (rng.standard_normal((C, C)) * 0.2).astype(np.float32) for n in ("q", "k", "v", "o")}
bs = {n: (rng.standard_normal(C) * 0.1).astype(np.float32) for n in ("q", "k", "v", "o")}
MASK = ~np.tril(np.ones((T, T), dtype=bool))


def attention(m, x, W, b, mask, to_heads, from_heads):
    q, k, v = (to_heads(m.nn.functional.linear(x, W[n], b[n])) for n in ("q", "k", "v"))
    att = q.matmul(k.transpose(-2, -1)) * (1.0 / D ** 0.5)
    att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
    return m.nn.functional.linear(from_heads(att.matmul(v)), W["o"], b["o"])


def to_heads(t):
    return t.reshape(Bt, T, H, D).permute(0, 2, 1, 3)


def from_heads(t):
    return t.permute(0, 2, 1, 3).reshape(Bt, T, C)


x = flow.tensor(X, placement=pl, sbp=S0)
W = {n: flow.tensor(w, placement=pl, sbp=B, requires_grad=True) for n, w in Ws.items()}
b = {n: flow.tensor(v, placement=pl, sbp=B, requires_grad=True) for n, v in bs.items()}
mask = flow.tensor(MASK, placement=pl, sbp=B)
with comm.stats.recording() as fwd:
    y = attention(flow, x, W, b, mask, to_heads, from_heads)
    loss = (y * y).sum()
assert y.sbp == (S0,), f"attention output should stay batch-split, got {y.sbp}"
assert fwd.total_bytes == 0, f"forward moved bytes: {fwd.calls}"
with comm.stats.recording() as bwd:
    loss.backward()
names = {n for n, _ in bwd.calls}
n_params = len(W) + len(b)
assert names == {"all_reduce"}, f"backward collectives other than the weight all-reduces: {bwd.calls}"
assert len(bwd.calls) == n_params, f"expected {n_params} all-reduces (one per parameter), got {bwd.calls}"
expect = sum(2 * (world - 1) * a.nbytes // world for a in list(Ws.values()) + list(bs.values()))
assert bwd.total_bytes == expect, (bwd.total_bytes, expect)

tx = torch.tensor(X)
tW = {n: torch.tensor(w, requires_grad=True) for n, w in Ws.items()}
tb = {n: torch.tensor(v, requires_grad=True) for n, v in bs.items()}
ty = attention(torch, tx, tW, tb, torch.tensor(MASK), to_heads, from_heads)
(ty * ty).sum().backward()
np.testing.assert_allclose(y.detach().numpy(), ty.detach().numpy(), rtol=1e-4, atol=1e-4)
for n in Ws:
    np.testing.assert_allclose(W[n].grad.numpy(), tW[n].grad.numpy(), rtol=1e-3, atol=1e-3, err_msg=f"W{n}")
    np.testing.assert_allclose(b[n].grad.numpy(), tb[n].grad.numpy(), rtol=1e-3, atol=1e-3, err_msg=f"b{n}")
if rank == 0:
    print(f"attention bytes OK: forward 0 bytes, backward {len(bwd.calls)} all-reduces, {bwd.total_bytes} bytes")

# ------------------------------------------------------------------ 2. dropout on split data
flow.manual_seed(1234)  # generators seeded alike on every rank (the documented requirement)
p = 0.25
ones = flow.ones(world * 64, 32, placement=pl, sbp=S0, requires_grad=True)
out = F.dropout(ones, p=p, training=True)
assert out.sbp == (S0,), out.sbp
vals = out.detach().numpy()
assert np.all((vals == 0) | np.isclose(vals, 1 / (1 - p))), np.unique(vals)
kept = float((vals != 0).mean())
assert abs(kept - (1 - p)) < 0.05, kept
shards = vals.reshape(world, 64, 32)
assert all(not np.array_equal(shards[0], shards[i]) for i in range(1, world)), "shards drew the same mask"
g = rng.standard_normal(vals.shape).astype(np.float32)
out.backward(flow.tensor(g, placement=pl, sbp=B))
np.testing.assert_allclose(ones.grad.numpy(), g * vals, rtol=1e-6)
if rank == 0:
    print(f"dropout on S(0) OK: kept {kept:.3f}")
    print("global ops extra OK")
