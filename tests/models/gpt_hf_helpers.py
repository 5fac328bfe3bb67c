"""Shared by the GPT tests: a small random transformers GPT-2 saved as a HF folder."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

HF_CONFIG = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=32, resid_pdrop=0.0,
                 embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=None)


def randomize_biases_and_norms(model, norm_marker):
    """Random (not zero / one) biases and LayerNorm parameters (names containing `norm_marker`),
    so that their gradients and layouts are exercised."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias") or norm_marker in name:
                p.add_(torch.randn_like(p) * 0.1)


def make_hf_gpt2(path, seed=0, **overrides):
    """A randomly initialised transformers GPT2LMHeadModel saved (safetensors) in `path`."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(**{**HF_CONFIG, **overrides})
    model = GPT2LMHeadModel(cfg)
    randomize_biases_and_norms(model, ".ln_")
    model.eval()
    model.save_pretrained(str(path), safe_serialization=True)
    return model


