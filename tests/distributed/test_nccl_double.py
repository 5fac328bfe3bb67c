"""Several GPUs without GPUs: each MPI rank's `import cupy` is the CuPy double with one "GPU" of
its own, and the double's `cupy.cuda.nccl` is NCCL's API over MPI (tests/cupy_double/_nccl.py:
float16 summed in float16, buffers checked against the communicator's device, duplicate devices
refused, unmatched sends hang as on GPUs). So the engine's NCCL transport
(engine/distributed/nccl.py) and every parallel layout on CUDA placements run here:

* every collective of engine.distributed.comm on CUDA arrays gives, bit for bit, what the MPI
  path gives on the same host arrays (2, 3 and 4 ranks; float16 sums accumulate in float32);
* two ranks on one GPU are refused at once with the ranks and the device named (ranks that each
  see only their own GPU, all "cuda:0", are not); GradScaler flags of mixed kinds agree over MPI;
* tools/train_net.py trains GPT-2 on CUDA under dp, tp, pp, their mix on 8 ranks and ZeRO, and
  logs the single-process CPU losses within 1e-5;
* a training step on several GPUs reads the device once per iteration (the logged loss, on the
  last pipeline stage) and never waits for its own work, in float32 and float16 (the GradScaler's
  inf/nan flag agreed by an NCCL max), under dp, tp, pp, dp x tp with ZeRO-3;
* the CUDA-graph trainer captures and replays NCCL collectives under dp and tp (GPT-2, BERT, ViT,
  Swin): the eager losses; MPI inside a capture is refused, metadata agreement allowed.
"""
import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "gpt2"))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "graph"))

from gpt2_helpers import TINY, max_rel_err, trained_losses  # noqa: E402
from mpi_helper import SCRIPTS, gpu_env, run_command, run_mpi  # noqa: E402


@pytest.mark.parametrize("nprocs", [2, 3, 4])
def test_nccl_collectives_match_the_mpi_path(nprocs):
    _, out, _ = run_mpi(nprocs, "nccl_collectives.py", env=gpu_env(nprocs))
    assert f"nccl collectives OK on {nprocs} ranks" in out


def test_flags_of_mixed_kinds_are_agreed_over_mpi():
    _, out, _ = run_mpi(2, "flags_mixed.py", env=gpu_env(2))
    assert out.count("mixed flags OK") == 2, out


def test_two_ranks_on_one_gpu_are_refused_by_name():
    rc, out, err = run_mpi(2, "nccl_collectives.py", env=gpu_env(2, ENGINE_CUDA_DEVICE="0"), check=False)
    assert rc != 0
    assert "NCCL needs one GPU per rank: ranks 0 and 1 of [0, 1] both compute on cuda:0" in err, err[-3000:]
    assert "ENGINE_CUDA_DEVICE=0" in err


def test_ranks_that_each_see_only_their_own_gpu_are_accepted():
    """Per-rank CUDA_VISIBLE_DEVICES (or SLURM's --gpus-per-task=1): every rank computes on
    "cuda:0", distinct GPUs all the same: told apart by their PCI bus ids, as NCCL does."""
    env = gpu_env(2, CUPY_DOUBLE_DEVICES="1", CUPY_DOUBLE_FIRST_BUS="local_rank")
    _, out, _ = run_mpi(2, "nccl_collectives.py", env=env)
    assert "nccl collectives OK on 2 ranks" in out


BASE = ["train.train_iter=3", "train.log_period=1", "train.evaluation.enabled=False", "train.checkpointer.period=0",
        "train.train_micro_batch_size=null", "train.global_batch_size=8", *TINY]


def layout(dp=1, tp=1, pp=1):
    return [f"train.dist.data_parallel_size={dp}", f"train.dist.tensor_parallel_size={tp}",
            f"train.dist.pipeline_parallel_size={pp}", f"tokenization.make_vocab_size_divisible_by={256 // tp}"]


def test_gpt2_layouts_on_gpus_match_one_cpu_process(tmp_path, monkeypatch):
    acc = ["train.num_accumulation_steps=2"]
    ref = trained_losses(str(tmp_path / "cpu"), *BASE, *acc, *layout(), iters=3)
    worst = {}
    for name, (dp, tp, pp), extra in [("dp2", (2, 1, 1), []), ("tp2", (1, 2, 1), []), ("pp2", (1, 1, 2), []),
                                      ("dp2_zero2", (2, 1, 1), ["train.zero_optimization.enabled=True",
                                                                "train.zero_optimization.stage=2"]),
                                      ("dp2_tp2_pp2", (2, 2, 2), [])]:
        n = dp * tp * pp
        report = tmp_path / f"{name}_report"
        report.mkdir()
        for k, v in gpu_env(n, CUPY_DOUBLE_REPORT=str(report)).items():
            monkeypatch.setenv(k, v)
        got = trained_losses(str(tmp_path / name), *BASE, *acc, *layout(dp, tp, pp), *extra,
                             "train.input_placement_device=cuda", iters=3, nprocs=n)
        worst[name] = max_rel_err(got, ref)
        assert worst[name] < 1e-5, (name, worst[name], got, ref)
        ranks = [json.loads(p.read_text()) for p in report.iterdir()]
        ranks = [r for r in ranks if r["rank"] is not None]  # not the launcher
        assert len(ranks) == n and all(r["launches"] > 100 for r in ranks), ranks
        nccl = {k for r in ranks for k in r["by_name"] if k.startswith("nccl.")}
        assert dp * tp == 1 or "nccl.allReduce" in nccl, (name, nccl)  # gradients, row-parallel outputs
        if pp > 1:  # activations and gradients cross stages GPU to GPU
            assert {"nccl.send", "nccl.recv"} <= nccl, (name, nccl)
    print("GPT-2 on double GPUs, max relative loss error vs 1 CPU process:", {k: f"{v:.1e}" for k, v in worst.items()})


@pytest.mark.parametrize("pp,m,kind,extra", [
    (2, 1, "1F1B", []), (3, 4, "1F1B", []), (4, 2, "GPipe", []), (3, 1, "GPipe", []),
    (2, 4, "1F1B", ["train.graph.enabled=True"]), (4, 4, "GPipe", ["train.graph.enabled=True"]),
], ids=["pp2-m1-1f1b", "pp3-m4-1f1b", "pp4-m2-gpipe", "pp3-m1-gpipe", "pp2-m4-1f1b-graph", "pp4-m4-gpipe-graph"])
def test_pipeline_schedules_on_gpus_match_one_cpu_process(tmp_path, monkeypatch, pp, m, kind, extra):
    """Every stage on its own GPU, activations and gradients over NCCL. The double's NCCL
    completes a send only when its receive is posted and runs each rank's GPU work in order on
    the host, so it hangs where GPUs would (sends that cross, each queued behind the other's
    receive: all 1F1B sends launched alone do) and also where only a host running ahead of its
    GPU would not (all sends held for the next receive: GPipe's then are): the pairing of
    libai.engine.pipeline.paired_sends passes both."""
    args = [*BASE, "model.cfg.hidden_layers=4", f"train.num_accumulation_steps={m}",
            f"train.dist.pipeline_schedule={kind}"]
    ref = trained_losses(str(tmp_path / "cpu"), *args, *layout(), iters=3)
    for k, v in gpu_env(pp).items():
        monkeypatch.setenv(k, v)
    got = trained_losses(str(tmp_path / "gpus"), *args, *layout(pp=pp), *extra, "train.input_placement_device=cuda",
                         iters=3, nprocs=pp)
    assert max_rel_err(got, ref) < 1e-5, (got, ref)


def test_pipeline_evaluation_on_gpus_matches_one_cpu_process(tmp_path, monkeypatch):
    """The evaluator's forward-only passes through pp=3 GPU stages (the tied embedding fetched,
    then the activations: between GPUs a pair's transfers are matched in the order they are made,
    and the last stage once received them the other way round, a hang) give one process's
    perplexity."""
    from gpt2_helpers import records

    args = [*BASE, "model.cfg.hidden_layers=4", "train.num_accumulation_steps=2", "train.evaluation.enabled=True",
            "train.evaluation.eval_period=2", "train.evaluation.eval_iter=2"]
    trained_losses(str(tmp_path / "cpu"), *args, *layout(), iters=3)
    for k, v in gpu_env(3).items():
        monkeypatch.setenv(k, v)
    trained_losses(str(tmp_path / "gpus"), *args, *layout(pp=3), "train.dist.pipeline_num_layers=4",
                   "train.input_placement_device=cuda", iters=3, nprocs=3)
    ppl = {name: [r["PPL"] for r in records(str(tmp_path / name)) if "PPL" in r] for name in ("cpu", "gpus")}
    assert len(ppl["cpu"]) == 2 and len(ppl["gpus"]) == 2, ppl
    assert all(abs(g - c) <= 1e-5 * c for g, c in zip(ppl["gpus"], ppl["cpu"])), ppl


FP16 = ["train.amp.enabled=True", "train.amp.dtype=float16"]


@pytest.mark.parametrize("nprocs,args", [
    (2, ["train.dist.data_parallel_size=2", *FP16]),
    (2, ["train.dist.tensor_parallel_size=2"]),
    (2, ["train.dist.pipeline_parallel_size=2", "train.num_accumulation_steps=2", *FP16]),
    (4, ["train.dist.data_parallel_size=2", "train.dist.tensor_parallel_size=2", "train.zero_optimization.enabled=True",
         "train.zero_optimization.stage=3", *FP16]),
], ids=["dp2-fp16", "tp2", "pp2-fp16", "dp2-tp2-zero3-fp16"])
def test_a_step_on_several_gpus_reads_the_device_once(tmp_path, nprocs, args):
    cmd = [sys.executable, "-m", "engine.distributed.launch", "--nproc-per-node", str(nprocs),
           os.path.join(SCRIPTS, "device_reads.py"), str(tmp_path), *args]
    _, out, _ = run_command(cmd, timeout=300, env=gpu_env(nprocs))
    assert out.count("device reads OK") == nprocs, out


def test_mpi_inside_a_cuda_graph_capture_is_refused_but_metadata_checks_are_not():
    _, out, _ = run_mpi(2, "mpi_in_capture.py", env=gpu_env(2))
    assert out.count("mpi in capture OK") == 2, out


# BERT's masked-LM head scores every position under capture, only the masked ones eagerly: the
# same loss summed in another order (as in tests/graph)
GRAPH_TOLERANCE = {"bert_pretrain": 1e-6}


@pytest.mark.parametrize("name,dp,tp,extra", [
    ("gpt2_pretrain", 2, 1, ["train.num_accumulation_steps=2"]),
    ("gpt2_pretrain", 1, 2, FP16),
    ("gpt2_pretrain", 2, 2, FP16),
    ("bert_pretrain", 2, 2, []),
    ("vit_imagenet", 2, 2, []),
    ("swin_imagenet", 2, 2, []),
], ids=["gpt2-dp2-acc2", "gpt2-tp2-fp16", "gpt2-dp2-tp2-fp16", "bert-dp2-tp2", "vit-dp2-tp2", "swin-dp2-tp2"])
def test_cuda_graph_trainer_on_several_gpus_trains_the_eager_losses(tmp_path, monkeypatch, name, dp, tp, extra):
    """train.cuda_graph.enabled=True under data and tensor parallelism: every rank captures its
    forward + backward once, NCCL collectives included (tp's all-reduces and gathers, the loss
    averaged over data-parallel ranks), and replays it at each later iteration with the new batch,
    dropout on (each rank's replays draw what its eager steps draw); 6 iterations (3 eager, 3
    replays) against eager on the same double GPUs, bit for bit. A replay that skipped the
    collectives changes the tp2 losses from the 4th iteration (checked by hand)."""
    from graph_helpers import run

    n = dp * tp
    args = [f"train.dist.data_parallel_size={dp}", f"train.dist.tensor_parallel_size={tp}",
            "train.input_placement_device=cuda", *extra]
    if name in ("gpt2_pretrain", "bert_pretrain"):
        args.append("tokenization.make_vocab_size_divisible_by=128")
    got = {}
    for mode, flag in (("eager", []), ("cuda_graph", ["train.cuda_graph.enabled=True"])):
        report = tmp_path / f"{mode}_report"
        report.mkdir()
        for k, v in gpu_env(n, CUPY_DOUBLE_REPORT=str(report)).items():
            monkeypatch.setenv(k, v)
        got[mode] = run(str(tmp_path / mode), name, *args, *flag, iters=6, nprocs=n)
        ranks = [r for r in (json.loads(p.read_text()) for p in report.iterdir()) if r["rank"] is not None]
        replays = sorted(r["by_name"].get("cudaGraphLaunch", 0) for r in ranks)
        m = 2 if "train.num_accumulation_steps=2" in extra else 1
        assert replays == [3 * m if flag else 0] * n, (mode, replays)  # 3 iterations of m micro-batches
    assert sorted(got["cuda_graph"]) == sorted(got["eager"]) == list(range(6))
    tol = GRAPH_TOLERANCE.get(name, 0.0)
    assert all(abs(got["cuda_graph"][i] - got["eager"][i]) <= tol * abs(got["eager"][i]) for i in range(6)), got


def test_cuda_graph_trainer_refuses_pipeline_parallelism(tmp_path, monkeypatch):
    """A stage's handoffs are scheduled by the host (1F1B's pairing, MPI headers): refused at the
    start, naming the key, on every rank."""
    from gpt2_helpers import train_net
    from graph_helpers import BASE, CONFIGS, NO_DROPOUT, SMALL

    for k, v in gpu_env(2).items():
        monkeypatch.setenv(k, v)
    rc, out, err = train_net(f"train.output_dir={tmp_path}", "train.train_iter=4", *BASE, *SMALL["gpt2_pretrain"],
                             *NO_DROPOUT["gpt2_pretrain"], "train.dist.pipeline_parallel_size=2",
                             "train.input_placement_device=cuda", "train.cuda_graph.enabled=True",
                             config=CONFIGS["gpt2_pretrain"], nprocs=2, check=False)
    assert rc != 0 and "train.cuda_graph.enabled=True with pipeline_parallel_size > 1" in out + err, (out + err)[-3000:]
