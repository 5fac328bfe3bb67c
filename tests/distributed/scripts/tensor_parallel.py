"""Tensor-parallel pieces on global tensors, checked on every rank (run under mpiexec).

    python -m engine.distributed.run tensor_parallel.py SECTION...

Sections: `embedding` (vocab-parallel embedding vs torch, 1-D placement and a mesh axis of
the 2x2 mesh), `ce` (vocab-parallel cross-entropy vs torch, with the communication check),
`mlp` (Megatron MLP on the 2x2 mesh trained with SGD vs the single-process engine run, and
with gradient accumulation). Any failed assert aborts the whole job. With ENGINE_TEST_DEVICE=cuda
the placements are CUDA ones (one GPU per rank; collectives over NCCL).
"""
import os
import sys

import numpy as np
import torch

import engine as flow
from engine.distributed import comm, sbp as S

F = flow.nn.functional
R, N = comm.get_rank(), comm.get_world_size()
B, P = S.broadcast, S.partial_sum
DEV = os.environ.get("ENGINE_TEST_DEVICE", "cpu")
ALL = flow.placement(DEV, list(range(N)))


def close(a, b, what, rtol=1e-5, atol=1e-6):
    a = a.detach().cpu().numpy() if hasattr(a, "detach") else np.asarray(a)
    b = b.detach().cpu().numpy() if hasattr(b, "detach") else np.asarray(b)
    assert a.shape == b.shape, f"{what}: shape {a.shape} != {b.shape}"
    assert np.allclose(a, b, rtol=rtol, atol=atol), f"{what}: max abs diff {np.abs(a - b).max()}"


def rel_diff(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


# ------------------------------------------------------------------ vocab-parallel embedding
def check_embedding(placement, ids_sbp, w_sbp, out_sbp, V, D, ids_shape, padding_idx, seed):
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((V, D)).astype(np.float32)
    ids_np = rng.integers(0, V, size=ids_shape)
    ids_np.reshape(-1)[:4] = ids_np.reshape(-1)[0]  # repeated ids
    if padding_idx is not None:
        ids_np.reshape(-1)[5:7] = padding_idx % V
    G = rng.standard_normal(ids_shape + (D,)).astype(np.float32)

    ids = flow.tensor(ids_np, placement=placement, sbp=ids_sbp)
    w = flow.tensor(W, placement=placement, sbp=w_sbp, requires_grad=True)
    with comm.stats.recording() as rec:
        out = F.embedding(ids, w, padding_idx=padding_idx)
    assert out.sbp == out_sbp, f"embedding output sbp {out.sbp}, expected {out_sbp}"
    assert rec.bytes_of("all_gather") == 0, f"the table was gathered: {rec.calls}"
    (out * flow.tensor(G, placement=placement, sbp=(B,) * placement.ndim)).sum().backward()
    assert w.grad.sbp == w.sbp, (w.grad.sbp, w.sbp)

    tw = torch.tensor(W, requires_grad=True)
    tout = torch.nn.functional.embedding(torch.tensor(ids_np), tw, padding_idx=padding_idx)
    (tout * torch.tensor(G)).sum().backward()
    what = f"embedding V={V} ids {ids_sbp} w {w_sbp} pad={padding_idx}"
    close(out, tout, what)
    close(w.grad, tw.grad, what + " grad")


def test_embedding():
    # 1-D placements: uneven vocab (11 rows over 4 ranks: 3,3,3,2), repeated ids, padding_idx
    for V, pad in ((11, None), (11, 3), (11, -1), (16, 0)):
        check_embedding(ALL, (B,), (S.split(0),), (P,), V, 5, (3, 7), pad, seed=V + (pad or 0))
    # ids split on the batch too: the cheaper layout is chosen, the values are the same
    rng = np.random.default_rng(1)
    W = rng.standard_normal((11, 4)).astype(np.float32)
    ids_np = rng.integers(0, 11, size=(N * 2, 3))
    ids = flow.tensor(ids_np, placement=ALL, sbp=S.split(0))
    w = flow.tensor(W, placement=ALL, sbp=S.split(0), requires_grad=True)
    out = F.embedding(ids, w, padding_idx=2)
    out.sum().backward()
    tw = torch.tensor(W, requires_grad=True)
    torch.nn.functional.embedding(torch.tensor(ids_np), tw, padding_idx=2).sum().backward()
    close(out, torch.tensor(W)[torch.tensor(ids_np)], "embedding ids S(0) x w S(0)")
    close(w.grad, tw.grad, "embedding ids S(0) x w S(0) grad")
    # table split on the embedding dim: the plain kernel on column shards
    check_embedding(ALL, (B,), (S.split(1),), (S.split(2),), 11, 2 * N, (3, 7), 4, seed=7)
    if N == 4:  # a mesh axis of the 2x2 mesh: ids batch-split on axis 0, vocab split on axis 1
        mesh = flow.placement(DEV, [[0, 1], [2, 3]])
        for V, pad in ((11, None), (11, 5)):
            check_embedding(mesh, (S.split(0), B), (B, S.split(0)), (S.split(0), P), V, 6, (4, 5), pad, seed=3)
    if R == 0:
        print(f"embedding OK on {N} ranks")


# ------------------------------------------------------------------ vocab-parallel cross-entropy
def check_ce(placement, x_sbp, t_sbp, X, T, G, **kw):
    x = flow.tensor(X, placement=placement, sbp=x_sbp, requires_grad=True)
    t = flow.tensor(T, placement=placement, sbp=t_sbp)
    with comm.stats.recording() as rec:
        loss = F.cross_entropy(x, t, **kw)
        if kw.get("reduction") == "none":
            (loss * flow.tensor(G, placement=placement, sbp=(B,) * placement.ndim)).sum().backward()
        else:
            loss.backward()
    assert x.grad.sbp == x.sbp, (x.grad.sbp, x.sbp)
    tx = torch.tensor(X, requires_grad=True)
    tl = torch.nn.functional.cross_entropy(tx, torch.tensor(T), **kw)
    (tl * torch.tensor(G)).sum().backward() if kw.get("reduction") == "none" else tl.backward()
    what = f"cross_entropy {X.shape} x {x_sbp} {kw}"
    close(loss, tl, what, rtol=1e-5, atol=1e-5)
    close(x.grad, tx.grad, what + " grad", rtol=1e-5, atol=1e-6)
    return rec


def test_cross_entropy():
    rng = np.random.default_rng(0)
    n, c = 12, 37  # 37 classes over 4 ranks: 10, 9, 9, 9
    X = (rng.standard_normal((n, c)) * 3).astype(np.float32)
    T = rng.integers(0, c, size=n)
    T[2] = T[7] = -100
    G = rng.standard_normal(n).astype(np.float32)
    for red in ("mean", "sum", "none"):
        for eps in (0.0, 0.1):
            check_ce(ALL, (S.split(1),), (B,), X, T, G, reduction=red, label_smoothing=eps)
    T5 = T.copy()
    T5[T5 < 0] = 5
    check_ce(ALL, (S.split(-1),), (B,), X, T5, G, ignore_index=5, label_smoothing=0.1)
    # rows split too (the decomposition is generic), and [N, C, d] logits split on classes
    check_ce(ALL, (S.split(0),), (S.split(0),), X, T, G, label_smoothing=0.1)
    X3 = rng.standard_normal((3, c, 4)).astype(np.float32)
    T3 = rng.integers(0, c, size=(3, 4))
    T3[0, 1] = -100
    check_ce(ALL, (S.split(1),), (B,), X3, T3, rng.standard_normal((3, 4)).astype(np.float32),
             reduction="none", label_smoothing=0.1)
    if N == 4:  # 2x2 mesh: rows data-parallel on axis 0, classes tensor-parallel on axis 1
        mesh = flow.placement(DEV, [[0, 1], [2, 3]])
        for red in ("mean", "none"):
            check_ce(mesh, (S.split(0), S.split(1)), (S.split(0), B), X, T, G, reduction=red, label_smoothing=0.1)

    # communication: O(rows), never the logits
    n, c = 16, 4096
    X = rng.standard_normal((n, c)).astype(np.float32)
    T = rng.integers(0, c, size=n)
    T[0] = -100
    G = np.zeros(n, np.float32)
    rec = check_ce(ALL, (S.split(1),), (B,), X, T, G, label_smoothing=0.1)
    logits_bytes = n * c * 4
    assert rec.bytes_of("all_gather") == 0 and rec.bytes_of("all_to_all") == 0, rec.calls
    assert rec.total_bytes <= 16 * n * 4, (rec.total_bytes, rec.calls)  # a few all-reduces of n floats
    if R == 0:
        print(f"cross_entropy OK on {N} ranks: {rec.total_bytes} bytes sent per rank "
              f"({len(rec.calls)} collectives) for {logits_bytes} bytes of logits")


# ------------------------------------------------------------------ Megatron MLP on the 2x2 mesh
D_IN, HID, D_OUT, BATCH, STEPS, LR = 8, 16, 8, 8, 20, 0.1


def mlp_data():
    rng = np.random.default_rng(42)
    init = dict(
        w1=(rng.standard_normal((HID, D_IN)) / np.sqrt(D_IN)).astype(np.float32),
        b1=(rng.standard_normal(HID) * 0.1).astype(np.float32),
        w2=(rng.standard_normal((D_OUT, HID)) / np.sqrt(HID)).astype(np.float32),
        b2=(rng.standard_normal(D_OUT) * 0.1).astype(np.float32),
    )
    X = rng.standard_normal((STEPS, BATCH, D_IN)).astype(np.float32)
    Y = rng.standard_normal((STEPS, BATCH, D_OUT)).astype(np.float32)
    return init, X, Y


def mlp(x, p):
    return F.linear(F.gelu(F.linear(x, p["w1"], p["b1"])), p["w2"], p["b2"])


def train(params, batches, micro=1, sync=None, lamb_clip=False):
    """SGD steps; each step's batch in `micro` micro-batches (loss scaled by 1/micro).
    `lamb_clip`: LAMB with clip_grad_norm_ instead (norms of sharded tensors are global)."""
    if lamb_clip:
        opt = flow.optim.LAMB(list(params.values()), lr=0.01, weight_decay=0.01)
    else:
        opt = flow.optim.SGD(list(params.values()), lr=LR)
    losses = []
    for xs, ys in batches:
        opt.zero_grad()
        total = 0.0
        ctx = flow.distributed.no_grad_sync() if sync else _null()
        with ctx:
            for x, y in zip(xs, ys):
                loss = F.mse_loss(mlp(x, params), y) / micro
                loss.backward()
                total += loss.item()
        if sync:
            # deferred: data-parallel gradients are still partial sums (no all-reduce per micro-batch)
            assert params["w1"].grad.sbp == (P, S.split(0)), params["w1"].grad.sbp
            flow.distributed.sync_grads(params.values())
            assert all(p.grad.sbp == p.sbp for p in params.values())
        if lamb_clip:
            norm = flow.nn.utils.clip_grad_norm_(list(params.values()), max_norm=0.5)
            losses.append(float(norm.item()))
        opt.step()
        losses.append(total)
    return losses


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def test_mlp():
    assert N == 4
    mesh = flow.placement(DEV, [[0, 1], [2, 3]])
    layout = dict(w1=(B, S.split(0)), b1=(B, S.split(0)), w2=(B, S.split(1)), b2=(B, B))
    data_sbp = (S.split(0), B)
    init, X, Y = mlp_data()

    for micro, lamb_clip in ((1, False), (2, False), (1, True)):
        local = {k: flow.tensor(v, requires_grad=True) for k, v in init.items()}
        glob = {k: flow.tensor(v, placement=mesh, sbp=layout[k], requires_grad=True) for k, v in init.items()}

        def batches(as_global):
            for s in range(STEPS if micro == 1 and not lamb_clip else 10):
                xs = np.split(X[s], micro)
                ys = np.split(Y[s], micro)
                if as_global:
                    yield ([flow.tensor(a, placement=mesh, sbp=data_sbp) for a in xs],
                           [flow.tensor(a, placement=mesh, sbp=data_sbp) for a in ys])
                else:
                    yield [flow.tensor(a) for a in xs], [flow.tensor(a) for a in ys]

        ref = train(local, batches(False), micro, lamb_clip=lamb_clip)
        got = train(glob, batches(True), micro, sync=micro > 1, lamb_clip=lamb_clip)
        for k in layout:
            assert glob[k].sbp == layout[k], (k, glob[k].sbp)
        worst = max(rel_diff(a, b) for a, b in zip(got, ref))
        what = f"micro={micro}" + (" LAMB+clip" if lamb_clip else "")
        assert worst <= 1e-5, f"{what}: step losses (and grad norms) differ (rel {worst}): {got} vs {ref}"
        for k in init:
            d = rel_diff(glob[k].detach().cpu().numpy(), local[k].detach().cpu().numpy())
            assert d <= 1e-5, f"{what}: final {k} differs (rel {d})"
        if R == 0:
            losses = ref[1::2] if lamb_clip else ref  # LAMB+clip lists (grad norm, loss) per step
            print(f"mlp OK ({what}): losses {losses[0]:.5f} -> {losses[-1]:.5f}, max rel diff {worst:.2e}"
                  + (f", clipped grad norms {ref[0]:.3f} -> {ref[-2]:.3f}" if lamb_clip else ""))


if __name__ == "__main__":
    for name in sys.argv[1:] or ("embedding", "ce"):
        {"embedding": test_embedding, "ce": test_cross_entropy, "mlp": test_mlp}[name]()
    if R == 0:
        print(f"tensor_parallel OK on {N} ranks")
