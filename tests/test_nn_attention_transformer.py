"""F.scaled_dot_product_attention, nn.MultiheadAttention and the nn.Transformer layers against torch.

SDPA: the fused tiled kernel against torch's own F.scaled_dot_product_attention on random shapes
(causal, bool and float masks broadcast over batch and heads, L != S, scale, grouped-query heads,
empty sizes), forward and backward, float64; the tiling itself is exercised by shrinking the
tile sizes so that one call runs many query/key tiles and batch blocks, and a counter checks that
fully masked tiles are skipped and no tile exceeds its bound. Dropout: the kernel's mask is a
function of (seed, position) (engine.ops.attention.sdpa_uniform), so the reference is torch's
math with that same mask, forward and backward; its statistics are checked separately.

Modules: built in both libraries, torch's (random) weights loaded into the engine's, then outputs,
input gradients and parameter gradients compared in train (dropout 0) and eval mode; state_dict
keys (and their order) must be torch's.
"""
from collections import OrderedDict

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import engine as flow
import engine.nn.functional as F
from engine.ops import attention as A

RNG = np.random.default_rng


# ====================================================================== SDPA
def _sdpa_pair(shapes, mask_shape=None, mask_kind=None, mask_grad=False, seed=0, dtype=np.float64, **kw):
    """Run torch's and the engine's SDPA on the same random q, k, v (and mask); return
    (engine out, torch out, [(engine grad, torch grad, name)])."""
    r = RNG(seed)
    arrs = [r.standard_normal(s).astype(dtype) for s in shapes]
    tin = [torch.tensor(a, requires_grad=True) for a in arrs]
    ein = [flow.tensor(a, requires_grad=True) for a in arrs]
    tm = em = None
    if mask_shape is not None:
        if mask_kind == "bool":
            mv = r.random(mask_shape) < 0.7
        else:
            mv = r.standard_normal(mask_shape).astype(dtype)
            mv[r.random(mask_shape) < 0.3] = -np.inf
        tm = torch.tensor(mv, requires_grad=mask_grad)
        em = flow.tensor(mv, requires_grad=mask_grad)
    to = TF.scaled_dot_product_attention(*tin, attn_mask=tm, **kw)
    eo = F.scaled_dot_product_attention(*ein, attn_mask=em, **kw)
    g = r.standard_normal(tuple(to.shape)).astype(dtype)
    to.backward(torch.tensor(g))
    eo.backward(flow.tensor(g))
    grads = [(e.grad.numpy(), t.grad.numpy(), n) for e, t, n in zip(ein, tin, "qkv")]
    if mask_grad:
        grads.append((em.grad.numpy(), tm.grad.numpy(), "mask"))
    return eo.detach().numpy(), to.detach().numpy(), grads


def _assert_pair(res, rtol=1e-10, atol=1e-12):
    eo, to, grads = res
    assert eo.shape == to.shape
    np.testing.assert_allclose(eo, to, rtol=rtol, atol=atol, err_msg="output")
    for e, t, name in grads:
        assert e.shape == t.shape, name
        np.testing.assert_allclose(e, t, rtol=rtol, atol=atol, err_msg=f"grad of {name}")


SDPA_CASES = {
    "plain": dict(shapes=[(2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 4)]),
    "causal-L<S": dict(shapes=[(2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 4)], is_causal=True),
    "causal-L>S": dict(shapes=[(2, 3, 9, 8), (2, 3, 4, 8), (2, 3, 4, 4)], is_causal=True),
    "bool-2d": dict(shapes=[(2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 4)], mask_shape=(5, 7), mask_kind="bool"),
    "bool-padding": dict(shapes=[(2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 4)], mask_shape=(2, 1, 1, 7),
                         mask_kind="bool"),
    "bool-per-head": dict(shapes=[(2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 4)], mask_shape=(3, 5, 7), mask_kind="bool"),
    "float-per-batch-grad": dict(shapes=[(2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 4)], mask_shape=(2, 1, 5, 7),
                                 mask_kind="float", mask_grad=True),
    "float-broadcast-grad": dict(shapes=[(2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 4)], mask_shape=(3, 1, 7),
                                 mask_kind="float", mask_grad=True),
    "float-column-grad": dict(shapes=[(2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 4)], mask_shape=(5, 1),
                              mask_kind="float", mask_grad=True),
    "scale": dict(shapes=[(3, 4, 6), (3, 5, 6), (3, 5, 2)], scale=0.37),
    "gqa": dict(shapes=[(2, 6, 5, 8), (2, 2, 7, 8), (2, 3, 7, 4)], enable_gqa=True),
    "gqa-causal-scale": dict(shapes=[(1, 4, 6, 3), (1, 1, 6, 3), (1, 2, 6, 5)], enable_gqa=True, is_causal=True,
                             scale=1.3),
    "broadcast-batch": dict(shapes=[(2, 1, 5, 8), (2, 3, 7, 8), (1, 3, 7, 4)], mask_shape=(3, 5, 7),
                            mask_kind="bool"),
    "unbatched-2d": dict(shapes=[(5, 8), (7, 8), (7, 3)], is_causal=True),
    "5d": dict(shapes=[(2, 2, 3, 4, 8), (2, 2, 3, 5, 8), (2, 2, 3, 5, 2)], mask_shape=(2, 1, 1, 4, 5),
               mask_kind="float"),
    "odd-sizes-one-row": dict(shapes=[(1, 1, 1, 3), (1, 1, 1, 3), (1, 1, 1, 1)]),
    "empty-L": dict(shapes=[(2, 3, 0, 8), (2, 3, 7, 8), (2, 3, 7, 4)]),
    "empty-S": dict(shapes=[(2, 3, 4, 8), (2, 3, 0, 8), (2, 3, 0, 4)]),
    "empty-E": dict(shapes=[(2, 3, 4, 0), (2, 3, 6, 0), (2, 3, 6, 4)]),
    "empty-batch": dict(shapes=[(0, 3, 4, 8), (0, 3, 6, 8), (0, 3, 6, 4)], is_causal=True),
}


@pytest.mark.parametrize("name", sorted(SDPA_CASES))
def test_sdpa_matches_torch(name):
    _assert_pair(_sdpa_pair(**SDPA_CASES[name]))


def test_sdpa_float32_and_fully_masked_rows():
    # float32 at float32 tolerances; a bool mask with whole rows False gives 0 and no gradient, as torch
    mask = np.ones((4, 6), bool)
    mask[1] = False
    r = RNG(3)
    arrs = [r.standard_normal(s).astype(np.float32) for s in [(2, 2, 4, 8), (2, 2, 6, 8), (2, 2, 6, 5)]]
    tin = [torch.tensor(a, requires_grad=True) for a in arrs]
    ein = [flow.tensor(a, requires_grad=True) for a in arrs]
    to = TF.scaled_dot_product_attention(*tin, attn_mask=torch.tensor(mask))
    eo = F.scaled_dot_product_attention(*ein, attn_mask=flow.tensor(mask))
    assert eo.dtype is flow.float32
    np.testing.assert_allclose(eo.detach().numpy(), to.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert not eo.detach().numpy()[:, :, 1].any()
    g = r.standard_normal(tuple(to.shape)).astype(np.float32)
    to.backward(torch.tensor(g))
    eo.backward(flow.tensor(g))
    for e, t in zip(ein, tin):
        np.testing.assert_allclose(e.grad.numpy(), t.grad.numpy(), rtol=1e-5, atol=1e-6)
    assert not ein[0].grad.numpy()[:, :, 1].any()


def test_sdpa_low_precision_runs_in_float32():
    r = RNG(4)
    arrs = [r.standard_normal(s).astype(np.float32) for s in [(2, 2, 5, 8), (2, 2, 6, 8), (2, 2, 6, 4)]]
    eo = F.scaled_dot_product_attention(*[flow.tensor(a).half() for a in arrs], is_causal=True)
    assert eo.dtype is flow.float16
    ref = TF.scaled_dot_product_attention(*[torch.tensor(a).half().float() for a in arrs], is_causal=True)
    np.testing.assert_allclose(eo.float().numpy(), ref.numpy(), rtol=2e-3, atol=2e-3)


@pytest.fixture
def small_tiles(monkeypatch):
    """Tiles of 4 x 3 scores and at most 2 batch rows per block: one call runs many of each."""
    monkeypatch.setattr(A, "Q_BLOCK", 4)
    monkeypatch.setattr(A, "K_BLOCK", 3)
    monkeypatch.setattr(A, "SDPA_TILE_ELEMENTS", 24)


@pytest.mark.parametrize("name", ["plain", "causal-L<S", "causal-L>S", "bool-padding", "bool-per-head",
                                  "float-per-batch-grad", "float-broadcast-grad", "float-column-grad", "gqa",
                                  "broadcast-batch", "5d"])
def test_sdpa_many_tiles_matches_torch(small_tiles, name):
    """The online softmax across key tiles, the causal diagonal tiles, the mask tiles and their
    gradients summed over broadcast rows, with many tiles and batch blocks per call."""
    case = dict(SDPA_CASES[name])
    case["shapes"] = [s[:-2] + (s[-2] * 3 + 1, s[-1]) for s in case["shapes"]]
    if "mask_shape" in case:
        ms = case["mask_shape"]
        case["mask_shape"] = ms[:-2] + tuple(1 if d == 1 else d * 3 + 1 for d in ms[-2:])
    _assert_pair(_sdpa_pair(**case))


@pytest.mark.parametrize("mask_kind", [None, "bool", "float"])
def test_sdpa_threads_give_the_same_bits(small_tiles, mask_kind):
    """Blocks of batch rows on the engine's threads (a call large enough to be split): the same
    values as torch, and the same bits with one thread or two."""
    from engine.backend import parallel

    shapes = [(2, 2, 40, 16), (2, 2, 45, 16), (2, 2, 45, 8)]
    case = dict(shapes=shapes, mask_shape=(2, 1, 40, 45) if mask_kind else None, mask_kind=mask_kind,
                mask_grad=mask_kind == "float")
    before = parallel.get_num_threads()
    try:
        parallel.set_num_threads(1)
        one = _sdpa_pair(**case, dtype=np.float32)
        parallel.set_num_threads(2)
        two = _sdpa_pair(**case, dtype=np.float32)
    finally:
        parallel.set_num_threads(before)
    _assert_pair(two, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(one[0], two[0])
    for (a, _, name), (b, _, _) in zip(one[2], two[2]):
        np.testing.assert_array_equal(a, b, err_msg=name)


def _count_tiles(monkeypatch):
    """Record the shape of every score tile the kernel computes."""
    seen = []
    orig = A._SDPAKernel.tiles

    def tiles(self, *args):
        for k0, k1, s in orig(self, *args):
            seen.append(s.shape)
            yield k0, k1, s

    monkeypatch.setattr(A._SDPAKernel, "tiles", tiles)
    return seen


def test_sdpa_causal_skips_tiles_above_the_diagonal(small_tiles, monkeypatch):
    seen = _count_tiles(monkeypatch)
    q = flow.randn(1, 1, 16, 4)
    k = flow.randn(1, 1, 15, 4)
    F.scaled_dot_product_attention(q, k, k, is_causal=True)
    # query blocks [0,4) [4,8) [8,12) [12,16) see keys < 4, 8, 12, 15: 2 + 3 + 4 + 5 tiles of at most 3 keys
    assert len(seen) == 2 + 3 + 4 + 5
    assert max(int(np.prod(s)) for s in seen) <= 4 * 3
    seen.clear()
    F.scaled_dot_product_attention(q, k, k)
    assert len(seen) == 4 * 5


def test_sdpa_skips_fully_masked_tiles(small_tiles, monkeypatch):
    seen = _count_tiles(monkeypatch)
    lengths = np.array([3, 6])  # key padding: batch 0 keeps 3 keys (1 tile), batch 1 keeps 6 (2 tiles)
    mask = np.arange(12)[None, None, None, :] < lengths[:, None, None, None]
    q, k = flow.randn(2, 1, 4, 4), flow.randn(2, 1, 12, 4)
    for m in (flow.tensor(mask), flow.tensor(np.where(mask, 0.0, -np.inf).astype(np.float32))):
        seen.clear()
        F.scaled_dot_product_attention(q, k, k, attn_mask=m)
        assert len(seen) == 2  # both batch rows in one block (24 // 12): the tiles either of them needs
        monkeypatch.setattr(A, "SDPA_TILE_ELEMENTS", 12)  # one batch row per block
        seen.clear()
        F.scaled_dot_product_attention(q, k, k, attn_mask=m)
        assert len(seen) == 1 + 2
        monkeypatch.setattr(A, "SDPA_TILE_ELEMENTS", 24)


def test_sdpa_dropout_equals_torch_math_with_the_same_mask():
    """The kernel's dropout mask is sdpa_uniform(seed, position) >= p: torch's math with that mask
    gives the same output and gradients; the seed is the call's one draw from the default generator."""
    r = RNG(5)
    p = 0.3
    shapes = [(2, 3, 9, 8), (2, 3, 11, 8), (2, 3, 11, 5)]
    arrs = [r.standard_normal(s) for s in shapes]
    fmask = r.standard_normal((9, 11))
    g = r.standard_normal((2, 3, 9, 5))
    for causal in (False, True):
        flow.manual_seed(11)
        seed = A.sdpa_dropout_seed()
        flow.manual_seed(11)
        ein = [flow.tensor(a, requires_grad=True) for a in arrs]
        em = None if causal else flow.tensor(fmask)
        eo = F.scaled_dot_product_attention(*ein, attn_mask=em, dropout_p=p, is_causal=causal)
        eo.backward(flow.tensor(g))

        keep = A.sdpa_uniform(np, seed, (0, 6), (0, 9), (0, 11), 9, 11).reshape(2, 3, 9, 11) >= p
        tin = [torch.tensor(a, requires_grad=True) for a in arrs]
        scores = tin[0] @ tin[1].transpose(-1, -2) / np.sqrt(8)
        if causal:
            scores = scores.masked_fill(~torch.ones(9, 11, dtype=torch.bool).tril(), float("-inf"))
        else:
            scores = scores + torch.tensor(fmask)
        to = (scores.softmax(-1) * torch.tensor(keep) / (1 - p)) @ tin[2]
        to.backward(torch.tensor(g))
        np.testing.assert_allclose(eo.detach().numpy(), to.detach().numpy(), rtol=1e-10, atol=1e-12)
        for e, t in zip(ein, tin):
            np.testing.assert_allclose(e.grad.numpy(), t.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_sdpa_dropout_statistics():
    """With uniform attention and value = identity, out[b, i, j] = keep / (S (1 - p)): the mask is
    visible. Its drop rate is p within 5 sigma, calls draw fresh masks, a reseed repeats one, and
    p = 1 drops everything (zeros, as torch)."""
    s_len, p = 64, 0.25
    q = flow.zeros(4, 2, 32, 8)
    k = flow.zeros(4, 2, s_len, 8)
    v = flow.tensor(np.broadcast_to(np.eye(s_len, dtype=np.float32), (4, 2, s_len, s_len)).copy())
    flow.manual_seed(0)
    a = F.scaled_dot_product_attention(q, k, v, dropout_p=p).numpy()
    b = F.scaled_dot_product_attention(q, k, v, dropout_p=p).numpy()
    flow.manual_seed(0)
    a2 = F.scaled_dot_product_attention(q, k, v, dropout_p=p).numpy()
    n = a.size
    rate = float((a == 0).mean())
    assert abs(rate - p) < 5 * np.sqrt(p * (1 - p) / n)
    np.testing.assert_allclose(a[a != 0], 1 / (s_len * (1 - p)), rtol=1e-6)
    assert (a != b).any() and (a == a2).all()
    assert not F.scaled_dot_product_attention(q, k, v, dropout_p=1.0).numpy().any()
    assert (F.scaled_dot_product_attention(q, k, v, dropout_p=0.0).numpy() == 1 / s_len).all()


def test_sdpa_errors_match_torch():
    q, k, v = flow.randn(2, 3, 4, 8), flow.randn(2, 3, 5, 8), flow.randn(2, 3, 5, 6)
    tq, tk, tv = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 6)
    cases = [
        (dict(attn_mask=(np.ones((4, 5), bool)), is_causal=True), RuntimeError, "is_causal"),
        (dict(attn_mask=np.ones((4, 5), np.int64)), RuntimeError, "attn_mask dtype"),
        (dict(attn_mask=np.ones((4, 5), np.float64)), RuntimeError, "attn_mask dtype"),
        (dict(attn_mask=np.ones((4, 6), bool)), RuntimeError, "broadcast"),
        (dict(attn_mask=np.ones((2, 2, 3, 4, 5), bool)), RuntimeError, "broadcast"),
        (dict(dropout_p=1.5), RuntimeError, "dropout probability"),
    ]
    for kw, exc, words in cases:
        tkw = {n: torch.tensor(x) if isinstance(x, np.ndarray) else x for n, x in kw.items()}
        ekw = {n: flow.tensor(x) if isinstance(x, np.ndarray) else x for n, x in kw.items()}
        with pytest.raises(exc):
            TF.scaled_dot_product_attention(tq, tk, tv, **tkw)
        with pytest.raises(exc, match=words):
            F.scaled_dot_product_attention(q, k, v, **ekw)
    bad = [((q.double(), k, v), (tq.double(), tk, tv), RuntimeError, "same dtype"),
           ((q, flow.randn(2, 3, 5, 7), v), (tq, torch.randn(2, 3, 5, 7), tv), RuntimeError, "embedding size"),
           ((q, k, flow.randn(2, 3, 6, 6)), (tq, tk, torch.randn(2, 3, 6, 6)), RuntimeError, "sequence length"),
           ((flow.randn(8), flow.randn(5, 8), flow.randn(5, 2)), (torch.randn(8), torch.randn(5, 8),
                                                                  torch.randn(5, 2)), RuntimeError, "2"),
           ((flow.randn(2, 4, 4, 8), k, v), (torch.randn(2, 4, 4, 8), tk, tv), RuntimeError, "broadcast"),
           ((flow.ones(4, 8, dtype=flow.int64),) * 2 + (flow.ones(4, 2, dtype=flow.int64),),
            (torch.ones(4, 8, dtype=torch.int64),) * 2 + (torch.ones(4, 2, dtype=torch.int64),), RuntimeError,
            "floating")]
    for eargs, targs, exc, words in bad:
        with pytest.raises(exc):
            TF.scaled_dot_product_attention(*targs)
        with pytest.raises(exc, match=words):
            F.scaled_dot_product_attention(*eargs)
    with pytest.raises(RuntimeError):
        TF.scaled_dot_product_attention(torch.randn(2, 4, 4, 8), tk, tv, enable_gqa=True)
    with pytest.raises(RuntimeError, match="divide"):
        F.scaled_dot_product_attention(flow.randn(2, 4, 4, 8), k, v, enable_gqa=True)
    with pytest.raises(IndexError):
        TF.scaled_dot_product_attention(torch.randn(4, 8), torch.randn(5, 8), torch.randn(5, 3), enable_gqa=True)
    with pytest.raises(IndexError):
        F.scaled_dot_product_attention(flow.randn(4, 8), flow.randn(5, 8), flow.randn(5, 3), enable_gqa=True)


# ====================================================================== modules
def _load(em, tm):
    em.load_state_dict(OrderedDict((k, flow.tensor(v.detach().numpy())) for k, v in tm.state_dict().items()))


def _randomise(tm, seed=0):
    r = RNG(seed)
    with torch.no_grad():
        for p in tm.parameters():
            p.copy_(torch.from_numpy(0.5 * r.standard_normal(tuple(p.shape))))


def _pair(make, seed=0):
    """The same module in both libraries, float64, torch's randomised weights in both."""
    torch.manual_seed(seed)
    tm = make(torch.nn).double()
    em = make(flow.nn).double()
    assert list(em.state_dict()) == list(tm.state_dict())
    _randomise(tm, seed)
    _load(em, tm)
    return em, tm


def _as_pair(a, grad):
    if a is None:
        return None, None
    e, t = flow.tensor(a), torch.tensor(a)
    if grad:
        e.requires_grad_(True)
        t.requires_grad_(True)
    return e, t


def _compare(em, tm, args, kwargs=None, train=False, pick=lambda out: out, rtol=1e-9, atol=1e-11, same=()):
    """Call both modules on the same inputs (numpy arrays; float ones get gradients; `same` lists
    positions that are passed as one tensor object several times, e.g. self-attention), compare the
    output(s), then backpropagate one random gradient and compare input and parameter gradients."""
    em.train(train)
    tm.train(train)
    pairs = []
    for i, a in enumerate(args):
        if isinstance(a, int):  # the same object as argument a
            pairs.append(pairs[a])
        else:
            pairs.append(_as_pair(a, a is not None and a.dtype.kind == "f"))
    kwargs = kwargs or {}
    ekw = {n: (flow.tensor(v) if isinstance(v, np.ndarray) else v) for n, v in kwargs.items()}
    tkw = {n: (torch.tensor(v) if isinstance(v, np.ndarray) else v) for n, v in kwargs.items()}
    eo = pick(em(*[p[0] for p in pairs], **ekw))
    to = pick(tm(*[p[1] for p in pairs], **tkw))
    eo = eo if isinstance(eo, tuple) else (eo,)
    to = to if isinstance(to, tuple) else (to,)
    loss_e, loss_t = 0, 0
    r = RNG(99)
    for e, t in zip(eo, to):
        if t is None:
            assert e is None
            continue
        assert tuple(e.shape) == tuple(t.shape)
        np.testing.assert_allclose(e.detach().numpy(), t.detach().numpy(), rtol=rtol, atol=atol)
        g = r.standard_normal(tuple(t.shape))
        loss_e = loss_e + (e * flow.tensor(g)).sum()
        loss_t = loss_t + (t * torch.tensor(g)).sum()
    loss_e.backward()
    loss_t.backward()
    for i, (e, t) in enumerate(p for p in pairs if p[0] is not None and p[0].requires_grad):
        np.testing.assert_allclose(e.grad.numpy(), t.grad.numpy(), rtol=rtol, atol=atol, err_msg=f"input {i}")
    tparams = dict(tm.named_parameters())
    for name, p in em.named_parameters():
        tg = tparams[name].grad
        if tg is None:
            assert p.grad is None, name
        else:
            np.testing.assert_allclose(p.grad.numpy(), tg.numpy(), rtol=rtol, atol=atol, err_msg=name)


def _randn(*shape, seed=1):
    return RNG(seed).standard_normal(shape)


def _bool(*shape, p=0.3, seed=2):
    return RNG(seed).random(shape) < p


def _padding(lengths, s):
    return np.arange(s)[None, :] >= np.asarray(lengths)[:, None]  # True = padded (torch's MHA convention)


def _causal(n, kind="float"):
    m = np.triu(np.ones((n, n), bool), 1)
    return m if kind == "bool" else np.where(m, -np.inf, 0.0)


MHA_OPTIONS = {
    "default": dict(),
    "no-bias": dict(bias=False),
    "kdim-vdim": dict(kdim=5, vdim=3),
    "batch-first": dict(batch_first=True),
    "bias-kv": dict(add_bias_kv=True),
    "zero-attn": dict(add_zero_attn=True),
    "bias-kv-zero-attn-kdim": dict(add_bias_kv=True, add_zero_attn=True, kdim=5, vdim=3),
}


@pytest.mark.parametrize("opt", sorted(MHA_OPTIONS))
@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("train", [True, False])
def test_multihead_attention(opt, need_weights, train):
    kw = MHA_OPTIONS[opt]
    em, tm = _pair(lambda nn: nn.MultiheadAttention(8, 2, **kw))
    bf = kw.get("batch_first", False)
    n, lq, ls = 3, 5, 6

    def seq(length, dim, seed):
        return _randn(n, length, dim, seed=seed) if bf else _randn(length, n, dim, seed=seed)

    q = seq(lq, 8, 1)
    k, v = seq(ls, kw.get("kdim", 8), 2), seq(ls, kw.get("vdim", 8), 3)
    kpm = _padding([6, 4, 2], ls)
    masks = dict(attn_mask=_bool(lq, ls, seed=4), key_padding_mask=kpm)
    _compare(em, tm, [q, k, v], dict(need_weights=need_weights, **masks), train=train)
    # float masks, per-head 3-D attention mask, separate weights per head
    masks = dict(attn_mask=np.where(_bool(n * 2, lq, ls, seed=5), -np.inf, _randn(n * 2, lq, ls, seed=6)),
                 key_padding_mask=np.where(kpm, -np.inf, 0.0))
    _compare(em, tm, [q, k, v], dict(need_weights=need_weights, average_attn_weights=False, **masks), train=train)
    if "kdim" not in kw:
        _compare(em, tm, [q, 0, 0], dict(need_weights=need_weights), train=train)  # self-attention: q is k is v
        _compare(em, tm, [q, k, 1], dict(need_weights=need_weights), train=train)  # key is value
        # the is_causal hint with its mask (SDPA's own causal path when need_weights=False)
        _compare(em, tm, [q, 0, 0], dict(attn_mask=_causal(lq), is_causal=True, need_weights=need_weights),
                 train=train)


def test_multihead_attention_unbatched_and_float32():
    em, tm = _pair(lambda nn: nn.MultiheadAttention(6, 3))
    q, k = _randn(4, 6, seed=1), _randn(5, 6, seed=2)
    _compare(em, tm, [q, k, 1], dict(key_padding_mask=np.array([False, True, False, False, True])))
    _compare(em, tm, [q, k, 1], dict(attn_mask=_bool(3, 4, 5), need_weights=False))
    torch.manual_seed(0)
    tm = torch.nn.MultiheadAttention(8, 4, batch_first=True)
    em = flow.nn.MultiheadAttention(8, 4, batch_first=True)
    _load(em, tm)
    x = _randn(2, 7, 8).astype(np.float32)
    _compare(em, tm, [x, 0, 0], dict(attn_mask=_causal(7, "bool"), need_weights=False), rtol=1e-5, atol=1e-6)


def test_multihead_attention_structure_and_init():
    for kw in MHA_OPTIONS.values():
        tm, em = torch.nn.MultiheadAttention(8, 2, **kw), flow.nn.MultiheadAttention(8, 2, **kw)
        assert list(em.state_dict()) == list(tm.state_dict())
        assert [n for n, _ in em.named_parameters()] == [n for n, _ in tm.named_parameters()]
        assert repr(em) == repr(tm)
    em = flow.nn.MultiheadAttention(16, 4)
    w = em.in_proj_weight.detach().numpy()
    bound = np.sqrt(6 / (16 + 48))  # xavier_uniform on [3E, E]
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.8 * bound
    assert not em.in_proj_bias.detach().numpy().any() and not em.out_proj.bias.detach().numpy().any()


def test_multihead_attention_errors():
    with pytest.raises(AssertionError):
        torch.nn.MultiheadAttention(7, 2)
    with pytest.raises(AssertionError, match="divisible"):
        flow.nn.MultiheadAttention(7, 2)
    with pytest.raises(ValueError):
        flow.nn.MultiheadAttention(0, 2)
    em = flow.nn.MultiheadAttention(8, 2)
    x = flow.randn(5, 2, 8)
    with pytest.raises(RuntimeError, match="Need attn_mask"):
        em(x, x, x, is_causal=True)
    with pytest.raises(RuntimeError, match="2D attn_mask"):
        em(x, x, x, attn_mask=flow.zeros(4, 5))
    with pytest.raises(RuntimeError, match="3D attn_mask"):
        em(x, x, x, attn_mask=flow.zeros(3, 5, 5))
    with pytest.raises(AssertionError, match="bool and floating"):
        em(x, x, x, attn_mask=flow.zeros(5, 5, dtype=flow.int64))
    with pytest.raises(AssertionError, match="3-D"):
        em(x, x[0], x[0])


def test_multihead_attention_dropout_is_unbiased():
    """Dropout on the attention weights: the output is linear in them, so its mean over many draws
    is the eval output (checked to a few standard errors), and a draw differs from the eval output."""
    em = flow.nn.MultiheadAttention(4, 2, dropout=0.4).double()
    x = flow.tensor(_randn(3, 2, 4))
    em.eval()
    ref = em(x, x, x, need_weights=False)[0].detach().numpy()
    em.train()
    for need_weights in (False, True):
        draws = np.stack([em(x, x, x, need_weights=need_weights)[0].detach().numpy() for _ in range(400)])
        assert (np.abs(draws[0] - ref) > 1e-6).any()
        se = draws.std(0) / np.sqrt(len(draws))
        assert (np.abs(draws.mean(0) - ref) < 5 * se + 1e-12).all()


# ---------------------------------------------------------------------- transformer layers
LAYER_OPTIONS = {
    "post-norm-relu": dict(),
    "pre-norm-gelu": dict(norm_first=True, activation="gelu"),
    "batch-first-callable": dict(batch_first=True, activation="silu"),
    "no-bias-eps": dict(bias=False, layer_norm_eps=1e-3),
}


def _layer_kwargs(nn, opt):
    kw = dict(LAYER_OPTIONS[opt])
    if kw.get("activation") == "silu":
        kw["activation"] = nn.functional.silu
    return kw


@pytest.mark.parametrize("opt", sorted(LAYER_OPTIONS))
@pytest.mark.parametrize("train", [True, False])
def test_transformer_encoder_layer(opt, train):
    em, tm = _pair(lambda nn: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, **_layer_kwargs(nn, opt)))
    bf = LAYER_OPTIONS[opt].get("batch_first", False)
    x = _randn(3, 5, 8) if bf else _randn(5, 3, 8)
    _compare(em, tm, [x], train=train)
    _compare(em, tm, [x], dict(src_mask=_causal(5), src_key_padding_mask=_padding([5, 3, 1], 5)), train=train)
    _compare(em, tm, [x], dict(src_mask=_causal(5, "bool"), is_causal=True), train=train)
    _compare(em, tm, [_randn(5, 8)], dict(src_key_padding_mask=_padding([3], 5)[0]), train=train)


@pytest.mark.parametrize("opt", sorted(LAYER_OPTIONS))
@pytest.mark.parametrize("train", [True, False])
def test_transformer_decoder_layer(opt, train):
    em, tm = _pair(lambda nn: nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, **_layer_kwargs(nn, opt)))
    bf = LAYER_OPTIONS[opt].get("batch_first", False)
    tgt = _randn(3, 4, 8, seed=1) if bf else _randn(4, 3, 8, seed=1)
    mem = _randn(3, 6, 8, seed=2) if bf else _randn(6, 3, 8, seed=2)
    _compare(em, tm, [tgt, mem], train=train)
    _compare(em, tm, [tgt, mem], dict(tgt_mask=_causal(4), tgt_is_causal=True,
                                      memory_key_padding_mask=_padding([6, 2, 4], 6),
                                      tgt_key_padding_mask=_padding([4, 4, 2], 4),
                                      memory_mask=_bool(4, 6, p=0.2)), train=train)


@pytest.mark.parametrize("train", [True, False])
def test_transformer_encoder_decoder_stacks(train):
    def make_enc(nn):
        layer = nn.TransformerEncoderLayer(8, 2, 12, dropout=0.0)
        return nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(8), enable_nested_tensor=False)

    em, tm = _pair(make_enc)
    x = _randn(5, 2, 8)
    _compare(em, tm, [x], dict(mask=_causal(5)), train=train)  # detected as causal (is_causal=None)
    _compare(em, tm, [x], dict(src_key_padding_mask=_padding([5, 2], 5)), train=train)

    def make_dec(nn):
        return nn.TransformerDecoder(nn.TransformerDecoderLayer(8, 2, 12, dropout=0.0, norm_first=True), 2)

    em, tm = _pair(make_dec)
    _compare(em, tm, [_randn(4, 2, 8), _randn(5, 2, 8, seed=3)], dict(tgt_mask=_causal(4)), train=train)


def test_encoder_inference_zeroes_padding_as_torch_s_nested_tensor_path():
    """Eval, no gradients, batch_first, a left-aligned key padding mask: torch runs the stack on a
    nested tensor and pads it back with zeros (before the final norm), so a mean over every
    position counts them as zeros. Training, gradients, an attention mask, right-aligned padding
    or a layer torch cannot fuse (norm_first, odd heads) keep the computed values."""
    def make(nn, **kw):
        layer = nn.TransformerEncoderLayer(8, 2, 12, dropout=0.0, batch_first=True, **kw)
        return nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(8))

    x = _randn(3, 5, 8)
    left, right = _padding([5, 3, 1], 5), _padding([5, 3, 1], 5)[:, ::-1].copy()
    for kw in (dict(), dict(norm_first=True)):
        em, tm = _pair(lambda nn: make(nn, **kw))
        em.eval(), tm.eval()
        for mask in (left, right):
            with torch.no_grad(), flow.no_grad():
                want = tm(torch.tensor(x), src_key_padding_mask=torch.tensor(mask)).numpy()
                got = em(flow.tensor(x), src_key_padding_mask=flow.tensor(mask)).numpy()
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-11)
    em, _ = _pair(lambda nn: make(nn))
    em.eval()
    with flow.no_grad():
        out = em(flow.tensor(x), src_key_padding_mask=flow.tensor(left)).numpy()
    assert np.all(out[1, 3:] == em.norm(flow.zeros(8, dtype=flow.float64)).detach().numpy())  # norm of zeros
    out = em(flow.tensor(x), src_key_padding_mask=flow.tensor(left)).detach().numpy()  # gradients: computed
    assert not np.all(out[1, 3:] == out[1, 4])


def test_transformer_full_model():
    def make(nn):
        return nn.Transformer(8, 2, 1, 2, 12, dropout=0.0, batch_first=True)

    em, tm = _pair(make)
    src, tgt = _randn(2, 5, 8, seed=1), _randn(2, 4, 8, seed=2)
    mask = flow.nn.Transformer.generate_square_subsequent_mask(4).numpy()
    np.testing.assert_array_equal(mask, torch.nn.Transformer.generate_square_subsequent_mask(4).numpy())
    _compare(em, tm, [src, tgt], dict(tgt_mask=mask, src_key_padding_mask=_padding([5, 3], 5)), train=True)
    with pytest.raises(RuntimeError, match="batch number"):
        em(flow.randn(2, 5, 8), flow.randn(3, 4, 8))
    with pytest.raises(RuntimeError, match="d_model"):
        em(flow.randn(2, 5, 8), flow.randn(2, 4, 6))


def test_transformer_structure_and_errors():
    for make in (lambda nn: nn.TransformerEncoderLayer(8, 2, 16),
                 lambda nn: nn.TransformerDecoderLayer(8, 2, 16, bias=False, activation=nn.GELU()),
                 lambda nn: nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16), 3,
                                                  enable_nested_tensor=False),
                 lambda nn: nn.TransformerDecoder(nn.TransformerDecoderLayer(8, 2, 16), 2, nn.LayerNorm(8)),
                 lambda nn: nn.Transformer(8, 2, 1, 1, 16)):
        tm, em = make(torch.nn), make(flow.nn)
        assert list(em.state_dict()) == list(tm.state_dict())
        assert repr(em) == repr(tm)
    stack = flow.nn.TransformerEncoder(flow.nn.TransformerEncoderLayer(8, 2, 16), 2, enable_nested_tensor=False)
    a, b = stack.layers[0].linear1.weight, stack.layers[1].linear1.weight
    assert a is not b and np.array_equal(a.detach().numpy(), b.detach().numpy())  # deep copies
    with pytest.raises(RuntimeError, match="relu/gelu"):
        flow.nn.TransformerEncoderLayer(8, 2, activation="tanh")
    layer = flow.nn.TransformerEncoderLayer(8, 2, 16)
    with pytest.raises(RuntimeError, match="Need attn_mask"):
        layer(flow.randn(4, 2, 8), is_causal=True)


def test_transformer_layer_dropout_is_active_in_training_only():
    layer = flow.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.3)
    x = flow.randn(5, 2, 8)
    layer.train()
    flow.manual_seed(1)
    a = layer(x).detach().numpy()
    b = layer(x).detach().numpy()
    flow.manual_seed(1)
    a2 = layer(x).detach().numpy()
    assert (a != b).any() and np.array_equal(a, a2)
    layer.eval()
    np.testing.assert_array_equal(layer(x).detach().numpy(), layer(x).detach().numpy())


def test_mismatched_mask_types_warn_as_torch():
    em = flow.nn.MultiheadAttention(8, 2)
    x = flow.randn(5, 2, 8)
    with pytest.warns(UserWarning, match="mismatched key_padding_mask and attn_mask"):
        em(x, x, x, key_padding_mask=flow.zeros(2, 5, dtype=flow.bool), attn_mask=flow.zeros(5, 5))
    layer = flow.nn.TransformerEncoderLayer(8, 2, 16)
    with pytest.warns(UserWarning, match="mismatched src_key_padding_mask and src_mask"):
        layer(x, src_mask=flow.zeros(5, 5), src_key_padding_mask=flow.zeros(2, 5, dtype=flow.bool))
