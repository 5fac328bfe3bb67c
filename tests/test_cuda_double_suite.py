"""CI's run of the device-aware tests on "cuda" through the strict CuPy double: the op parity
harness (every op forward and backward against PyTorch), the optimizers, gradient clipping and
the ops' error paths, with ENGINE_TEST_DEVICE=cuda in a process where `import cupy` is the double
(the whole suite runs that way with `ENGINE_CUPY_DOUBLE=1 ENGINE_TEST_DEVICE=cuda pytest tests`)."""
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEVICE_AWARE = ["ops/test_parity.py", "test_optim.py", "test_clip_grad.py", "test_nn_ops_errors.py",
                "test_fused_kernels_gpu.py", "test_indexing_errors.py", "test_torch_compat_ops.py",
                "test_distributions.py",
                # the RNNs' CUDA path is their ops': the packed parity (RNN/LSTM/GRU, 1-2 layers, both
                # directions, batch first or not, float32/64) and the cells cover it (54 of 258 tests, 10 s)
                "test_nn_rnn.py::test_packed_sequence_layer_parity",
                "test_nn_rnn.py::test_cell_unrolled_over_time_and_empty_batch",
                "test_nn_rnn.py::test_single_step_and_empty_batch"]


def test_device_aware_tests_pass_on_cuda_through_the_double(tmp_path):
    report = tmp_path / "launches"
    env = dict(os.environ, ENGINE_CUPY_DOUBLE="1", ENGINE_TEST_DEVICE="cuda", CUPY_DOUBLE_REPORT=str(report),
               OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
           *[os.path.join(HERE, t) for t in DEVICE_AWARE]]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=os.path.dirname(HERE))
    tail = proc.stdout[-3000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    passed = int(re.search(r"(\d+) passed", proc.stdout).group(1))
    launches = int(report.read_text())
    print(f"device-aware tests on cuda through the double: {passed} passed, {launches} kernel launches")
    assert passed > 1500 and launches > 10 * passed, tail  # the tests really computed on "cuda"
