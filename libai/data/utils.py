"""Helpers for data preparation."""
from tqdm import tqdm

__all__ = ["progress"]


def progress(iterable=None, desc=None, total=None, **kwargs):
    """A tqdm progress bar for preprocessing, shown on rank 0 only (quiet on other ranks)."""
    from libai.utils import distributed as dist

    disable = kwargs.pop("disable", False) or dist.get_rank() != 0
    return tqdm(iterable, desc=desc, total=total, disable=disable, leave=False, **kwargs)
