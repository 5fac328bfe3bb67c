"""Trainer and hook state through state_dict (detectron2's contract), saved with the model by the
checkpointer and restored on resume; the public `failed` flag, `Checkpointer.enabled` and
`PeriodicCheckpointer.save_periodic` / `prune`."""
import logging
import os
import shutil

import pytest

import engine as flow
from libai.config import LazyConfig
from libai.engine import DefaultTrainer, HookBase, TrainerBase, hooks
from libai.models.mlp_classifier import MLPClassifier
from libai.utils.checkpoint import STATE_FILE, Checkpointer, PeriodicCheckpointer

CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", "mlp_cls.py")


class Counter(HookBase):
    """A stateful hook: counts the steps it saw."""

    def __init__(self):
        self.steps = 0

    def after_step(self):
        self.steps += 1

    def state_dict(self):
        return {"steps": self.steps} if self.steps else {}

    def load_state_dict(self, state):
        self.steps = state["steps"]


class Idle(TrainerBase):
    def run_step(self):
        pass


def test_hook_base_has_no_state():
    h = HookBase()
    assert h.state_dict() == {}
    h.load_state_dict({})


def test_trainer_state_dict_collects_stateful_hooks_and_round_trips():
    t = Idle()
    t.register_hooks([hooks.IterationTimer(), Counter(), Counter()])
    t.train(0, 3)
    # hooks without state are left out; a second hook of a class gets "#1"
    assert t.state_dict() == {"iteration": 3, "hooks": {"Counter": {"steps": 3}, "Counter#1": {"steps": 3}}}
    t._hooks[2].steps = 7

    u = Idle()
    u.register_hooks([hooks.IterationTimer(), Counter(), Counter()])
    u.load_state_dict(t.state_dict())
    assert u.iter == 3 and [h.steps for h in u._hooks[1:]] == [3, 7]


def test_load_state_dict_warns_on_a_state_without_hook_and_rejects_malformed_input(caplog):
    t = Idle()
    t.register_hooks([Counter()])
    lg = logging.getLogger("libai")
    lg.addHandler(caplog.handler)
    try:
        t.load_state_dict({"iteration": 4, "hooks": {"Counter": {"steps": 2}, "Gone": {"x": 1}}})
    finally:
        lg.removeHandler(caplog.handler)
    assert t.iter == 4 and t._hooks[0].steps == 2
    assert "'Gone'" in caplog.text and "ignored" in caplog.text
    for bad in ({}, {"iteration": "4"}, {"iteration": 4, "hooks": []}, {"iteration": 4, "hooks": {"Counter": 3}}, 5):
        with pytest.raises(ValueError, match="trainer state"):
            t.load_state_dict(bad)


def test_failed_is_public_read_only_and_set_by_train():
    seen = []

    class Boom(TrainerBase):
        def run_step(self):
            if self.iter == 1:
                raise RuntimeError("boom")

    class Watch(HookBase):
        def after_train(self):
            seen.append(self.trainer.failed)

    ok = Idle()
    ok.register_hooks([Watch()])
    ok.train(0, 2)
    bad = Boom()
    bad.register_hooks([Watch()])
    with pytest.raises(RuntimeError):
        bad.train(0, 3)
    assert seen == [False, True] and bad.failed and not ok.failed
    with pytest.raises(AttributeError):
        bad.failed = False


def test_checkpointer_saves_and_restores_the_trainer_state(tmp_path):
    model = MLPClassifier(in_features=4, hidden_size=8, num_classes=3)
    t = Idle()
    t.register_hooks([Counter()])
    t.train(0, 5)
    ck = Checkpointer(model, str(tmp_path), trainer=t)
    ck.save("model_0000004", iteration=4)  # the save's iteration wins over trainer.iter (5)
    state = flow.load(os.path.join(str(tmp_path), "model_0000004", STATE_FILE))
    assert state["iteration"] == 4 and state["hooks"] == {"Counter": {"steps": 5}}

    u = Idle()
    u.register_hooks([Counter()])
    extra = Checkpointer(model, str(tmp_path), trainer=u).load(os.path.join(str(tmp_path), "model_0000004"))
    assert u.iter == 4 and u._hooks[0].steps == 5 and extra["iteration"] == 4
    # weights only: the trainer state is not restored
    v = Idle()
    v.register_hooks([Counter()])
    Checkpointer(model, "", trainer=v).load(os.path.join(str(tmp_path), "model_0000004"), checkpointables=[])
    assert v.iter == 0 and v._hooks[0].steps == 0


def test_weights_of_another_model_are_refused_not_skipped(tmp_path, caplog):
    """train.load_weight of another model's checkpoint matched no key: it used to log the
    missing/unexpected keys and train from random weights. Partial matches still load."""
    from engine.serialization import CheckpointError

    model = MLPClassifier(in_features=4, hidden_size=8, num_classes=3)
    path = str(tmp_path / "other.safetensors")
    flow.save({"GPT_model.embeddings.weight": flow.zeros(5, 2)}, path)
    with pytest.raises(CheckpointError, match=r"none of the 1 tensors of .*other.safetensors is a parameter or buffer "
                                              r"of the model \(MLPClassifier"):
        Checkpointer(model, "").load(path, checkpointables=[])
    partial = {k: v for k, v in model.state_dict().items() if k.startswith("body.")}
    flow.save(partial, path)
    with caplog.at_level(logging.WARNING):
        Checkpointer(model, "").load(path, checkpointables=[])
    assert "head.weight" in caplog.text  # named as missing, and the rest loaded


def test_a_disabled_checkpointer_writes_nothing(tmp_path):
    model = MLPClassifier(in_features=4, hidden_size=8, num_classes=3)
    ck = Checkpointer(model, str(tmp_path), enabled=False)
    ck.save("model_0000000", iteration=0)
    assert os.listdir(str(tmp_path)) == []


def test_save_periodic_saves_off_period_and_prunes(tmp_path):
    model = MLPClassifier(in_features=4, hidden_size=8, num_classes=3)
    pc = PeriodicCheckpointer(Checkpointer(model, str(tmp_path)), period=10, max_iter=100, max_to_keep=2)
    for it in (2, 5, 6):
        pc.save_periodic(it)
    assert sorted(os.listdir(str(tmp_path))) == ["last_checkpoint", "model_0000005", "model_0000006"]
    assert pc.last_saved_iter == 6
    pc.max_to_keep = 1
    pc.prune()
    assert sorted(os.listdir(str(tmp_path))) == ["last_checkpoint", "model_0000006"]


def _cfg(out, *overrides):
    cfg = LazyConfig.load(CONFIG)
    return LazyConfig.apply_overrides(cfg, [f"train.output_dir={out}", "train.train_iter=20",
                                            "train.checkpointer.period=5", "train.evaluation.eval_period=10",
                                            "train.log_period=5", *overrides])


def _best_hook(trainer):
    return next(h for h in trainer._hooks if isinstance(h, hooks.BestCheckpointer))


def test_resumed_best_checkpointer_knows_the_best_from_the_checkpoint_not_model_best(tmp_path):
    out = str(tmp_path)
    first = DefaultTrainer(_cfg(out))
    first.train(stop_iter=10)
    best = _best_hook(first)
    assert best.best_iter == 9 and best.best_metric is not None
    # the evaluation at iteration 9 runs after the checkpoint of iteration 9; the new best
    # refreshed that checkpoint's trainer state
    state = flow.load(os.path.join(out, "model_0000009", STATE_FILE))
    assert state["iteration"] == 9
    assert state["hooks"] == {"BestCheckpointer": {"metric": "Acc@1", "mode": "max",
                                                   "best_metric": best.best_metric, "best_iter": 9}}
    assert flow.load(os.path.join(out, "model_0000004", STATE_FILE))["hooks"] == {}  # before any evaluation

    shutil.rmtree(os.path.join(out, "model_best"))  # the hook must not need it
    resumed = DefaultTrainer(_cfg(out, "train.resume=true"))
    assert resumed.start_iter == 10 and resumed.iter == 9
    assert (_best_hook(resumed).best_metric, _best_hook(resumed).best_iter) == (best.best_metric, 9)

    # another metric: the saved best does not apply
    other = DefaultTrainer(_cfg(out, "train.resume=true", "train.evaluation.eval_metric=Acc@2"))
    assert _best_hook(other).best_metric is None


def test_scheduler_state_is_saved_once_as_its_checkpointable(tmp_path):
    trainer = DefaultTrainer(_cfg(str(tmp_path), "train.evaluation.enabled=false"))
    trainer.train(stop_iter=5)
    state = flow.load(os.path.join(str(tmp_path), "model_0000004", STATE_FILE))
    assert state["hooks"] == {} and "lr_scheduler" in state["checkpointables"]
    assert os.path.isfile(os.path.join(str(tmp_path), "model_0000004", "lr_scheduler.safetensors"))


def test_checkpointer_period_zero_disables_model_best_too(tmp_path):
    trainer = DefaultTrainer(_cfg(str(tmp_path), "train.checkpointer.period=0"))
    assert not trainer.checkpointer.enabled
    trainer.train()
    assert _best_hook(trainer).best_metric is not None
    assert not [d for d in os.listdir(str(tmp_path)) if d.startswith("model_")]


def test_cuda_input_device_without_cuda_is_an_error():
    if flow.cuda.is_available():
        pytest.skip("CUDA is available here")
    cfg = LazyConfig.apply_overrides(LazyConfig.load(CONFIG), ["train.input_placement_device=cuda"])
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        DefaultTrainer.input_device(cfg)


def test_a_failed_checkpoint_write_names_the_checkpoint(tmp_path, monkeypatch):
    """A full disk raises OSError(ENOSPC) with no file name: the error names the checkpoint, and
    last_checkpoint keeps naming the previous one."""
    import errno

    model = MLPClassifier(in_features=4, hidden_size=8, num_classes=3)
    ck = Checkpointer(model, str(tmp_path))
    ck.save("model_0000001", iteration=1)
    real_save = flow.save

    def full_disk(obj, path, *args, **kwargs):
        if "model_0000002" in path and path.endswith("model.safetensors"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(flow, "save", full_disk)
    with pytest.raises(OSError, match=r"No space left on device: writing checkpoint .*model_0000002 failed") as e:
        ck.save("model_0000002", iteration=2)
    assert e.value.errno == errno.ENOSPC
    assert open(os.path.join(str(tmp_path), "last_checkpoint")).read() == "model_0000001"


def test_a_resumed_metrics_file_counts_what_it_drops(tmp_path, caplog):
    """start_at keeps the records before the resumed iteration; the message counts the later
    records and, apart, lines that are not records (a torn last line, a kill's, is expected)."""
    from libai.utils.events import JSONWriter

    path = tmp_path / "metrics.json"
    path.write_text('{"iteration": 3, "loss": 1}\n{"iteration": 4, "lo\n{"iteration": 5, "loss": 1}\n'
                    '{"iteration": 40, "loss": 2}\n{"iteration": 41, "loss": 2}\n{"iteration": 42, "l')
    with caplog.at_level(logging.INFO):
        JSONWriter(str(path)).start_at(40)
    assert path.read_text() == '{"iteration": 3, "loss": 1}\n{"iteration": 5, "loss": 1}\n'
    assert "dropped 2 record(s) of iterations >= 40" in caplog.text
    assert "dropped 1 line(s) that are not JSON records (line 2)" in caplog.text


def test_a_hugging_face_folder_or_another_vocabulary_padding_names_the_fix(tmp_path):
    import json

    from engine.serialization import CheckpointError
    from libai.layers import VocabEmbedding

    model = MLPClassifier(in_features=4, hidden_size=8, num_classes=3)
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 8}))
    flow.save({"wte.weight": flow.zeros(5, 8)}, str(hf / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"is a Hugging Face folder \(config.json, model_type 'gpt2'\).*"
                                              r"convert_checkpoint.py --from-hf"):
        Checkpointer(model, "").load(str(hf), checkpointables=[])

    class Tiny(flow.nn.Module):
        def __init__(self, rows):
            super().__init__()
            self.embeddings = VocabEmbedding(rows, 4)

    path = str(tmp_path / "padded.safetensors")
    flow.save({"embeddings.weight": flow.zeros(8, 4)}, path)
    with pytest.raises(CheckpointError, match="the vocabulary rows differ.*make_vocab_size_divisible_by"):
        Checkpointer(Tiny(6), "").load(path, checkpointables=[])


def test_a_nan_metric_is_never_the_best(caplog):
    hook = hooks.BestCheckpointer(5, checkpointer=None, val_metric="Pearson", mode="max")
    with caplog.at_level(logging.WARNING):
        assert not hook._better(float("nan"))
    assert "Pearson is NaN: not a candidate for model_best" in caplog.text
    assert hook._better(0.5)


def test_a_relative_tokenizer_path_is_no_config_change(tmp_path):
    """load_checkpoint_config points relative tokenizer files at the checkpoint's copies; the
    resume's comparison reads the config as saved, so an unchanged run reports no change."""
    from omegaconf import OmegaConf

    from libai.config import LazyConfig
    from libai.utils.checkpoint import config_changes

    cfg = OmegaConf.create({"tokenization": {"tokenizer": {"vocab_file": "vocabdir/vocab.txt"}},
                            "train": {"train_iter": 5}})
    ckpt = tmp_path / "model_0000004"
    ckpt.mkdir()
    LazyConfig.save(cfg, str(ckpt / "config.yaml"))
    (ckpt / "vocab.txt").write_text("[PAD]\n")
    assert config_changes(cfg, str(ckpt)) == ""
    cfg.train.train_iter = 7
    assert config_changes(cfg, str(ckpt)) == "train.train_iter: 5 -> 7"
    (ckpt / "config.yaml").write_text("model: [unclosed\n")  # a damaged config is said, not taken as agreement
    changed = config_changes(cfg, str(ckpt))
    assert changed.startswith(f"its config {ckpt / 'config.yaml'} could not be read to compare ("), changed
