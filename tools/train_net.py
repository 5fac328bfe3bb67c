#!/usr/bin/env python
"""Train or evaluate a model described by a LazyConfig file.

    python tools/train_net.py --config-file CONFIG [--resume] [--overwrite-output-dir] [--eval-only]
                              [--fast-dev-run] [--stop-iter N] [key=value ...]

Flags and overrides may come in any order. After a SIGINT or SIGTERM the run finishes its
iteration, writes a checkpoint and exits with status 128 + the signal number.
"""
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from libai.config import LazyConfig  # noqa: E402
from libai.engine import DefaultTrainer, default_argument_parser, default_setup, write_eval_results  # noqa: E402
from libai.engine.trainer import StopSignalAbort  # noqa: E402
from libai.utils import distributed as dist  # noqa: E402
from libai.utils.checkpoint import Checkpointer  # noqa: E402
from libai.utils.output_dir import release_output_dir  # noqa: E402

logger = logging.getLogger("libai.tools.train_net")


def main(args):
    cfg = LazyConfig.load(args.config_file)
    cfg = LazyConfig.apply_overrides(cfg, args.opts)
    default_setup(cfg, args)  # resolves cfg.train: plain cfg.train.x from here on

    if args.eval_only:
        model = DefaultTrainer.build_model(cfg)
        extra = Checkpointer(model, save_dir=cfg.train.output_dir).resume_or_load(
            cfg.train.load_weight, resume=args.resume)
        if args.resume and not extra and not cfg.train.load_weight:
            sys.exit(f"--eval-only --resume: train.output_dir={cfg.train.output_dir!r} holds no checkpoint to "
                     "evaluate (a mistyped output_dir?); give the run's output_dir or train.load_weight=CHECKPOINT")
        if not extra and not cfg.train.load_weight and not args.resume:
            logger.warning("--eval-only without train.load_weight (or --resume): evaluating the initial weights")
        # the valid/test splits of the training data (one epoch each, whatever train.train_iter is), then
        # dataloader.test: the trainer's order, so the results have the training run's names
        loaders = DefaultTrainer.build_eval_only_loaders(cfg, DefaultTrainer.build_tokenizer(cfg))
        if not loaders:
            sys.exit("--eval-only: nothing to evaluate: the config has no dataloader.test, and dataloader.train's "
                     "splits give no valid or test data (dataloader.train.splits)")
        results = DefaultTrainer.test(cfg, loaders, model)
        write_eval_results(cfg, results, iteration=int(extra.get("iteration", 0)) if extra else 0)
        return results

    trainer = DefaultTrainer(cfg)
    results = trainer.train(stop_iter=args.stop_iter)
    if trainer.interrupted:
        sys.exit(128 + trainer.interrupted)
    return results


if __name__ == "__main__":
    try:
        main(default_argument_parser().parse_args())
    except StopSignalAbort as e:
        if dist.get_world_size() > 1:  # the abort-on-exception hook ends every rank (MPI_Abort)
            raise
        sys.stderr.write(f"{e}\n")
        sys.exit(128 + e.signum)  # 143 for a second SIGTERM, as for the first
    finally:
        release_output_dir()
