"""engine.utils: activation checkpointing (`engine.utils.checkpoint.checkpoint`)."""
from . import checkpoint  # noqa: F401
