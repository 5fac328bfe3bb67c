"""Tensor-parallel MLP step against the single-process engine step of the same MLP.

    python -m engine.distributed.launch --nproc-per-node 2 tools/benchmarks/tp_mlp.py [--steps 10]
    python tools/benchmarks/tp_mlp.py              # the single-process step alone

MLP 768 -> 3072 -> 768 (tanh-GELU), batch 8 x 256 tokens, mean-squared-error loss, forward +
backward + SGD step. Tensor parallel (Megatron): W1/b1 split on the output features
(column-parallel), W2 split on the input features (row-parallel, partial result), b2 and the
activations broadcast over a 1-D placement of all ranks; one all-reduce of the [8, 256, 768]
output per step (the loss needs the whole output) and the usual partial-gradient boxing.

Under the launcher, after the tensor-parallel timing rank 0 times the single-process step in a
child process with the whole machine (the engine's default threads) and with one thread (the
share of one rank), while the other ranks wait without spinning. Times are the median over
steps of the slowest rank. On a 2-core host tp=2 cannot beat one process using both cores:
the figure shows the overhead of the global-tensor layer and the communication.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import engine as flow  # noqa: E402

F = flow.nn.functional
D, H, BATCH, SEQ, LR = 768, 3072, 8, 256, 0.1


def init_arrays():
    rng = np.random.default_rng(0)
    return dict(
        w1=(rng.standard_normal((H, D)) / np.sqrt(D)).astype(np.float32),
        b1=np.zeros(H, np.float32),
        w2=(rng.standard_normal((D, H)) / np.sqrt(H)).astype(np.float32),
        b2=np.zeros(D, np.float32),
        x=rng.standard_normal((BATCH, SEQ, D)).astype(np.float32),
        y=rng.standard_normal((BATCH, SEQ, D)).astype(np.float32),
    )


def make_step(params, x, y):
    opt = flow.optim.SGD(list(params.values()), lr=LR)

    def step():
        opt.zero_grad()
        h = F.gelu(F.linear(x, params["w1"], params["b1"]), approximate="tanh")
        out = F.linear(h, params["w2"], params["b2"])
        loss = F.mse_loss(out, y)
        loss.backward()
        opt.step()
        return loss

    return step


def time_steps(step, steps, barrier=None, warmup=2):
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        if barrier:
            barrier()
        t0 = time.perf_counter()
        step().item()
        if barrier:
            barrier()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def single(steps):
    a = init_arrays()
    params = {k: flow.tensor(a[k], requires_grad=True) for k in ("w1", "b1", "w2", "b2")}
    return time_steps(make_step(params, flow.tensor(a["x"]), flow.tensor(a["y"])), steps)


def tensor_parallel(steps):
    from engine.distributed import comm, sbp as S

    p = flow.placement.all("cpu")
    a = init_arrays()
    layout = dict(w1=S.split(0), b1=S.split(0), w2=S.split(1), b2=S.broadcast)
    params = {k: flow.tensor(a[k], placement=p, sbp=s, requires_grad=True) for k, s in layout.items()}
    x = flow.tensor(a["x"], placement=p, sbp=S.broadcast)
    y = flow.tensor(a["y"], placement=p, sbp=S.broadcast)
    step = make_step(params, x, y)
    step()
    with comm.stats.recording() as rec:
        step()
    t = time_steps(step, steps, barrier=comm.barrier)
    return t, rec.total_bytes, len(rec.calls)


def child_env(threads):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "MPIR_", "MPICH_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "ENGINE_NUM_THREADS",
                         "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env["OPENBLAS_NUM_THREADS"] = "1"
    if threads:
        env["ENGINE_NUM_THREADS"] = str(threads)
    return env


def run_single_child(steps, threads=None):
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--single-json", "--steps", str(steps)],
                         env=child_env(threads), capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["single_s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--single-json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.single_json:
        print(json.dumps({"single_s": single(args.steps)}))
        return
    from engine.distributed import comm

    n = comm.get_world_size()
    if n == 1:
        t = single(args.steps)
        print(f"single-process MLP step {D}->{H}->{D}, batch {BATCH}x{SEQ}: {t * 1e3:.1f} ms")
        return
    t_tp, nbytes, ncalls = tensor_parallel(args.steps)
    if comm.get_rank() == 0:
        t_all = run_single_child(args.steps)
        t_one = run_single_child(args.steps, threads=1)
        done = np.ones(1, np.int64)
        for r in range(1, n):
            comm.send(done, r, tag=77)
        print(f"MLP {D}->{H}->{D}, batch {BATCH}x{SEQ} tokens, fwd+bwd+SGD, median of {args.steps} steps")
        print(f"  tensor parallel tp={n} ({os.environ.get('ENGINE_NUM_THREADS', '?')} thread/rank): "
              f"{t_tp * 1e3:.1f} ms  ({ncalls} collectives, {nbytes / 1e6:.1f} MB sent per rank per step)")
        print(f"  single process, default threads:  {t_all * 1e3:.1f} ms  -> tp/single {t_tp / t_all:.2f}")
        print(f"  single process, 1 thread:         {t_one * 1e3:.1f} ms  -> tp/single {t_tp / t_one:.2f}")
    else:  # wait for rank 0's single-process runs without spinning on a core
        req = comm.irecv(np.empty(1, np.int64), 0, tag=77)
        while not req.is_completed():
            time.sleep(0.05)


if __name__ == "__main__":
    main()
