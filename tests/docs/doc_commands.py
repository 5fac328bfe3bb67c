"""Which documented shell commands the doc test does not run (and why), and how it shortens the
ones it runs. Every entry of NOT_RUN must match at least one command of the docs
(test_doc_snippets.py checks it), so the list cannot go stale."""
import re

# regex on one command (after `a && b` is split) -> why it is not run by the doc test
NOT_RUN = {
    r"^python -m pip install ": "installs the package: CI's own first step (.ci/run) does exactly this",
    r"^pip install -e \"\.\[cuda": "installs CuPy for an NVIDIA GPU (none on the CI machine)",
    r"^python -m pytest\b": "runs the test suite this test is part of",
    r"^ENGINE_TEST_DEVICE=cuda ": "runs the suite on an NVIDIA GPU (none on the CI machine)",
    r"^git clone |^cd libai-engine$": "makes the checkout CI starts from",
    r"^python -m venv |^\. \.venv/bin/activate$": "makes the fresh virtual environment CI starts from",
    r"^python tools/benchmarks/gpu_\w+\.py": "times a GPU (none on the CI machine); docs/cuda.md says where it was run",
    r" train\.py --my-args$": "a template: train.py and --my-args stand for the reader's own script",
    r" --hosts | --hostfile ": "needs several hosts (the CI machine is one)",
    r"^python tools/benchmarks/gpt2_block\.py$": ("a benchmark that times minutes of CPU work; "
                                                  "tests/test_benchmarks_smoke.py runs it at a tiny size"),
}

# appended to every tools/train_net.py command (later overrides win): a couple of iterations (the
# GLUE/CLUE configs count epochs, and `max(train_iter, train_epoch * iterations per epoch)` would
# keep their 3 epochs), one evaluation batch; the layouts, data, checkpoints and evaluation still
# run for real
SHORT_TRAIN = ["train.train_iter=2", "train.train_epoch=0", "train.evaluation.eval_iter=1", "train.log_period=1"]
SHORT_GENERATE = ["--max-new-tokens", "4"]

# per document: (documented text, what the test runs instead) -- a tiny stand-in for a model that
# takes days on 2 cores; the fixture that builds the stand-in folder uses the same sizes
TINY_GPT2 = dict(hidden_layers=2, hidden_size=64, ffn_hidden_size=256, num_attention_heads=4, max_seq_length=128)
REWRITE = {
    "docs/gpt2.md": [("model.cfg.hidden_layers=12", f"model.cfg.hidden_layers={TINY_GPT2['hidden_layers']}"),
                     ("model.cfg.hidden_size=768", f"model.cfg.hidden_size={TINY_GPT2['hidden_size']}"),
                     ("model.cfg.ffn_hidden_size=3072", f"model.cfg.ffn_hidden_size={TINY_GPT2['ffn_hidden_size']}"),
                     ("model.cfg.num_attention_heads=12",
                      f"model.cfg.num_attention_heads={TINY_GPT2['num_attention_heads']}"),
                     ("model.cfg.max_seq_length=1024", f"model.cfg.max_seq_length={TINY_GPT2['max_seq_length']}")],
}


def not_run_reason(cmd):
    for pattern, reason in NOT_RUN.items():
        if re.search(pattern, cmd):
            return reason
    return None


def shorten(cmd, doc):
    for documented, tested in REWRITE.get(doc, []):
        cmd = cmd.replace(documented, tested)
    cmd = re.sub(r"--stop-iter \d+", "--stop-iter 1", cmd)  # within the shortened run
    if re.search(r"\btools/train_net\.py\b", cmd):
        return f"{cmd} {' '.join(SHORT_TRAIN)}"
    if re.search(r"\btools/generate\.py\b", cmd):
        return f"{cmd} {' '.join(SHORT_GENERATE)}"
    return cmd
