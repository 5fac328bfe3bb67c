"""`default_argument_parser`: the command line shared by tools/train_net.py and projects."""
import argparse
import os
import sys

__all__ = ["default_argument_parser"]


class _Parser(argparse.ArgumentParser):
    """Flags may stand anywhere among the `key=value` overrides (`... a=1 --resume b=2`), and
    `--config-file` must name an existing file. Flags are spelled out: argparse's prefix matching
    would read `--o` as --overwrite-output-dir, which deletes the previous run."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        if getattr(self, "_intermixing", False):
            return super().parse_known_args(args, namespace)
        self._intermixing = True
        try:
            ns, extra = self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False
        config_file = getattr(ns, "config_file", None)
        if config_file is not None:
            if not config_file:
                self.error("--config-file is required: the LazyConfig recipe to run (e.g. configs/gpt2_pretrain.py)")
            if os.path.isdir(config_file):
                self.error(f"--config-file {config_file!r} is a directory, not a config file")
            if not os.path.isfile(config_file):
                self.error(f"--config-file {config_file!r} does not exist")
        return ns, extra


def default_argument_parser(epilog=None):
    """--config-file, --resume, --overwrite-output-dir, --eval-only, --fast-dev-run and
    `key=value` overrides (flags and overrides in any order)."""
    prog = sys.argv[0] if sys.argv and sys.argv[0] else "train_net.py"
    parser = _Parser(
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
    parser.add_argument(
        "--overwrite-output-dir",
        action="store_true",
        help="delete the previous run (checkpoints, last_checkpoint, metrics.json, TensorBoard events) found in "
             "train.output_dir and start over (sets train.overwrite_output_dir)",
    )
    parser.add_argument("--eval-only", action="store_true", help="perform evaluation only")
    parser.add_argument(
        "--fast-dev-run",
        action="store_true",
        help="run a few iterations of training and evaluation to check the setup",
    )
    parser.add_argument(
        "opts",
        help="config overrides as key=value (hydra override grammar), anywhere on the command line",
        default=[],
        nargs="*",
    )
    return parser
