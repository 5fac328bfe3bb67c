"""Rank-aware logging: `setup_logger` as in LiBai / detectron2.

Rank 0 logs to the console and to `output/log.txt`; other ranks log only to
`output/log.txt.rank{r}` unless `enable_all_ranks=True` (then they print too, tagged by rank).
"""
import logging
import os
import sys
import time
from collections import Counter

__all__ = ["setup_logger", "log_first_n", "log_every_n", "log_every_n_seconds"]


class _ColorfulFormatter(logging.Formatter):
    def __init__(self, *args, root_name="libai", abbrev_name=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._root_name = root_name + "."
        self._abbrev_name = (abbrev_name or root_name) + "."

    def formatMessage(self, record):
        record.name = record.name.replace(self._root_name, self._abbrev_name)
        log = super().formatMessage(record)
        if record.levelno == logging.WARNING:
            prefix = "\x1b[31mWARNING\x1b[0m"
        elif record.levelno in (logging.ERROR, logging.CRITICAL):
            prefix = "\x1b[31;5mERROR\x1b[0m"
        else:
            return log
        return prefix + " " + log


_CONFIGURED = {}


def setup_logger(output=None, distributed_rank=0, *, color=True, name="libai", abbrev_name=None,
                 enable_all_ranks=False, level=logging.DEBUG):
    """Configure the `name` logger (idempotent per (name, output, rank)).

    Args:
        output: a directory (log goes to `output/log.txt`) or a file name ending in .txt/.log.
        distributed_rank: this process' rank; only rank 0 prints unless `enable_all_ranks`.
    """
    key = (name, output, distributed_rank, enable_all_ranks)
    logger = logging.getLogger(name)
    if key in _CONFIGURED:
        return logger
    # a new configuration replaces handlers installed by an earlier call for the same logger
    for h in list(logger.handlers):
        if getattr(h, "_libai_handler", False):
            logger.removeHandler(h)
            h.close()
    for k in [k for k in _CONFIGURED if k[0] == name]:
        del _CONFIGURED[k]
    _CONFIGURED[key] = True
    logger.setLevel(level)
    logger.propagate = False
    abbrev_name = abbrev_name or ("lb" if name == "libai" else name)
    rank_tag = f" [rank{distributed_rank}]" if enable_all_ranks and distributed_rank else ""
    plain = logging.Formatter(
        "[%(asctime)s] %(name)s %(levelname)s" + rank_tag + ": %(message)s", datefmt="%m/%d %H:%M:%S")

    if distributed_rank == 0 or enable_all_ranks:
        ch = logging.StreamHandler(stream=sys.stdout)
        ch.setLevel(logging.INFO)
        if color and sys.stdout.isatty():
            fmt = _ColorfulFormatter(
                "\x1b[32m[%(asctime)s %(name)s]:\x1b[0m" + rank_tag + " %(message)s",
                datefmt="%m/%d %H:%M:%S", root_name=name, abbrev_name=str(abbrev_name))
        else:
            fmt = plain
        ch.setFormatter(fmt)
        ch._libai_handler = True
        logger.addHandler(ch)

    if output is not None:
        if output.endswith(".txt") or output.endswith(".log"):
            filename = output
        else:
            filename = os.path.join(output, "log.txt")
        if distributed_rank > 0:
            filename = filename + f".rank{distributed_rank}"
        os.makedirs(os.path.dirname(os.path.abspath(filename)), exist_ok=True)
        fh = logging.FileHandler(filename, mode="a", encoding="utf-8")
        fh.setLevel(logging.DEBUG)
        fh.setFormatter(plain)
        fh._libai_handler = True
        logger.addHandler(fh)
    return logger


def _caller():
    frame = sys._getframe(2)
    while frame:
        code = frame.f_code
        if os.path.join("utils", "logger.") not in code.co_filename:
            mod_name = frame.f_globals["__name__"]
            if mod_name == "__main__":
                mod_name = "libai"
            return mod_name, (code.co_filename, frame.f_lineno, code.co_name)
        frame = frame.f_back
    return "libai", None


_LOG_COUNTER = Counter()
_LOG_TIMER = {}


def log_first_n(lvl, msg, n=1, *, name=None, key="caller"):
    caller_module, caller_key = _caller()
    hash_key = (caller_key,) if key == "caller" else (msg,) if key == "message" else (caller_key, msg)
    _LOG_COUNTER[hash_key] += 1
    if _LOG_COUNTER[hash_key] <= n:
        logging.getLogger(name or caller_module).log(lvl, msg)


def log_every_n(lvl, msg, n=1, *, name=None):
    caller_module, key = _caller()
    _LOG_COUNTER[key] += 1
    if n == 1 or _LOG_COUNTER[key] % n == 1:
        logging.getLogger(name or caller_module).log(lvl, msg)


def log_every_n_seconds(lvl, msg, n=1, *, name=None):
    caller_module, key = _caller()
    last = _LOG_TIMER.get(key, None)
    now = time.time()
    if last is None or now - last >= n:
        logging.getLogger(name or caller_module).log(lvl, msg)
        _LOG_TIMER[key] = now

