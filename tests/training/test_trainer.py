"""In-process tests of the trainer loop, hooks, gradient accumulation, checkpoints, samplers,
topology and evaluators."""
import logging
import os
import signal

import numpy as np
import pytest

import engine as flow
from libai.config import LazyConfig
from libai.engine import DefaultTrainer, HookBase, TrainerBase, hooks
from libai.evaluation import ClsEvaluator, PPLEvaluator, inference_on_dataset
from libai.utils import distributed as dist
from libai.utils.checkpoint import CheckpointError, Checkpointer, PeriodicCheckpointer
from libai.utils.events import EventStorage, JSONWriter
from libai.data import CyclicSampler, SingleRoundSampler, build_test_loader
from libai.data.datasets import BlobsDataset
from libai.models.mlp_classifier import MLPClassifier

CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", "mlp_cls.py")


def load_cfg(out, *overrides):
    cfg = LazyConfig.load(CONFIG)
    LazyConfig.apply_overrides(cfg, [f"train.output_dir={out}", *overrides])
    return cfg


# ---------------------------------------------------------------------- loop and hooks
class Recorder(HookBase):
    def __init__(self, name, log):
        self.name, self.log = name, log

    def before_train(self):
        self.log.append((self.name, "before_train", self.trainer.iter))

    def before_step(self):
        self.log.append((self.name, "before_step", self.trainer.iter))

    def after_step(self):
        self.log.append((self.name, "after_step", self.trainer.iter))

    def after_train(self):
        self.log.append((self.name, "after_train", self.trainer.iter))


class CountingTrainer(TrainerBase):
    def __init__(self, log):
        super().__init__()
        self.log = log

    def run_step(self):
        assert self.storage.iter == self.iter
        self.log.append(("trainer", "run_step", self.iter))


def test_hooks_run_in_documented_order():
    log = []
    t = CountingTrainer(log)
    t.register_hooks([Recorder("a", log), None, Recorder("b", log)])
    t.train(3, 5)
    want = [("a", "before_train", 3), ("b", "before_train", 3)]
    for i in (3, 4):
        want += [("a", "before_step", i), ("b", "before_step", i), ("trainer", "run_step", i),
                 ("a", "after_step", i), ("b", "after_step", i)]
    want += [("a", "after_train", 5), ("b", "after_train", 5)]
    assert log == want
    assert t.storage.iter == 5


def test_after_train_runs_after_an_exception_and_stop_iter():
    log = []

    class Boom(CountingTrainer):
        def run_step(self):
            if self.iter == 1:
                raise RuntimeError("boom")

    t = Boom(log)
    t.register_hooks([Recorder("a", log)])
    with pytest.raises(RuntimeError, match="boom"):
        t.train(0, 4)
    assert log[-1] == ("a", "after_train", 1)

    log.clear()
    t = CountingTrainer(log)
    t.register_hooks([Recorder("a", log)])
    t.train(0, 10, stop_iter=2)
    assert [e for e in log if e[0] == "trainer"] == [("trainer", "run_step", 0), ("trainer", "run_step", 1)]
    assert t.max_iter == 10 and log[-1] == ("a", "after_train", 2)

    # a stop at or before the start runs no iteration and counts none (after_train sees iter 5,
    # not 6: nothing that never ran is checkpointed or logged)
    log.clear()
    t = CountingTrainer(log)
    t.register_hooks([Recorder("a", log)])
    t.train(5, 10, stop_iter=3)
    assert [e for e in log if e[0] == "trainer"] == [] and log[-1] == ("a", "after_train", 5) and t.iter == 5


class SignallingTrainer(CountingTrainer):
    """Sends itself `signals` (a list of signal numbers) during the step of iteration 2."""

    def __init__(self, log, signals):
        super().__init__(log)
        self.signals = signals

    def run_step(self):
        super().run_step()
        if self.iter == 2:
            for sig in self.signals:
                os.kill(os.getpid(), sig)
            self.log.append(("trainer", "step finished", self.iter))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_ends_the_loop_after_the_current_step(tmp_path, sig):
    log = []
    model = MLPClassifier(in_features=4, hidden_size=8, num_classes=3)
    t = SignallingTrainer(log, [sig])
    t.register_hooks([Recorder("a", log), hooks.PeriodicCheckpointer(Checkpointer(model, str(tmp_path)), 100)])
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    t.train(0, 10)
    assert ("trainer", "step finished", 2) in log and ("a", "after_step", 2) in log
    assert ("trainer", "run_step", 3) not in log and log[-1] == ("a", "after_train", 3)
    assert t.interrupted == sig and not t.failed
    # the checkpoint of the last finished iteration, and the previous handlers are back
    assert open(os.path.join(str(tmp_path), "last_checkpoint")).read() == "model_0000002"
    assert {s: signal.getsignal(s) for s in handlers} == handlers


def test_a_second_signal_abandons_the_step_without_a_checkpoint(tmp_path):
    log = []
    model = MLPClassifier(in_features=4, hidden_size=8, num_classes=3)
    t = SignallingTrainer(log, [signal.SIGTERM, signal.SIGINT])
    t.register_hooks([Recorder("a", log), hooks.PeriodicCheckpointer(Checkpointer(model, str(tmp_path)), 100)])
    with pytest.raises(KeyboardInterrupt, match="second stop signal"):
        t.train(0, 10)
    assert ("trainer", "step finished", 2) not in log and log[-1] == ("a", "after_train", 2)
    assert t.failed and os.listdir(str(tmp_path)) == []


def test_default_trainer_hook_order(tmp_path):
    cfg = load_cfg(str(tmp_path), "train.train_iter=2")
    trainer = DefaultTrainer(cfg)
    kinds = [type(h) for h in trainer._hooks]
    assert kinds == [hooks.IterationTimer, hooks.LRScheduler, hooks.EvalHook, hooks.BestCheckpointer,
                     hooks.PeriodicWriter, hooks.PeriodicCheckpointer]


def test_evaluation_enabled_with_nothing_to_evaluate_is_warned(tmp_path, caplog):
    """No dataloader.test and no valid/test splits: no EvalHook, no model_best, and a warning
    naming the metric that will never be saved (it used to be silent)."""
    cfg = load_cfg(str(tmp_path), "train.train_iter=2", "~dataloader.test")
    with caplog.at_level("WARNING"):
        trainer = DefaultTrainer(cfg)
    assert hooks.EvalHook not in [type(h) for h in trainer._hooks]
    assert "train.evaluation.enabled=True, but there is nothing to evaluate" in caplog.text
    assert "'Acc@1'" in caplog.text


# ---------------------------------------------------------------------- gradient accumulation
def _losses(out, micro, acc, iters=8):
    cfg = load_cfg(out, f"train.train_iter={iters}", f"train.train_micro_batch_size={micro}",
                   f"train.num_accumulation_steps={acc}", "train.evaluation.enabled=false",
                   "train.checkpointer.period=0", "train.log_period=1")
    flow.manual_seed(3)
    trainer = DefaultTrainer(cfg)
    trainer.train()
    assert trainer.global_batch_size == micro * acc
    return [v for v, _ in trainer.storage.history("total_loss").values()]


def test_gradient_accumulation_matches_a_big_batch(tmp_path):
    a = _losses(str(tmp_path / "a"), micro=4, acc=2)
    b = _losses(str(tmp_path / "b"), micro=8, acc=1)
    assert len(a) == len(b) == 8
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    assert a[0] != a[-1]


# ---------------------------------------------------------------------- checkpoints
def _model_params(model):
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def _make_checkpoint(tmp_path):
    flow.manual_seed(0)
    model = MLPClassifier(in_features=4, hidden_size=8, num_classes=3)
    opt = flow.optim.AdamW(model.parameters(), lr=0.1)
    model(flow.randn(5, 4), flow.randint(0, 3, (5,)))["loss"].backward()
    opt.step()
    ck = Checkpointer(model, str(tmp_path), optimizer=opt)
    ck.save("model_0000000", iteration=0)
    return ck


@pytest.mark.parametrize("victim,how", [("model.safetensors", "truncate"), ("optimizer.safetensors", "flip"),
                                        ("rng_state_rank0.safetensors", "truncate"),
                                        ("rng_state_rank0.safetensors", "delete"),
                                        ("trainer_state.safetensors", "flip")])
def test_corrupted_checkpoint_names_the_file_and_changes_nothing(tmp_path, victim, how):
    """A damaged or (for this rank's RNG states, saved by as many ranks) missing file."""
    _make_checkpoint(tmp_path)
    path = os.path.join(str(tmp_path), "model_0000000", victim)
    data = bytearray(open(path, "rb").read())
    if how == "truncate":
        data = data[: len(data) // 2]
    elif how == "flip":
        data[-3] ^= 0xFF
    if how == "delete":
        os.remove(path)
    else:
        open(path, "wb").write(bytes(data))

    flow.manual_seed(1)
    model = MLPClassifier(in_features=4, hidden_size=8, num_classes=3)
    opt = flow.optim.AdamW(model.parameters(), lr=0.1)
    before, opt_before = _model_params(model), opt.state_dict()
    rng_before = flow.get_rng_state()
    ck = Checkpointer(model, str(tmp_path), optimizer=opt)
    with pytest.raises(CheckpointError, match=victim):
        ck.resume_or_load("", resume=True)
    after = _model_params(model)
    assert all(np.array_equal(before[k], after[k]) for k in before)
    assert opt.state_dict()["state"] == opt_before["state"] == {}
    assert str(flow.get_rng_state()) == str(rng_before)


def test_load_weight_reports_keys_and_rejects_shape_mismatch(tmp_path, caplog):
    ck = _make_checkpoint(tmp_path)
    ckpt = os.path.join(str(tmp_path), "model_0000000")
    # a model with an extra layer: missing keys are reported, matching ones loaded
    model = MLPClassifier(in_features=4, hidden_size=8, num_classes=3, num_layers=3)
    lg = logging.getLogger("libai")
    lg.addHandler(caplog.handler)
    try:
        Checkpointer(model, "").load(ckpt, checkpointables=[])
    finally:
        lg.removeHandler(caplog.handler)
    assert "not found" in caplog.text and "body.2.weight" in caplog.text
    np.testing.assert_array_equal(model.head.weight.detach().numpy(), ck.model.head.weight.detach().numpy())
    # a mis-shaped model: error naming the key, nothing loaded
    other = MLPClassifier(in_features=4, hidden_size=8, num_classes=5)
    before = _model_params(other)
    with pytest.raises(CheckpointError, match="head.weight"):
        Checkpointer(other, "").load(ckpt, checkpointables=[])
    assert all(np.array_equal(before[k], v) for k, v in _model_params(other).items())


def test_periodic_checkpointer_max_to_keep_and_atomic_pointer(tmp_path):
    model = MLPClassifier(in_features=4, hidden_size=8, num_classes=3)
    ck = Checkpointer(model, str(tmp_path))
    pc = PeriodicCheckpointer(ck, period=2, max_iter=10, max_to_keep=2)
    for it in range(10):
        pc.step(it)
    names = sorted(os.listdir(str(tmp_path)))
    assert names == ["last_checkpoint", "model_0000007", "model_0000009", "model_final"]
    # a resumed run adopts the existing checkpoints and keeps the bound
    pc2 = PeriodicCheckpointer(ck, period=2, max_iter=20, max_to_keep=2, adopt_existing=True)
    pc2.step(11)
    assert sorted(d for d in os.listdir(str(tmp_path)) if d.startswith("model_0")) == ["model_0000009", "model_0000011"]
    assert open(os.path.join(str(tmp_path), "last_checkpoint")).read() == "model_0000011"
    # a run that did not resume prunes only what it wrote itself
    pc3 = PeriodicCheckpointer(ck, period=2, max_iter=20, max_to_keep=1)
    pc3.step(13)
    pc3.step(15)
    assert sorted(d for d in os.listdir(str(tmp_path)) if d.startswith("model_0")) == [
        "model_0000009", "model_0000011", "model_0000015"]


# ---------------------------------------------------------------------- data
def test_cyclic_sampler_is_deterministic_dp_aware_and_resumable():
    s = CyclicSampler(10, 2, seed=5, data_parallel_rank=0, data_parallel_size=2)
    t = CyclicSampler(10, 2, seed=5, data_parallel_rank=1, data_parallel_size=2)
    it_s, it_t = iter(s), iter(t)
    epoch0 = [next(it_s) + next(it_t) for _ in range(2)]  # 2 global batches of 4 (10 -> 8 used)
    assert sorted(sum(epoch0, [])) == sorted(np.random.RandomState(5).permutation(10)[:8].tolist())
    state = s.state_dict()
    assert state["consumed_samples"] == 8
    nxt = next(it_s)
    s2 = CyclicSampler(10, 2, seed=5, data_parallel_rank=0, data_parallel_size=2)
    s2.load_state_dict(state)
    assert next(iter(s2)) == nxt == np.random.RandomState(6).permutation(10)[:2].tolist()


def test_single_round_sampler_covers_everything_once():
    shards = [list(SingleRoundSampler(11, 3, data_parallel_rank=r, data_parallel_size=3)) for r in range(3)]
    flat = sorted(i for shard in shards for b in shard for i in b)
    assert flat == list(range(11))


# ---------------------------------------------------------------------- topology
def test_pipeline_num_layers_larger_than_the_model_is_refused():
    """6 pipeline layers for a 3-layer model put every layer on stage 0 and none on stage 1."""
    from omegaconf import OmegaConf

    from libai.engine.default import infer_pipeline_num_layers

    cfg = OmegaConf.create({"model": {"cfg": {"hidden_layers": 3}},
                            "train": {"dist": {"pipeline_parallel_size": 2, "pipeline_num_layers": 6}}})
    with pytest.raises(ValueError, match=r"pipeline_num_layers=6 is larger than the model's 3 layers "
                                         r"\(model.cfg.hidden_layers\).*set it to 3"):
        infer_pipeline_num_layers(cfg)
    cfg.train.dist.pipeline_num_layers = 3
    infer_pipeline_num_layers(cfg)
    cfg.train.dist.pipeline_num_layers = None
    infer_pipeline_num_layers(cfg)
    assert cfg.train.dist.pipeline_num_layers == 3


def test_distributed_topology_layout():
    topo = dist.DistributedTopology(2, 2, 2, pipeline_num_layers=5, world_size=8, rank=6)
    assert (topo.pipeline_stage, topo.data_parallel_rank, topo.tensor_parallel_rank) == (1, 1, 0)
    assert topo.layer_stage_ids == [0, 0, 0, 1, 1]
    assert topo.get_layer_ranks(0) == [[0, 1], [2, 3]] and topo.get_layer_ranks(-1) == [[4, 5], [6, 7]]
    p = topo.get_layer_placement(4, "cpu")
    assert p.hierarchy == (2, 2) and p.ranks == [[4, 5], [6, 7]]
    assert topo.get_nd_sbp([flow.sbp.split(0), flow.sbp.broadcast]) == [flow.sbp.split(0), flow.sbp.broadcast]
    dp_only = dist.DistributedTopology(None, 1, 1, world_size=4, rank=3)
    assert dp_only.data_parallel_size == 4 and dp_only.get_layer_ranks(0) == [0, 1, 2, 3]
    assert dp_only.get_nd_sbp([flow.sbp.split(0), flow.sbp.broadcast]) == [flow.sbp.split(0)]
    custom = dist.DistributedTopology(1, 1, 2, pipeline_num_layers=3, custom_pipeline_stage_id=[0, 1, 1],
                                      world_size=2, rank=0)
    assert custom.layer_stage_ids == [0, 1, 1]
    with pytest.raises(ValueError, match="does not match the world size"):
        dist.DistributedTopology(2, 2, 1, world_size=8, rank=0)


# ---------------------------------------------------------------------- evaluation and events
def test_cls_and_ppl_evaluators():
    model = MLPClassifier(in_features=16, hidden_size=8, num_classes=4)
    loader = build_test_loader(BlobsDataset(num_samples=50), test_batch_size=16)
    res = inference_on_dataset(model, loader, ClsEvaluator(topk=(1, 4)), eval_iter=2)
    assert set(res) == {"Acc@1", "Acc@4"} and res["Acc@4"] == 100.0
    assert model.training  # restored

    ev = ClsEvaluator(topk=(1, 2))
    ev.process({"labels": flow.tensor([0, 1, 2])},
               {"prediction_scores": flow.tensor([[0.9, 0.1, 0.0], [0.6, 0.4, 0.0], [0.5, 0.4, 0.0]])})
    assert ev.evaluate() == {"Acc@1": pytest.approx(100 / 3), "Acc@2": pytest.approx(200 / 3)}

    ppl = PPLEvaluator()
    ppl.process({}, {"lm_loss": flow.tensor(1.0)})
    ppl.process({}, {"lm_loss": flow.tensor(3.0)})
    assert ppl.evaluate()["PPL"] == pytest.approx(np.exp(2.0))
    # batches of 4 and 2 samples (the last batch smaller): the mean over samples, whatever the
    # batches are (the data-parallel size regroups them), not the mean of the batch means
    ppl.reset()
    ppl.process({"input_ids": flow.zeros(4, 3), "labels": flow.zeros(4, 3)}, {"lm_loss": flow.tensor(1.0)})
    ppl.process({"input_ids": flow.zeros(2, 3), "labels": flow.zeros(2, 3)}, {"lm_loss": flow.tensor(4.0)})
    assert ppl.evaluate()["PPL"] == pytest.approx(np.exp((4 * 1.0 + 2 * 4.0) / 6))


def test_event_storage_and_json_writer(tmp_path):
    path = str(tmp_path / "m.json")
    with EventStorage(0) as s:
        w = JSONWriter(path)
        for i in range(3):
            s.iter = i
            s.put_scalar("loss", float(i))
            s.put_scalar("lr", 0.1, smoothing_hint=False)
        assert s.latest_with_smoothing_hint(20)["loss"] == (1.0, 2)  # median of 0, 1, 2
        w.write()
        w.close()
    import json

    lines = [json.loads(x) for x in open(path)]
    assert lines == [{"iteration": 2, "loss": 2.0, "lr": 0.1}]


class SignalOnEval(ClsEvaluator):
    """A ClsEvaluator that sends this process SIGTERM while processing the second batch of the
    `at`-th evaluation since the class counter was reset (None: never); the trainer builds one
    evaluator per evaluation."""

    evaluations = 0

    def __init__(self, topk=(1, 2), at=None):
        super().__init__(topk=topk)
        type(self).evaluations += 1
        self.at = at
        self.batches = 0

    def process(self, inputs, outputs):
        super().process(inputs, outputs)
        self.batches += 1
        if self.at == type(self).evaluations and self.batches == 2:
            os.kill(os.getpid(), signal.SIGTERM)


def _eval_trainer(out, at=None, resume=False):
    from libai.config import LazyCall

    cfg = load_cfg(out, "train.train_iter=30", "train.log_period=5", "train.checkpointer.period=10",
                   "train.evaluation.eval_period=10", f"train.resume={resume}")
    cfg.train.evaluation.evaluator = LazyCall(SignalOnEval)(topk=(1, 2), at=at)
    SignalOnEval.evaluations = 0
    flow.manual_seed(3)
    return DefaultTrainer(cfg)


def _comparable_records(out):
    import json

    with open(os.path.join(out, "metrics.json")) as f:
        return [{k: v for k, v in json.loads(line).items() if k not in ("time", "data_time", "eta_seconds")}
                for line in f]


def test_an_evaluation_cut_short_by_a_signal_runs_first_on_resume(tmp_path):
    """The evaluation of iteration 19 (a log iteration too) is interrupted: the run stops with a
    checkpoint of 19 that carries the pending evaluation and the unwritten record; the resumed
    run evaluates 19 first and ends with the uninterrupted run's records, best model and weights."""
    ref = str(tmp_path / "ref")
    _eval_trainer(ref).train()
    out = str(tmp_path / "run")
    t = _eval_trainer(out, at=2)
    t.train()
    assert t.interrupted == signal.SIGTERM and not t.failed
    assert open(os.path.join(out, "last_checkpoint")).read() == "model_0000019"
    state = flow.load(os.path.join(out, "model_0000019", "trainer_state.safetensors"))
    assert state["hooks"]["EvalHook"] == {"pending_iter": 19}
    assert max(r["iteration"] for r in _comparable_records(out)) == 14  # record 19 is held
    resumed = _eval_trainer(out, resume=True)
    assert resumed.start_iter == 20
    resumed.train()
    assert _comparable_records(out) == _comparable_records(ref)
    best = [flow.load(os.path.join(d, "model_best", "trainer_state.safetensors")) for d in (out, ref)]
    assert best[0]["iteration"] == best[1]["iteration"] and best[0]["best_metric"] == best[1]["best_metric"]
    final = [flow.load(os.path.join(d, "model_final", "model.safetensors")) for d in (out, ref)]
    assert all(np.array_equal(final[0][k].numpy(), final[1][k].numpy()) for k in final[1])


class _TotalAndParts(flow.nn.Module):
    """Returns "total_loss" plus its parts and a metric, as BertForPreTraining does."""

    def __init__(self):
        super().__init__()
        self.w = flow.nn.Parameter(flow.tensor([1.0, 2.0]))

    def forward(self, x):
        a, b = (self.w[0] * x).sum(), (self.w[1] * x).sum()
        return {"total_loss": a + b, "a_loss": a, "b_loss": b, "acc": (a * 0 + 0.5).detach()}


def test_a_total_loss_entry_is_the_loss_and_the_rest_is_logged():
    from libai.engine.trainer import EagerTrainer, loss_of

    assert float(loss_of({"x": flow.tensor(1.0), "y": flow.tensor(2.0)})) == 3.0  # no total: the sum
    model = _TotalAndParts()
    opt = flow.optim.SGD(model.parameters(), lr=1.0)
    trainer = EagerTrainer(model, iter([{"x": flow.tensor([1.0, 2.0])}] * 2), opt)
    with EventStorage(0) as storage:
        trainer.storage = storage
        trainer.run_step()
    # d(total)/dw = [sum x, sum x] = [3, 3]; SGD with lr 1 subtracts it once (parts not added again)
    np.testing.assert_allclose(model.w.detach().numpy(), [-2.0, -1.0])
    latest = {k: v for k, (v, _) in storage.latest().items()}
    assert latest["total_loss"] == 9.0 and latest["a_loss"] == 3.0 and latest["b_loss"] == 6.0
    assert latest["acc"] == 0.5
