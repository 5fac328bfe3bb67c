"""(c, second half) tools/generate.py on a Hugging Face GPT-2 (a random tiny transformers model
with the default corpus's tokenizer files): greedy decoding gives transformers' greedy
`generate` tokens, directly (--hf-path) and through tools/convert_checkpoint.py (--checkpoint
with the recipe); the converted directory also loads as `train.load_weight`."""
import os
import shutil
import sys

import numpy as np

from gpt2_helpers import CONFIG, ROOT, TINY, generate, records, run_command, env, train_net

VOCAB = 6784  # the default corpus tokenizer (6702 tokens) padded to a multiple of 128
TOKENS = 6702
PROMPT = "The for statement is used"


def make_hf_folder(path):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from libai.data.corpus import default_gpt2_corpus

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=32, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg)
    with torch.no_grad():  # a less uniform random model: larger embeddings
        model.transformer.wte.weight.mul_(20.0)
    model.eval()
    model.save_pretrained(str(path), safe_serialization=True)
    corpus = default_gpt2_corpus()
    shutil.copy(corpus["vocab_file"], os.path.join(path, "vocab.json"))
    shutil.copy(corpus["merges_file"], os.path.join(path, "merges.txt"))
    return model


def ids_of(stdout):
    return [int(x) for x in stdout.splitlines()[0].split()[1:]]


def test_generate_matches_transformers_greedy(tmp_path):
    import torch

    from libai.tokenizer import GPT2Tokenizer

    hf_dir = str(tmp_path / "hf")
    hf = make_hf_folder(hf_dir)
    n_new = 15
    prompt = GPT2Tokenizer.from_pretrained(hf_dir).encode(PROMPT, add_special_tokens=False)
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=n_new, do_sample=False,
                          attention_mask=torch.ones((1, len(prompt)), dtype=torch.long), pad_token_id=0,
                          eos_token_id=None, suppress_tokens=list(range(TOKENS, VOCAB)))[0].tolist()
    assert len(ref) == len(prompt) + n_new

    _, out, _ = generate("--hf-path", hf_dir, "--prompt", PROMPT, "--max-new-tokens", str(n_new), "--greedy",
                         "--ignore-eos", "--print-ids")
    assert ids_of(out) == ref

    ckpt = str(tmp_path / "converted")
    run_command([sys.executable, os.path.join(ROOT, "tools", "convert_checkpoint.py"), "--from-hf", hf_dir,
                 "--to", ckpt], env=env())
    _, out2, _ = generate("--config-file", CONFIG, "--checkpoint", ckpt, "--prompt", PROMPT, "--max-new-tokens",
                          str(n_new), "--greedy", "--ignore-eos", "--print-ids", *TINY)
    assert ids_of(out2) == ref

    # the converted directory as train.load_weight (weights only) for evaluation
    out_dir = str(tmp_path / "eval")
    _, stdout, stderr = train_net("--eval-only", f"train.output_dir={out_dir}", f"train.load_weight={ckpt}",
                                  "train.evaluation.eval_iter=2", *TINY)
    log = open(os.path.join(out_dir, "log.txt")).read()
    assert f"Loading model weights from {ckpt}" in log
    assert "not found in" not in log and "not used by the model" not in log
    ppl = records(out_dir)[-1]["PPL"]
    assert np.isfinite(ppl) and ppl > 1


def test_sampling_arguments_are_checked_before_decoding():
    """NaN passed the old `temperature < 0` test and failed later inside multinomial; a top_p of 0
    from Python dropped every token. Both are refused by name, as HF's logits warpers refuse them."""
    import pytest

    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import engine as flow
    from generate import choose_next

    logits = flow.tensor([[1.0, 2.0, 3.0]])
    for kwargs, match in ((dict(temperature=float("nan")), "temperature >= 0"), (dict(top_p=0.0), "0 < top_p <= 1"),
                          (dict(top_p=float("nan")), "0 < top_p <= 1"), (dict(top_k=-1), "top_k >= 0")):
        with pytest.raises(ValueError, match=match):
            choose_next(logits, **kwargs)
    rc, _, err = generate("--hf-path", "/nonexistent", "--prompt", "x", "--temperature", "nan", check=False)
    assert rc == 2 and "need temperature >= 0 (0: greedy), got nan" in err
