"""Helpers for data preparation."""

__all__ = ["progress"]


def progress(iterable=None, desc=None, total=None, **kwargs):
    """A tqdm progress bar for preprocessing, shown on rank 0 only (quiet on other ranks)."""
    from tqdm import tqdm  # imported here: ~50 ms at every process's start otherwise

    from libai.utils import distributed as dist

    disable = kwargs.pop("disable", False) or dist.get_rank() != 0
    return tqdm(iterable, desc=desc, total=total, disable=disable, leave=False, **kwargs)
