"""The engine without its CPU accelerations: with MKL off (numpy's OpenBLAS, numpy's GELU), the
compiled kernels off (numpy's layer_norm), oneDNN off (im2col convolutions) and the buffer pool
off, the parity cases of the ops
they touch still match PyTorch. The default suite runs with all on; this runs those cases again
in a child process with all off."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ops_parity_with_mkl_the_jit_onednn_and_the_buffer_pool_off():
    env = dict(os.environ, ENGINE_MKL="0", ENGINE_JIT="0", ENGINE_ONEDNN="0", ENGINE_BUFFER_POOL_MB="0",
               PYTHONPATH=ROOT)
    code = ("import engine.backend.mkl as m, engine.backend.buffers as b, engine.backend.jit as j, "
            "engine.backend.onednn as d; print(m.available(), b._limit, j.available(), d.available())")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.stdout.split() == ["False", "0", "False", "False"], r.stdout + r.stderr
    selection = "matmul or linear or gelu or attention or bmm or mm or einsum or softmax or layer_norm or conv"
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
                        os.path.join(ROOT, "tests", "ops", "test_parity.py"), "-k", selection],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and " failed" not in r.stdout
