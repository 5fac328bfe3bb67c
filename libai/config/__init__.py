"""libai.config: LazyConfig files, LazyCall/instantiate, overrides and config helpers.

See docs/config.md.
"""
from .arguments import default_argument_parser
from .batch_size import BatchSizes, resolve_batch_sizes
from .config import configurable, get_config, get_config_root, try_get_key
from .instantiate import InstantiationError, instantiate, locate
from .lazy import ConfigKeyError, LazyCall, LazyConfig, unknown_key_error
from .train_config import resolve_train_config

__all__ = [
    "LazyCall",
    "LazyConfig",
    "ConfigKeyError",
    "unknown_key_error",
    "instantiate",
    "InstantiationError",
    "locate",
    "configurable",
    "try_get_key",
    "get_config",
    "get_config_root",
    "resolve_batch_sizes",
    "resolve_train_config",
    "BatchSizes",
    "default_argument_parser",
]
