"""tools/benchmarks/gpu_gpt2.py without a GPU: `--smoke` runs end to end with the engine on 'cuda'
(the strict CuPy double, in a subprocess where `import cupy` is the double) and PyTorch on the
CPU, printing every figure with finite values; without CUDA and without --smoke it exits with a
message saying it needs a GPU; the MFU arithmetic and the peak table are checked in process."""
import json
import math
import os
import re
import subprocess
import sys

import pytest

import gpu_helper

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BENCH = os.path.join(ROOT, "tools", "benchmarks")
SCRIPT = os.path.join(BENCH, "gpu_gpt2.py")
THREADS = {"ENGINE_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}

sys.path.insert(0, BENCH)
try:
    import gpu_gpt2
finally:
    sys.path.remove(BENCH)


def double_env():
    """The environment of a process whose `import cupy` is the CuPy double (gpu_helper.double_env),
    with this process's environment, one thread and the repository root on the path."""
    env = gpu_helper.double_env()
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], ROOT])
    return dict(os.environ, **THREADS, **env)


def plain_env():
    """No double: `import cupy` is the real wheel (which finds no GPU on CI)."""
    env = {k: v for k, v in os.environ.items() if k != "ENGINE_CUPY_DOUBLE"}
    return dict(env, **THREADS, PYTHONPATH=ROOT)


def run_script(env, *args):
    return subprocess.run([sys.executable, SCRIPT, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def test_smoke_with_flash_attention(tmp_path):
    """--attention flash runs the flash kernels (the record counts their forward calls), here with
    the fused backward; where they cannot run (float32) the benchmark refuses rather than time the
    unfused core under that name."""
    out_json = tmp_path / "gpu.jsonl"
    proc = run_script(double_env(), "--smoke", "--dtype", "fp16", "--attention", "flash", "--peak-tflops", "0.001",
                      "--flash-backward", "fused", "--json", str(out_json))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    record = json.loads(out_json.read_text().splitlines()[-1])
    assert record["attention"] == "flash" and record["flash_forward_calls"] >= 2  # two layers, one step at least
    assert record["flash_backward"] == "fused"
    proc = run_script(double_env(), "--smoke", "--dtype", "fp32", "--attention", "flash", "--peak-tflops", "0.001")
    assert proc.returncode != 0 and "flash-attention kernels did not run" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "cuda-graph"])
def test_smoke_with_dropout(tmp_path, graph):
    """--dropout P trains both models with dropout (flash attention's dropout in the engine), so
    the first-step losses are reported, not compared; with --cuda-graph too (each replay draws new
    numbers: engine/cuda_graphs.py)."""
    out_json = tmp_path / "gpu.jsonl"
    proc = run_script(double_env(), "--smoke", "--dropout", "0.1", "--peak-tflops", "0.001", "--json", str(out_json),
                      *(["--cuda-graph"] if graph else []))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "not compared: dropout 0.1" in proc.stdout, proc.stdout[-2000:]
    record = json.loads(out_json.read_text().splitlines()[-1])
    assert record["dropout"] == 0.1 and record["first_loss_rel_diff"] is None and record["cuda_graph"] == graph
    assert math.isfinite(record["engine"]["ms_per_step"]) and record["engine"]["last_loss"] > 0
    proc = run_script(double_env(), "--smoke", "--dropout", "1.0")
    assert proc.returncode == 2 and "--dropout must be in [0, 1)" in proc.stderr, proc.stderr[-2000:]


def gpt2_params(layers, hidden, vocab, seq):
    """GPT-2's parameter count (tied LM head): per layer qkv + proj + two MLP matmuls with biases and
    two LayerNorms; word and position embeddings; the final LayerNorm."""
    return layers * (12 * hidden * hidden + 13 * hidden) + vocab * hidden + seq * hidden + 2 * hidden


@pytest.mark.parametrize("dtype,graph", [("fp16", False), ("fp32", False), ("fp16", True)],
                         ids=["fp16", "fp32", "fp16-cuda-graph"])
def test_smoke_prints_every_figure_finite(tmp_path, dtype, graph):
    out_json = tmp_path / "gpu.jsonl"
    proc = run_script(double_env(), "--smoke", "--dtype", dtype, "--peak-tflops", "0.001", "--json", str(out_json),
                      *(["--cuda-graph"] if graph else []))
    out = proc.stdout
    print(out)
    assert proc.returncode == 0, out + proc.stderr
    for label in (r"torch \(HF GPT2LMHeadModel\)", r"engine \(GPTForPreTraining\)"):
        assert re.search(label + r":\s+[\d.]+ ms/step\s+\d+ tokens/s\s+MFU [\d.]+%\s+peak memory", out), out
    assert re.search(r"engine \(GPTForPreTraining\).*peak memory \d+ MiB", out), out
    assert re.search(r"ratio engine/torch = \d+\.\d\d \(step time; tokens/s engine/torch \d+\.\d\d\)", out), out
    assert re.search(r"first-step loss: torch \S+\s+engine \S+\s+rel diff \S+ \(agree\)", out), out
    assert ("loss scale after the run: engine 65536" in out) == (dtype == "fp16"), out

    r = json.loads(out.strip().splitlines()[-1])
    assert out_json.read_text().strip() == json.dumps(r)  # --json appends the same record
    assert (r["smoke"], r["dtype"], r["torch_device"], r["device"]) == (True, dtype, "cpu", "CuPy double (numpy)")
    assert r["params"] == gpt2_params(2, 64, r["vocab"], 32)
    assert r["flops_per_token"] == 6 * (r["params"] - 32 * 64) + 12 * 2 * 64 * 32
    for lib in ("engine", "torch"):
        f = r[lib]
        for key in ("ms_per_step", "tokens_per_s", "mfu", "first_loss"):
            assert math.isfinite(f[key]) and f[key] > 0, (lib, key, f[key])
        assert f["tokens_per_s"] == pytest.approx(2 * 32 / (f["ms_per_step"] / 1e3))
        assert f["mfu"] == pytest.approx(f["tokens_per_s"] * r["flops_per_token"] / 1e9)
    assert r["engine"]["peak_memory_bytes"] >= 0  # the double's pool holds nothing: 0
    assert r["torch"]["peak_memory_bytes"] is None  # torch ran on the CPU
    assert r["ratio_step_time_engine_over_torch"] == pytest.approx(
        r["engine"]["ms_per_step"] / r["torch"]["ms_per_step"])
    assert abs(r["engine"]["first_loss"] - r["torch"]["first_loss"]) <= 1e-2 * r["torch"]["first_loss"]
    assert r["cuda_graph"] == graph
    assert sorted(r["engine"]["phases_ms"]) == (["optimizer", "replay"] if graph else
                                                ["backward", "forward", "optimizer"])
    # the replayed steps train: the loss after the timed steps is below the first one
    assert r["engine"]["last_loss"] < r["engine"]["first_loss"]


def test_without_a_gpu_it_says_it_needs_one():
    probe = subprocess.run([sys.executable, "-c", "import engine; print(engine.cuda.is_available())"], cwd=ROOT,
                           env=plain_env(), capture_output=True, text=True, timeout=120)
    if probe.stdout.strip() != "False":
        pytest.skip(f"the engine sees a GPU here ({probe.stdout.strip()} {probe.stderr[-200:]}): the full run "
                    "would start")
    proc = run_script(plain_env())
    assert proc.returncode != 0
    assert "gpu_gpt2.py needs a CUDA GPU" in proc.stderr and "--smoke" in proc.stderr, proc.stderr


def test_peak_table_and_flops_per_token():
    assert gpu_gpt2.peak_tflops_for("NVIDIA H100 80GB HBM3") == 989.0
    assert gpu_gpt2.peak_tflops_for("NVIDIA H100 PCIe") == 756.0
    assert gpu_gpt2.peak_tflops_for("NVIDIA H200") == 989.0
    assert gpu_gpt2.peak_tflops_for("NVIDIA A100-SXM4-80GB") == 312.0
    assert gpu_gpt2.peak_tflops_for("Tesla T4") is None
    assert gpu_gpt2.padded_vocab(smoke=False) == 50304
    # GPT-2 124M with the padded vocab: 124,475,904 parameters, 123,689,472 without the position
    # embeddings (nanoGPT's "123.69M"); 6N + 12 * layers * hidden * seq FLOPs per token
    n = gpt2_params(12, 768, 50304, 1024)
    assert n == 124_475_904
    fpt = gpu_gpt2.flops_per_token(n - 1024 * 768, 12, 768, 1024)
    assert fpt == 6 * 123_689_472 + 12 * 12 * 768 * 1024
    assert gpu_gpt2.mfu(100_000, fpt, 989.0) == pytest.approx(100_000 * fpt / 989e12)
    assert gpu_gpt2.mfu(100_000, fpt, None) is None


def test_disagreeing_first_losses_stop_the_benchmark():
    assert gpu_gpt2.check_losses(10.0, 10.0005, "fp32") < 1e-4
    assert gpu_gpt2.check_losses(10.0, 10.05, "fp16") < 1e-2
    for dtype, bad in (("fp32", 10.01), ("fp16", 10.2), ("fp16", float("nan"))):
        with pytest.raises(SystemExit, match="first-step losses disagree"):
            gpu_gpt2.check_losses(10.0, bad, dtype)


def test_profile_and_attention_tools_run_through_the_double():
    """gpu_profile.py, gpu_attention.py and gpu_matmul.py (the tools that found where the GPU
    step's time goes) run end to end on 'cuda' through the CuPy double and print their tables."""
    prof = subprocess.run([sys.executable, os.path.join(BENCH, "gpu_profile.py"), "--smoke", "--top", "40"], cwd=ROOT,
                          env=double_env(), capture_output=True, text=True, timeout=300)
    assert prof.returncode == 0, prof.stdout + prof.stderr
    assert re.search(r"host issues the step in [\d.]+ ms; the step ends after [\d.]+ ms", prof.stdout), prof.stdout
    assert re.search(r"FlashQKVAttention\.backward\s+[\d.]+ ms\s+2 calls", prof.stdout), prof.stdout  # the default
    att = subprocess.run([sys.executable, os.path.join(BENCH, "gpu_attention.py"), "--batch", "1", "--seq", "8",
                          "--reps", "1"], cwd=ROOT, env=double_env(), capture_output=True, text=True, timeout=300)
    assert att.returncode == 0, att.stdout + att.stderr
    # 12 rows, and 4 of engine.backend.cublas (the double's numpy model of cuBLAS stands in for it)
    assert len(re.findall(r"\s[\d.]+ ms$", att.stdout, re.M)) == 16, att.stdout
    mm = subprocess.run([sys.executable, os.path.join(BENCH, "gpu_matmul.py"), "--tiny"], cwd=ROOT, env=double_env(),
                        capture_output=True, text=True, timeout=300)
    assert mm.returncode == 0, mm.stdout + mm.stderr
    assert len(re.findall(r"float(16|32)\s+[\d.]+\s+n/a$", mm.stdout, re.M)) == 10, mm.stdout


def test_flash_benchmark_runs_through_the_double(tmp_path):
    """gpu_flash.py (the flash kernels against PyTorch's SDPA and the unfused core) runs end to
    end through the double: its comparison with PyTorch passes (the double computes the kernels'
    references) and every version gets a finite time: the forward's other block shape (one m-tile
    per warp at the smoke's head size 32), the fused backward and a baseline module included."""
    out_json = tmp_path / "flash.jsonl"
    proc = subprocess.run([sys.executable, os.path.join(BENCH, "gpu_flash.py"), "--smoke", "--baseline",
                           os.path.join(ROOT, "engine", "kernels", "flash_attention.py"), "--json", str(out_json)],
                          cwd=ROOT, env=double_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    record = json.loads(out_json.read_text().splitlines()[-1])
    assert set(record["ms"]) == {"engine flash", "engine flash, fwd 1 m-tile/warp", "engine flash, fused bwd",
                                 "flash of flash_attention.py",
                                 "engine unfused (cuBLAS + softmax)",
                                 "torch scaled_dot_product_attention (cpu)"}, record["ms"]
    assert all(math.isfinite(t) and t > 0 for v in record["ms"].values() for t in v.values()), record["ms"]
    assert all(e < 1e-2 for v in record["errors_vs_torch"].values() for e in v.values()), record["errors_vs_torch"]
