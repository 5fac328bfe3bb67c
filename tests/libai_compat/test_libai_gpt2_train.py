"""LiBai's configs/gpt2_pretrain.py (libai_configs/, LiBai's file with only its three data paths
changed, in a copy) trains through our tools/train_net.py and through LiBai's own tools/train_net.py
(libai_tools/, unchanged) with the same losses; LiBai's --eval-only gives our perplexity; the
custom-trainer pattern of LiBai's tutorial (libai_tools/my_train_net.py) trains.

The data is the project's small embedded corpus (libai.data.corpus.default_gpt2_corpus, as the
other GPT-2 tests use); the model is shrunk on the command line, as a LiBai user shrinks a recipe for
a quick run, and trained eagerly (graph.enabled=False) and in LiBai's default graph mode."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from libai.data.corpus import default_gpt2_corpus

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUR_TRAIN_NET = os.path.join(ROOT, "tools", "train_net.py")
LIBAI_TRAIN_NET = os.path.join(HERE, "libai_tools", "train_net.py")
MY_TRAIN_NET = os.path.join(HERE, "libai_tools", "my_train_net.py")

ITERS = 4
SMALL = ["graph.enabled=False", "model.cfg.hidden_layers=2", "model.cfg.hidden_size=64",
         "model.cfg.ffn_hidden_size=256", "model.cfg.num_attention_heads=4", "model.cfg.max_seq_length=32",
         "dataloader.train.dataset.0.max_seq_length=32", "dataloader.test.0.dataset.max_seq_length=32",
         f"train.train_iter={ITERS}", "train.log_period=1",
         f"train.evaluation.eval_period={ITERS}", "train.evaluation.eval_iter=2", f"train.checkpointer.period={ITERS}",
         "train.test_micro_batch_size=4",
         # LiBai's GPT-2 configs keep LiBai's default eval_metric "Acc@1", which no GPT-2 evaluation
         # computes (LiBai logs it and never saves model_best; here it is an error naming the key)
         "train.evaluation.eval_metric=PPL", "train.evaluation.eval_mode=min"]

# LiBai's data paths in configs/gpt2_pretrain.py -> the default corpus's files
LIBAI_PATHS = {"vocab_file": "./data_test/gpt_data/gpt2-vocab.json",
               "merges_file": "./data_test/gpt_data/gpt2-merges.txt",
               "data_prefix": "./data_test/gpt_data/loss_compara_content_sentence"}


@pytest.fixture(scope="module")
def libai_config(tmp_path_factory):
    """A copy of libai_configs/ whose gpt2_pretrain.py points at the default corpus."""
    corpus = default_gpt2_corpus()
    dst = tmp_path_factory.mktemp("libai") / "configs"
    shutil.copytree(os.path.join(HERE, "libai_configs"), dst, ignore=shutil.ignore_patterns("__pycache__"))
    path = dst / "gpt2_pretrain.py"
    text = path.read_text()
    for key, libai_path in LIBAI_PATHS.items():
        assert text.count(f'"{libai_path}"') == 1, key
        text = text.replace(f'"{libai_path}"', repr(corpus[key]))
    path.write_text(text)
    return str(path)


def run(script, config, *args, check=True):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONHASHSEED="0",
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run([sys.executable, script, "--config-file", config, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"{os.path.basename(script)} {' '.join(args)} failed ({proc.returncode}):\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def records(out):
    with open(os.path.join(out, "metrics.json")) as f:
        return [json.loads(line) for line in f if line.strip()]


def losses(out):
    return {r["iteration"]: r["total_loss"] for r in records(out) if "total_loss" in r}


def csv_results(text):
    """{metric: value} of the last `copypaste:` pair of lines (libai.evaluation.print_csv_format)."""
    lines = [ln.split("copypaste: ", 1)[1] for ln in text.splitlines() if "copypaste: " in ln]
    return dict(zip(lines[-2].split(","), map(float, lines[-1].split(","))))


@pytest.fixture(scope="module")
def our_run(libai_config, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("ours") / "out")
    proc = run(OUR_TRAIN_NET, libai_config, f"train.output_dir={out}", *SMALL)
    return out, proc


def test_libai_gpt2_config_trains_through_our_train_net(our_run):
    out, proc = our_run
    got = losses(out)
    assert sorted(got) == list(range(ITERS)) and all(np.isfinite(v) for v in got.values())
    log = open(os.path.join(out, "log.txt")).read()
    assert "model.cfg.vocab_size = 6784" in log  # the corpus tokenizer's 6702 tokens padded to 128s
    assert "train.rdma_enabled=True: no effect here" in log  # LiBai's default, accepted
    # perplexity on the valid split (plain names) and on dataloader.test (LiBai's GPT2Dataset of
    # 10 samples, test/...); the best valid perplexity is kept as model_best
    ppl = [r for r in records(out) if "PPL" in r]
    assert ppl and ppl[-1]["iteration"] == ITERS
    assert all(np.isfinite(ppl[-1][k]) and ppl[-1][k] > 1 for k in ("PPL", "test/PPL"))
    assert os.path.isfile(os.path.join(out, "model_final", "model.safetensors"))
    assert os.path.isfile(os.path.join(out, "model_best", "model.safetensors"))


def test_libai_default_graph_mode_trains_the_eager_losses(libai_config, our_run, tmp_path):
    """LiBai's config keeps its graph.enabled=True: the step runs through nn.Graph, with the
    recipe's dropout, and logs the eager run's losses bit for bit."""
    out = str(tmp_path / "g")
    run(OUR_TRAIN_NET, libai_config, f"train.output_dir={out}", *SMALL[1:])
    assert losses(out) == losses(our_run[0])


def test_libai_train_net_trains_the_same_and_evaluates_with_eval_only(libai_config, our_run, tmp_path):
    ours, _ = our_run
    out = str(tmp_path / "libai")
    run(LIBAI_TRAIN_NET, libai_config, f"train.output_dir={out}", *SMALL)
    assert losses(out) == losses(ours)  # same seeds, same steps: the same losses bit for bit

    # LiBai's --eval-only (tokenizer, model, Checkpointer.resume_or_load, build_test_loader(cfg,
    # tokenizer), DefaultTrainer.test) on the trained weights, and ours on the same weights
    weights = os.path.join(ours, "model_final")
    ev = run(LIBAI_TRAIN_NET, libai_config, "--eval-only", f"train.output_dir={tmp_path / 'ev'}",
             f"train.load_weight={weights}", *SMALL)
    libai_ppl = csv_results(open(os.path.join(tmp_path / "ev", "log.txt")).read() + ev.stdout)
    run(OUR_TRAIN_NET, libai_config, "--eval-only", f"train.output_dir={tmp_path / 'ev2'}",
        f"train.load_weight={weights}", *SMALL)
    ours_ppl = records(str(tmp_path / "ev2"))[-1]
    assert set(libai_ppl) == {"PPL"} and np.isfinite(libai_ppl["PPL"])
    # LiBai's --eval-only evaluates dataloader.test alone; ours the valid split first, then it (test/...)
    assert libai_ppl["PPL"] == pytest.approx(ours_ppl["test/PPL"], rel=1e-4)  # the csv line has 4 decimals


def test_the_tutorial_custom_trainer_runs(libai_config, tmp_path):
    out = str(tmp_path / "mine")
    proc = run(MY_TRAIN_NET, libai_config, f"train.output_dir={out}", *SMALL)
    assert "InfoHook: start training at 0" in proc.stdout and f"InfoHook: end training at {ITERS}" in proc.stdout
    assert "InfoHook: iteration 3 output ['lm_loss']" in proc.stdout
    got = losses(out)
    assert sorted(got) == list(range(ITERS)) and all(np.isfinite(v) for v in got.values())
    assert os.path.isfile(os.path.join(out, "model_final", "model.safetensors"))
