"""Shared by tests/gpt2: run tools/*.py (one process, or N ranks through
`python -m engine.distributed.launch`) on configs/gpt2_pretrain.py with a tiny model."""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "distributed"))

from mpi_helper import mpi_env, run_command  # noqa: E402

CONFIG = os.path.join(ROOT, "configs", "gpt2_pretrain.py")
TRAIN_NET = os.path.join(ROOT, "tools", "train_net.py")
GENERATE = os.path.join(ROOT, "tools", "generate.py")

# the recipe shrunk for CI (dropout off so that layouts and resumes can be compared)
TINY = ["model.cfg.hidden_layers=2", "model.cfg.hidden_size=64", "model.cfg.ffn_hidden_size=256",
        "model.cfg.num_attention_heads=4", "model.cfg.max_seq_length=32",
        "model.cfg.embedding_dropout_prob=0.0", "model.cfg.attention_dropout_prob=0.0",
        "model.cfg.output_dropout_prob=0.0"]


def env():
    return mpi_env(PYTHONHASHSEED="0")


def train_net(*args, nprocs=1, timeout=240, config=CONFIG, check=True):
    """tools/train_net.py --config-file CONFIG ARGS (through the launcher when nprocs > 1); CONFIG
    defaults to configs/gpt2_pretrain.py. Returns (returncode, stdout, stderr); a failure fails the
    test unless check=False."""
    if nprocs == 1:
        cmd = [sys.executable, TRAIN_NET, "--config-file", config, *args]
    else:
        cmd = [sys.executable, "-m", "engine.distributed.launch", "--nproc-per-node", str(nprocs), TRAIN_NET,
               "--config-file", config, *args]
    return run_command(cmd, timeout=timeout, env=env(), check=check)


def generate(*args, timeout=120, check=True):
    return run_command([sys.executable, GENERATE, *args], timeout=timeout, env=env(), check=check)


def records(out):
    with open(os.path.join(out, "metrics.json")) as f:
        return [json.loads(line) for line in f if line.strip()]


def losses(out):
    """{iteration: total_loss} (the last record of an iteration wins, e.g. after a resume)."""
    return {r["iteration"]: r["total_loss"] for r in records(out) if "total_loss" in r}


def trained_losses(out, *args, iters, nprocs=1, config=CONFIG):
    """Train into `out` (tools/train_net.py with ARGS, log_period 1) and return its logged
    {iteration: total_loss}, checking that every iteration 0 .. iters-1 was logged."""
    train_net(f"train.output_dir={out}", *args, nprocs=nprocs, config=config)
    got = losses(out)
    assert sorted(got) == list(range(iters)), got
    return got


def max_rel_err(got, ref):
    """The largest relative difference of two {iteration: loss} logs over ref's iterations."""
    return max(rel_err(got[i], ref[i]) for i in ref)


def rel_err(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def train_counting_device_reads(stats, out, *args, iters):
    """Train the tiny GPT-2 on CUDA in this process, as tools/train_net.py builds the trainer,
    with `args` overrides; `stats` are the CuPy double's counters. Returns, per iteration,
    (host synchronisations, their sites, [whether each event the host waited for was recorded
    before the iteration began])."""
    from libai.config import LazyConfig
    from libai.engine import DefaultTrainer, default_argument_parser, default_setup
    from libai.engine.hooks import HookBase

    opts = [*TINY, f"train.train_iter={iters}", "train.log_period=1", "train.evaluation.enabled=False",
            "train.checkpointer.period=100", "train.input_placement_device=cuda", f"train.output_dir={out}", *args]
    parsed = default_argument_parser().parse_args(["--config-file", CONFIG, *opts])
    cfg = LazyConfig.apply_overrides(LazyConfig.load(CONFIG), parsed.opts)
    default_setup(cfg, parsed)
    seen = []

    class CountReads(HookBase):
        def before_step(self):
            stats.reset()
            stats.trace = True
            self.clock = type(stats).clock

        def after_step(self):
            seen.append((stats.syncs, list(stats.sync_sites), [w < self.clock for w in stats.event_waits]))

    trainer = DefaultTrainer(cfg)
    trainer.register_hooks([CountReads()])
    trainer.train()
    assert len(seen) == iters, seen
    return seen
