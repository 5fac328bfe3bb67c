import logging
from collections.abc import Mapping

__all__ = ["print_csv_format", "flatten_results_dict"]


def print_csv_format(results):
    """Log evaluation results (a dict of metrics, or {task: {metric: value}}) as csv lines that
    are easy to copy into a spreadsheet."""
    logger = logging.getLogger(__name__)
    if not isinstance(results, Mapping):
        raise TypeError(f"results must be a mapping, got {type(results).__name__}")
    flat = flatten_results_dict(results)
    if not flat:
        logger.info("copypaste: (no results)")
        return
    logger.info("copypaste: " + ",".join(flat.keys()))
    logger.info("copypaste: " + ",".join(f"{v:.4f}" if isinstance(v, float) else str(v) for v in flat.values()))


def flatten_results_dict(results):
    """{"a": {"b": 1}} -> {"a/b": 1} (keys joined with "/")."""
    out = {}
    for k, v in results.items():
        if isinstance(v, Mapping):
            for kk, vv in flatten_results_dict(v).items():
                out[f"{k}/{kk}"] = vv
        else:
            out[k] = v
    return out
