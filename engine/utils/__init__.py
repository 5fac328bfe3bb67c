"""engine.utils: activation checkpointing (`engine.utils.checkpoint.checkpoint`) and data loading
(`engine.utils.data`, as torch.utils.data)."""
from . import checkpoint  # noqa: F401
from . import data  # noqa: F401
