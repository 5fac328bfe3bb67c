"""libai layers / GPT-2 on a dp x tp layout vs the single-process run (under mpiexec).

    python -m engine.distributed.run gpt_parallel.py REF.npz DP TP [DEVICE]
    python -m engine.distributed.run gpt_parallel.py --write REF.npz DEVICE   (one process)

REF.npz holds the single-process results of the same computations (written by
tests/distributed/test_gpt_parallel.py with `compute(...)` below); every rank builds the same
models (same seed: parameters are drawn as logical tensors, so the values do not depend on the
layout), runs them on the layout and compares forward outputs, the loss and every gradient
(gathered with .numpy()) within 1e-5 relative.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

import engine as flow  # noqa: E402
from libai.utils import distributed as dist  # noqa: E402

B = flow.sbp.broadcast
S = flow.sbp.split
GPT = dict(hidden_layers=2, vocab_size=96, hidden_size=64, num_attention_heads=4, max_seq_length=16,
           initializer_range=0.2)
BATCH, SEQ = 4, 12


def data():
    rng = np.random.default_rng(7)
    ids = rng.integers(0, GPT["vocab_size"], size=(BATCH, SEQ))
    labels = rng.integers(0, GPT["vocab_size"], size=(BATCH, SEQ))
    labels[0, :3] = -100
    labels[2, 5] = -100
    x = rng.standard_normal((BATCH, SEQ, 64)).astype(np.float32)
    g = rng.standard_normal((BATCH, SEQ, 64)).astype(np.float32)
    pad = np.ones((BATCH, SEQ), np.int64)
    pad[1, 8:] = 0
    return ids, labels, x, g, pad


def compute():
    """The results of this layout (all gathered to numpy on every rank)."""
    from libai.layers import TransformerLayer
    from libai.models import GPTForPreTraining

    ids, labels, x_np, g_np, pad = data()
    out = {}
    hidden_sbp = dist.get_hidden_sbp()
    placement = dist.get_layer_placement(0)

    # ---- one TransformerLayer (causal, then padding mask), input given as a global [S(0), B] tensor
    for mask_type in ("causal", "padding"):
        flow.manual_seed(11)
        layer = TransformerLayer(64, 256, 4, attn_mask_type=mask_type, init_method=flow.nn.init.normal_,
                                 layer_idx=0)
        x = flow.tensor(x_np, placement=placement, sbp=hidden_sbp, requires_grad=True)
        mask = flow.tensor(pad[:, None, None, :], placement=placement, sbp=[B] * placement.ndim) \
            if mask_type == "padding" else None
        y = layer(x, mask)
        assert tuple(y.sbp) == tuple(hidden_sbp), (y.sbp, hidden_sbp)
        (y * flow.tensor(g_np, placement=placement, sbp=hidden_sbp)).sum().backward()
        out[f"layer_{mask_type}_out"] = host(y)
        out[f"layer_{mask_type}_dx"] = host(x.grad)
        for k, p in layer.named_parameters():
            out[f"layer_{mask_type}_grad.{k}"] = host(p.grad)

    # ---- a 2-layer GPT: logits (split on the vocabulary), vocab-parallel loss, gradients
    flow.manual_seed(5)
    model = GPTForPreTraining(**GPT)
    model.train()
    ids_g = flow.tensor(ids, placement=placement, sbp=hidden_sbp)
    labels_g = flow.tensor(labels, placement=placement, sbp=hidden_sbp)
    logits = model.GPT_model(ids_g)
    if dist.get_tensor_parallel_size() > 1:
        assert logits.sbp[-1] == S(2), f"logits are not split on the vocabulary: {logits.sbp}"
    per_token = model.loss_func.lm_loss.__class__(reduction="none")(logits, labels_g)
    from engine.distributed import comm

    with comm.stats.recording() as rec:
        loss = model(ids_g, labels_g)["lm_loss"]
        loss.backward()
    # Megatron's communication only: all-reduces (row-parallel outputs, embedding, loss terms,
    # data-parallel gradients); nothing is gathered (no logits, no weights, no activations)
    gathered = rec.bytes_of("all_gather") + rec.bytes_of("all_to_all")
    assert gathered == 0, f"forward/backward gathered {gathered} bytes: {rec.calls}"
    out["gpt_logits"] = host(logits)
    out["gpt_per_token"] = host(per_token)
    out["gpt_loss"] = np.asarray(loss.item())
    for k, p in model.named_parameters():
        out[f"gpt_grad.{k}"] = host(p.grad)
    return out


def host(t):
    """The whole logical value of global tensor `t` as a numpy array (from any device)."""
    return t.detach().cpu().numpy()


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def main():
    if sys.argv[1] == "--write":  # gpt_parallel.py --write OUT.npz DEVICE: the one-process reference
        dist.set_device_type(sys.argv[3])
        np.savez(sys.argv[2], **compute())
        return
    ref_file, dp, tp = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    device = sys.argv[4] if len(sys.argv) > 4 else "cpu"
    dist.setup_dist_util({"data_parallel_size": dp, "tensor_parallel_size": tp})
    dist.set_device_type(device)
    ref = dict(np.load(ref_file))
    got = compute()
    assert sorted(got) == sorted(ref), set(got) ^ set(ref)
    worst = {}
    for k in ref:
        r = rel(got[k], ref[k])
        group = k.split(".")[0]
        worst[group] = max(worst.get(group, 0.0), r)
        assert got[k].shape == ref[k].shape, (k, got[k].shape, ref[k].shape)
        assert r <= 1e-5, f"{k}: relative error {r:.3g} on dp={dp} tp={tp}"
    if dist.get_rank() == 0:
        print(f"gpt_parallel OK dp={dp} tp={tp} on {device}: " + ", ".join(f"{k} {v:.2g}" for k, v in sorted(worst.items())))


if __name__ == "__main__":
    main()
