"""libai.layers and libai.utils.distributed in one process: topology arithmetic, parameter
layouts, layer maths against plain formulas, masks and dropout."""
import numpy as np
import pytest
import torch

import engine as flow
from libai.layers import (
    MLP, Embedding, LayerNorm, Linear, LMLogits, MultiheadAttention, ParallelCrossEntropyLoss, TransformerLayer,
    VocabEmbedding, dropout,
)
from libai.utils import distributed as dist

B, S, P = flow.sbp.broadcast, flow.sbp.split, flow.sbp.partial_sum


def topo(dp, tp, pp=1, rank=0, **kw):
    return dist.DistributedTopology(data_parallel_size=None, tensor_parallel_size=tp, pipeline_parallel_size=pp,
                                    world_size=dp * tp * pp, rank=rank, **kw)


def test_topology_stage_major_mesh():
    t = topo(2, 2, 2, rank=6, pipeline_num_layers=4)
    assert (t.data_parallel_size, t.tensor_parallel_size, t.pipeline_parallel_size) == (2, 2, 2)
    assert (t.pipeline_stage, t.data_parallel_rank, t.tensor_parallel_rank) == (1, 1, 0)
    assert t.get_stage_ranks(0) == [[0, 1], [2, 3]] and t.get_stage_ranks(1) == [[4, 5], [6, 7]]
    assert [t.get_layer_stage_id(i) for i in range(4)] == [0, 0, 1, 1]
    assert t.get_layer_stage_id(-1) == 1
    assert t.get_layer_placement(3, "cpu").mesh.tolist() == [[4, 5], [6, 7]]
    with pytest.raises(IndexError, match="layer_idx 4"):
        t.get_layer_stage_id(4)
    assert t.get_nd_sbp([S(0), S(1)]) == [S(0), S(1)]
    assert topo(4, 1).get_nd_sbp([S(0), S(1)]) == [S(0)]
    assert topo(1, 4).get_nd_sbp([S(0), S(1)]) == [S(1)]
    assert topo(1, 1).get_nd_sbp([S(0), S(1)]) == [B]
    assert topo(1, 4).get_layer_ranks(0) == [0, 1, 2, 3]
    assert topo(2, 2).get_hidden_sbp() == [S(0), B]
    t = topo(1, 1, 1)
    assert t.get_layer_stage_id(7) == 0  # one stage: every layer on it
    with pytest.raises(ValueError, match="world size 6 is not divisible"):
        dist.DistributedTopology(tensor_parallel_size=4, world_size=6, rank=0)
    with pytest.raises(ValueError, match="does not match the world size"):
        dist.DistributedTopology(data_parallel_size=2, tensor_parallel_size=2, world_size=8, rank=0)


def test_single_process_defaults():
    assert dist.get_layer_placement(0).mesh.tolist() == [0]
    assert dist.get_nd_sbp([S(0), S(1)]) == [B]
    assert dist.get_hidden_sbp() == [B]
    assert dist.get_data_parallel_rank() == 0 and dist.get_data_parallel_size() == 1


@pytest.mark.parametrize("parallel", ["data", "col", "row"])
def test_linear_matches_formula(parallel):
    flow.manual_seed(0)
    lin = Linear(6, 8, parallel=parallel, init_method=flow.nn.init.normal_)
    with flow.no_grad():
        lin.bias.copy_(flow.tensor(np.arange(8, dtype=np.float32), placement=lin.bias.placement, sbp=lin.bias.sbp))
    x = np.random.default_rng(0).standard_normal((2, 3, 6)).astype(np.float32)
    y = lin(flow.tensor(x))
    w, b = lin.weight.detach().numpy(), lin.bias.detach().numpy()
    assert np.allclose(y.detach().numpy(), x @ w.T + b, atol=1e-5)
    assert lin.weight.placement == dist.get_layer_placement(0)
    y2, bias = Linear(6, 8, parallel=parallel, skip_bias_add=True)(flow.tensor(x))
    assert tuple(bias.shape) == (8,)


def test_embeddings_and_padding():
    flow.manual_seed(0)
    emb = VocabEmbedding(10, 4, padding_idx=3)
    assert np.all(emb.weight.detach().numpy()[3] == 0)
    ids = np.array([[1, 3, 9]])
    out = emb(flow.tensor(ids))
    assert np.allclose(out.detach().numpy(), emb.weight.detach().numpy()[ids])
    pos = Embedding(5, 4)
    assert np.allclose(pos(flow.tensor(np.arange(3)[None])).detach().numpy(), pos.weight.detach().numpy()[None, :3])
    logits = LMLogits(10)(out, emb.weight)
    assert np.allclose(logits.detach().numpy(), out.detach().numpy() @ emb.weight.detach().numpy().T, atol=1e-5)


def torch_attention(x, w_qkv, b_qkv, w_o, b_o, heads, causal, keep=None):
    """Reference on the per-head fused layout [heads, 3, d]."""
    b, s, h = x.shape
    d = h // heads
    qkv = (x @ w_qkv.T + b_qkv).view(b, s, heads, 3, d)
    q, k, v = qkv.unbind(3)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    sc = q @ k.transpose(-1, -2) / d ** 0.5
    if causal:
        sc = sc.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), -10000.0)
    if keep is not None:
        sc = sc.masked_fill(keep == 0, -10000.0)
    ctx = (sc.softmax(-1) @ v).transpose(1, 2).reshape(b, s, h)
    return ctx @ w_o.T + b_o


@pytest.mark.parametrize("mask_type", ["causal", "padding"])
def test_attention_matches_reference(mask_type):
    flow.manual_seed(1)
    attn = MultiheadAttention(16, 4, attn_mask_type=mask_type)
    with flow.no_grad():
        for lin in (attn.query_key_value, attn.dense):
            lin.bias.copy_(flow.randn(*lin.bias.shape, placement=lin.bias.placement, sbp=lin.bias.sbp))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 16)).astype(np.float32)
    keep = np.ones((2, 1, 1, 5), np.int64)
    keep[1, ..., 3:] = 0
    mask = flow.tensor(keep) if mask_type == "padding" else None
    y = attn(flow.tensor(x), mask).detach().numpy()
    p = {k: torch.tensor(v.detach().numpy()) for k, v in attn.named_parameters()}
    ref = torch_attention(torch.tensor(x), p["query_key_value.weight"], p["query_key_value.bias"],
                          p["dense.weight"], p["dense.bias"], 4, mask_type == "causal",
                          torch.tensor(keep) if mask_type == "padding" else None)
    assert np.abs(y - ref.numpy()).max() < 1e-5


def test_transformer_layer_pre_and_post_ln():
    x = flow.tensor(np.random.default_rng(0).standard_normal((2, 4, 8)).astype(np.float32),
                    placement=dist.get_layer_placement(0), sbp=[B])
    for pos in ("pre", "post"):
        flow.manual_seed(3)
        layer = TransformerLayer(8, 32, 2, layernorm_position=pos, attn_mask_type="causal")
        ln1, attn, ln2, mlp = layer.input_layernorm, layer.self_attention, layer.post_attention_layernorm, layer.mlp
        y = layer(x).detach().numpy()
        if pos == "pre":
            h = x + attn(ln1(x))
            ref = h + mlp(ln2(h))
        else:
            h = ln1(x + attn(x))
            ref = ln2(h + mlp(h))
        assert np.allclose(y, ref.detach().numpy(), atol=1e-6)
    with pytest.raises(ValueError, match="layernorm_position"):
        TransformerLayer(8, 32, 2, layernorm_position="middle")


def test_mlp_is_gelu_tanh():
    flow.manual_seed(0)
    mlp = MLP(8, 32)
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    p = {k: torch.tensor(v.detach().numpy()) for k, v in mlp.named_parameters()}
    h = torch.nn.functional.gelu(torch.tensor(x) @ p["dense_h_to_4h.weight"].T + p["dense_h_to_4h.bias"],
                                 approximate="tanh")
    ref = h @ p["dense_4h_to_h.weight"].T + p["dense_4h_to_h.bias"]
    assert np.abs(mlp(flow.tensor(x)).detach().numpy() - ref.numpy()).max() < 1e-5


def test_parallel_cross_entropy_matches_torch():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((2, 5, 11)).astype(np.float32)
    target = rng.integers(0, 11, size=(2, 5))
    target[0, 1] = -100
    x = flow.tensor(logits, placement=dist.get_layer_placement(0), sbp=[B], requires_grad=True)
    per = ParallelCrossEntropyLoss()(x, flow.tensor(target))
    mean = ParallelCrossEntropyLoss(reduction="mean")(x, flow.tensor(target))
    tl = torch.nn.functional.cross_entropy(torch.tensor(logits).reshape(10, 11), torch.tensor(target).reshape(10),
                                           reduction="none").reshape(2, 5)
    assert np.allclose(per.detach().numpy(), tl.numpy(), atol=1e-6)
    assert np.isclose(mean.item(), tl.sum().item() / 9, rtol=1e-6)
    with pytest.raises(ValueError, match="disagree"):
        ParallelCrossEntropyLoss()(x, flow.tensor(target[:, :4]))


def test_global_dropout_rate_and_scale():
    flow.manual_seed(0)
    x = flow.ones(200, 50, placement=dist.get_layer_placement(0), sbp=[B])
    y = dropout(x, 0.25).numpy()
    assert set(np.unique(y)) <= {0.0, np.float32(1 / 0.75)}
    assert abs((y == 0).mean() - 0.25) < 0.02
    assert dropout(x, 0.25, training=False) is x


def test_zero_model_sizes_are_errors_naming_the_key():
    """A zero size would otherwise fail as a ZeroDivisionError or a reshape error deep inside the
    model or the data loader (a probe found `model.cfg.hidden_layers=0` doing so)."""
    import pytest

    from libai.models import BertModel, GPTModel, SwinTransformer, VisionTransformer
    from libai.models.mlp_classifier import MLPClassifier

    gpt = dict(hidden_layers=1, vocab_size=8, hidden_size=8, num_attention_heads=2)
    bert = dict(vocab_size=8, hidden_size=8, hidden_layers=1, num_attention_heads=2)
    for build, message in (
            (lambda: GPTModel(**dict(gpt, hidden_layers=0)), "GPTModel: hidden_layers must be a positive integer, got 0"),
            (lambda: GPTModel(**dict(gpt, num_attention_heads=0)), "GPTModel: num_attention_heads must be"),
            (lambda: GPTModel(**gpt, max_seq_length=0), "GPTModel: max_seq_length must be a positive integer"),
            (lambda: BertModel(**dict(bert, hidden_size=0)), "BertModel: hidden_size must be a positive integer"),
            (lambda: BertModel(**bert, max_position_embeddings=0), "BertModel: max_position_embeddings must be"),
            (lambda: VisionTransformer(embed_dim=0), "VisionTransformer: embed_dim must be a positive integer"),
            (lambda: SwinTransformer(depths=(2, 0)), r"SwinTransformer: depths must be positive integers, got \(2, 0\)"),
            (lambda: MLPClassifier(hidden_size=0), "MLPClassifier: hidden_size must be a positive integer, got 0")):
        with pytest.raises(ValueError, match=message):
            build()
