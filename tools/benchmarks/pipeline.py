"""Pipeline bubble: measured against the theoretical (p-1)/(m+p-1), 1F1B and GPipe, GPT-2 recipe.

    python tools/benchmarks/pipeline.py [--stages 2 --micro-batches 1,2,4,8 --iters 8]

For each schedule and number of micro-batches m, `tools/train_net.py --config-file
configs/gpt2_pretrain.py` runs under the launcher with train.dist.pipeline_parallel_size=p (one
thread per rank on a machine with p cores) and train.num_accumulation_steps=m; the trainer logs
each iteration's bubble (the stages' mean idle fraction of the schedule's wall time: waiting
for a neighbour's activations or gradients) and every stage's busy time. The table gives the
medians over the iterations after the first two, and the step time against one process
running the same m micro-batches with every core (what pipelining buys on this machine).

Model: the recipe's GPT-2 (4 layers, hidden 256, 4 heads, 128 tokens) with dropout off, micro
batch `--micro-batch` (default 4), vocabulary padded as the recipe does, AdamW.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "gpt2_pretrain.py")
TRAIN_NET = os.path.join(ROOT, "tools", "train_net.py")
sys.path.insert(0, ROOT)

from libai.engine.pipeline import theoretical_bubble  # noqa: E402


def train(out, args, nprocs):
    """Run the recipe; returns the metrics.json records."""
    launcher = [sys.executable, "-m", "engine.distributed.launch", "--nproc-per-node", str(nprocs)] if nprocs > 1 \
        else [sys.executable]
    cmd = [*launcher, TRAIN_NET, "--config-file", CONFIG, f"train.output_dir={out}", *args]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    if proc.returncode != 0:
        sys.exit(f"run failed ({' '.join(cmd)}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    with open(os.path.join(out, "metrics.json")) as f:
        return [json.loads(line) for line in f if line.strip()]


def medians(records, skip, keys):
    rows = [r for r in records if r.get("iteration", -1) >= skip and all(k in r for k in keys)]
    return {k: statistics.median(r[k] for r in rows) for k in keys}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--micro-batches", default="1,2,4,8", help="comma-separated numbers of micro-batches m")
    ap.add_argument("--micro-batch", type=int, default=4, help="samples per micro-batch")
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--schedules", default="1F1B,GPipe")
    ap.add_argument("--stage-ids", default="0,0,0,1",
                    help="train.dist.custom_pipeline_stage_id (one per layer; 'even' splits the layers evenly); "
                         "the default balances the recipe's 4 layers: the last stage also runs the LM head")
    args = ap.parse_args()
    p = args.stages
    if args.layers < p:
        sys.exit(f"--layers ({args.layers}) must be >= --stages ({p})")
    common = [f"model.cfg.hidden_layers={args.layers}", f"model.cfg.hidden_size={args.hidden}",
              f"model.cfg.ffn_hidden_size={4 * args.hidden}", f"model.cfg.max_seq_length={args.seq}",
              "model.cfg.embedding_dropout_prob=0.0", "model.cfg.attention_dropout_prob=0.0",
              "model.cfg.output_dropout_prob=0.0", f"train.train_iter={args.iters}", "train.log_period=1",
              f"train.train_micro_batch_size={args.micro_batch}", "train.global_batch_size=null",
              "train.evaluation.enabled=False", "train.checkpointer.period=0"]
    stage_ids = []
    if args.stage_ids != "even":
        ids = [int(x) for x in args.stage_ids.split(",")]
        if len(ids) != args.layers:
            sys.exit(f"--stage-ids has {len(ids)} entries for {args.layers} layers (or give 'even')")
        stage_ids = [f"train.dist.custom_pipeline_stage_id=[{','.join(map(str, ids))}]"]

    skip = min(2, args.iters - 1)
    print(f"pipeline bubble: GPT-2 ({args.layers} layers, hidden {args.hidden}, seq {args.seq}), {p} stages, "
          f"micro-batch {args.micro_batch}, stage of each layer {args.stage_ids}, {os.cpu_count()} cores; "
          f"medians of iterations >= {skip}")
    print("bubble: the stages' mean idle fraction of the schedule; busiest: the idle fraction of the busiest "
          "stage (the bottleneck, comparable with the theory for unequal stages)")
    print(f"{'schedule':9s} {'m':>3s} {'bubble':>7s} {'busiest':>7s} {'theory':>7s} {'step ms':>8s} {'1 proc ms':>9s} "
          f"{'ratio':>6s}  stage busy ms")
    with tempfile.TemporaryDirectory() as tmp:
        for m in [int(x) for x in args.micro_batches.split(",")]:
            single = medians(train(os.path.join(tmp, f"single_{m}"), [*common, f"train.num_accumulation_steps={m}"],
                                   1), skip, ["time"])["time"]
            for kind in args.schedules.split(","):
                out = os.path.join(tmp, f"{kind}_{m}")
                recs = train(out, [*common, f"train.num_accumulation_steps={m}",
                                   f"train.dist.pipeline_parallel_size={p}", f"train.dist.pipeline_schedule={kind}",
                                   *stage_ids], p)
                busy_keys = [f"pipeline_stage{s}_busy_time" for s in range(p)]
                med = medians(recs, skip, ["pipeline_bubble", "pipeline_time", "time", *busy_keys])
                busy = " ".join(f"{1000 * med[k]:.0f}" for k in busy_keys)
                busiest = 1 - max(med[k] for k in busy_keys) / med["pipeline_time"]
                print(f"{kind:9s} {m:3d} {med['pipeline_bubble']:7.3f} {busiest:7.3f} {theoretical_bubble(p, m):7.3f} "
                      f"{1000 * med['time']:8.0f} {1000 * single:9.0f} {med['time'] / single:6.2f}  {busy}")


if __name__ == "__main__":
    main()
