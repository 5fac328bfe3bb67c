"""VisionTransformer against HuggingFace's ViTForImageClassification on shared weights (a small
random config saved locally): logits, loss and every parameter gradient; the converter both ways;
DropPath."""
import numpy as np
import pytest
import torch
from transformers import ViTConfig, ViTForImageClassification, ViTModel

import engine as flow
from libai.layers import DropPath
from libai.models import VisionTransformer
from libai.models.utils.hf_gpt2 import HFConfigError
from libai.models.utils.hf_vit import hf_config_from_vit_kwargs, libai_to_hf_vit

from vision_hf_helpers import assert_logits_match, assert_loss_matches, assert_regression_loss_matches, save_perturbed

CFG = dict(image_size=24, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
           intermediate_size=80, num_labels=7, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    torch.manual_seed(0)
    model = ViTForImageClassification(ViTConfig(**CFG))
    with torch.no_grad():  # random (not zero) biases and cls/position embeddings
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    path = tmp_path_factory.mktemp("vit")
    model.save_pretrained(path)
    return str(path), model


def _batch(n=4, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 3, 24, 24)).astype(np.float32), rng.integers(0, 7, n)


def test_logits_match(hf_folder):
    path, hf = hf_folder
    ours = VisionTransformer.from_huggingface(path).eval()
    x, _ = _batch()
    got = ours(flow.tensor(x))["prediction_scores"].detach().numpy()
    want = hf.eval()(pixel_values=torch.from_numpy(x)).logits.detach().numpy()
    assert got.shape == (4, 7)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_loss_and_every_gradient_match(hf_folder):
    path, hf = hf_folder
    ours = VisionTransformer.from_huggingface(path).train()
    x, y = _batch(seed=1)
    loss = ours(flow.tensor(x), flow.tensor(y))["losses"]
    loss.backward()
    hf.train().zero_grad()
    out = hf(pixel_values=torch.from_numpy(x), labels=torch.from_numpy(y))
    out.loss.backward()
    np.testing.assert_allclose(float(loss.detach().numpy()), float(out.loss), rtol=1e-5)
    grads = {k: p.grad.numpy() for k, p in ours.named_parameters()}
    mine = libai_to_hf_vit(grads, ours_kwargs(hf))
    theirs = {k: v.grad.numpy() for k, v in hf.named_parameters()}
    theirs = {_file_name(k): v for k, v in theirs.items()}
    assert sorted(mine) == sorted(theirs)
    # relative to each tensor's largest gradient; the key biases' gradients are zero in exact
    # arithmetic (softmax ignores a constant per query): both sides hold rounding noise there
    # (~5e-10 of the largest gradient), so they must be that small rather than equal
    largest = max(np.abs(g).max() for g in theirs.values())
    for k, g in theirs.items():
        if k.endswith("attention.key.bias"):
            assert max(np.abs(mine[k]).max(), np.abs(g).max()) < 1e-7 * largest, k
            continue
        assert np.abs(mine[k] - g).max() / np.abs(g).max() < 1e-4, k


def ours_kwargs(hf):
    return dict(depth=CFG["num_hidden_layers"], num_heads=CFG["num_attention_heads"])


def _file_name(k):
    """transformers 5's in-memory parameter names -> the names save_pretrained writes."""
    import re

    for pat, rep in [(r"layers\.(\d+)\.attention\.q_proj", r"encoder.layer.\1.attention.attention.query"),
                     (r"layers\.(\d+)\.attention\.k_proj", r"encoder.layer.\1.attention.attention.key"),
                     (r"layers\.(\d+)\.attention\.v_proj", r"encoder.layer.\1.attention.attention.value"),
                     (r"layers\.(\d+)\.attention\.o_proj", r"encoder.layer.\1.attention.output.dense"),
                     (r"layers\.(\d+)\.mlp\.fc1", r"encoder.layer.\1.intermediate.dense"),
                     (r"layers\.(\d+)\.mlp\.fc2", r"encoder.layer.\1.output.dense"),
                     (r"layers\.(\d+)\.", r"encoder.layer.\1.")]:
        k, n = re.subn(pat, rep, k)
        if n:
            break
    return k


def test_converter_round_trip_and_config(hf_folder, tmp_path):
    """libai -> HF files (libai_to_hf_vit + hf_config_from_vit_kwargs) -> transformers loads them
    and computes the same logits."""
    import json

    from safetensors.numpy import save_file

    path, hf = hf_folder
    ours = VisionTransformer.from_huggingface(path)
    sd = {k: p.detach().numpy() for k, p in ours.named_parameters()}
    kw = dict(img_size=24, patch_size=4, in_chans=3, embed_dim=32, depth=3, num_heads=4, mlp_ratio=2.5,
              num_classes=7, layernorm_epsilon=1e-12)
    save_file(libai_to_hf_vit(sd, kw), str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(hf_config_from_vit_kwargs(kw)))
    back = ViTForImageClassification.from_pretrained(str(tmp_path))
    x, _ = _batch(seed=2)
    np.testing.assert_allclose(back.eval()(pixel_values=torch.from_numpy(x)).logits.detach().numpy(),
                               hf.eval()(pixel_values=torch.from_numpy(x)).logits.detach().numpy(), rtol=0, atol=1e-6)


def test_backbone_only_folder_and_bad_configs(tmp_path):
    torch.manual_seed(1)
    cfg = ViTConfig(**CFG)
    ViTModel(cfg, add_pooling_layer=True).save_pretrained(tmp_path / "backbone")
    model = VisionTransformer.from_huggingface(str(tmp_path / "backbone"), num_classes=3)
    assert model.head.weight.shape == (3, 32)  # a new head over the loaded backbone
    ViTForImageClassification(ViTConfig(**dict(CFG, hidden_act="gelu_new"))).save_pretrained(tmp_path / "act")
    with pytest.raises(HFConfigError, match="hidden_act='gelu_new'"):
        VisionTransformer.from_huggingface(str(tmp_path / "act"))
    ViTForImageClassification(ViTConfig(**dict(CFG, image_size=26))).save_pretrained(tmp_path / "size")
    with pytest.raises(HFConfigError, match="image_size=26 is not a multiple of patch_size=4"):
        VisionTransformer.from_huggingface(str(tmp_path / "size"))


def test_drop_path_per_sample_scaling_and_eval_identity():
    flow.manual_seed(0)
    dp = DropPath(0.25)
    x = flow.ones(4000, 3, 2)
    y = dp(x).numpy()
    per_sample = y.reshape(4000, -1)
    assert set(np.unique(per_sample)) <= {0.0, np.float32(1 / 0.75)} and (per_sample == per_sample[:, :1]).all()
    assert abs((per_sample[:, 0] == 0).mean() - 0.25) < 4 * np.sqrt(0.25 * 0.75 / 4000)
    dp.eval()
    assert dp(x) is x
    with pytest.raises(ValueError, match=r"drop_prob must be in \[0, 1\)"):
        DropPath(1.0)


def test_training_step_runs_with_drop_path_and_soft_labels():
    flow.manual_seed(0)
    model = VisionTransformer(img_size=16, patch_size=4, embed_dim=24, depth=2, num_heads=3, num_classes=5,
                              drop_path_rate=0.2, drop_rate=0.1).train()
    x = flow.tensor(np.random.default_rng(0).standard_normal((4, 3, 16, 16)).astype(np.float32))
    soft = np.full((4, 5), 0.05, np.float32)
    soft[np.arange(4), [0, 1, 2, 3]] = 0.8
    loss = model(x, flow.tensor(soft))["losses"]
    loss.backward()
    assert np.isfinite(float(loss.detach().numpy()))
    assert all(p.grad is not None for p in model.parameters())
    with pytest.raises(ValueError, match=r"expected images \[N, 3, 16, 16\]"):
        model(flow.zeros(2, 3, 8, 8))


def test_missing_and_extra_tensors_are_refused(hf_folder):
    from safetensors.numpy import load_file

    from libai.models.utils.hf_vit import hf_to_libai_vit

    path, _ = hf_folder
    sd = load_file(f"{path}/model.safetensors")
    kw = dict(num_heads=4, depth=3)
    assert "cls_token" in hf_to_libai_vit(sd, kw, path="f.safetensors")
    missing = {k: v for k, v in sd.items() if "layer.1.output.dense.bias" not in k}
    with pytest.raises(HFConfigError, match="f.safetensors: missing tensor 'encoder.layer.1.output.dense.bias'"):
        hf_to_libai_vit(missing, kw, path="f.safetensors")
    extra = dict(sd, **{"vit.encoder.layer.9.output.dense.bias": np.zeros(3, np.float32)})
    with pytest.raises(HFConfigError, match="VisionTransformer does not have: .*layer.9.output.dense.bias"):
        hf_to_libai_vit(extra, kw, path="f.safetensors")
    with_pooler = dict(sd, **{"vit.pooler.dense.bias": np.zeros(3, np.float32)})
    hf_to_libai_vit(with_pooler, kw)  # a ViTModel's pooler is ignored, not refused


def _hf_variant(path, cls=ViTForImageClassification, **overrides):
    torch.manual_seed(2)
    return save_perturbed(cls(ViTConfig(**{**CFG, **overrides})), path, seed=2)


@pytest.mark.parametrize("overrides", [dict(hidden_size=56, num_attention_heads=4, intermediate_size=61),
                                       dict(image_size=[24, 32]), dict(image_size=[24, 32], patch_size=[4, 8])],
                         ids=["intermediate-61", "image-hw", "patch-hw"])
def test_config_variants_match(tmp_path, overrides):
    """An MLP width that is no multiple of the hidden size (int(56 * (61 / 56)) is 60 in floating
    point); rectangular images and patches."""
    hf = _hf_variant(tmp_path, **overrides)
    assert_logits_match(hf, VisionTransformer, tmp_path, overrides.get("image_size", [24, 24]))


def test_regression_head_matches_hf(tmp_path):
    assert_regression_loss_matches(_hf_variant(tmp_path / "reg", num_labels=1), VisionTransformer,
                                   tmp_path / "reg", (24, 24))


MULTI_HOT = np.array([[1, 0, 1], [0, 1, 0]], np.float32)
TARGETS_3 = np.array([[0.5, -1.0, 2.0], [1.5, 0.0, -0.5]], np.float32)


@pytest.mark.parametrize("kind, labels", [("multi_label_classification", MULTI_HOT), ("regression", TARGETS_3),
                                          ("single_label_classification", np.array([2, 0]))])
def test_each_hf_problem_type_trains_with_hf_loss(tmp_path, kind, labels):
    """The folder's problem_type is the loss: HF's BCE with logits for multi-hot labels, the mean
    squared error of three outputs, the cross-entropy (the ViT sample in issue probes)."""
    hf = _hf_variant(tmp_path, num_labels=3, problem_type=kind)
    assert_loss_matches(hf, VisionTransformer, tmp_path, (24, 24), labels)


def test_problem_type_none_reads_float_labels_as_soft_targets_unless_named(tmp_path):
    """Without a problem_type, float labels [N, C] are Mixup's soft targets (LiBai's convention;
    HF would infer multi-label): the soft-target cross-entropy. Naming the problem type gives HF's."""
    _hf_variant(tmp_path, num_labels=3)
    x = flow.tensor(np.random.default_rng(4).standard_normal((2, 3, 24, 24)).astype(np.float32))
    model = VisionTransformer.from_huggingface(str(tmp_path)).train()
    logits = torch.from_numpy(model.head(model.forward_features(x)).detach().numpy())
    target = torch.from_numpy(MULTI_HOT)
    soft = torch.nn.functional.cross_entropy(logits, target)  # class probabilities as the target
    np.testing.assert_allclose(float(model(x, flow.tensor(MULTI_HOT))["losses"].detach().numpy()), float(soft),
                               rtol=1e-6)
    named = VisionTransformer.from_huggingface(str(tmp_path), problem_type="multi_label_classification").train()
    bce = torch.nn.functional.binary_cross_entropy_with_logits(logits, target)
    np.testing.assert_allclose(float(named(x, flow.tensor(MULTI_HOT))["losses"].detach().numpy()), float(bce),
                               rtol=1e-6)
    with pytest.raises(ValueError, match=r"labels of shape \[2\] for logits of shape \[2, 3\]"):
        named(x, flow.tensor(np.array([1.0, 0.0], np.float32)))
    with pytest.raises(ValueError, match="problem_type='multilabel' is not one of"):
        VisionTransformer.from_huggingface(str(tmp_path), problem_type="multilabel")


def test_another_number_of_classes_needs_ignore_mismatched_sizes(tmp_path):
    hf = _hf_variant(tmp_path)  # 7 labels
    with pytest.raises(HFConfigError, match=r"head.weight is \[7, 32\], the model's \[10, 32\]"):
        VisionTransformer.from_huggingface(str(tmp_path), num_classes=10)
    model = VisionTransformer.from_huggingface(str(tmp_path), num_classes=10, ignore_mismatched_sizes=True)
    assert tuple(model.head.weight.shape) == (10, 32)
    assert np.array_equal(model.cls_token.detach().numpy(), hf.vit.embeddings.cls_token.detach().numpy())


def test_a_vit_model_pooler_is_named_when_dropped(tmp_path, caplog):
    _hf_variant(tmp_path, cls=ViTModel)
    with caplog.at_level("WARNING"):
        VisionTransformer.from_huggingface(str(tmp_path), num_classes=3)
    assert "['pooler.dense.bias', 'pooler.dense.weight'] (ViTModel's pooler)" in caplog.text
    assert "not loaded, and not written back" in caplog.text
