"""Evaluation of the GPT-2 recipe on a corpus big enough for valid AND test splits (issue 17):

1. result names: the valid split's metrics keep their plain names (`PPL`, the recipe's
   train.evaluation.eval_metric), the test split's are `test/PPL`; model_best is written; an
   eval_metric that names no result fails the run at the first evaluation, naming the key, the
   value and the names there are;
2. a test split shorter than one sample is a ValueError naming it (not an AssertionError);
3. --eval-only evaluates one epoch of each split: its perplexity does not depend on train.train_iter;
4. --fast-dev-run does not claim to have saved model_best;
5. --stop-iter N repeated on the run it stopped (nothing left before N) writes nothing: the
   resumed run's metrics.json is the uninterrupted run's.
"""
import json
import os

import numpy as np
import pytest

from gpt2_helpers import TINY, records, train_net

# 1000 documents: the recipe's splits [949, 50, 1] give 949 train / 50 valid / 1 test documents (the
# test document long enough for 12 samples of 32 tokens)
N_DOCS, DOC_LEN, TEST_DOC_LEN = 1000, 40, 400
VOCAB = {"<|endoftext|>": 0, "a": 1, "b": 2, "ab": 3, "c": 4, "abc": 5}
MERGES = "#version: 0.2\na b\nab c\n"
RUN = ["train.train_iter=10", "train.log_period=1", "train.checkpointer.period=5", "train.evaluation.eval_period=5",
       "train.evaluation.eval_iter=2", *TINY]


def write_corpus(d, doc_lens):
    from libai.data import indexed_dataset as ix

    rng = np.random.RandomState(0)
    prefix = os.path.join(str(d), "corpus_text_document")
    b = ix.MMapIndexedDatasetBuilder(ix.data_file_path(prefix), dtype="uint16")
    for n in doc_lens:
        b.add_item(np.asarray(rng.randint(1, 6, size=n)))
        b.end_document()
    b.finalize(ix.index_file_path(prefix))
    (d / "vocab.json").write_text(json.dumps(VOCAB), encoding="utf-8")
    (d / "merges.txt").write_text(MERGES, encoding="utf-8")
    return [f"tokenization.tokenizer.vocab_file={d / 'vocab.json'}",
            f"tokenization.tokenizer.merges_file={d / 'merges.txt'}",
            f"dataloader.train.dataset.0.data_prefix={prefix}"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("valid_test_corpus"), [DOC_LEN] * (N_DOCS - 1) + [TEST_DOC_LEN])


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("run") / "out")
    _, stdout, stderr = train_net(f"train.output_dir={out}", *corpus, *RUN)
    return out, stdout + stderr


def log_of(out):
    with open(os.path.join(out, "log.txt")) as f:
        return f.read()


def plain(recs):
    """metrics.json records without the timings."""
    return [{k: v for k, v in r.items() if k not in ("time", "data_time", "eta_seconds")} for r in recs]


# ---------------------------------------------------------------------- 1. names and model_best
def test_valid_metrics_keep_plain_names_and_the_test_split_is_prefixed(trained):
    out, _ = trained
    evals = [r for r in records(out) if "PPL" in r]
    assert [r["iteration"] for r in evals] == [4, 10]  # every eval_period (not the last), and the final one
    for r in evals:
        assert set(k for k in r if "PPL" in k) == {"PPL", "test/PPL"}, r
        assert np.isfinite(r["PPL"]) and np.isfinite(r["test/PPL"]) and r["PPL"] != r["test/PPL"]
    log = log_of(out)
    assert "Evaluation results for the validation set (metrics named as the evaluator names them), " \
           "GPT2Dataset 'gpt-2_valid'" in log
    assert "Evaluation results for the test set (metrics named test/...), GPT2Dataset 'gpt-2_test'" in log
    assert "does not seem to be computed" not in log


def test_model_best_is_written_for_the_recipe_eval_metric(trained):
    out, _ = trained
    assert os.path.isfile(os.path.join(out, "model_best", "model.safetensors"))
    log = log_of(out)
    assert "Saved best model as latest eval score for PPL is" in log
    best = min((r["PPL"], r["iteration"]) for r in records(out) if "PPL" in r)
    assert f"for PPL is {best[0]:0.5f}" in log


def test_the_test_split_metric_can_pick_the_best_model(corpus, tmp_path):
    out = str(tmp_path / "out")
    train_net(f"train.output_dir={out}", *corpus, *RUN, "train.train_iter=5", "train.evaluation.eval_metric=test/PPL")
    assert os.path.isfile(os.path.join(out, "model_best", "model.safetensors"))
    assert "Saved best model as latest eval score for test/PPL is" in log_of(out)


def test_an_eval_metric_that_names_no_result_fails_at_the_first_evaluation(corpus, tmp_path):
    out = str(tmp_path / "out")
    rc, stdout, stderr = train_net(f"train.output_dir={out}", *corpus, *RUN, "train.evaluation.eval_metric=Acc@1",
                                   check=False)
    text = stdout + stderr
    assert rc != 0, text
    assert ("ValueError: train.evaluation.eval_metric='Acc@1' is not among the results of the evaluation at "
            "iteration 4: ['PPL', 'test/PPL']") in text, text[-3000:]
    # training stopped there: no iteration after the first evaluation, and no model_best
    assert max(r["iteration"] for r in records(out)) == 4
    assert not os.path.exists(os.path.join(out, "model_best"))


# ---------------------------------------------------------------------- 2. a split too small
def test_a_test_split_shorter_than_one_sample_names_the_split(tmp_path):
    from libai.config import LazyCall
    from libai.data import GPT2Dataset, build_nlp_train_val_test_loader

    args = write_corpus(tmp_path, [DOC_LEN] * 999 + [20])  # the test split: one document of 20 tokens
    prefix = args[-1].split("=", 1)[1]
    with pytest.raises(Exception) as e:
        build_nlp_train_val_test_loader(
            dataset=[LazyCall(GPT2Dataset)(name="gpt-2", data_prefix=prefix, seq_length=32, seed=1)],
            splits=[[949.0, 50.0, 1.0]], weights=[1.0], train_val_test_num_samples=[0, 0, 0], train_batch_size=2,
            test_batch_size=2)
    assert not isinstance(e.value, AssertionError)
    msg = str(e.value)
    assert "GPT2Dataset 'gpt-2_test': the split has 20 tokens in 1 documents" in msg
    assert "seq_length + 1 = 33 tokens" in msg
    assert "dataloader.train.splits" in msg and "model.cfg.max_seq_length" in msg


# ---------------------------------------------------------------------- 3. --eval-only
def test_eval_only_does_not_depend_on_train_iter(trained, corpus, tmp_path):
    out, _ = trained
    weights = f"train.load_weight={out}/model_final"
    ppl = {}
    for train_iter in (10, 200):
        ev = str(tmp_path / f"ev{train_iter}")
        train_net("--eval-only", f"train.output_dir={ev}", weights, *corpus, *RUN,
                  f"train.train_iter={train_iter}")
        (rec,) = records(ev)
        ppl[train_iter] = {k: v for k, v in rec.items() if "PPL" in k}
    assert ppl[10] == ppl[200]
    assert "train_val_test_num_samples = [0, 0, 0] (one epoch of each split" in log_of(ev)
    assert set(ppl[10]) == {"PPL", "test/PPL"}  # the training run's names
    # the perplexities the training run recorded for those weights: training builds one epoch of
    # the valid and test splits too (its test split, 12 samples, is shorter than the 2 x 8 x 3 = 48
    # samples LiBai's formula would ask for, which repeated and reshuffled it), so both are equal
    final = [r for r in records(out) if r["iteration"] == 10 and "PPL" in r][-1]
    assert ppl[10] == {k: final[k] for k in ("PPL", "test/PPL")}


# ---------------------------------------------------------------------- 4. --fast-dev-run
def test_fast_dev_run_does_not_claim_a_saved_best_model(corpus, tmp_path):
    out = str(tmp_path / "out")
    train_net("--fast-dev-run", f"train.output_dir={out}", *corpus, *TINY, "dataloader.train.splits=[[9.0,1.0,0.0]]")
    log = log_of(os.path.join(out, "fast_dev_run"))
    assert "Saved best model" not in log
    assert ("model_best not saved: checkpoints are disabled (train.checkpointer.period <= 0; --fast-dev-run "
            "sets it)") in log
    assert "Best eval score for PPL is now" in log
    assert not os.path.exists(os.path.join(out, "fast_dev_run", "model_best"))


# ---------------------------------------------------------------------- 5. --stop-iter
def test_stop_iter_repeated_on_the_stopped_run_adds_nothing(trained, corpus, tmp_path):
    ref, _ = trained
    out = str(tmp_path / "out")
    train_net("--stop-iter", "7", f"train.output_dir={out}", *corpus, *RUN)
    assert open(os.path.join(out, "last_checkpoint")).read().strip() == "model_0000006"
    # the same command again, with --resume: it continues at 7, where it must stop: nothing to do
    _, stdout, stderr = train_net("--resume", "--stop-iter", "7", f"train.output_dir={out}", *corpus, *RUN)
    assert not os.path.exists(os.path.join(out, "model_0000007"))  # iteration 7 never ran
    assert open(os.path.join(out, "last_checkpoint")).read().strip() == "model_0000006"
    train_net("--resume", f"train.output_dir={out}", *corpus, *RUN)
    assert plain(records(out)) == plain(records(ref))
    assert "--stop-iter 7: this run starts at iteration 7" in stdout + stderr
