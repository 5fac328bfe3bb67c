"""The attention core of GPT-2 124M on a GPU (batch 8, 12 heads, seq 1024, head 64): the engine's
PackedQKVAttention forward + backward with float16 inputs computed in float16 or upcast to
float32 (engine.ops.attention.HALF_ATTENTION_ON_GPU), and the batched products underneath on
strided head views or contiguous copies: CuPy's matmul and engine.backend.cublas (cuBLAS on the
views in place; its tensor-op and default algorithms).

    python tools/benchmarks/gpu_attention.py [--batch 8] [--seq 1024]
    ENGINE_CUPY_DOUBLE=1 PYTHONPATH=tests/cupy_double/shim:tests \\
        python tools/benchmarks/gpu_attention.py --batch 1 --seq 16 --reps 1   # CPU check
Medians of --reps synchronised runs after one warm-up, in ms.
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def timed(fn, sync, reps):
    fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--head-size", type=int, default=64)
    p.add_argument("--reps", type=int, default=10)
    a = p.parse_args()
    import engine as flow
    from engine import backend
    from engine.backend import cublas
    from engine.ops import attention as A

    cp = backend.cupy()
    sync = flow.cuda.synchronize
    b, s, h, d = a.batch, a.seq, a.heads, a.head_size
    rng = np.random.default_rng(0)
    x = rng.standard_normal((b, s, 3 * h * d)).astype(np.float16)
    g = rng.standard_normal((b, s, h * d)).astype(np.float16)
    mask = np.triu(np.ones((s, s), bool), 1)[None, None]
    rows = []

    saved, saved_algo = A.HALF_ATTENTION_ON_GPU, cublas.HALF_ALGO
    for label, half in (("attention op fwd+bwd, float16 computed in float16", True),
                        ("attention op fwd+bwd, float16 upcast to float32", False)):
        A.HALF_ATTENTION_ON_GPU = half
        qkv = flow.tensor(x, device="cuda", requires_grad=True)
        m, go = flow.tensor(mask, device="cuda"), flow.tensor(g, device="cuda")

        def fwd():
            return A.PackedQKVAttention.apply(qkv, m, None, heads=h, scale=d ** -0.5, fill=-10000.0,
                                              dropout_p=0.0, generator=flow.default_generator)[0]

        def step():
            qkv.grad = None
            fwd().backward(go)

        rows.append((label.replace("fwd+bwd", "fwd"), timed(fwd, sync, a.reps)))
        rows.append((label, timed(step, sync, a.reps)))
    A.HALF_ATTENTION_ON_GPU = saved

    for dt in (np.float16, np.float32):
        q4 = cp.asarray(x.astype(dt)).reshape(b, s, h, 3 * d)
        q, k = q4[..., :d].transpose(0, 2, 1, 3), q4[..., d:2 * d].transpose(0, 2, 1, 3)
        out = cp.empty((b, h, s, s), dt)
        qc, kc = cp.ascontiguousarray(q), cp.ascontiguousarray(k)
        name = np.dtype(dt).name
        rows.append((f"q k^T {name}, strided head views, out=", timed(lambda: cp.matmul(q, k.transpose(0, 1, 3, 2),
                                                                                       out=out), sync, a.reps)))
        rows.append((f"q k^T {name}, contiguous q and k, out=", timed(lambda: cp.matmul(qc, kc.transpose(0, 1, 3, 2),
                                                                                       out=out), sync, a.reps)))
        rows.append((f"q k^T {name}, contiguous, new output", timed(lambda: cp.matmul(qc, kc.transpose(0, 1, 3, 2)),
                                                                     sync, a.reps)))
        rows.append((f"copy q and k contiguous {name}", timed(lambda: (cp.ascontiguousarray(q),
                                                                       cp.ascontiguousarray(k)), sync, a.reps)))
        if dt == np.float16 and cublas.available():
            for algo_name, algo in (("tensor-op", cublas.GEMM_DEFAULT_TENSOR_OP), ("default", cublas.GEMM_DEFAULT)):
                cublas.HALF_ALGO = algo
                rows.append((f"q k^T {name}, engine.backend.cublas, head views, {algo_name} algo",
                             timed(lambda: cublas.gemm_batched(q, k.transpose(0, 1, 3, 2), out), sync, a.reps)))
                rows.append((f"q k^T {name}, engine.backend.cublas, contiguous, {algo_name} algo",
                             timed(lambda: cublas.gemm_batched(qc, kc.transpose(0, 1, 3, 2), out), sync, a.reps)))
            cublas.HALF_ALGO = saved_algo
    flops = 2 * b * h * s * s * d
    print(f"attention core on {flow.cuda.get_device_name()}: batch {b}, heads {h}, seq {s}, head {d} "
          f"(one q k^T: {flops / 1e9:.1f} GFLOP); engine.backend.cublas: "
          f"{'in use' if cublas.available() else cublas.why_unavailable()}")
    for label, ms in rows:
        tf = f"{flops / ms / 1e9:.1f} TFLOP/s" if label.startswith("q k^T") else ""
        print(f"  {label:66s} {tf:>15s} {ms:8.3f} ms")


if __name__ == "__main__":
    main()
