"""A checkpoint carries the config it was trained with (config.yaml beside the weights), so that
tools/generate.py --checkpoint DIR and tools/convert_checkpoint.py --from-libai DIR need nothing
else; the Hugging Face export has the tokenizer's vocabulary (padding rows dropped), its files and
its <|endoftext|> as bos/eos, and transformers loads it without a warning and computes our logits.
"""
import json
import os
import shutil
import sys

import numpy as np

from gpt2_helpers import CONFIG, ROOT, TINY, env, generate, run_command, train_net
from test_gpt2_hf_generate import TOKENS, VOCAB, make_hf_folder  # a tiny HF GPT-2 with a padded vocabulary

CONVERT = os.path.join(ROOT, "tools", "convert_checkpoint.py")
PROMPT = "The for statement is used"
SIZES = TINY[:5]  # trained with dropout: the checkpoint's config says so, generate turns it off

# transformers in a fresh process (its warnings are logged once per process): load a folder's
# model and tokenizer, save the logits of the texts, print their ids
HF_LOAD = r"""
import sys, warnings
warnings.simplefilter("always")
import numpy as np, torch, transformers
transformers.utils.logging.disable_progress_bar()
transformers.utils.logging.set_verbosity_warning()
path, out, model_cls, tok_cls, *texts = sys.argv[1:]
model = getattr(transformers, model_cls).from_pretrained(path).eval()
enc = getattr(transformers, tok_cls).from_pretrained(path)(*texts)
with torch.no_grad():
    result = model(**{k: torch.tensor([enc[k]]) for k in ("input_ids", "token_type_ids") if k in enc})
np.save(out, result.logits if hasattr(result, "logits") else result.prediction_logits)
print(" ".join(map(str, enc["input_ids"])))
"""


def convert(*args, check=True):
    return run_command([sys.executable, CONVERT, *args], env=env(), check=check)


def ids_of(stdout):
    return [int(x) for x in stdout.splitlines()[0].split()[1:]]


def hf_load(path, tmp_path, model_cls="GPT2LMHeadModel", tok_cls="GPT2TokenizerFast", texts=(PROMPT,)):
    """(ids, logits [1, s, vocab], stderr) of transformers' `model_cls` and `tok_cls` from HF
    folder `path` on `texts` (a text, or a pair)."""
    out = str(tmp_path / "hf_logits.npy")
    _, stdout, stderr = run_command([sys.executable, "-c", HF_LOAD, path, out, model_cls, tok_cls, *texts], env=env())
    return [int(x) for x in stdout.split()], np.load(out), stderr


def our_logits(ckpt, ids):
    """GPTModel logits of checkpoint `ckpt`, built from the config it carries."""
    import engine as flow
    from libai.config import instantiate
    from libai.utils import distributed as dist
    from libai.utils.checkpoint import Checkpointer, load_checkpoint_config

    dist.setup_dist_util(None)
    cfg = load_checkpoint_config(ckpt)
    for key in ("embedding_dropout_prob", "attention_dropout_prob", "output_dropout_prob"):
        cfg.model.cfg[key] = 0.0
    model = instantiate(cfg.model)
    Checkpointer(model, save_dir="").load(ckpt, checkpointables=[])
    gpt = model.GPT_model.eval()
    with flow.no_grad():
        return gpt(flow.tensor(np.asarray([ids], dtype=np.int64))).numpy()


def check_hf_export(hf_dir, ckpt, tmp_path):
    """The HF folder written from `ckpt`: tokenizer files, unpadded vocabulary, bos/eos, no
    warning from transformers, our logits on the real vocabulary."""
    from libai.tokenizer import GPT2Tokenizer

    for name in ("config.json", "model.safetensors", "vocab.json", "merges.txt", "tokenizer_config.json",
                 "generation_config.json"):
        assert os.path.isfile(os.path.join(hf_dir, name)), name
    cfg = json.load(open(os.path.join(hf_dir, "config.json")))
    tok = GPT2Tokenizer.from_pretrained(hf_dir)
    eot = tok.convert_tokens_to_ids("<|endoftext|>")
    assert len(tok) == TOKENS and cfg["vocab_size"] == TOKENS
    assert cfg["bos_token_id"] == cfg["eos_token_id"] == eot
    gen = json.load(open(os.path.join(hf_dir, "generation_config.json")))
    assert gen["bos_token_id"] == gen["eos_token_id"] == eot
    ids, ref, stderr = hf_load(hf_dir, tmp_path)
    assert "warn" not in stderr.lower() and "50256" not in stderr and "token_id" not in stderr, stderr
    assert ids == tok.encode(PROMPT, add_special_tokens=False)
    assert ref.shape == (1, len(ids), TOKENS)
    ours = our_logits(ckpt, ids)
    assert ours.shape == (1, len(ids), VOCAB)
    np.testing.assert_allclose(ours[..., :TOKENS], ref, rtol=0, atol=1e-4)


def test_trained_checkpoint_generates_and_exports_with_its_own_config(tmp_path):
    out = str(tmp_path / "run")
    train_net(f"train.output_dir={out}", "train.train_iter=3", "train.log_period=1", "train.checkpointer.period=2",
              "train.evaluation.enabled=False", *SIZES)
    from libai.utils.checkpoint import load_checkpoint_config

    for name in ("model_0000001", "model_final"):
        cfg = load_checkpoint_config(os.path.join(out, name))
        assert os.path.isfile(os.path.join(out, name, "config.yaml"))
        assert (cfg.model.cfg.hidden_size, cfg.model.cfg.hidden_layers, cfg.model.cfg.vocab_size) == (64, 2, VOCAB)
        assert os.path.isfile(cfg.tokenization.tokenizer.vocab_file)
    assert not [d for d in os.listdir(out) if d.endswith(".tmp")]  # no temp directory left
    ckpt = os.path.join(out, "model_final")

    # generate: --checkpoint alone; the recipe's sizes no longer need repeating
    common = ["--prompt", PROMPT, "--max-new-tokens", "8", "--greedy", "--ignore-eos", "--print-ids"]
    _, g0, _ = generate("--checkpoint", ckpt, *common)
    ids = ids_of(g0)
    assert len(ids) > 8 and all(0 <= i < TOKENS for i in ids)
    _, g1, _ = generate("--config-file", CONFIG, "--checkpoint", ckpt, *common, *SIZES)  # the old command line
    _, g2, err2 = generate("--config-file", CONFIG, "--checkpoint", ckpt, *common)  # the checkpoint's sizes win
    assert ids_of(g1) == ids_of(g2) == ids
    assert "model.cfg.hidden_size: 256 -> 64" in err2
    rc, _, err = run_command([sys.executable, os.path.join(ROOT, "tools", "generate.py"), "--checkpoint", ckpt,
                              *common, "model.cfg.hidden_size=128"], env=env(), check=False)
    assert rc != 0 and "model.cfg.hidden_size=128 does not match checkpoint" in err, err
    # a training checkpoint without its own config.yaml (written before they carried one): the
    # output directory's config.yaml
    os.remove(os.path.join(out, "model_0000001", "config.yaml"))
    _, g3, _ = generate("--checkpoint", os.path.join(out, "model_0000001", "model.safetensors"), *common)
    assert len(ids_of(g3)) == len(ids)

    # export to Hugging Face with no --config: the checkpoint's config gives sizes and tokenizer
    hf_dir = str(tmp_path / "hf")
    convert("--from-libai", ckpt, "--to-hf", hf_dir)
    check_hf_export(hf_dir, ckpt, tmp_path)
    # --config with the recipe (4 layers of 256): the checkpoint's sizes win, with a warning naming them
    _, _, err = convert("--from-libai", ckpt, "--config", CONFIG, "--to-hf", str(tmp_path / "hf2"))
    assert "hidden_size: 256 -> 64" in err and "hidden_layers: 4 -> 2" in err, err
    assert json.load(open(tmp_path / "hf2" / "config.json"))["n_layer"] == 2
    assert json.load(open(tmp_path / "hf2" / "config.json"))["vocab_size"] == TOKENS

    # train.load_weight into the recipe's own (bigger) model: the shape error says which sizes the
    # checkpoint was trained with, as overrides to pass
    rc, _, err = train_net(f"train.output_dir={tmp_path / 'ft'}", f"train.load_weight={ckpt}", "train.train_iter=1",
                           "train.evaluation.enabled=False", check=False)
    assert rc != 0 and "shape mismatch" in err
    assert f"{ckpt} was trained with model.cfg.hidden_layers=2 model.cfg.hidden_size=64" in err, err


def test_converted_from_hf_generates_with_checkpoint_only(tmp_path):
    hf_dir = str(tmp_path / "hf")
    make_hf_folder(hf_dir)
    common = ["--prompt", PROMPT, "--max-new-tokens", "10", "--greedy", "--ignore-eos", "--print-ids"]
    # generating from the folder gives transformers' greedy tokens (test_gpt2_hf_generate.py)
    _, out, _ = generate("--hf-path", hf_dir, *common)
    ref = ids_of(out)
    assert len(ref) > 10

    ckpt = str(tmp_path / "converted")
    convert("--from-hf", hf_dir, "--to", ckpt)
    for name in ("config.yaml", "vocab.json", "merges.txt", "model.safetensors"):
        assert os.path.isfile(os.path.join(ckpt, name)), name
    _, out, _ = generate("--checkpoint", ckpt, *common)
    assert ids_of(out) == ref
    # the directory moved elsewhere: its tokenizer files are found beside the weights
    moved = str(tmp_path / "elsewhere" / "gpt2")
    shutil.move(ckpt, moved)
    _, out, _ = generate("--checkpoint", moved, *common)
    assert ids_of(out) == ref

    # and back to Hugging Face: the tokenizer's vocabulary, its files, bos/eos
    back = str(tmp_path / "back")
    convert("--from-libai", moved, "--to-hf", back)
    check_hf_export(back, moved, tmp_path)


def test_generate_names_a_checkpoint_of_another_model(tmp_path):
    """A checkpoint of another model (here the MLP recipe's) is refused naming its model, rather
    than failing inside GPT-2's code with an AttributeError."""
    out = str(tmp_path / "mlp")
    train_net(f"train.output_dir={out}", "train.train_iter=2", config=os.path.join(ROOT, "configs", "mlp_classifier.py"))
    rc, _, stderr = generate("--checkpoint", f"{out}/model_final", "--prompt", "x", check=False)
    assert rc != 0 and "its model is MLPClassifier; tools/generate.py generates text with GPT-2" in stderr, stderr[-2000:]
