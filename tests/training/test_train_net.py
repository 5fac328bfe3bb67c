"""End to end through `tools/train_net.py` (subprocesses): training, logs, TensorBoard,
checkpoints, exact resume, --eval-only, --fast-dev-run."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "tests", "training", "configs", "mlp_cls.py")
COMMON = ["train.train_iter=20", "train.log_period=1", "train.checkpointer.period=5",
          "train.checkpointer.max_to_keep=2", "train.evaluation.eval_period=10"]


def train_net(*args):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONHASHSEED="0")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "train_net.py"), "--config-file", CONFIG, *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise AssertionError(f"train_net.py {' '.join(args)} failed ({proc.returncode}):\n"
                             f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def records(out):
    with open(os.path.join(out, "metrics.json")) as f:
        return [json.loads(line) for line in f if line.strip()]


def losses_by_iter(out):
    return {r["iteration"]: r["total_loss"] for r in records(out) if "total_loss" in r}


def test_train_then_resume_and_eval_only(tmp_path):
    """One reference run (shared by the checks below; a single test so that parallel test
    workers do not each train it)."""
    out = str(tmp_path / "full")
    proc = train_net(f"train.output_dir={out}", *COMMON)
    full_run = (out, proc)
    check_trains_end_to_end_with_logs_metrics_and_checkpoints(full_run)
    check_tensorboard_events_readable(full_run)
    check_resume_is_bitwise_identical(full_run, tmp_path)
    check_resumed_run_keeps_the_same_best_checkpoint(full_run, tmp_path)
    check_eval_only_reproduces_the_trained_metric(full_run, tmp_path)


def check_trains_end_to_end_with_logs_metrics_and_checkpoints(full_run):
    out, proc = full_run
    # console line per log period with the documented fields
    line = next(ln for ln in proc.stdout.splitlines() if "iteration: 19/20" in ln)
    for field in ("total_loss:", "loss:", "lr:", "time:", "data_time:", "throughput:", "samples/s"):
        assert field in line, line
    assert os.path.isfile(os.path.join(out, "log.txt")) and os.path.isfile(os.path.join(out, "config.yaml"))

    recs = records(out)
    train_recs = [r for r in recs if "total_loss" in r]
    assert [r["iteration"] for r in train_recs] == list(range(20))
    for r in train_recs:
        for key in ("iteration", "total_loss", "loss", "lr", "time", "data_time"):
            assert key in r, (key, r)
    assert train_recs[-1]["total_loss"] < train_recs[0]["total_loss"]
    # evaluation at iteration 9 (eval_period 10) and after training (iteration 20)
    evals = {r["iteration"]: r for r in recs if "Acc@1" in r}
    assert sorted(evals) == [9, 20]
    assert 0 <= evals[20]["Acc@1"] <= 100 and evals[20]["Acc@2"] >= evals[20]["Acc@1"]

    # checkpoints: periodic ones bounded by max_to_keep=2, final, best, pointer
    names = sorted(d for d in os.listdir(out) if d.startswith("model_"))
    assert names == ["model_0000014", "model_0000019", "model_best", "model_final"]
    assert open(os.path.join(out, "last_checkpoint")).read().strip() == "model_final"
    assert [d for d in os.listdir(out) if d.startswith(".")] == [".lock"]  # no temp directories left
    files = sorted(os.listdir(os.path.join(out, "model_0000019")))
    assert files == ["config.yaml", "lr_scheduler.safetensors", "model.safetensors", "optimizer.safetensors",
                     "rng_state_rank0.safetensors", "train_loader.safetensors", "trainer_state.safetensors"]


def check_tensorboard_events_readable(full_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, _ = full_run
    acc = EventAccumulator(out)
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"total_loss", "loss", "lr", "time", "Acc@1"} <= tags, tags
    loss = acc.Scalars("total_loss")
    assert [e.step for e in loss] == list(range(20))
    by_iter = losses_by_iter(out)
    assert all(abs(e.value - by_iter[e.step]) < 1e-6 for e in loss)  # float32 in the event file
    assert [e.step for e in acc.Scalars("Acc@1")] == [9, 20]


def check_resume_is_bitwise_identical(full_run, tmp_path):
    ref_out, _ = full_run
    out = str(tmp_path / "resumed")
    train_net("--stop-iter", "10", f"train.output_dir={out}", *COMMON)
    first = losses_by_iter(out)
    assert sorted(first) == list(range(10))
    assert open(os.path.join(out, "last_checkpoint")).read().strip() == "model_0000009"
    train_net("--resume", f"train.output_dir={out}", *COMMON)
    ref = losses_by_iter(ref_out)
    resumed = [r for r in records(out) if "total_loss" in r]
    assert [r["iteration"] for r in resumed] == list(range(20))  # 0-9, then 10-19 after the resume
    for r in resumed:
        assert r["total_loss"] == ref[r["iteration"]], r["iteration"]  # bitwise (same float)
    ref_lr = {r["iteration"]: r["lr"] for r in records(ref_out) if "lr" in r}
    assert all(r["lr"] == ref_lr[r["iteration"]] for r in resumed)
    ref_final = [r for r in records(ref_out) if r["iteration"] == 20][-1]
    final = [r for r in records(out) if r["iteration"] == 20][-1]
    assert final["Acc@1"] == ref_final["Acc@1"]


def check_resumed_run_keeps_the_same_best_checkpoint(full_run, tmp_path):
    """The resumed BestCheckpointer starts from the best of iteration 9 (its state in the
    checkpoint), so model_best ends as in the uninterrupted run."""
    import engine as flow

    ref_out, _ = full_run
    out = str(tmp_path / "resumed")  # written by check_resume_is_bitwise_identical

    def best(d):
        state = flow.load(os.path.join(d, "model_best", "trainer_state.safetensors"))
        return state["iteration"], state["best_metric"], state["hooks"]["BestCheckpointer"]

    assert best(out) == best(ref_out)


def check_eval_only_reproduces_the_trained_metric(full_run, tmp_path):
    out, _ = full_run
    trained = [r for r in records(out) if r["iteration"] == 20 and "Acc@1" in r][-1]
    ev_out = str(tmp_path / "eval")
    proc = train_net("--eval-only", f"train.output_dir={ev_out}", f"train.load_weight={out}/model_final")
    rec = records(ev_out)[-1]
    assert rec["Acc@1"] == trained["Acc@1"] and rec["Acc@2"] == trained["Acc@2"]
    assert rec["iteration"] == 19  # the checkpoint's iteration
    assert "copypaste: Acc@1,Acc@2" in proc.stdout
    # into the training run's own directory: its metrics.json keeps one record per iteration, in
    # order; the evaluation goes to eval_only.json
    before = open(os.path.join(out, "metrics.json")).read()
    train_net("--eval-only", f"train.output_dir={out}", f"train.load_weight={out}/model_final")
    assert open(os.path.join(out, "metrics.json")).read() == before
    with open(os.path.join(out, "eval_only.json")) as f:
        rec = json.loads(f.readlines()[-1])
    assert rec["iteration"] == 19 and rec["Acc@1"] == trained["Acc@1"]


def test_fast_dev_run(tmp_path):
    """Into output_dir/fast_dev_run, replacing the previous fast-dev-run there; the recipe's
    own output_dir (here holding a real run's metrics) is not touched."""
    out = str(tmp_path / "fast")
    os.makedirs(out)
    with open(os.path.join(out, "metrics.json"), "w") as f:
        f.write('{"iteration": 0, "total_loss": 1.0}\n')
    for _ in range(2):
        proc = train_net("--fast-dev-run", f"train.output_dir={out}", "train.train_iter=1000")
        recs = records(os.path.join(out, "fast_dev_run"))
        assert max(r["iteration"] for r in recs if "total_loss" in r) == 19  # 20 iterations, log every one
        assert len([r for r in recs if "total_loss" in r]) == 20
        assert any("Acc@1" in r for r in recs)
        assert not [d for d in os.listdir(out) if d.startswith("model_")]  # no checkpoints kept
        assert "--fast-dev-run" in proc.stdout
    assert records(out) == [{"iteration": 0, "total_loss": 1.0}]


def test_bad_keys_values_and_paths_stop_before_training_naming_the_culprit(tmp_path):
    out = str(tmp_path / "typo")
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for args, error in (
            (["+train.eval_perod=5"], "'train.eval_perod' does not exist; did you mean"),
            (["train.nccl_fusion_max_ops=8"], "NotImplementedError: train.nccl_fusion_max_ops=8"),
            (["train.amp.dtype=float32"], "train.amp.dtype must be 'float16', 'bfloat16' or None, got 'float32'"),
            (["train.start_iter=5"], "NotImplementedError: train.start_iter=5"),
            (["train.train_iter=abc"], "train.train_iter must be an integer >= 0, got 'abc'"),
            (["train.test_micro_batch_size=0"], "train.test_micro_batch_size must be an integer >= 1, got 0"),
            ([f"train.output_dir={afile}"], f"train.output_dir='{afile}' is a file, not a directory"),
            (["--config-file", ""], "--config-file is required"),
            (["--config-file", str(tmp_path)], "is a directory, not a config file"),
            # a prefix is not a flag: `--o` read as --overwrite-output-dir would delete a run
            (["--o"], "unrecognized arguments: --o"),
            (["--stop-iter", "-2"], "expected a positive iteration count, got -2"),
            (["--eval-only", "--resume"], f"train.output_dir='{out}' holds no checkpoint to evaluate"),
            (["--eval-only", "~dataloader.test"], "--eval-only: nothing to evaluate"),
    ):
        proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "train_net.py"), "--config-file", CONFIG,
                               f"train.output_dir={out}", *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode != 0 and error in proc.stderr, (args, proc.stderr[-2000:])
        assert not os.path.exists(os.path.join(out, "metrics.json"))


def test_no_fixed_seed_draws_one_records_it_and_resumes_with_it(tmp_path):
    """train.seed=-1 (LiBai's "no fixed seed"; None too): a seed is drawn, written into
    config.yaml, and a resume takes it back (its samplers' saved state must match)."""
    import yaml

    out = str(tmp_path / "run")
    proc = train_net(f"train.output_dir={out}", *COMMON, "train.seed=-1", "--stop-iter", "10")
    with open(os.path.join(out, "config.yaml")) as f:
        seed = yaml.safe_load(f)["train"]["seed"]
    assert isinstance(seed, int) and seed >= 0 and f"this run's is {seed}" in proc.stdout
    proc = train_net(f"train.output_dir={out}", *COMMON, "train.seed=null", "--resume")
    assert f"this run's is {seed}" in proc.stdout and "continuing at iteration 10" in proc.stdout
    assert max(losses_by_iter(out)) == 19
