"""engine.utils: activation checkpointing (`engine.utils.checkpoint.checkpoint`), data loading
(`engine.utils.data`, as torch.utils.data) and `engine.utils.deterministic`."""
from . import checkpoint  # noqa: F401
from . import data  # noqa: F401
from . import deterministic  # noqa: F401
