"""SwinTransformer against HuggingFace's SwinForImageClassification on shared weights (small random
configs saved locally): logits for a plain config, one whose maps need window padding (with
shifted windows on padded maps and an odd-sized map merged), and one whose window does not divide
the map; loss and every parameter gradient."""
import numpy as np
import pytest
import torch
from transformers import SwinConfig, SwinForImageClassification

import engine as flow
from libai.models import SwinTransformer
from libai.models.utils.hf_gpt2 import HFConfigError

from vision_hf_helpers import assert_logits_match, assert_loss_matches, assert_regression_loss_matches, save_perturbed

CASES = {
    # 16x16 -> 8x8 maps, window 4: two stages of shifted windows, no padding
    "plain": dict(image_size=32, patch_size=2, embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=4),
    # 18x18 (padded to 20), 9x9 (padded to 12), 5x5 (padded to 8, still shifted): padding everywhere
    "padded": dict(image_size=36, patch_size=2, embed_dim=16, depths=[2, 2, 2], num_heads=[2, 2, 4], window_size=4),
    # 14x14 with window 3 (padded to 15), merged to 7x7 (padded to 9)
    "window-3": dict(image_size=28, patch_size=2, embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=3),
}


def _hf(tmp_path_factory, name):
    cfg = SwinConfig(**CASES[name], num_labels=5, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                     drop_path_rate=0.0)
    torch.manual_seed(0)
    model = SwinForImageClassification(cfg)
    with torch.no_grad():  # non-zero biases and relative position tables
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    path = tmp_path_factory.mktemp(f"swin_{name}")
    model.save_pretrained(path)
    return str(path), model


def _images(name, n=2, seed=0):
    s = CASES[name]["image_size"]
    return np.random.default_rng(seed).standard_normal((n, 3, s, s)).astype(np.float32)


@pytest.mark.parametrize("name", sorted(CASES))
def test_logits_match(tmp_path_factory, name):
    path, hf = _hf(tmp_path_factory, name)
    ours = SwinTransformer.from_huggingface(path).eval()
    x = _images(name)
    got = ours(flow.tensor(x))["prediction_scores"].detach().numpy()
    want = hf.eval()(pixel_values=torch.from_numpy(x)).logits.detach().numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_loss_and_gradients_match(tmp_path_factory):
    path, hf = _hf(tmp_path_factory, "padded")
    ours = SwinTransformer.from_huggingface(path).train()
    x, y = _images("padded", n=4, seed=1), np.array([0, 3, 1, 4])
    loss = ours(flow.tensor(x), flow.tensor(y))["losses"]
    loss.backward()
    hf.train().zero_grad()
    out = hf(pixel_values=torch.from_numpy(x), labels=torch.from_numpy(y))
    out.loss.backward()
    np.testing.assert_allclose(float(loss.detach().numpy()), float(out.loss), rtol=1e-5)
    grads = dict(ours.named_parameters())
    hf_grads = {k[len("swin."):] if k.startswith("swin.") else k: p.grad.numpy() for k, p in hf.named_parameters()}
    floor = 1e-5 * max(np.abs(g).max() for g in hf_grads.values())

    def close(mine, theirs, what):
        scale = max(np.abs(theirs).max(), floor)
        assert np.abs(mine - theirs).max() / scale < 1e-4, what

    close(grads["patch_embed.inner.weight"].grad.numpy(), hf_grads["embeddings.patch_embeddings.projection.weight"],
          "patch embedding")
    close(grads["head.weight"].grad.numpy(), hf_grads["classifier.weight"], "head")
    for i, depth in enumerate(CASES["padded"]["depths"]):
        for j in range(depth):
            hf_pre, lb = f"encoder.layers.{i}.blocks.{j}.", f"stages.{i}.{j}."
            # (transformers 5's in-memory names)
            table = f"{hf_pre}attention.relative_position_bias.relative_position_bias_table"
            close(grads[f"{lb}attn.relative_position_bias_table"].grad.numpy(), hf_grads[table], f"{lb} bias table")
            close(grads[f"{lb}mlp.dense_h_to_4h.weight"].grad.numpy(), hf_grads[f"{hf_pre}mlp.fc1.weight"], f"{lb} mlp")
            close(grads[f"{lb}attn.proj.weight"].grad.numpy(), hf_grads[f"{hf_pre}attention.o_proj.weight"],
                  f"{lb} proj")
            close(grads[f"{lb}norm1.weight"].grad.numpy(), hf_grads[f"{hf_pre}layernorm_before.weight"], f"{lb} norm1")
        if i < 2:
            close(grads[f"merges.{i}.reduction.weight"].grad.numpy(),
                  hf_grads[f"encoder.layers.{i}.downsample.reduction.weight"], f"merge {i}")


def test_unsupported_hf_configs_are_named(tmp_path):
    SwinForImageClassification(SwinConfig(**CASES["plain"], qkv_bias=False)).save_pretrained(tmp_path / "bias")
    with pytest.raises(HFConfigError, match="qkv_bias=False"):
        SwinTransformer.from_huggingface(str(tmp_path / "bias"))
    SwinForImageClassification(SwinConfig(**dict(CASES["plain"], patch_size=[2, 4]))).save_pretrained(
        tmp_path / "patch")
    with pytest.raises(HFConfigError, match=r"patch_size=\[2, 4\] \(square patches only\)"):
        SwinTransformer.from_huggingface(str(tmp_path / "patch"))
    with pytest.raises(NotImplementedError, match="qk_scale"):
        SwinTransformer(img_size=32, qk_scale=0.1)


def test_relative_position_index_is_a_non_persistent_buffer():
    """Derived from the window size: moves with the module, never in a state dict or a checkpoint,
    and load_logical_state_dict (strict) does not ask for it."""
    from libai.models.utils.weights import load_logical_state_dict, logical_state_dict

    model = SwinTransformer(img_size=16, patch_size=2, embed_dim=8, depths=(2,), num_heads=(2,), window_size=4,
                            num_classes=3)
    assert dict(model.named_buffers())["stages.0.0.attn.relative_position_index"].shape == (256,)
    sd = logical_state_dict(model)
    assert not any("relative_position_index" in k for k in sd)
    load_logical_state_dict(model, sd)  # strict: every persistent key present, nothing missing


def _hf_variant(path, **overrides):
    """A HF Swin saved in `path` from the "plain" case with `overrides`, its weights perturbed."""
    cfg = SwinConfig(**{**CASES["plain"], "num_labels": 5, "hidden_dropout_prob": 0.0,
                        "attention_probs_dropout_prob": 0.0, "drop_path_rate": 0.0, **overrides})
    torch.manual_seed(1)
    return save_perturbed(SwinForImageClassification(cfg), path, seed=1)


@pytest.mark.parametrize("overrides", [dict(layer_norm_eps=1e-1), dict(use_absolute_embeddings=True),
                                       dict(image_size=[32, 24])], ids=["eps", "absolute-embeddings", "image-hw"])
def test_config_variants_match(tmp_path, overrides):
    """layer_norm_eps is the blocks' and the final norm's only (HF's patch embedding and merging
    norms keep 1e-5); the absolute position table; a [height, width] image size."""
    hf = _hf_variant(tmp_path, **overrides)
    assert_logits_match(hf, SwinTransformer, tmp_path, overrides.get("image_size", [32, 32]))


def test_regression_head_matches_hf(tmp_path):
    assert_regression_loss_matches(_hf_variant(tmp_path / "reg", num_labels=1), SwinTransformer, tmp_path / "reg",
                                   (32, 32))


@pytest.mark.parametrize("kind", ["multi_label_classification", "regression"])
def test_multi_label_and_multi_output_regression_train_with_hf_loss(tmp_path, kind):
    hf = _hf_variant(tmp_path, problem_type=kind)  # 5 labels
    labels = np.random.default_rng(6).integers(0, 2, (2, 5)).astype(np.float32)
    assert_loss_matches(hf, SwinTransformer, tmp_path, (32, 32), labels)


def test_a_map_smaller_than_the_window_is_named(tmp_path):
    """HF's Swin fails at its forward when a stage's map is smaller than the window (position
    tables sized for the window); loading such a folder names the stage, not a table's shape."""
    _hf_variant(tmp_path, image_size=16, depths=[2, 2, 2], num_heads=[2, 2, 2])  # maps 8, 4, 2; window 4
    with pytest.raises(HFConfigError, match="stage 2's map 2x2 is smaller than window_size=4"):
        SwinTransformer.from_huggingface(str(tmp_path))
    _hf_variant(tmp_path / "equal", image_size=16)  # maps 8, 4: a map equal to the window loads
    SwinTransformer.from_huggingface(str(tmp_path / "equal"))


def test_stochastic_depth_from_hf_drops_the_attention_branch_only(tmp_path):
    """HF's SwinLayer drops the attention branch only: one block with drop_path 0.5 gives two
    distinct outputs for one image (kept, dropped); both branches (LiBai's, the default) four."""
    _hf_variant(tmp_path, depths=[2], num_heads=[2], drop_path_rate=0.5)  # blocks' rates 0 and 0.5
    x = flow.tensor(np.random.default_rng(5).standard_normal((1, 3, 32, 32)).astype(np.float32))

    def outcomes(model):
        model.train()
        flow.manual_seed(0)
        with flow.no_grad():
            return len({model(x)["prediction_scores"].numpy().round(5).tobytes() for _ in range(40)})

    hf_like = SwinTransformer.from_huggingface(str(tmp_path))
    assert not hf_like.stages[0][1].mlp_drop_path
    assert outcomes(hf_like) == 2
    assert outcomes(SwinTransformer.from_huggingface(str(tmp_path), mlp_drop_path=True)) == 4
