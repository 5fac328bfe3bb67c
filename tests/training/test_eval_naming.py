"""How DefaultTrainer.test names the results of several loaders and how BestCheckpointer looks its
metric up (issue 17): the first loader (the validation set) keeps the evaluator's plain names, the
second is `test/...`, a third `test_2/...`; an eval_metric that names no result is a ValueError at
the first evaluation; a better value that is not saved is not logged as saved. (End to end with
GPT-2 valid + test splits: tests/gpt2/test_gpt2_evaluation.py.)"""
import logging
import os

import pytest

from libai.config import LazyConfig
from libai.engine import DefaultTrainer, hooks
from libai.evaluation.utils import flatten_results_dict
from libai.utils.checkpoint import Checkpointer
from libai.utils.events import EventStorage

CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", "mlp_cls.py")


def _cfg(out, *overrides):
    cfg = LazyConfig.load(CONFIG)
    return LazyConfig.apply_overrides(cfg, [f"train.output_dir={out}", "train.train_iter=10",
                                            "train.checkpointer.period=5", "train.evaluation.eval_period=5",
                                            "train.log_period=5", *overrides])


def test_prefixes_by_place():
    from libai.engine.default import eval_result_prefixes

    assert eval_result_prefixes(0) == []
    assert eval_result_prefixes(1) == [""]
    assert eval_result_prefixes(3) == ["", "test", "test_2"]


def test_several_loaders_validation_plain_then_test(tmp_path):
    cfg = _cfg(str(tmp_path))
    model = DefaultTrainer.build_model(cfg)
    (loader,) = DefaultTrainer.build_test_loader(cfg)
    one = DefaultTrainer.test(cfg, [loader], model)
    assert set(one) == {"Acc@1", "Acc@2"}  # one loader: the evaluator's names, as LiBai
    three = flatten_results_dict(DefaultTrainer.test(cfg, [loader, loader, loader], model))
    assert set(three) == {"Acc@1", "Acc@2", "test/Acc@1", "test/Acc@2", "test_2/Acc@1", "test_2/Acc@2"}
    assert three["Acc@1"] == three["test/Acc@1"] == one["Acc@1"]
    named = flatten_results_dict(DefaultTrainer.test(cfg, [loader, loader], model, names=["val", "other"]))
    assert set(named) == {"val/Acc@1", "val/Acc@2", "other/Acc@1", "other/Acc@2"}
    with pytest.raises(ValueError, match="one distinct prefix to each of the 2 loaders"):
        DefaultTrainer.test(cfg, [loader, loader], model, names=["a", "a"])


class _Trainer:
    """What BestCheckpointer reads of a trainer."""

    def __init__(self, storage, it, max_iter=100):
        self.storage, self.iter, self.start_iter, self.max_iter = storage, it, 0, max_iter


def _evaluated(storage, it, **results):
    storage.iter = it
    storage.put_scalars(**results, smoothing_hint=False)
    storage.put_eval_names(sorted(results))


def _hook(tmp_path, metric="PPL", enabled=True):
    ckpt = Checkpointer(DefaultTrainer.build_model(_cfg(str(tmp_path))), str(tmp_path), enabled=enabled)
    return hooks.BestCheckpointer(5, ckpt, metric, mode="min")


def test_a_metric_no_evaluation_computed_is_an_error_naming_the_key(tmp_path):
    storage = EventStorage()
    best = _hook(tmp_path, "Acc@1")
    best.trainer = _Trainer(storage, 4)
    _evaluated(storage, 4, **{"PPL": 3.0, "test/PPL": 4.0})
    with pytest.raises(ValueError) as e:
        best.after_step()
    msg = str(e.value)
    assert "train.evaluation.eval_metric='Acc@1'" in msg and "iteration 4: ['PPL', 'test/PPL']" in msg
    # an evaluation without any result: the same error
    _evaluated(storage, 9)
    best.trainer.iter = 9
    with pytest.raises(ValueError, match=r"iteration 9: none \(the evaluator returned no results\)"):
        best.after_step()


def test_an_interrupted_evaluation_is_no_error_and_no_news(tmp_path):
    storage = EventStorage()
    best = _hook(tmp_path, "PPL", enabled=False)
    best.trainer = _Trainer(storage, 4)
    _evaluated(storage, 4, PPL=3.0)
    best.after_step()
    assert (best.best_metric, best.best_iter) == (3.0, 4)
    storage.iter = 9  # the evaluation of iteration 9 was cut short: no results, no names
    best.trainer.iter = 9
    best.after_step()
    assert (best.best_metric, best.best_iter) == (3.0, 4)


def test_a_best_not_saved_is_not_logged_as_saved(tmp_path, caplog):
    storage = EventStorage()
    best = _hook(tmp_path, "PPL", enabled=False)
    best.trainer = _Trainer(storage, 4)
    _evaluated(storage, 4, PPL=3.0)
    with caplog.at_level(logging.INFO, logger="libai.engine.hooks"):
        best.after_step()
    text = caplog.text
    assert "Saved best model" not in text
    assert "Best eval score for PPL is now 3.00000 @ iteration 4; model_best not saved: checkpoints are " \
           "disabled" in text
    assert not os.path.exists(os.path.join(str(tmp_path), "model_best"))

    saving = _hook(tmp_path / "b", "PPL", enabled=True)
    saving.trainer = _Trainer(storage, 4)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="libai.engine.hooks"):
        saving.after_step()
    assert "Saved best model as latest eval score for PPL is 3.00000 @ iteration 4." in caplog.text
    assert os.path.isdir(os.path.join(str(tmp_path / "b"), "model_best"))


def test_the_trainer_fails_at_its_first_evaluation(tmp_path):
    trainer = DefaultTrainer(_cfg(str(tmp_path), "train.evaluation.eval_metric=PPL"))
    with pytest.raises(ValueError, match=r"eval_metric='PPL' is not among the results of the evaluation at "
                                         r"iteration 4: \['Acc@1', 'Acc@2'\]"):
        trainer.train()
    assert trainer.iter == 4 and not os.path.exists(os.path.join(str(tmp_path), "model_best"))


def test_stop_iter_not_after_the_start_runs_nothing(tmp_path, caplog):
    out = str(tmp_path)
    with caplog.at_level(logging.WARNING, logger="libai.engine.default"):
        DefaultTrainer(_cfg(out)).train(stop_iter=3)
    # the early stop is announced as an interruption is, with the checkpoint to resume from
    assert any("--stop-iter 3: stopped after iteration 2 of" in r.getMessage() and "model_0000002" in r.getMessage()
               and "continue with --resume" in r.getMessage() for r in caplog.records), caplog.text
    assert sorted(d for d in os.listdir(out) if d.startswith("model_")) == ["model_0000002"]
    resumed = DefaultTrainer(_cfg(out, "train.resume=true"))
    assert resumed.start_iter == 3
    resumed.train(stop_iter=3)  # nothing before iteration 3 is left to run
    assert sorted(d for d in os.listdir(out) if d.startswith("model_")) == ["model_0000002"]
    assert open(os.path.join(out, "last_checkpoint")).read().strip() == "model_0000002"
