"""The training benchmarks in tools/benchmarks run end to end at a tiny size (subprocesses, one
thread each): they print both libraries' agreeing first-step losses, the timings and the ratio."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "tools", "benchmarks")
TINY = ["--layers", "1", "--hidden", "64", "--heads", "2", "--seq", "16", "--batch", "2", "--steps", "2",
        "--warmup", "1"]


def run_bench(name, *args):
    # ENGINE_JIT=1: the compiled CPU kernels, as a user's benchmark runs them (tests/conftest.py
    # turns them off in the suite's other children), checked against PyTorch end to end here
    env = dict(os.environ, PYTHONPATH=ROOT, ENGINE_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1", ENGINE_JIT="1")
    proc = subprocess.run([sys.executable, os.path.join(BENCH, name), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_bert_train_tiny():
    out = run_bench("bert_train.py", *TINY)
    print(out)
    assert "vocab 8192" in out
    m = re.search(r"first-step loss: torch (\S+)\s+engine (\S+)\s.*\(agree\)", out)
    assert m, out
    loss_t, loss_f = float(m.group(1)), float(m.group(2))
    assert abs(loss_t - loss_f) <= 1e-4 * abs(loss_t)
    assert re.search(r"torch \(HF BertForPreTraining\)\s+:\s+[\d.]+ ms/step\s+\d+ tokens/s", out), out
    assert re.search(r"engine \(BertForPreTraining\)\s+:\s+[\d.]+ ms/step\s+\d+ tokens/s", out), out
    assert re.search(r"ratio engine/torch = \d+\.\d\d", out), out
    assert re.search(r"peak memory engine: VmHWM\s+\d+ MiB", out), out


def test_bert_train_disagreeing_losses_fail_loudly():
    sys.path.insert(0, BENCH)
    try:
        import bert_train
    finally:
        sys.path.remove(BENCH)
    assert bert_train.check_losses(2.0, 2.0001) < 1e-4
    for bad in (2.01, float("nan")):
        with pytest.raises(SystemExit, match="losses disagree"):
            bert_train.check_losses(2.0, bad)


def test_vision_train_tiny():
    out = run_bench("vision_train.py", "--layers", "1", "--hidden", "64", "--heads", "2", "--batch", "2",
                    "--steps", "2", "--warmup", "1")
    print(out)
    m = re.search(r"first-step loss: torch (\S+)\s+engine (\S+)\s.*\(agree\)", out)
    assert m, out
    assert abs(float(m.group(1)) - float(m.group(2))) <= 1e-4 * abs(float(m.group(1)))
    assert re.search(r"engine \(VisionTransformer\)\s*:\s+[\d.]+ ms/step\s+[\d.]+ images/s", out), out
    assert re.search(r"ratio engine/torch = \d+\.\d\d", out), out


def test_vision_train_swin_runs():
    out = run_bench("vision_train.py", "--model", "swin", "--swin-tiny", "--batch", "4", "--steps", "1", "--group", "2",
                    "--warmup", "1")
    m = re.search(r"first-step loss: torch (\S+)\s+engine (\S+)\s.*\(agree\)", out)
    assert m, out
    assert "Swin training step: image 32, patch 2, embed 32, depths (2, 2), heads (2, 4)" in out, out
    assert re.search(r"engine \(SwinTransformer\)\s*:\s+[\d.]+ ms/step\s+[\d.]+ images/s", out), out


def test_pipeline_bubble_benchmark_tiny():
    out = run_bench("pipeline.py", "--micro-batches", "2", "--iters", "3", "--layers", "2", "--hidden", "32",
                    "--seq", "16", "--micro-batch", "2", "--stage-ids", "even")
    print(out)
    row = r"^(1F1B|GPipe)\s+2\s+(\d\.\d+)\s+-?\d\.\d+\s+0\.333\s+\d+\s+\d+\s+\d+\.\d\d\s+\d+ \d+$"
    rows = re.findall(row, out, re.M)
    assert [r[0] for r in rows] == ["1F1B", "GPipe"], out
    assert all(0 < float(r[1]) < 1 for r in rows), out


def test_activation_checkpointing_lowers_the_peak_memory_of_a_gpt2_step():
    """The benchmark's children: equal losses with dropout on (the script fails otherwise) and a
    lower peak resident set with checkpointing (measured 0.70x at this size, 0.49x at the
    benchmark's); the bfloat16 and float16 settings run too."""
    out = run_bench("gpt2_memory.py", "--layers", "4", "--hidden", "128", "--heads", "2", "--seq", "128",
                    "--batch", "8", "--vocab", "1024", "--steps", "2")
    print(out)
    m = re.search(r"checkpointing : peak memory growth\s+[\d.]+ MiB \((\d+\.\d+)x\).*loss vs plain 0\.0e\+00", out)
    assert m, out
    assert float(m.group(1)) < 0.9, out
    for dtype in ("bfloat16", "float16"):  # mixed precision runs; its loss follows float32's
        m = re.search(rf"{dtype}\s*: peak memory.*loss vs plain (\S+)", out)
        assert m and float(m.group(1)) < 1e-2, out


def test_graph_chains_finds_only_single_reader_elementwise_runs():
    """graph_chains.py's chain finder on a traced step: exp(x * 2 + 1) is one chain of three
    elementwise kernels; a value read twice (y below) ends a chain, and a matmul is no link."""
    sys.path.insert(0, BENCH)
    import graph_chains

    import engine as flow

    w = flow.nn.Parameter(flow.ones(4, 4))

    class Step(flow.nn.Graph):
        def build(self, x):
            a = (x * 2 + 1).exp()  # Mul -> Add -> Exp
            y = x - 3
            b = (y * y).sigmoid()  # y read twice by Mul: Sub starts no chain; Mul -> Sigmoid does
            return (a @ w).sum() + b.sum()

    g = Step()
    g(flow.ones(4, 4))
    tape = g.last_tape
    runs = [[tape.entries[i].label for i in run] for run in graph_chains.chains(tape)]
    assert ["Mul", "Add", "Exp"] in runs, runs
    assert ["Mul", "Sigmoid"] in runs, runs
    assert not any(r[0] == "Sub" for r in runs), runs


def test_graph_chains_reports_a_tiny_gpt2():
    out = run_bench("graph_chains.py", "--model", "gpt2", "--tiny", "--steps", "1")
    assert re.search(r"elementwise ops: [\d.]+ ms \([\d.]+% of the step\); in \d+ chains of 2\+", out), out
    assert re.search(r"fusing every chain saves at most [\d.]+ ms", out), out
    assert "Matmul" in out or "Linear" in out, out


def test_hot_ops_table_rows():
    """ops.py, filtered to two rows: each prints both libraries' milliseconds and the ratio
    (the fused bias + dropout + residual row runs LiBai's op against PyTorch's composition)."""
    out = run_bench("ops.py", "bias+dropout", "conv2d")
    print(out)
    for name in (r"bias\+dropout\+residual \[8,256,384\]", r"conv2d \[8,16,16,16\]x\[32,16,3,3\]"):
        assert re.search(name + r"\s+[\d.]+\s+[\d.]+\s+\d+\.\d\d$", out, re.M), out
    assert len(out.strip().splitlines()) == 3, out  # the header and the two rows asked for


def test_interleaved_times_settles_each_group_before_timing():
    """The benchmarks' shared timing loop: alternating groups, `group - 1` timed runs per group
    after untimed ones lasting at least `settle_s` (so the other library's polling threads have
    gone to sleep), exactly the asked count of timed runs per function when it divides evenly."""
    sys.path.insert(0, BENCH)
    try:
        from gpt2_block import interleaved_times
    finally:
        sys.path.remove(BENCH)
    import time

    log = []

    def make(name):
        def fn():
            log.append((name, time.perf_counter()))
            time.sleep(0.001)
        return fn

    times = interleaved_times([make("a"), make("b")], iters=6, group=4, settle_s=0.01)
    assert [len(t) for t in times] == [6, 6]
    assert all(t >= 0.001 for ts in times for t in ts)
    runs = [name for name, _ in log]
    groups = [runs[0]]  # the sequence of libraries, one entry per group
    for prev, cur in zip(runs, runs[1:]):
        if cur != prev:
            groups.append(cur)
    assert groups == ["a", "b", "a", "b"]
    first_group = log[:runs.index("b")]  # untimed runs, then the 3 timed ones
    first_timed = first_group[-3]
    assert len(first_group) >= 5 and first_timed[1] - first_group[0][1] >= 0.01
