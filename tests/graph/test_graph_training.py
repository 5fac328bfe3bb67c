"""train.graph.enabled=True against eager, through tools/train_net.py: GPT-2, BERT, ViT and Swin
for 20 iterations in one process (dropout and stochastic depth on and off, 2 micro-batches) and
10 under dp=2 x tp=2 with the launcher; a checkpoint taken in one mode resumes in the other."""
import os

import pytest

from graph_helpers import BASE, CONFIGS, NO_DROPOUT, SMALL, records, run, train_net
from gpu_helper import double_env, real_cupy

ACC = ["train.num_accumulation_steps=2"]
GRAPH = ["train.graph.enabled=True"]
DP2_TP2 = ["train.dist.data_parallel_size=2", "train.dist.tensor_parallel_size=2"]
# BERT's masked-LM head scores only the masked positions eagerly and every position in graph
# mode (its shapes cannot depend on the mask): the same loss, summed in another order
TOLERANCE = {"bert_pretrain": 1e-6}


def rel_err(a, b):
    return max(abs(a[i] - b[i]) / abs(b[i]) for i in b)


def check(got, want, name):
    assert sorted(got) == sorted(want)
    if name in TOLERANCE:
        assert rel_err(got, want) <= TOLERANCE[name], (name, rel_err(got, want))
    else:
        assert got == want, name  # bit for bit


@pytest.mark.parametrize("dropout", [True, False], ids=["dropout", "no-dropout"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_graph_mode_trains_the_eager_losses(tmp_path, name, dropout):
    extra = ACC + ([] if dropout else NO_DROPOUT[name])
    eager = run(str(tmp_path / "eager"), name, *extra)
    graph = run(str(tmp_path / "graph"), name, *extra, *GRAPH)
    check(graph, eager, name)
    print(f"{name} ({'dropout' if dropout else 'no dropout'}): graph vs eager max relative loss error "
          f"{rel_err(graph, eager):.1e} over 20 iterations")


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_graph_mode_on_cuda_through_the_double_trains_the_eager_losses(tmp_path, monkeypatch, name):
    """nn.Graph on CUDA placements: traced and replayed through the CuPy double (numpy under
    CuPy's rules), dropout on, against the same recipe eager on CUDA (not yet run on a real GPU).
    GPT-2 also in float16 with loss scaling (the scale a device tensor read at every replay) and
    with activation checkpointing (the device generator's offsets saved and swapped at replay)."""
    for k, v in double_env().items():
        monkeypatch.setenv(k, v)
    extra = ["train.input_placement_device=cuda"]
    runs = [extra] + ([extra + ["train.amp.enabled=True", "train.amp.dtype=float16"],
                       extra + ["train.activation_checkpoint.enabled=True"]] if name == "gpt2_pretrain" else [])
    for i, args in enumerate(runs):
        eager = run(str(tmp_path / f"eager{i}"), name, *args, iters=5)
        graph = run(str(tmp_path / f"graph{i}"), name, *args, *GRAPH, iters=5)
        check(graph, eager, name)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_cuda_graph_trainer_through_the_double_trains_the_eager_losses(tmp_path, monkeypatch, name):
    """train.cuda_graph.enabled=True (CUDAGraphTrainer): 3 eager iterations, then each forward +
    backward replayed from one capture with the new batch copied in, through the CuPy double
    (whose graphs replay the captured work on the same memory), dropout and stochastic depth on
    (each replay draws the numbers the eager step draws): the eager losses, bit for bit (BERT
    within 1e-6: it scores every position under capture, as in graph mode), also with 2
    micro-batches per iteration (a second capture adds to the first one's gradients). GPT-2 also
    in float16 with loss scaling, with 4 micro-batches, and with activation checkpointing (whose
    recomputation redraws its forward's dropout: the stream's place in the graph is part of the
    saved RNG state)."""
    for k, v in double_env().items():
        monkeypatch.setenv(k, v)
    extra = ["train.input_placement_device=cuda"]
    fp16 = ["train.amp.enabled=True", "train.amp.dtype=float16"]
    runs = [extra, extra + ACC] + ([extra + fp16, extra + fp16 + ["train.activation_checkpoint.enabled=True"],
                                    extra + fp16 + ["train.num_accumulation_steps=4"]]
                                   if name == "gpt2_pretrain" else [])
    for i, args in enumerate(runs):
        eager = run(str(tmp_path / f"eager{i}"), name, *args, iters=6)
        graph = run(str(tmp_path / f"graph{i}"), name, *args, "train.cuda_graph.enabled=True", iters=6)
        check(graph, eager, name)


@pytest.mark.skipif(real_cupy() is None, reason="needs CuPy with a CUDA GPU (the two tests above run the same "
                                                 "recipes through the CuPy double)")
@pytest.mark.parametrize("mode", ["graph", "cuda_graph"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_graph_modes_on_a_real_gpu_train_the_eager_losses(tmp_path, name, mode):
    """The two tests above on a real GPU: nn.Graph and the CUDA-graph trainer, dropout on,
    against eager on the same GPU, GPT-2 in float16 with loss scaling too. Eager is not
    bit-reproducible on a GPU (cuBLAS's and the kernels' atomics: two eager runs differed by up
    to 9e-6 over 20 steps on an H100), so the losses agree within 5e-5 relative."""
    extra = ["train.input_placement_device=cuda"]
    flag = GRAPH if mode == "graph" else ["train.cuda_graph.enabled=True"]
    runs = [extra] + ([extra + ["train.amp.enabled=True", "train.amp.dtype=float16"]] if name == "gpt2_pretrain"
                      else [])
    for i, args in enumerate(runs):
        eager = run(str(tmp_path / f"eager{i}"), name, *args, iters=6)
        replayed = run(str(tmp_path / f"{mode}{i}"), name, *args, *flag, iters=6)
        assert sorted(replayed) == sorted(eager)
        assert rel_err(replayed, eager) <= 5e-5, (name, mode, args, replayed, eager)


@pytest.mark.parametrize("extra,message", [
    (["train.input_placement_device=cpu"], "input_placement_device=cpu"),
    (GRAPH, "graph mode"),
    (["train.zero_optimization.enabled=True"], "train.zero_optimization.enabled=True"),
], ids=["cpu", "with-nn-graph", "zero"])
def test_cuda_graph_trainer_refuses_what_it_cannot_hold(tmp_path, monkeypatch, extra, message):
    for k, v in double_env().items():
        monkeypatch.setenv(k, v)
    device = [] if any(a.startswith("train.input_placement_device") for a in extra) else \
        ["train.input_placement_device=cuda"]
    rc, out, err = train_net(f"train.output_dir={tmp_path}", "train.train_iter=5", *BASE, *SMALL["gpt2_pretrain"],
                             *device, *extra, "train.cuda_graph.enabled=True", "train.cuda_graph.warmup_iters=1",
                             config=CONFIGS["gpt2_pretrain"], check=False)
    assert rc != 0 and message in out + err, (out + err)[-3000:]


def vocab(name):
    return ["tokenization.make_vocab_size_divisible_by=128"] if name in ("gpt2_pretrain", "bert_pretrain") else []


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_graph_mode_under_dp2_tp2_trains_the_eager_losses(tmp_path, name):
    """10 iterations on 4 ranks (the trace, then 9 replays of each micro-batch's step): the
    one-process tests above run 20."""
    extra = ACC + DP2_TP2 + vocab(name)
    eager = run(str(tmp_path / "eager"), name, *extra, iters=10, nprocs=4)
    graph = run(str(tmp_path / "graph"), name, *extra, *GRAPH, iters=10, nprocs=4)
    check(graph, eager, name)


@pytest.mark.parametrize("first,then", [(GRAPH, []), ([], GRAPH)], ids=["graph-then-eager", "eager-then-graph"])
def test_a_checkpoint_resumes_across_modes(tmp_path, first, then):
    """20 iterations with a checkpoint at 10, stopped there and resumed in the other mode: the
    losses after the resume are those of the uninterrupted run (dropout on: the RNG states
    travel in the checkpoint)."""
    name = "gpt2_pretrain"
    common = ["train.train_iter=20", "train.log_period=1", "train.train_micro_batch_size=null",
              "train.global_batch_size=8", "train.evaluation.enabled=False", "train.checkpointer.period=10",
              *SMALL[name]]
    full = run(str(tmp_path / "full"), name, *first, "train.checkpointer.period=10")
    out = str(tmp_path / "split")
    train_net(f"train.output_dir={out}", "--stop-iter", "10", *common, *first, config=CONFIGS[name])
    assert os.path.isdir(os.path.join(out, "model_0000009"))
    train_net(f"train.output_dir={out}", "--resume", *common, *then, config=CONFIGS[name])
    resumed = {r["iteration"]: r["total_loss"] for r in records(out) if "total_loss" in r}
    assert {i: resumed[i] for i in range(10, 20)} == {i: full[i] for i in range(10, 20)}


PP = ["train.dist.pipeline_parallel_size=2", "train.num_accumulation_steps=4"]


@pytest.mark.parametrize("extra", [
    [],
    ["train.dist.pipeline_schedule=GPipe", "train.amp.enabled=True", "train.amp.dtype=float16",
     "train.activation_checkpoint.enabled=True"],
], ids=["1F1B", "GPipe-float16-checkpointing"])
def test_graph_mode_under_pipeline_parallelism_trains_the_eager_losses(tmp_path, extra):
    """pp=2 on 2 ranks, GPT-2 (its word embedding tied to the head on the other stage), 4
    micro-batches, dropout on: each stage's schedule is one graph whose handoffs (activations,
    their gradients, the tied weight and its gradient) are replayed; the losses are eager's, bit
    for bit. Also GPipe's order with float16 loss scaling and activation checkpointing."""
    name = "gpt2_pretrain"
    args = PP + extra + vocab(name)
    eager = run(str(tmp_path / "eager"), name, *args, iters=8, nprocs=2)
    graph = run(str(tmp_path / "graph"), name, *args, *GRAPH, iters=8, nprocs=2)
    check(graph, eager, name)
    # the bubble is logged in graph mode too (busy: wall time less the time blocked on the peer),
    # except for the first iteration, whose time is mostly the capture
    rows = records(str(tmp_path / "graph"))
    logged = [r for r in rows if "pipeline_bubble" in r]
    assert "pipeline_bubble" not in rows[0] and "pipeline_bubble" in rows[1], rows[:2]
    assert len(logged) == 7 and all(0 < r["pipeline_bubble"] < 1 for r in logged)
    assert all(0 < r[f"pipeline_stage{s}_busy_time"] <= r["pipeline_time"] for r in logged for s in (0, 1))


def test_pipeline_on_cuda_through_the_double_eagerly_and_in_graph_mode(tmp_path, monkeypatch):
    """pp=2 on CUDA placements (the CuPy double, one GPU per rank): the activations and gradients
    cross from GPU to GPU over NCCL (the double's, over MPI) and live on the stage's device;
    eager pp=2 matches one process, and graph mode (whose replays send and receive again)
    matches eager bit for bit."""
    for k, v in double_env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("CUPY_DOUBLE_DEVICES", "2")
    name = "gpt2_pretrain"
    args = ["train.input_placement_device=cuda", "train.num_accumulation_steps=4"] + vocab(name) + NO_DROPOUT[name]
    single = run(str(tmp_path / "single"), name, *args, iters=4)
    eager = run(str(tmp_path / "eager"), name, *args, PP[0], iters=4, nprocs=2)
    graph = run(str(tmp_path / "graph"), name, *args, PP[0], *GRAPH, iters=4, nprocs=2)
    assert max(abs(eager[i] - single[i]) / abs(single[i]) for i in single) < 1e-5
    check(graph, eager, name)


def test_graph_mode_under_dp2_pp2_with_zero3_trains_the_eager_losses(tmp_path):
    """4 ranks, BERT (tied word embedding) with ZeRO stage 3: the parameters' all-gathers inside
    the replayed schedules, and the reduction into the shards after them, are eager's."""
    name = "bert_pretrain"
    extra = PP + ["train.dist.data_parallel_size=2", "train.zero_optimization.enabled=True",
                  "train.zero_optimization.stage=3"] + vocab(name)
    eager = run(str(tmp_path / "eager"), name, *extra, iters=6, nprocs=4)
    graph = run(str(tmp_path / "graph"), name, *extra, *GRAPH, iters=6, nprocs=4)
    check(graph, eager, name)


def test_graph_mode_under_bfloat16_autocast_trains_the_eager_losses(tmp_path):
    amp = ["train.amp.enabled=True", "train.amp.dtype=bfloat16"]
    eager = run(str(tmp_path / "eager"), "gpt2_pretrain", *amp, iters=8)
    graph = run(str(tmp_path / "graph"), "gpt2_pretrain", *amp, *GRAPH, iters=8)
    assert graph == eager


def test_graph_mode_under_float16_loss_scaling_trains_the_eager_losses(tmp_path):
    """float16 autocast with dynamic loss scaling: the graph scales each micro-batch's backward
    by the scaler's current scale (read at every replay), the trainer's eager update unscales,
    skips inf/nan steps and adjusts the scale. Losses and the logged scales equal eager's."""
    amp = ["train.amp.enabled=True", "train.amp.dtype=float16", *ACC]
    runs = {}
    for mode, extra in (("eager", []), ("graph", GRAPH)):
        out = str(tmp_path / mode)
        run(out, "gpt2_pretrain", *amp, *extra, iters=6)
        runs[mode] = [(r["iteration"], r["total_loss"], r["loss_scale"]) for r in records(out) if "total_loss" in r]
    assert runs["graph"] == runs["eager"] and len(runs["eager"]) == 6


def test_graph_mode_with_activation_checkpointing_trains_the_eager_losses(tmp_path):
    """Every TransformerLayer recomputed in backward, dropout on, 2 micro-batches: each replay
    swaps in the random state its own forward had, so the recomputed masks are the forward's."""
    extra = ["train.activation_checkpoint.enabled=True", *ACC]
    eager = run(str(tmp_path / "eager"), "gpt2_pretrain", *extra, iters=6)
    graph = run(str(tmp_path / "graph"), "gpt2_pretrain", *extra, *GRAPH, iters=6)
    assert graph == eager  # (that checkpointing changes no number: tests/training)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_graph_mode_with_zero_trains_the_eager_losses(tmp_path, stage):
    """ZeRO over dp=2 (dropout on, 2 micro-batches): the graph's backward leaves the gradients
    (partial sums under stages 2 and 3, whose sync is deferred; stage 3's parameters gathered by
    recorded boxing from shards read at every replay), the eager update reduces them into the
    shards, steps and gathers."""
    extra = ["train.zero_optimization.enabled=True", f"train.zero_optimization.stage={stage}",
             "train.dist.data_parallel_size=2", *ACC]
    eager = run(str(tmp_path / "eager"), "gpt2_pretrain", *extra, iters=4, nprocs=2)
    graph = run(str(tmp_path / "graph"), "gpt2_pretrain", *extra, *GRAPH, iters=4, nprocs=2)
    assert graph == eager


def test_activation_checkpointing_under_bfloat16_autocast_eagerly_and_in_graph_mode(tmp_path):
    """The recomputation runs under the forward's autocast (it used to run in float32 and fail
    the checkpoint's dtype check): checkpointed, graph-mode and plain runs log the same losses."""
    amp = ["train.amp.enabled=True", "train.amp.dtype=bfloat16"]
    ckpt = ["train.activation_checkpoint.enabled=True"]
    plain = run(str(tmp_path / "plain"), "gpt2_pretrain", *amp, iters=6)
    eager = run(str(tmp_path / "eager"), "gpt2_pretrain", *amp, *ckpt, iters=6)
    graph = run(str(tmp_path / "graph"), "gpt2_pretrain", *amp, *ckpt, *GRAPH, iters=6)
    assert eager == plain and graph == plain
