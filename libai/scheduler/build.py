def build_lr_scheduler(cfg, optimizer, **overrides):
    """Instantiate the LazyCall scheduler config `cfg` (e.g. cfg.train.scheduler) on `optimizer`.

    `overrides` (e.g. max_iter=..., warmup_iter=... computed by the trainer) replace the config's
    arguments; the config itself is not modified."""
    from libai.config import instantiate

    return instantiate(cfg, optimizer=optimizer, **overrides)
