"""(a) The quickstart command (`tools/train_net.py --config-file configs/gpt2_pretrain.py`, a
short CI override) trains, evaluates perplexity on the valid split, checkpoints, and its loss
falls; `train.load_weight` of its checkpoint reproduces its perplexity (--eval-only); (c, first
half) tools/generate.py greedy on that checkpoint is deterministic, and seeded sampling repeats."""
import os

import numpy as np

from gpt2_helpers import TINY, CONFIG, generate, losses, records, train_net

QUICK = ["train.train_iter=30", "train.log_period=1", "train.checkpointer.period=30",
         "train.evaluation.eval_period=30", "train.evaluation.eval_iter=2", *TINY[:5]]


def test_quickstart_trains_evaluates_checkpoints_and_generates(tmp_path):
    out = str(tmp_path / "quick")
    _, stdout, _ = train_net(f"train.output_dir={out}", *QUICK)
    recs = records(out)
    by_iter = losses(out)
    assert sorted(by_iter) == list(range(30))
    first, last = by_iter[0], by_iter[29]
    print(f"quickstart total_loss: first {first:.4f} -> last {last:.4f}")
    assert np.isfinite(first) and np.isfinite(last)
    assert last < first - 0.3, (first, last)
    # the vocabulary is the default corpus tokenizer's padded size; perplexity on the valid split
    assert "model.cfg.vocab_size = 6784" in stdout + open(os.path.join(out, "log.txt")).read()
    ppl = [r["PPL"] for r in recs if "PPL" in r]
    assert ppl and all(np.isfinite(p) and p > 1 for p in ppl)
    assert open(os.path.join(out, "last_checkpoint")).read().strip() in ("model_final", "model_best")
    assert os.path.isfile(os.path.join(out, "model_final", "model.safetensors"))

    # train.load_weight with the trained checkpoint: --eval-only repeats the final perplexity
    ev = out + "_eval"
    train_net("--eval-only", f"train.output_dir={ev}", f"train.load_weight={out}/model_final", *QUICK)
    final = [r for r in recs if "PPL" in r and r["iteration"] == 30][-1]
    assert records(ev)[-1]["PPL"] == final["PPL"]

    # (c) greedy decoding from the trained checkpoint: the same text twice, sampling is seeded
    ckpt = os.path.join(out, "model_final")
    common = ["--config-file", CONFIG, "--checkpoint", ckpt, "--prompt", "The while statement",
              "--max-new-tokens", "12", "--print-ids", "--ignore-eos", *TINY[:5]]
    _, g1, _ = generate(*common, "--greedy")
    _, g2, _ = generate(*common, "--greedy")
    assert g1 == g2 and g1.startswith("ids: ")
    ids = [int(x) for x in g1.splitlines()[0].split()[1:]]
    assert len(ids) > 12 and all(0 <= i < 6702 for i in ids)  # never a vocabulary padding id
    assert "The while statement" in g1
    _, s1, _ = generate(*common, "--temperature", "0.9", "--top-k", "20", "--top-p", "0.9", "--seed", "5")
    _, s2, _ = generate(*common, "--temperature", "0.9", "--top-k", "20", "--top-p", "0.9", "--seed", "5")
    assert s1 == s2
