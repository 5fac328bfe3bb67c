"""GPTModel against transformers' GPT2LMHeadModel (a small random model saved with
save_pretrained): logits, LM loss, every parameter gradient, greedy generation with the KV
cache, the checkpoint converter round trip and the loader's error paths. Single process."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import engine as flow
from libai.models import GPTForPreTraining, GPTModel
from libai.models.utils import (
    HFConfigError, libai_to_hf_gpt2, load_logical_state_dict, logical_state_dict, read_safetensors,
)

from gpt_hf_helpers import HF_CONFIG, ROOT, make_hf_gpt2

RNG = np.random.default_rng(1234)
IDS = RNG.integers(0, HF_CONFIG["vocab_size"], size=(3, 16))


def shifted_labels(ids):
    labels = np.full_like(ids, -100)
    labels[:, :-1] = ids[:, 1:]
    labels[1, 3:6] = -100  # some ignored targets inside the sequence too
    return labels


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def test_logits_match_hf(hf_gpt2):
    path, hf = hf_gpt2
    model = GPTModel.from_huggingface(path)
    model.eval()
    logits = model(flow.tensor(IDS))
    ref = hf(torch.tensor(IDS)).logits.detach().numpy()
    assert tuple(logits.shape) == ref.shape
    err = np.abs(logits.detach().numpy() - ref).max()
    print(f"max abs logit error vs HF: {err:.3g}")
    assert err < 1e-4, err


def test_left_padded_batch_with_position_ids_matches_hf(hf_gpt2):
    """HF's generate runs a left-padded batch with position_ids = mask.cumsum(-1) - 1 (1 at pads):
    given the same position_ids and attention mask, the logits of every real token are HF's, and
    the padded row's last logits equal the unpadded prompt's."""
    path, hf = hf_gpt2
    model = GPTModel.from_huggingface(path)
    model.eval()
    ids = np.array(IDS[:2], dtype=np.int64)
    mask = np.ones_like(ids)
    mask[0, :3] = 0  # row 0: three pads on the left
    pos = np.where(mask == 1, mask.cumsum(-1) - 1, 1)
    with flow.no_grad():
        got = model(flow.tensor(ids), attention_mask=flow.tensor(mask), position_ids=flow.tensor(pos)).numpy()
        alone = model(flow.tensor(ids[:1, 3:])).numpy()
    want = hf(torch.tensor(ids), attention_mask=torch.tensor(mask), position_ids=torch.tensor(pos)).logits.detach()
    real = mask.astype(bool)
    assert np.abs(got[real] - want.numpy()[real]).max() < 1e-4
    assert np.abs(got[0, -1] - alone[0, -1]).max() < 1e-4
    with pytest.raises(ValueError, match="position_ids of shape"):
        model(flow.tensor(ids), position_ids=flow.tensor(pos[:, :2]))


def test_loss_and_gradients_match_hf(hf_gpt2):
    path, _ = hf_gpt2
    hf = make_hf_gpt2(os.path.join(path, "grad_copy"), seed=0)  # a fresh copy to train on
    model = GPTForPreTraining(**GPTModel.from_huggingface(path).config)
    load_logical_state_dict(model.GPT_model, logical_state_dict(GPTModel.from_huggingface(path)))
    model.train()
    labels = shifted_labels(IDS)
    out = model(flow.tensor(IDS), flow.tensor(labels))
    assert set(out) == {"lm_loss"}
    loss = out["lm_loss"]
    loss.backward()

    hf.train()
    hf.zero_grad()
    # HF shifts internally: labels = the inputs, with our ignored targets moved back by one
    hf_labels = torch.tensor(IDS).clone()
    hf_labels[torch.tensor(labels[:, :-1] == -100).nonzero(as_tuple=True)[0],
              torch.tensor(labels[:, :-1] == -100).nonzero(as_tuple=True)[1] + 1] = -100
    hf_loss = hf(torch.tensor(IDS), labels=hf_labels).loss
    hf_loss.backward()
    assert abs(loss.item() - hf_loss.item()) <= 1e-5 * abs(hf_loss.item()), (loss.item(), hf_loss.item())

    grads = {k[len("GPT_model."):]: p.grad.numpy() for k, p in model.named_parameters()}
    assert all(g is not None for g in grads.values())
    mapped = libai_to_hf_gpt2(grads, HF_CONFIG["n_layer"], HF_CONFIG["n_head"])
    hf_grads = {k: p.grad.numpy() for k, p in hf.named_parameters() if p.grad is not None}
    assert set(mapped) == set(hf_grads) - {"lm_head.weight"}
    worst = max((rel(mapped[k], hf_grads[k]), k) for k in mapped)
    worst_abs = max(np.abs(mapped[k] - hf_grads[k]).max() for k in mapped)
    print(f"loss {loss.item():.6f} vs HF {hf_loss.item():.6f}; worst gradient rel error {worst[0]:.3g} "
          f"({worst[1]}), max abs {worst_abs:.3g}")
    assert worst[0] < 1e-4, worst


def test_eval_outputs(hf_gpt2):
    path, hf = hf_gpt2
    model = GPTForPreTraining(**GPTModel.from_huggingface(path).config)
    load_logical_state_dict(model.GPT_model, logical_state_dict(GPTModel.from_huggingface(path)))
    model.eval()
    out = model(flow.tensor(IDS))
    assert set(out) == {"prediction_scores"}
    out = model(flow.tensor(IDS), flow.tensor(shifted_labels(IDS)))
    assert set(out) == {"prediction_scores", "lm_loss"}  # PPLEvaluator reads the loss


def test_kv_cache_matches_full_forward(hf_gpt2):
    path, _ = hf_gpt2
    model = GPTModel.from_huggingface(path)
    model.eval()
    with flow.no_grad():
        full = model(flow.tensor(IDS)).numpy()
        logits, past = model(flow.tensor(IDS[:, :9]), use_cache=True)
        parts = [logits.numpy()]
        for t in range(9, IDS.shape[1], 2):
            logits, past = model(flow.tensor(IDS[:, t:t + 2]), past_key_values=past, use_cache=True)
            parts.append(logits.numpy())
    assert len(past) == HF_CONFIG["n_layer"] and tuple(past[0][0].shape) == (3, 4, 16, 16)
    assert np.abs(np.concatenate(parts, axis=1) - full).max() < 1e-5


def greedy(model, prompt, n):
    with flow.no_grad():
        logits, past = model(flow.tensor(prompt), use_cache=True)
        out = [prompt]
        for _ in range(n):
            nxt = logits.numpy()[:, -1].argmax(-1)[:, None]
            out.append(nxt)
            logits, past = model(flow.tensor(nxt), past_key_values=past, use_cache=True)
    return np.concatenate(out, axis=1)


def test_greedy_generation_matches_hf(hf_gpt2):
    path, hf = hf_gpt2
    model = GPTModel.from_huggingface(path)
    model.eval()
    prompt = IDS[:2, :5]
    ours = greedy(model, prompt, 10)
    with torch.no_grad():
        ref = hf.generate(torch.tensor(prompt), max_new_tokens=10, do_sample=False,
                          attention_mask=torch.ones(prompt.shape, dtype=torch.long), pad_token_id=0).numpy()
    assert ref.shape == (2, 15)
    np.testing.assert_array_equal(ours, ref)


def test_convert_checkpoint_round_trip(hf_gpt2, tmp_path):
    path, hf = hf_gpt2
    ckpt, back = tmp_path / "ckpt", tmp_path / "hf_back"
    tool = os.path.join(ROOT, "tools", "convert_checkpoint.py")
    env = dict(os.environ, PYTHONPATH=ROOT)
    subprocess.run([sys.executable, tool, "--from-hf", path, "--to", str(ckpt)], check=True, env=env)
    assert (ckpt / "model.safetensors").is_file()
    subprocess.run([sys.executable, tool, "--from-libai", str(ckpt), "--to-hf", str(back)], check=True, env=env)
    a = read_safetensors(os.path.join(path, "model.safetensors"))
    b = read_safetensors(str(back / "model.safetensors"))
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k
    # the checkpoint loads into the training model; the HF folder into transformers
    sd = flow.load(str(ckpt / "model.safetensors"))
    cfg = json.loads((ckpt / "gpt_config.json").read_text())
    model = GPTForPreTraining(**cfg)
    load_logical_state_dict(model, sd)
    model.eval()
    from transformers import GPT2LMHeadModel

    hf2 = GPT2LMHeadModel.from_pretrained(str(back)).eval()
    ref = hf(torch.tensor(IDS)).logits.detach().numpy()
    assert np.abs(hf2(torch.tensor(IDS)).logits.detach().numpy() - ref).max() == 0
    assert np.abs(model(flow.tensor(IDS))["prediction_scores"].detach().numpy() - ref).max() < 1e-4


def test_convert_from_libai_with_lazy_config(hf_gpt2, tmp_path):
    """--config takes a training config whose model.cfg has GPTModel's keys."""
    path, _ = hf_gpt2
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import convert_checkpoint as cc

    ckpt = cc.hf_to_libai(path, str(tmp_path / "ckpt"))
    os.remove(os.path.join(ckpt, "gpt_config.json"))
    os.remove(os.path.join(ckpt, "config.yaml"))  # the config the converted directory carries
    with pytest.raises(FileNotFoundError, match="gpt_config.json"):
        cc.libai_to_hf(ckpt, str(tmp_path / "x"))
    cfg_file = tmp_path / "cfg.py"
    cfg_file.write_text(
        "from omegaconf import DictConfig\n"
        f"model = dict(cfg=dict(hidden_layers=2, vocab_size=100, hidden_size=64, num_attention_heads=4, "
        "max_seq_length=32))\n")
    out = cc.libai_to_hf(ckpt, str(tmp_path / "back"), str(cfg_file))
    a = read_safetensors(os.path.join(path, "model.safetensors"))
    b = read_safetensors(os.path.join(out, "model.safetensors"))
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_missing_files_are_named(tmp_path, hf_gpt2):
    with pytest.raises(FileNotFoundError, match="config.json"):
        GPTModel.from_huggingface(str(tmp_path))
    path, _ = hf_gpt2
    d = tmp_path / "no_weights"
    d.mkdir()
    (d / "config.json").write_text(open(os.path.join(path, "config.json")).read())
    with pytest.raises(FileNotFoundError, match=r"no_weights/model\.safetensors"):
        GPTModel.from_huggingface(str(d))
    with pytest.raises(FileNotFoundError, match="does_not_exist"):
        GPTModel.from_huggingface(str(tmp_path / "does_not_exist"))


@pytest.mark.parametrize("key,value", [
    ("scale_attn_by_inverse_layer_idx", True), ("reorder_and_upcast_attn", True), ("add_cross_attention", True),
    ("activation_function", "relu"), ("scale_attn_weights", False),
])
def test_unsupported_config_key_is_named(hf_gpt2, tmp_path, key, value):
    path, _ = hf_gpt2
    cfg = json.loads(open(os.path.join(path, "config.json")).read())
    cfg[key] = value
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    os.symlink(os.path.join(path, "model.safetensors"), tmp_path / "model.safetensors")
    with pytest.raises(HFConfigError, match=key):
        GPTModel.from_huggingface(str(tmp_path))


def test_overrides_and_from_config(hf_gpt2):
    path, _ = hf_gpt2
    model = GPTModel.from_huggingface(path, output_dropout_prob=0.1)
    assert model.config["output_dropout_prob"] == 0.1
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(dict(hidden_layers=1, vocab_size=12, hidden_size=8, num_attention_heads=2,
                                max_seq_length=6))
    m = GPTModel(cfg)
    assert m.config["ffn_hidden_size"] == 32 and len(m.transformer.layers) == 1
    m2 = GPTForPreTraining(cfg)
    assert m2.GPT_model.config == m.config
    with pytest.raises(ValueError, match="max_seq_length 6"):
        m(flow.tensor(np.zeros((1, 7), np.int64)))
