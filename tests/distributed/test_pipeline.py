"""Pipeline parallelism (libai/engine/pipeline.py, engine/distributed/pipeline.py).

* the 1F1B and GPipe schedules: every micro-batch forward once before its backward, 1F1B's
  warm-up of p-s-1 forwards and at most p-s micro-batches alive per stage;
* every model's pipeline steps, run in order in one process, are its forward (bit for bit);
* the engine's handoff on 4 ranks (2 stages of 2): shards keep their SBP, gradients return;
* through tools/train_net.py under the launcher, 10 iterations with dropout off: GPT-2 under
  pp=2, pp=4 and dp=2 x tp=2 x pp=2 (8 processes), BERT under pp=2 and dp x tp x pp, ViT and
  Swin under pp=2 log the single-process losses within 1e-5 relative with the same number of
  micro-batches; GPipe logs what 1F1B logs; a checkpoint written under dp2 x tp2 x pp2 resumes
  in one process onto the uninterrupted losses.
"""
import os
import sys

import numpy as np
import pytest

import engine as flow
from libai.engine.pipeline import schedule, theoretical_bubble
from libai.models.utils.pipeline import run_steps

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "gpt2"))

from gpt2_helpers import TINY, losses, max_rel_err, records, train_net, trained_losses  # noqa: E402
from mpi_helper import gpu_env, run_mpi  # noqa: E402


# ------------------------------------------------------------------ schedules
@pytest.mark.parametrize("kind", ["1F1B", "GPipe"])
@pytest.mark.parametrize("stages", [1, 2, 3, 4])
@pytest.mark.parametrize("m", [1, 2, 3, 5, 8])
def test_schedule_runs_each_micro_batch_forward_then_backward(kind, stages, m):
    for s in range(stages):
        order = schedule(kind, s, stages, m)
        assert sorted(order) == sorted([("F", k) for k in range(m)] + [("B", k) for k in range(m)])
        assert [k for op, k in order if op == "F"] == list(range(m))
        assert [k for op, k in order if op == "B"] == list(range(m))
        alive, peak = 0, 0
        for op, k in order:
            assert op == "F" or order.index(("F", k)) < order.index(("B", k))
            alive += 1 if op == "F" else -1
            peak = max(peak, alive)
        if kind == "1F1B":
            assert peak == min(stages - s, m)  # activations of at most p-s micro-batches
            assert order[:min(stages - s - 1, m)] == [("F", k) for k in range(min(stages - s - 1, m))]
        else:
            assert peak == m


def test_schedule_names_and_bubble():
    with pytest.raises(ValueError, match="1F1B"):
        schedule("interleaved", 0, 2, 4)
    assert theoretical_bubble(4, 8) == pytest.approx(3 / 11)
    assert theoretical_bubble(1, 8) == 0


# ------------------------------------------------------------------ steps == forward
def _gpt():
    from libai.models import GPTForPreTraining

    model = GPTForPreTraining(hidden_layers=2, vocab_size=96, hidden_size=32, num_attention_heads=4,
                              max_seq_length=16)
    ids = np.random.default_rng(0).integers(0, 96, (3, 16))
    return model, {"input_ids": flow.tensor(ids), "labels": flow.tensor(np.roll(ids, -1, 1))}


def _bert(cls_name):
    from libai import models

    rng = np.random.default_rng(1)
    cfg = dict(vocab_size=96, hidden_size=32, hidden_layers=2, num_attention_heads=4, max_position_embeddings=16,
               hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ids = rng.integers(0, 96, (3, 16))
    batch = {"input_ids": flow.tensor(ids), "attention_mask": flow.tensor(np.ones((3, 16), np.int64)),
             "tokentype_ids": flow.tensor(np.zeros((3, 16), np.int64))}
    if cls_name == "BertForPreTraining":
        model = models.BertForPreTraining(cfg)
        labels = np.where(rng.random((3, 16)) < 0.3, ids, -1)
        batch.update(lm_labels=flow.tensor(labels), loss_mask=flow.tensor((labels >= 0).astype(np.int64)),
                     ns_labels=flow.tensor(rng.integers(0, 2, (3,))))
    else:
        model = models.BertForSequenceClassification(cfg, num_labels=3)
        batch["labels"] = flow.tensor(rng.integers(0, 3, (3,)))
    return model, batch


def _vision(kind):
    from libai.models import SwinTransformer, VisionTransformer

    if kind == "vit":
        model = VisionTransformer(img_size=16, patch_size=4, in_chans=3, embed_dim=32, depth=2, num_heads=4,
                                  num_classes=5)
    else:
        model = SwinTransformer(img_size=16, patch_size=2, in_chans=3, num_classes=5, embed_dim=16, depths=(2, 1),
                                num_heads=(2, 4), window_size=4, drop_path_rate=0.0)
    rng = np.random.default_rng(2)
    return model, {"images": flow.tensor(rng.standard_normal((2, 3, 16, 16)).astype(np.float32)),
                   "labels": flow.tensor(rng.integers(0, 5, (2,)))}


@pytest.mark.parametrize("make", [_gpt, lambda: _bert("BertForPreTraining"),
                                  lambda: _bert("BertForSequenceClassification"),
                                  lambda: _vision("vit"), lambda: _vision("swin")],
                         ids=["gpt2", "bert_pretraining", "bert_classification", "vit", "swin"])
@pytest.mark.parametrize("training", [True, False])
def test_pipeline_steps_in_order_are_the_forward(make, training):
    model, batch = make()
    model.train(training)
    with flow.no_grad():
        want = model(**batch)
        got = run_steps(model.pipeline_steps(), batch)
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_array_equal(got[k].numpy(), want[k].numpy(), err_msg=k)


def test_pipeline_steps_of_swin_follow_its_blocks():
    model, _ = _vision("swin")
    steps = model.pipeline_steps()
    # embedding, one step per block (3 blocks: layers 0, 1, 2), then the head on the last stage
    assert [s.layer_idx for s in steps] == [0, 0, 1, 2, -1]


def test_a_model_without_pipeline_steps_is_refused_by_name():
    from libai.engine.pipeline import PipelineRunner

    with pytest.raises(NotImplementedError, match="Sequential has no pipeline_steps"):
        PipelineRunner(flow.nn.Sequential(), get_batch=None)


# ------------------------------------------------------------------ the engine's handoff
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_handoff_between_stages_on_4_ranks(device):
    """On cuda: one GPU per rank (the CuPy double), the shards crossing over its NCCL."""
    env = gpu_env(4, ENGINE_TEST_DEVICE="cuda") if device == "cuda" else None
    _, out, _ = run_mpi(4, "pipeline_handoff.py", env=env)
    assert out.count("pipeline handoff ok") == 4


def test_sends_are_paired_with_the_next_receive_as_megatron_pairs_them():
    """1F1B's steady phase: a forward's sends go with the next backward's receives, a backward's
    with the next forward's (but the last backward's); warm-up, cool-down and GPipe send at once."""
    from libai.engine.pipeline import paired_sends

    # 4 stages, 6 micro-batches: stage 0 warms up with 3 forwards, then 3 (F, B) pairs, then 3 B
    order = schedule("1F1B", 0, 4, 6)
    assert order[:3] == [("F", 0), ("F", 1), ("F", 2)]
    assert {order[i] for i in paired_sends("1F1B", 0, 4, 6)} == {("F", 3), ("B", 0), ("F", 4), ("B", 1), ("F", 5)}
    # the last stage: no warm-up, every backward but the last pairs with the next forward's receive
    order = schedule("1F1B", 3, 4, 3)
    assert [order[i] for i in sorted(paired_sends("1F1B", 3, 4, 3))] == [("F", 0), ("B", 0), ("F", 1), ("B", 1),
                                                                         ("F", 2)]
    assert paired_sends("1F1B", 0, 4, 2) == set()  # two micro-batches on 4 stages: all warm-up and cool-down
    assert paired_sends("GPipe", 1, 4, 8) == set()


def test_a_frozen_tied_weight_gets_no_gradient_eagerly_or_in_graph_mode():
    _, out, _ = run_mpi(2, "pipeline_graph_frozen_tied.py")
    assert out.count("frozen tied pipeline graph ok") == 2


# ------------------------------------------------------------------ recipes under the launcher
BASE = ["train.train_iter=10", "train.log_period=1", "train.train_micro_batch_size=null", "train.global_batch_size=8",
        "train.evaluation.enabled=False", "train.checkpointer.period=0"]
GPT_CONFIG = os.path.join(ROOT, "configs", "gpt2_pretrain.py")
BERT_CONFIG = os.path.join(ROOT, "configs", "bert_pretrain.py")
VIT_CONFIG = os.path.join(ROOT, "configs", "vit_imagenet.py")
SWIN_CONFIG = os.path.join(ROOT, "configs", "swin_imagenet.py")
BERT_TINY = ["model.cfg.hidden_layers=2", "model.cfg.hidden_size=64", "model.cfg.intermediate_size=256",
             "model.cfg.num_attention_heads=4", "model.cfg.max_position_embeddings=32",
             "model.cfg.hidden_dropout_prob=0.0", "model.cfg.attention_probs_dropout_prob=0.0"]
VIT_TINY = ["model.embed_dim=48", "model.depth=2", "model.num_heads=4", "model.drop_path_rate=0.0",
            "model.drop_rate=0.0", "model.attn_drop_rate=0.0"]
SWIN_TINY = ["model.drop_path_rate=0.0", "model.drop_rate=0.0", "model.attn_drop_rate=0.0"]


def layout(dp=1, tp=1, pp=1, vocab=True):
    args = [f"train.dist.data_parallel_size={dp}", f"train.dist.tensor_parallel_size={tp}",
            f"train.dist.pipeline_parallel_size={pp}"]
    return args + ([f"tokenization.make_vocab_size_divisible_by={256 // tp}"] if vocab else [])


def run(tmp_path, name, config, *args, nprocs=1):
    return trained_losses(str(tmp_path / name), *BASE, *args, iters=10, nprocs=nprocs, config=config)


def test_gpt2_pipeline_layouts_match_one_process(tmp_path):
    m4 = [*TINY, "model.cfg.hidden_layers=4", "train.num_accumulation_steps=4"]
    ref = run(tmp_path, "single", GPT_CONFIG, *m4, *layout())
    worst = {}
    for name, (dp, tp, pp), extra in [("pp2", (1, 1, 2), []), ("pp4", (1, 1, 4), []),
                                      ("pp4_gpipe", (1, 1, 4), ["train.dist.pipeline_schedule=GPipe"]),
                                      ("dp2_tp2_pp2", (2, 2, 2), [])]:
        got = run(tmp_path, name, GPT_CONFIG, *m4, *layout(dp, tp, pp), *extra, nprocs=dp * tp * pp)
        worst[name] = max_rel_err(got, ref)
        assert worst[name] < 1e-5, (name, worst[name])
        # the schedule's bubble and every stage's busy time are logged each iteration
        logged = [r for r in records(str(tmp_path / name)) if "pipeline_bubble" in r]
        assert len(logged) == 10 and all(0 < r["pipeline_bubble"] < 1 for r in logged)
        assert all(f"pipeline_stage{s}_busy_time" in logged[-1] for s in range(pp))
    print("GPT-2 pipeline layouts, max relative loss error vs 1 process:", {k: f"{v:.1e}" for k, v in worst.items()})


def test_bert_pipeline_layouts_match_one_process(tmp_path):
    args = [*BERT_TINY, "model.cfg.hidden_layers=4", "train.num_accumulation_steps=4"]
    ref = run(tmp_path, "single", BERT_CONFIG, *args, *layout())
    for name, (dp, tp, pp) in [("pp2", (1, 1, 2)), ("pp4", (1, 1, 4)), ("dp2_tp2_pp2", (2, 2, 2))]:
        got = run(tmp_path, name, BERT_CONFIG, *args, *layout(dp, tp, pp), nprocs=dp * tp * pp)
        assert max_rel_err(got, ref) < 1e-5, (name, max_rel_err(got, ref))


@pytest.mark.parametrize("config,tiny", [(VIT_CONFIG, VIT_TINY), (SWIN_CONFIG, SWIN_TINY)], ids=["vit", "swin"])
def test_vision_pipeline_matches_one_process(tmp_path, config, tiny):
    args = [*tiny, "train.num_accumulation_steps=2"]
    ref = run(tmp_path, "single", config, *args, *layout(vocab=False))
    got = run(tmp_path, "pp2", config, *args, *layout(pp=2, vocab=False), nprocs=2)
    assert max_rel_err(got, ref) < 1e-5, max_rel_err(got, ref)


def test_resume_a_3d_parallel_checkpoint_in_one_process(tmp_path):
    args = [*TINY, "train.num_accumulation_steps=2", "train.checkpointer.period=5"]
    full = run(tmp_path, "full", GPT_CONFIG, *args, *layout())
    out = str(tmp_path / "resumed")
    train_net("--stop-iter", "5", f"train.output_dir={out}", *BASE, *args, *layout(2, 2, 2), nprocs=8,
              config=GPT_CONFIG)
    assert open(os.path.join(out, "last_checkpoint")).read().strip() == "model_0000004"
    opt = flow.load(os.path.join(out, "model_0000004", "optimizer.safetensors"))
    model = flow.load(os.path.join(out, "model_0000004", "model.safetensors"))
    # every parameter's state is in the logical checkpoint, also those of stage 1 (ranks 4-7)
    assert len(opt["state"]) == len(model)
    assert tuple(model["GPT_model.transformer.layers.1.mlp.dense_h_to_4h.weight"].shape) == (256, 64)
    train_net("--resume", f"train.output_dir={out}", *BASE, *args, *layout(), config=GPT_CONFIG)
    got = losses(out)
    assert max_rel_err(got, full) < 1e-5, max_rel_err(got, full)


def test_pipeline_num_layers_is_inferred_or_asked_for(tmp_path):
    from libai.config import LazyConfig
    from libai.engine.default import infer_pipeline_num_layers

    for recipe, key, want in [("gpt2_pretrain.py", "model.cfg.hidden_layers=6", 6),
                              ("vit_imagenet.py", "model.depth=3", 3), ("swin_imagenet.py", "model.depths=[2,4]", 6)]:
        cfg = LazyConfig.load(os.path.join(ROOT, "configs", recipe))
        LazyConfig.apply_overrides(cfg, [key, "train.dist.pipeline_parallel_size=2"])
        infer_pipeline_num_layers(cfg)
        assert cfg.train.dist.pipeline_num_layers == want, recipe
    cfg = LazyConfig.load(os.path.join(ROOT, "configs", "mlp_classifier.py"))
    LazyConfig.apply_overrides(cfg, ["train.dist.pipeline_parallel_size=2"])
    with pytest.raises(ValueError, match="needs train.dist.pipeline_num_layers"):
        infer_pipeline_num_layers(cfg)
