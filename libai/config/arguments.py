"""`default_argument_parser`: the command line shared by tools/train_net.py and projects."""
import argparse
import sys

__all__ = ["default_argument_parser"]


def default_argument_parser(epilog=None):
    """--config-file, --resume, --eval-only, --fast-dev-run and trailing `key=value` overrides."""
    prog = sys.argv[0] if sys.argv and sys.argv[0] else "train_net.py"
    parser = argparse.ArgumentParser(
        epilog=epilog
        or f"""
Examples:

Train with a config:
    $ {prog} --config-file configs/gpt2_pretrain.py

Change some config options (hydra override syntax, see docs/config.md):
    $ {prog} --config-file cfg.py train.train_iter=100 optim.lr=1e-3 +train.new_key=1 ~train.amp

Several processes:
    $ mpirun -n 4 {prog} --config-file cfg.py train.dist.data_parallel_size=4
""",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config-file", default="", metavar="FILE", help="path to config file")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="resume from the last checkpoint in train.output_dir (sets train.resume)",
    )
    parser.add_argument("--eval-only", action="store_true", help="perform evaluation only")
    parser.add_argument(
        "--fast-dev-run",
        action="store_true",
        help="run a few iterations of training and evaluation to check the setup",
    )
    parser.add_argument(
        "opts",
        help="config overrides at the end of the command, as key=value (hydra override grammar)",
        default=None,
        nargs=argparse.REMAINDER,
    )
    return parser
