"""Gradients at the edges of global tensors, on 2 (and 4) ranks:
local <-> global casts use the dual SBP in backward (S <-> S, B -> P, P -> B), grad_sbp, and
deferred gradient sync (no_grad_sync / sync_grads)."""
import numpy as np

import engine as flow
from engine.distributed import comm, no_grad_sync, sync_grads
from engine.distributed import sbp as S

r = flow.env.get_rank()
n = flow.env.get_world_size()
P = flow.placement("cpu", list(range(n)))
rng = np.random.default_rng(5)


def local_to_global_grads():
    G = rng.standard_normal((4 * n, 3 * n)).astype(np.float32)
    g = flow.tensor(G, placement=P, sbp=S.broadcast)
    # S(a): each rank's local gradient is its slice of the logical gradient
    for a in (0, 1):
        shard = np.split(G, n, axis=a)[r]
        loc = flow.tensor(np.ones_like(shard), requires_grad=True)
        y = loc.to_global(P, S.split(a))
        assert tuple(y.shape) == G.shape
        (y * g).sum().backward()
        assert np.allclose(loc.grad.numpy(), shard), ("S", a)
    # B: dual P -- rank 0 of the axis gets the gradient, the others zeros (they sum to it)
    loc = flow.tensor(np.ones(G.shape, np.float32), requires_grad=True)
    (loc.to_global(P, S.broadcast) * g).sum().backward()
    assert np.allclose(loc.grad.numpy(), G if r == 0 else 0), "B"
    # P: dual B -- every rank's summand gets the whole gradient
    loc = flow.tensor(np.full(G.shape, float(r), np.float32), requires_grad=True)
    y = loc.to_global(P, S.partial_sum)
    assert np.allclose(y.detach().numpy(), sum(range(n)))
    (y * g).sum().backward()
    assert np.allclose(loc.grad.numpy(), G), "P"


def to_local_grads():
    A = rng.standard_normal((2 * n, 4)).astype(np.float32)
    mine = rng.standard_normal((n, 2 * n, 4)).astype(np.float32)  # every rank draws all, uses its own
    # S(0): the local gradients are the shards of the leaf's gradient
    x = flow.tensor(A, placement=P, sbp=S.split(0), requires_grad=True)
    gl = np.split(mine[0], n, axis=0)[r]
    (x.to_local() * flow.tensor(gl)).sum().backward()
    assert x.grad.sbp == (S.split(0),)
    assert np.allclose(x.grad.numpy(), mine[0]), "to_local S"
    # B: dual P -- the logical gradient is the sum of the ranks' local gradients
    x = flow.tensor(A, placement=P, sbp=S.broadcast, requires_grad=True)
    (x.to_local() * flow.tensor(mine[r])).sum().backward()
    assert x.grad.sbp == (S.broadcast,)
    assert np.allclose(x.grad.numpy(), mine.sum(0), atol=1e-5), "to_local B"
    # P: dual B -- each summand's gradient is the (common) local gradient
    x = flow.tensor(A, placement=P, sbp=S.partial_sum, requires_grad=True)
    (x.to_local() * flow.tensor(mine[0])).sum().backward()
    assert x.grad.sbp == (S.partial_sum,)
    assert np.allclose(x.grad.numpy(), mine[0], atol=1e-5), "to_local P"
    # round trip global -> local -> global keeps the gradient of the identity
    x = flow.tensor(A, placement=P, sbp=S.broadcast, requires_grad=True)
    y = x.to_global(sbp=S.split(1)).to_local().to_global(P, S.split(1))
    (y * flow.tensor(mine[1], placement=P, sbp=S.broadcast)).sum().backward()
    assert np.allclose(x.grad.numpy(), mine[1], atol=1e-5), "round trip"


def grad_sbp():
    """Megatron's f: identity forward, all-reduce backward (B kept, gradient pinned to P -> B)."""
    A = rng.standard_normal((4, 2 * n)).astype(np.float32)
    W = rng.standard_normal((2 * n, 3)).astype(np.float32)
    x = flow.tensor(A, placement=P, sbp=S.broadcast, requires_grad=True)
    w = flow.tensor(W, placement=P, sbp=S.split(0))
    with comm.stats.recording() as st:
        y = x.to_global(sbp=S.split(1), grad_sbp=S.partial_sum)  # gradient arrives S(1), goes P -> B
        out = flow.matmul(y, w)  # S(1) x S(0) -> P
        out.sum().backward()
    assert np.allclose(x.grad.numpy(), np.ones((4, 3), np.float32) @ W.T, atol=1e-5)
    assert x.grad.sbp == (S.broadcast,)
    assert st.bytes_of("all_reduce") > 0
    # f on a non-leaf B activation: the P gradient of a column-parallel matmul is all-reduced
    # inside the conversion's backward (same sbp forward: an identity that still records)
    w1 = flow.tensor(W.T.copy(), placement=P, sbp=S.split(1))  # (3, 2n), columns split
    x = flow.tensor(A.T[:3].copy(), placement=P, sbp=S.broadcast, requires_grad=True)  # (3, 4), B
    h = x * 1.0
    f = h.to_global(sbp=S.broadcast, grad_sbp=S.broadcast)
    assert f is not h and f.sbp == (S.broadcast,)
    out = flow.matmul(f.T, w1)  # B x S(1) -> S(1)
    with comm.stats.recording() as st:
        out.sum().backward()
    assert st.bytes_of("all_reduce") > 0
    assert np.allclose(x.grad.numpy(), (np.ones((4, 2 * n), np.float32) @ W).T, atol=1e-5)


def deferred_sync():
    """A B parameter used on S(0) data: P gradients accumulate over 3 micro-batches without any
    all_reduce; sync_grads makes the gradient B and equal to the single-process sum."""
    Wn = rng.standard_normal((5, 3)).astype(np.float32)
    Xs = [rng.standard_normal((4 * n, 5)).astype(np.float32) for _ in range(3)]
    w = flow.tensor(Wn, placement=P, sbp=S.broadcast, requires_grad=True)
    with comm.stats.recording() as st:
        with no_grad_sync():
            for X in Xs:
                x = flow.tensor(X, placement=P, sbp=S.split(0))
                y = flow.matmul(x, w)
                (y * y).sum().backward()
                assert w.grad.sbp == (S.partial_sum,), w.grad.sbp
    assert st.bytes_of("all_reduce") == 0, st.calls
    assert st.total_bytes == 0, st.calls  # nothing moves at all until sync_grads
    ref = sum(2 * X.T @ (X @ Wn) for X in Xs)
    assert np.allclose(w.grad.numpy(), ref, rtol=1e-4, atol=1e-4)  # .numpy() reduces for the check only
    with comm.stats.recording() as st:
        sync_grads([w])
    assert w.grad.sbp == (S.broadcast,)
    assert st.bytes_of("all_reduce") == 2 * (n - 1) * Wn.nbytes // n, st.calls
    assert np.allclose(w.grad.to_local().numpy(), ref, rtol=1e-4, atol=1e-4)
    # without the context: synced at every backward (one all_reduce per micro-batch)
    w2 = flow.tensor(Wn, placement=P, sbp=S.broadcast, requires_grad=True)
    with comm.stats.recording() as st:
        for X in Xs:
            x = flow.tensor(X, placement=P, sbp=S.split(0))
            (flow.matmul(x, w2) ** 2).sum().backward()
            assert w2.grad.sbp == (S.broadcast,)
    assert st.bytes_of("all_reduce") >= 3 * 2 * (n - 1) * Wn.nbytes // n
    assert np.allclose(w2.grad.to_local().numpy(), ref, rtol=1e-4, atol=1e-4)


def mixed_deferred_and_synced_accumulation():
    """Gradient accumulation as a hand-written loop may do it: the first micro-batches deferred (partial
    sums), the last synced (all-reduced), and the other way round. Accumulating adds shards, so
    the accumulated gradient must first take the incoming one's layout (regression: a synced
    gradient added to a partial one was counted once per rank)."""
    Wn = rng.standard_normal((3, 2)).astype(np.float32)
    Xs = [rng.standard_normal((2 * n, 3)).astype(np.float32) for _ in range(3)]
    ref = sum(2 * X.T @ (X @ Wn) for X in Xs)
    for deferred in ([True, True, False], [False, True, True], [True, False, True]):
        w = flow.tensor(Wn, placement=P, sbp=S.broadcast, requires_grad=True)
        for X, d in zip(Xs, deferred):
            x = flow.tensor(X, placement=P, sbp=S.split(0))
            if d:
                with no_grad_sync():
                    (flow.matmul(x, w) ** 2).sum().backward()
            else:
                (flow.matmul(x, w) ** 2).sum().backward()
        sync_grads([w])
        assert w.grad.sbp == (S.broadcast,)
        assert np.allclose(w.grad.to_local().numpy(), ref, rtol=1e-4, atol=1e-4), deferred


def bucketed_sync():
    """sync_grads packs the gradients that wait only for a sum where their parameter is broadcast
    into one all-reduce per (placement, mesh axes, dtype) bucket, up to GRAD_BUCKET_BYTES, and
    gives every parameter its own slice of the sum in its own layout; other pending conversions
    (a split parameter's partial gradient: a reduce-scatter) are boxed one by one."""
    from engine.distributed import global_tensor

    meshes = [(P, [(S.broadcast,)], [(S.partial_sum,)])]
    if n == 4:
        mesh2 = flow.placement("cpu", [[0, 1], [2, 3]])
        meshes.append((mesh2, [(S.broadcast, S.broadcast)], [(S.partial_sum, S.partial_sum),
                                                              (S.partial_sum, S.broadcast)]))
    for placement_, own_sbps, grad_sbps in meshes:
        for own_sbp in own_sbps:
            for grad_sbp in grad_sbps:
                shapes = [((5, 3), np.float32), ((7,), np.float32), ((4, 2), np.float16), ((3, 1, 2), np.float32)]
                params, refs = [], []
                for shape, dtype in shapes:
                    w = flow.tensor(np.zeros(shape, dtype), placement=placement_, sbp=own_sbp, requires_grad=True)
                    # every rank draws every rank's local gradient, keeps its own: the sum is known
                    parts = [rng.standard_normal(shape).astype(dtype) for _ in range(n)]
                    mine = parts[r] if all(s.is_partial for s in grad_sbp) else None
                    if mine is None:  # partial on axis 0 only: the ranks of a column hold the same part
                        c = placement_.coords(r)
                        mine = parts[c[0]]
                        ref = sum(parts[i] for i in range(placement_.hierarchy[0]))
                    else:
                        ref = sum(parts)
                    w.grad = flow.tensor(mine).to_global(placement_, grad_sbp)
                    params.append(w)
                    refs.append(ref)
                # a split parameter whose gradient is a partial sum: not bucketed (P -> S)
                ws = flow.tensor(np.zeros((2 * n, 3), np.float32), placement=placement_,
                                 sbp=[S.split(0)] * placement_.ndim, requires_grad=True)
                parts = [rng.standard_normal((2 * n, 3)).astype(np.float32) for _ in range(n)]
                ws.grad = flow.tensor(parts[r]).to_global(placement_, [S.partial_sum] * placement_.ndim)
                with comm.stats.recording() as st:
                    sync_grads(params + [ws])
                axes = sum(1 for a, b in zip(own_sbp, grad_sbp) if a != b and placement_.hierarchy[0] > 1)
                reduces = [c for c in st.calls if c[0] == "all_reduce"]
                # one float32 bucket and one float16 bucket, each reduced once per summed mesh axis
                assert len(reduces) == 2 * axes, (placement_, grad_sbp, st.calls)
                for w, ref, (shape, dtype) in zip(params, refs, shapes):
                    assert w.grad.sbp == tuple(own_sbp) and w.grad.dtype == w.dtype, (w.grad.sbp, w.grad.dtype)
                    tol = 1e-2 if dtype == np.float16 else 1e-5
                    np.testing.assert_allclose(w.grad.to_local().numpy().astype(np.float32),
                                               ref.astype(np.float32), rtol=tol, atol=tol)
                assert ws.grad.sbp == ws.sbp
                np.testing.assert_allclose(ws.grad.to_global(sbp=[S.broadcast] * placement_.ndim).to_local().numpy(),
                                           sum(parts), rtol=1e-5, atol=1e-5)
    # buckets hold at most GRAD_BUCKET_BYTES: three 40-byte gradients under a 100-byte limit take two
    limit = global_tensor.GRAD_BUCKET_BYTES
    try:
        global_tensor.GRAD_BUCKET_BYTES = 100
        ws = [flow.tensor(np.zeros(10, np.float32), placement=P, sbp=S.broadcast, requires_grad=True) for _ in range(3)]
        for i, w in enumerate(ws):
            w.grad = flow.tensor(np.full(10, i + r, np.float32)).to_global(P, S.partial_sum)
        with comm.stats.recording() as st:
            sync_grads(ws)
        assert [c[0] for c in st.calls] == ["all_reduce"] * 2, st.calls
        for i, w in enumerate(ws):
            assert np.allclose(w.grad.to_local().numpy(), n * i + n * (n - 1) / 2)
    finally:
        global_tensor.GRAD_BUCKET_BYTES = limit


def main():
    local_to_global_grads()
    to_local_grads()
    grad_sbp()
    deferred_sync()
    mixed_deferred_and_synced_accumulation()
    bucketed_sync()
    if r == 0:
        print(f"global grads OK on {n} ranks")


if __name__ == "__main__":
    main()
