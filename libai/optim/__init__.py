"""libai.optim: optimizer parameter groups and `build_optimizer` (see docs/config.md)."""
from .build import build_optimizer, get_default_optimizer_params, is_norm_module, reduce_param_groups

__all__ = ["build_optimizer", "get_default_optimizer_params", "is_norm_module", "reduce_param_groups"]
