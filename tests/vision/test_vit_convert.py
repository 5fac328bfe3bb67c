"""tools/convert_checkpoint.py for ViT: a HuggingFace folder -> a libai checkpoint -> a
HuggingFace folder again holds the same tensors (bit for bit) and transformers computes the same
logits from it; a checkpoint the recipe trained converts with its model's keys."""
import json
import os
import subprocess
import sys

import numpy as np
import torch
from safetensors.numpy import load_file
from transformers import ViTConfig, ViTForImageClassification

from vision_helpers import ROOT, VIT_TINY, train_vit

CONVERT = os.path.join(ROOT, "tools", "convert_checkpoint.py")


def _convert(*args):
    r = subprocess.run([sys.executable, CONVERT, *args], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 0, r.stderr[-3000:]


def test_hf_to_libai_and_back(tmp_path):
    torch.manual_seed(0)
    cfg = ViTConfig(image_size=16, patch_size=4, hidden_size=24, num_hidden_layers=2, num_attention_heads=3,
                    intermediate_size=48, num_labels=4)
    hf = ViTForImageClassification(cfg).eval()
    hf.save_pretrained(tmp_path / "hf")
    _convert("--from-hf", str(tmp_path / "hf"), "--to", str(tmp_path / "ckpt"))
    kwargs = json.load(open(tmp_path / "ckpt" / "vit_config.json"))
    assert (kwargs["embed_dim"], kwargs["depth"], kwargs["num_heads"], kwargs["num_classes"]) == (24, 2, 3, 4)
    _convert("--from-libai", str(tmp_path / "ckpt"), "--to-hf", str(tmp_path / "hf2"))
    a, b = load_file(str(tmp_path / "hf" / "model.safetensors")), load_file(str(tmp_path / "hf2" / "model.safetensors"))
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    back = ViTForImageClassification.from_pretrained(str(tmp_path / "hf2")).eval()
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((2, 3, 16, 16)).astype(np.float32))
    np.testing.assert_array_equal(back(pixel_values=x).logits.detach().numpy(),
                                  hf(pixel_values=x).logits.detach().numpy())


def test_rectangular_images_and_the_original_config_survive_the_round_trip(tmp_path):
    """An [h, w] image size is a list in the checkpoint's config.yaml (it was written as an
    "unserializable ListConfig" string the way back could not read), and the HF config's other
    entries (label names, encoder_stride, pooler_act, problem_type) come back as they were."""
    torch.manual_seed(0)
    cfg = ViTConfig(image_size=[16, 24], patch_size=4, hidden_size=24, num_hidden_layers=1, num_attention_heads=3,
                    intermediate_size=48, id2label={0: "cat", 1: "dog", 2: "bird"}, encoder_stride=4,
                    pooler_act="relu", problem_type="single_label_classification")
    hf = ViTForImageClassification(cfg).eval()
    hf.save_pretrained(tmp_path / "hf")
    _convert("--from-hf", str(tmp_path / "hf"), "--to", str(tmp_path / "ckpt"))
    assert "img_size:\n  - 16\n  - 24\n" in (tmp_path / "ckpt" / "config.yaml").read_text()
    _convert("--from-libai", str(tmp_path / "ckpt"), "--to-hf", str(tmp_path / "hf2"))
    a, b = json.load(open(tmp_path / "hf" / "config.json")), json.load(open(tmp_path / "hf2" / "config.json"))
    changed = {k for k in set(a) | set(b) if k not in ("transformers_version", "dtype") and a.get(k) != b.get(k)}
    assert not changed, {k: (a.get(k), b.get(k)) for k in changed}
    back = ViTForImageClassification.from_pretrained(str(tmp_path / "hf2")).eval()
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((2, 3, 16, 24)).astype(np.float32))
    np.testing.assert_array_equal(back(pixel_values=x).logits.detach().numpy(),
                                  hf(pixel_values=x).logits.detach().numpy())


def test_a_trained_recipe_checkpoint_converts(tmp_path):
    out = str(tmp_path / "run")
    train_vit(f"train.output_dir={out}", *VIT_TINY, "train.train_iter=3", "train.evaluation.enabled=False")
    keys = dict(img_size=32, patch_size=4, in_chans=3, embed_dim=48, depth=2, num_heads=4, mlp_ratio=4.0,
                num_classes=10)
    (tmp_path / "kw.json").write_text(json.dumps(keys))
    _convert("--from-libai", os.path.join(out, "model_final"), "--config", str(tmp_path / "kw.json"),
             "--to-hf", str(tmp_path / "hf"))
    hf = ViTForImageClassification.from_pretrained(str(tmp_path / "hf")).eval()
    assert hf.config.num_labels == 10 and hf.config.hidden_size == 48
    # the trained weights themselves: the recipe's model on them computes transformers' logits
    import engine as flow
    from libai.models import VisionTransformer
    from libai.models.utils.weights import load_logical_state_dict

    ours = VisionTransformer(**keys).eval()
    load_logical_state_dict(ours, flow.load(os.path.join(out, "model_final", "model.safetensors")))
    x = np.random.default_rng(1).standard_normal((2, 3, 32, 32)).astype(np.float32)
    np.testing.assert_allclose(ours(flow.tensor(x))["prediction_scores"].detach().numpy(),
                               hf(pixel_values=torch.from_numpy(x)).logits.detach().numpy(), rtol=0, atol=1e-5)
