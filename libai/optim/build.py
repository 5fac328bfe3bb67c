"""Optimizer parameter groups (LiBai's `get_default_optimizer_params`) and `build_optimizer`."""
import copy
from collections import defaultdict

__all__ = ["get_default_optimizer_params", "reduce_param_groups", "build_optimizer", "is_norm_module"]


def is_norm_module(module):
    """Norm layers get `weight_decay_norm`: engine.nn.LayerNorm and any class named *Norm*."""
    import engine as flow

    if isinstance(module, flow.nn.LayerNorm):
        return True
    return any("Norm" in cls.__name__ for cls in type(module).__mro__ if cls.__name__ != "object")


def get_default_optimizer_params(
    model=None,
    base_lr=None,
    weight_decay=None,
    weight_decay_norm=None,
    weight_decay_bias=None,
    clip_grad_max_norm=None,
    clip_grad_norm_type=None,
    overrides=None,
):
    """Parameter groups for an optimizer: per-parameter hyperparameters, merged into few groups.

    Args:
        model: the module whose parameters are optimized (the trainer sets
            `cfg.optim.params.model` / passes it to `build_optimizer`).
        base_lr, weight_decay: `lr` / `weight_decay` put in every group (None: optimizer default).
        weight_decay_norm: weight decay of parameters of norm layers (LayerNorm, *Norm* classes).
        weight_decay_bias: weight decay of parameters named "bias".
        clip_grad_max_norm, clip_grad_norm_type: stored in every group for the trainer, which
            clips each group's gradients (`clip_grad_norm_type` defaults to 2.0 when only the max
            norm is given).
        overrides: {parameter name: {hyperparameter: value}}; the name is the parameter's own name
            ("bias", "weight") or its full dotted name in the model ("head.weight").

    Returns:
        list of dicts `{"params": [...], hyperparameters...}`; every trainable parameter appears
        exactly once (shared parameters are deduplicated).
    """
    if model is None:
        raise ValueError(
            "get_default_optimizer_params needs the model: set cfg.optim.params.model = model "
            "before instantiating, or use libai.optim.build_optimizer(cfg.optim, model)"
        )
    overrides = copy.copy(dict(overrides)) if overrides else {}
    defaults = {}
    if base_lr is not None:
        defaults["lr"] = base_lr
    if weight_decay is not None:
        defaults["weight_decay"] = weight_decay
    if clip_grad_max_norm is not None:
        if not float(clip_grad_max_norm) > 0:  # a negative norm would flip the gradients, 0 zero them
            raise ValueError(f"optim.params.clip_grad_max_norm must be positive (None: no clipping), "
                             f"got {clip_grad_max_norm!r}")
        defaults["clip_grad_max_norm"] = float(clip_grad_max_norm)
        defaults["clip_grad_norm_type"] = float(2.0 if clip_grad_norm_type is None else clip_grad_norm_type)
    if weight_decay_bias is not None:
        if "bias" in overrides:
            raise ValueError("conflicting overrides for 'bias': weight_decay_bias and overrides['bias']")
        overrides["bias"] = {"weight_decay": weight_decay_bias}

    groups = []
    seen = set()
    for module_name, module in model.named_modules():
        norm = is_norm_module(module)
        for name, param in module.named_parameters(recurse=False):
            if not param.requires_grad or id(param) in seen:
                continue
            seen.add(id(param))
            hyper = dict(defaults)
            if norm and weight_decay_norm is not None:
                hyper["weight_decay"] = weight_decay_norm
            full_name = f"{module_name}.{name}" if module_name else name
            hyper.update(overrides.get(name, {}))
            hyper.update(overrides.get(full_name, {}))
            groups.append({"params": [param], **hyper})
    return reduce_param_groups(groups)


def _freeze(value):
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    return value


def reduce_param_groups(groups):
    """Merge groups with identical hyperparameters (order of first appearance kept)."""
    merged = defaultdict(list)
    order = []
    for group in groups:
        key = tuple(sorted((k, _freeze(v)) for k, v in group.items() if k != "params"))
        if key not in merged:
            order.append((key, {k: v for k, v in group.items() if k != "params"}))
        merged[key].extend(group["params"])
    return [{"params": merged[key], **hyper} for key, hyper in order]


def build_optimizer(cfg_optim, model):
    """Instantiate an optimizer config (e.g. configs/common/optim.py's `optim`) for `model`.

    When `cfg_optim.params` is a LazyCall (e.g. of `get_default_optimizer_params`) it is built with
    `model=model`; when it is missing or None, `model.parameters()` are used. The config itself is
    not modified (so it stays saveable). Equivalent to LiBai's
    `cfg.optim.params.model = model; instantiate(cfg.optim)`.
    """
    from libai.config import instantiate
    from libai.config.instantiate import is_lazy_node

    params_cfg = cfg_optim.get("params", None) if hasattr(cfg_optim, "get") else None
    if params_cfg is None:
        params = list(model.parameters())
    elif is_lazy_node(params_cfg):
        params = instantiate(params_cfg, model=model)
    else:
        raise ValueError(
            "build_optimizer: cfg_optim.params must be a LazyCall producing parameter groups "
            f"(e.g. LazyCall(get_default_optimizer_params)(...)) or None, got {type(params_cfg).__name__}"
        )
    return instantiate(cfg_optim, params=params)
