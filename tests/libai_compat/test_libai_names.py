"""LiBai names that code written for LiBai imports: libai.data.data_utils, libai.models.build_model
and libai.models.utils (GraphBase), libai.engine.GraphTrainer, AdamW's do_bias_correction,
optimizer.clip_grad(), libai.utils.distributed's helpers, and the trainer's extension points
(build_train_loader(cfg, tokenizer), build_test_loader(cfg, tokenizer), EagerTrainer.run_step(
get_batch, input_placement_device))."""
import os
import warnings

import numpy as np
import pytest
import torch

import engine as flow
from libai.config import LazyCall, LazyConfig

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MLP_CONFIG = os.path.join(ROOT, "tests", "training", "configs", "mlp_cls.py")


# ---------------------------------------------------------------------- libai.data.data_utils
def test_data_utils_maps_to_our_indexed_dataset(tmp_path):
    from libai.data import data_utils
    from libai.data.data_utils import get_indexed_dataset, get_train_valid_test_split_
    from libai.data.indexed_dataset import MMapIndexedDatasetBuilder

    prefix = str(tmp_path / "d_text_document")
    builder = MMapIndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for doc in ([1, 2, 3], [4, 5], [6]):
        builder.add_item(np.array(doc, dtype=np.uint16))
        builder.end_document()
    builder.finalize(prefix + ".idx")
    ds = get_indexed_dataset(prefix, data_impl="mmap", skip_warmup=False)
    assert isinstance(ds, data_utils.MMapIndexedDataset) and ds[1].tolist() == [4, 5]
    assert get_train_valid_test_split_(100, [949.0, 50.0, 1.0]) == [0, 95, 100, 100]
    assert data_utils.compile_helper() is None  # nothing to compile: the helpers are numpy code
    for impl in ("lazy", "cached"):
        with pytest.raises(NotImplementedError, match=f"the '{impl}' indexed dataset format is not implemented"):
            get_indexed_dataset(prefix, data_impl=impl, skip_warmup=True)
    with pytest.raises(ValueError, match="only the 'mmap'"):
        get_indexed_dataset(prefix, data_impl="nope", skip_warmup=True)
    for cls in (data_utils.IndexedDataset, data_utils.IndexedCachedDataset):
        with pytest.raises(NotImplementedError, match="indexed dataset format\\) is not implemented"):
            cls(prefix)


def test_data_utils_is_shared_folder(monkeypatch):
    """LiBai's rule: IS_SHARED_FILE=1 says shared; a file on the root file system's device is not;
    one on another device is when its directory is a mount point under /nfs, /smb or /cifs."""
    from libai.data.data_utils import dataset_utils, is_shared_folder

    devices = {"/": 1, "/data/x": 1, "/nfs/home/x": 2, "/mnt/disk/x": 2}
    monkeypatch.setattr(dataset_utils.os, "stat", lambda p: type("st", (), {"st_dev": devices[p]}))
    monkeypatch.setattr(dataset_utils.os.path, "ismount", lambda d: d in ("/nfs/home", "/mnt/disk"))
    monkeypatch.setattr(dataset_utils.os.path, "realpath", lambda d: d)
    monkeypatch.delenv("IS_SHARED_FILE", raising=False)
    got = {p: is_shared_folder(p) for p in ("/data/x", "/nfs/home/x", "/mnt/disk/x")}
    assert got == {"/data/x": False, "/nfs/home/x": True, "/mnt/disk/x": False}
    monkeypatch.setenv("IS_SHARED_FILE", "1")
    assert is_shared_folder("/data/x") is True


def test_data_utils_samples_mapping_and_masking():
    from libai.data.data_utils import create_masked_lm_predictions, get_samples_mapping
    from libai.data.datasets.bert_dataset import build_samples_mapping

    class Sentences:  # 3 documents of 2, 3 and 2 sentences
        doc_idx = np.array([0, 2, 5, 7], dtype=np.int64)
        sizes = np.array([5, 6, 4, 7, 3, 8, 2], dtype=np.int32)

    got = get_samples_mapping(Sentences, "unused", None, 12, 10, 0.1, 7, "bert", True)
    want = build_samples_mapping(Sentences.doc_idx, Sentences.sizes, np.arange(3), 12, 10, 0.1, 7, 2, name="bert")
    np.testing.assert_array_equal(got, want)
    assert got.shape == (12, 3)
    with pytest.raises(NotImplementedError, match="num_epochs"):
        get_samples_mapping(Sentences, "unused", 2, 12, 10, 0.1, 7, "bert", True)
    with pytest.raises(NotImplementedError, match="n-gram span masking"):
        create_masked_lm_predictions(None, [1, 2], [], {}, 0.15, 0, 1, 2, 5, np.random.RandomState(0))


# ---------------------------------------------------------------------- models and graph mode
def test_build_model_and_graph_names():
    from libai.engine import DefaultTrainer, GraphTrainer
    from libai.models import build_graph, build_model
    from libai.models.mlp_classifier import MLPClassifier
    from libai.models.utils import GraphBase, init_method_normal, scaled_init_method_normal

    model = build_model(LazyCall(MLPClassifier)(in_features=4, hidden_size=8, num_classes=3))
    assert isinstance(model, MLPClassifier)
    for graph in (build_graph(None, model, is_train=True), DefaultTrainer.build_graph(
            LazyConfig.load(MLP_CONFIG), model, is_train=True)):
        assert isinstance(graph, GraphBase) and isinstance(graph, flow.nn.Graph) and graph.model is model
    assert isinstance(GraphTrainer(GraphBase(model), [], optimizer=flow.optim.SGD(model.parameters(), lr=0.1)),
                      GraphTrainer)
    for kwargs, what in ((dict(zero_optim=True), r"zero_optim=True \(ZeRO\)"),):
        with pytest.raises(NotImplementedError, match=f"GraphBase: {what}.*not implemented in graph mode"):
            GraphBase(model, **kwargs)
    w = flow.empty(2000)
    init_method_normal(0.5)(w)
    assert abs(float(w.std()) - 0.5) < 0.05
    scaled_init_method_normal(0.5, num_layers=8)(w)
    assert abs(float(w.std()) - 0.125) < 0.02


def test_graph_base_runs_a_libai_models_set_pipeline_stage_id():
    """A model class with LiBai's `set_pipeline_stage_id(model)` (OneFlow's GraphModule API, as
    LiBai's GPT/BERT write it) has it called by GraphBase: stages that agree with the layers'
    placement are recorded; a stage that would move a layer is refused."""
    from libai.models.utils import GraphBase
    from libai.utils import distributed as dist

    class Staged(flow.nn.Module):
        wrong = False

        def __init__(self):
            super().__init__()
            self.first = flow.nn.Linear(4, 4).to_global(placement=dist.get_layer_placement(0),
                                                        sbp=flow.sbp.broadcast)
            self.last = flow.nn.Linear(4, 2).to_global(placement=dist.get_layer_placement(-1),
                                                       sbp=flow.sbp.broadcast)

        def forward(self, x):
            return {"loss": self.last(self.first(x)).sum()}

        @staticmethod
        def set_pipeline_stage_id(model):
            dist_utils = dist.get_dist_util()
            for module_block in model.modules():
                if module_block.to(flow.nn.Module) is model.first:
                    module_block.to(flow.nn.graph.GraphModule).set_stage(
                        dist_utils.get_layer_stage_id(0), dist.get_layer_placement(0))
                elif module_block.to(flow.nn.Module) is model.last:
                    stage = flow.placement("cpu", ranks=[1]) if model.wrong else dist.get_layer_placement(-1)
                    module_block.to(flow.nn.graph.GraphModule).set_stage(dist_utils.get_layer_stage_id(-1), stage)

    model = Staged()
    GraphBase(model, is_train=False)
    assert [m.to(flow.nn.graph.GraphModule).stage_id for m in (model.first, model.last)] == [0, 0]
    model.wrong = True
    with pytest.raises(NotImplementedError, match="parameter 'weight' of Linear is placed on"):
        GraphBase(model, is_train=False)


def test_libai_style_graph_with_its_optimizer_steps_as_eager():
    """LiBai's GraphBase(model, optimizer, lr_scheduler, grad_acc_steps=2): the graph splits the
    batch, scales each half's backward by 1/2 and steps; the same as eager accumulation."""
    import copy

    import numpy as np
    from libai.models.mlp_classifier import MLPClassifier
    from libai.models.utils import GraphBase

    flow.manual_seed(0)
    model = MLPClassifier(in_features=4, hidden_size=8, num_classes=3)
    twin = copy.deepcopy(model)
    opt, opt2 = (flow.optim.AdamW(m.parameters(), lr=0.05) for m in (model, twin))
    graph = GraphBase(model, opt, flow.optim.lr_scheduler.StepLR(opt, 2), grad_acc_steps=2)
    sched2 = flow.optim.lr_scheduler.StepLR(opt2, 2)
    rng = np.random.default_rng(0)
    for step in range(4):
        x = flow.tensor(rng.standard_normal((8, 4)).astype("float32"))
        y = flow.tensor(rng.integers(0, 3, 8))
        got = graph(images=x, labels=y)
        for half in range(2):
            loss = twin(images=x[half * 4:(half + 1) * 4], labels=y[half * 4:(half + 1) * 4])["loss"]
            (loss / 2).backward()
        opt2.step()
        opt2.zero_grad()
        sched2.step()
        assert got["loss"].shape == (2,)
        for p, q in zip(model.parameters(), twin.parameters()):
            assert np.array_equal(p.detach().numpy(), q.detach().numpy()), step
    assert graph.num_traces == 1


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # float16 overflows are the point
def test_libai_style_float16_graph_scales_unscales_and_skips_as_eager():
    """LiBai's GraphBase(model, optimizer, fp16=True): float16 autocast (graph.config.enable_amp)
    and the graph's own loss scaling. A start scale that overflows makes some steps skip and the
    scale move both ways; the graph follows the eager GradScaler loop bit for bit."""
    import copy

    import numpy as np
    from libai.models.mlp_classifier import MLPClassifier
    from libai.models.utils import GraphBase

    flow.manual_seed(0)
    model = MLPClassifier(in_features=4, hidden_size=64, num_classes=3)
    twin = copy.deepcopy(model)
    opt, opt2 = (flow.optim.AdamW(m.parameters(), lr=0.05) for m in (model, twin))
    scaler = flow.amp.GradScaler(init_scale=2.0 ** 22, growth_interval=2)
    scaler2 = flow.amp.GradScaler(init_scale=2.0 ** 22, growth_interval=2)
    graph = GraphBase(model, opt, fp16=True, grad_scaler=scaler)
    rng = np.random.default_rng(0)
    skipped, scales = 0, set()
    for step in range(10):
        x = flow.tensor(rng.standard_normal((8, 4)).astype("float32"))
        y = flow.tensor(rng.integers(0, 3, 8))
        got = graph(images=x, labels=y)
        with flow.autocast("cpu", dtype=flow.float16):
            loss = twin(images=x, labels=y)["loss"]
        scaler2.scale(loss).backward()
        scaler2.step(opt2)
        skipped += scaler2.found_inf(opt2)
        scaler2.update()
        opt2.zero_grad()
        assert got["loss"].item() == loss.item() and scaler.get_scale() == scaler2.get_scale(), step
        for p, q in zip(model.parameters(), twin.parameters()):
            assert np.array_equal(p.detach().numpy(), q.detach().numpy()), step
        scales.add(scaler.get_scale())
    assert 0 < skipped < 10 and len(scales) >= 3, (skipped, scales)
    assert graph.num_traces == 1
    with pytest.raises(ValueError, match="a grad_scaler is for float16 training"):
        GraphBase(model, grad_scaler=scaler)


def test_default_trainer_runs_libai_graph_enabled_and_refuses_what_graph_mode_lacks(tmp_path):
    from libai.engine import DefaultTrainer, GraphTrainer

    cfg = LazyConfig.load(MLP_CONFIG)
    LazyConfig.apply_overrides(cfg, [f"train.output_dir={tmp_path / 'ok'}", "+graph.enabled=true"])
    assert isinstance(DefaultTrainer(cfg)._trainer, GraphTrainer)
    cfg = LazyConfig.load(MLP_CONFIG)
    LazyConfig.apply_overrides(cfg, [f"train.output_dir={tmp_path / 'fp16'}", "train.graph.enabled=True",
                                     "train.amp.enabled=True", "train.amp.dtype=float16"])
    trainer = DefaultTrainer(cfg)._trainer  # float16: the graph scales, the eager update unscales
    assert isinstance(trainer, GraphTrainer) and trainer.grad_scaler is trainer.graph.grad_scaler is not None
    for overrides, what in ((["+graph.auto_parallel.enabled=true"], "auto_parallel"),
                            (["+graph.global_mode.enabled=true"], "global_mode"),
                            (["+graph.train_graph.fp16=true"], "train_graph"),
                            (["+graph.train_graph._target_=engine.nn.Graph"], "train_graph._target_")):
        cfg = LazyConfig.load(MLP_CONFIG)
        LazyConfig.apply_overrides(cfg, [f"train.output_dir={tmp_path / what}", "train.graph.enabled=True",
                                         *overrides])
        with pytest.raises(NotImplementedError, match=what):
            DefaultTrainer(cfg)
        assert not os.path.exists(str(tmp_path / what))  # refused before the output directory is claimed


def test_missing_libai_names_say_so():
    with pytest.raises(ImportError, match="libai.models.T5Model \\(LiBai's\\) is not implemented"):
        from libai.models import T5Model  # noqa: F401
    with pytest.raises(ImportError, match="RobertaTokenizer \\(LiBai's\\) is not implemented"):
        from libai.tokenizer import RobertaTokenizer  # noqa: F401
    with pytest.raises(ImportError, match="BertForSequenceClassification"):
        from libai.models import BertForClassification  # noqa: F401
    import libai.models

    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        libai.models.Nope


# ---------------------------------------------------------------------- optimizers
def _adam_reference(w0, grads, lr, betas, eps, wd, correct, amsgrad=False):
    """torch tensor arithmetic in float64 (torch's AdamW has no do_bias_correction)."""
    w = torch.tensor(w0, dtype=torch.float64)
    m, v, vmax = torch.zeros_like(w), torch.zeros_like(w), torch.zeros_like(w)
    for t, g in enumerate(grads, 1):
        g = torch.tensor(g, dtype=torch.float64)
        w = w * (1 - lr * wd)
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        vmax = torch.maximum(vmax, v)
        vv = vmax if amsgrad else v
        bc1, bc2 = (1 - betas[0] ** t, 1 - betas[1] ** t) if correct else (1.0, 1.0)
        w = w - (lr / bc1) * m / (vv.sqrt() / bc2 ** 0.5 + eps)
    return w.numpy()


@pytest.mark.parametrize("correct", [True, False])
@pytest.mark.parametrize("amsgrad", [False, True])  # amsgrad takes the non-blocked path
@pytest.mark.parametrize("shape", [(7, 3), (1,), (0,)])
def test_adamw_do_bias_correction(correct, amsgrad, shape):
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal(shape)
    grads = [rng.standard_normal(shape) for _ in range(4)]
    p = flow.nn.Parameter(flow.tensor(w0))
    opt = flow.optim.AdamW([p], lr=0.05, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.1, amsgrad=amsgrad,
                           do_bias_correction=correct)
    for g in grads:
        p.grad = flow.tensor(g)
        opt.step()
    np.testing.assert_allclose(p.detach().numpy(), _adam_reference(w0, grads, 0.05, (0.8, 0.9), 1e-6, 0.1, correct,
                                                                  amsgrad), rtol=1e-12, atol=1e-12)
    if correct and not amsgrad:  # the default is torch's AdamW
        t = torch.nn.Parameter(torch.tensor(w0))
        topt = torch.optim.AdamW([t], lr=0.05, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.1)
        for g in grads:
            t.grad = torch.tensor(g)
            topt.step()
        np.testing.assert_allclose(p.detach().numpy(), t.detach().numpy(), rtol=1e-12, atol=1e-12)


def test_adam_do_bias_correction_float32_blocked_path_and_errors():
    rng = np.random.default_rng(1)
    w0 = rng.standard_normal(300).astype(np.float32)
    grads = [rng.standard_normal(300).astype(np.float32) for _ in range(3)]
    p = flow.nn.Parameter(flow.tensor(w0))
    opt = flow.optim.Adam([p], lr=0.01, do_bias_correction=False)
    for g in grads:
        p.grad = flow.tensor(g)
        opt.step()
    ref = _adam_reference(w0.astype(np.float64), grads, 0.01, (0.9, 0.999), 1e-8, 0.0, False)
    np.testing.assert_allclose(p.detach().numpy(), ref, rtol=1e-5, atol=1e-6)
    assert opt.state_dict()["param_groups"][0]["do_bias_correction"] is False
    with pytest.raises(TypeError, match="do_bias_correction must be a bool"):
        flow.optim.AdamW([flow.nn.Parameter(flow.ones(2))], do_bias_correction="yes")


def test_optimizer_clip_grad_uses_the_groups_settings():
    a, b = flow.nn.Parameter(flow.ones(2)), flow.nn.Parameter(flow.ones(2))
    opt = flow.optim.SGD([{"params": [a], "clip_grad_max_norm": 1.0, "clip_grad_norm_type": 2.0}, {"params": [b]}],
                         lr=0.1)
    a.grad, b.grad = flow.tensor([3.0, 4.0]), flow.tensor([3.0, 4.0])
    opt.clip_grad()
    ta = torch.nn.Parameter(torch.ones(2))
    ta.grad = torch.tensor([3.0, 4.0])
    torch.nn.utils.clip_grad_norm_([ta], 1.0, 2.0)
    np.testing.assert_allclose(a.grad.numpy(), ta.grad.numpy(), rtol=1e-6)
    assert b.grad.tolist() == [3.0, 4.0]  # a group without clip_grad_max_norm is left alone
    plain = flow.optim.SGD([b], lr=0.1)
    with pytest.warns(UserWarning, match="no parameter group has clip_grad_max_norm"):
        plain.clip_grad()


# ---------------------------------------------------------------------- distributed helpers
def test_distributed_helpers_single_process():
    import libai.utils.distributed as dist

    assert dist.is_last_process() and dist.get_num_nodes() == 1 and dist.broadcast_py_object({"a": 1}) == {"a": 1}
    S, B = flow.sbp.split, flow.sbp.broadcast
    assert dist.same_sbp([S(0), B], (S(0), B)) and not dist.same_sbp([S(0)], [S(1)])
    with pytest.raises(ValueError, match="different lengths"):
        dist.same_sbp([S(0)], [S(0), B])
    x = np.arange(12.0).reshape(4, 3)
    g = flow.tensor(x).to_global(placement=flow.placement("cpu", [0]), sbp=[S(0)])
    np.testing.assert_array_equal(dist.tton(g), x)
    np.testing.assert_array_equal(dist.ttol(g, pure_local=True).numpy(), x)
    assert not dist.ttol(g).is_global and dist.tton(flow.tensor(x)).tolist() == x.tolist()
    r0 = dist.tensor_to_rank0(g)
    assert r0.placement.ranks == [0] and r0.sbp == (B,)
    local = dist.convert_to_distributed_default_setting(flow.tensor(x))
    assert local.is_global and local.sbp == (B,) and local.placement.ranks == [0]
    with pytest.raises(NotImplementedError, match="npu"):
        dist.set_device_type("npu")
    with pytest.raises(ValueError, match="device_type must be one of"):
        dist.set_device_type("tpu")


def test_distributed_helpers_on_two_ranks():
    import sys

    sys.path.insert(0, os.path.join(ROOT, "tests", "distributed"))
    from mpi_helper import run_mpi

    run_mpi(2, os.path.join(HERE, "scripts", "dist_helpers.py"), timeout=120)


# ---------------------------------------------------------------------- trainer extension points
@pytest.fixture(autouse=True)
def _release_output_dirs():
    """In-process trainers claim their output directory (a lock file): release it after each test."""
    from libai.utils.output_dir import release_output_dir

    yield
    release_output_dir()


def _cfg(tmp_path, *overrides):
    cfg = LazyConfig.load(MLP_CONFIG)
    LazyConfig.apply_overrides(cfg, [f"train.output_dir={tmp_path}", "train.train_iter=2",
                                     "train.evaluation.enabled=false", "train.checkpointer.period=0", *overrides])
    return cfg


def test_loaders_take_a_tokenizer_for_their_datasets(tmp_path):
    from libai.config import resolve_batch_sizes, resolve_train_config
    from libai.data.datasets import BlobsDataset
    from libai.engine import DefaultTrainer

    seen = []

    class TokenizedBlobs(BlobsDataset):
        def __init__(self, tokenizer=None, **kwargs):
            seen.append(tokenizer)
            super().__init__(**kwargs)

    cfg = _cfg(tmp_path)
    resolve_train_config(cfg)
    resolve_batch_sizes(cfg.train, 1)
    cfg.dataloader.train.dataset._target_ = TokenizedBlobs
    cfg.dataloader.test[0].dataset._target_ = TokenizedBlobs
    before = LazyConfig.to_py(cfg)
    marker = object()
    train, valid, test = DefaultTrainer.build_train_loader(cfg, marker)
    (test_loader,) = DefaultTrainer.build_test_loader(cfg, marker)
    assert seen == [marker, marker] and valid is None and test is None
    assert len(train.dataset) == 512 and len(test_loader.dataset) == 256
    assert LazyConfig.to_py(cfg) == before  # the config is left as it was
    DefaultTrainer.build_train_loader(cfg)  # LiBai's one-argument call: no tokenizer given
    assert seen[-1] is None


def test_eager_trainer_run_step_libai_call(tmp_path):
    """LiBai's call: run_step(get_batch, input_placement_device), get_batch(data, device, mixup_func)."""
    from libai.engine import DefaultTrainer, EagerTrainer
    from libai.utils.events import EventStorage

    trainer = DefaultTrainer(_cfg(tmp_path))
    calls = []

    def get_batch(data, input_placement_device, mixup_func):
        calls.append((input_placement_device, mixup_func))
        return DefaultTrainer.get_batch(data, input_placement_device, mixup_func)

    inner = trainer._trainer
    assert isinstance(inner, EagerTrainer)
    inner.data_loader.mixup_func = None
    before = [p.detach().numpy().copy() for p in trainer.model.parameters()]
    with EventStorage(0) as storage:
        inner.storage = storage
        inner.run_step(get_batch, "cpu")
    assert calls == [("cpu", None)]
    assert any(not np.array_equal(a, p.detach().numpy()) for a, p in zip(before, trainer.model.parameters()))


def test_get_batch_applies_a_mixup_func():
    from libai.data.structures import DistTensorData, Instance
    from libai.engine import DefaultTrainer

    batch = Instance(images=DistTensorData(flow.ones(2, 3)), labels=DistTensorData(flow.tensor([0, 1])))

    def mixup(images, labels):
        return images * 0.5, flow.nn.functional.one_hot(labels, 2).float()

    out = DefaultTrainer.get_batch(batch, "cpu", mixup)
    assert out["images"].tolist() == [[0.5] * 3] * 2 and out["labels"].tolist() == [[1.0, 0.0], [0.0, 1.0]]
    plain = DefaultTrainer.get_batch({"images": flow.ones(1), "labels": flow.zeros(1)}, "cpu",
                                     lambda images, labels: (images + 1, labels))
    assert plain["images"].tolist() == [2.0]


def test_epoch_periods_follow_the_dataset(tmp_path):
    from libai.engine import DefaultTrainer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = DefaultTrainer(_cfg(tmp_path, "train.evaluation.enabled=true", "train.checkpointer.period=5",
                                      "train.evaluation.eval_after_n_epoch=2",
                                      "train.checkpointer.save_model_after_n_epoch=3"))
    # 512 samples / 16 per iteration = 32 iterations per epoch
    assert trainer.cfg.train.evaluation.eval_period == 64 and trainer.cfg.train.checkpointer.period == 96


def test_loss_entries_follow_libai_rule():
    """LiBai trains on the entries whose name contains "loss": {"loss": l, "acc": a} trains on l
    and logs total_loss = l ("total_loss" itself, when returned, still wins; no "loss" name: all)."""
    from libai.engine.trainer import EagerTrainer, loss_keys
    from libai.utils.events import EventStorage

    assert loss_keys({"lm_loss": 1, "sop_loss": 2, "acc": 3}) == ["lm_loss", "sop_loss"]
    assert loss_keys({"total_loss": 1, "lm_loss": 1}) == ["total_loss"] and loss_keys({"x": 1, "y": 2}) == ["x", "y"]

    class Model(flow.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = flow.nn.Parameter(flow.tensor([1.0, 2.0]))

        def forward(self, x):
            loss = (self.w * x).sum()
            return {"loss": loss, "acc": loss * 0 + 7.0}

    model = Model()
    opt = flow.optim.SGD(model.parameters(), lr=1.0)
    trainer = EagerTrainer(model, iter([{"x": flow.tensor([1.0, 2.0])}]), opt)
    with EventStorage(0) as storage:
        trainer.storage = storage
        trainer.run_step()
    np.testing.assert_allclose(model.w.detach().numpy(), [0.0, 0.0])  # d(loss)/dw = x only
    latest = {k: v for k, (v, _) in storage.latest().items()}
    assert latest["total_loss"] == 5.0 and latest["acc"] == 7.0


def test_libai_set_activation_checkpoint_idiom_through_graph_module():
    """LiBai's models turn checkpointing on with OneFlow's GraphModule:
    `module_block.to(nn.graph.GraphModule).activation_checkpointing = True` for every layer whose
    `to(nn.Module)` is a TransformerLayer: here that sets the layer's own switch."""
    from libai.layers import TransformerLayer

    layer = TransformerLayer(hidden_size=16, ffn_hidden_size=32, num_attention_heads=2)
    blocks = [m for m in layer.modules() if isinstance(m.to(flow.nn.Module), TransformerLayer)]
    assert blocks == [layer]
    blocks[0].to(flow.nn.graph.GraphModule).activation_checkpointing = True
    assert layer.activation_checkpointing and "forward" not in layer.__dict__


def test_graph_base_calls_a_libai_models_own_set_activation_checkpoint():
    from libai.layers import TransformerLayer
    from libai.models.utils import GraphBase

    class Ported(flow.nn.Module):  # a model written for LiBai: its own rule, OneFlow's GraphModule
        def __init__(self):
            super().__init__()
            self.layers = flow.nn.ModuleList([TransformerLayer(16, 32, 2) for _ in range(2)])
            self.head = flow.nn.Linear(16, 2)

        @staticmethod
        def set_activation_checkpoint(model):
            for module_block in model.modules():
                if isinstance(module_block.to(flow.nn.Module), TransformerLayer):
                    module_block.to(flow.nn.graph.GraphModule).activation_checkpointing = True

    model = Ported()
    GraphBase(model, activation_checkpoint=True)
    assert all(layer.activation_checkpointing for layer in model.layers)
