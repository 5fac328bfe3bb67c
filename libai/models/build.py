"""LiBai's libai.models.build: build_model (the model a config describes) and build_graph (the
nn.Graph that runs it in graph mode, libai.models.utils.GraphBase)."""
from libai.config import instantiate

__all__ = ["build_model", "build_graph"]


def build_model(cfg):
    """The model `cfg` (a LazyCall config, e.g. cfg.model) describes; no weights are loaded."""
    return instantiate(cfg)


def build_graph(cfg, model, optimizer=None, lr_scheduler=None, is_train=False):
    """The nn.Graph of `cfg.graph.train_graph` (is_train) or `cfg.graph.eval_graph`, as LiBai builds
    it: the LazyCall of a GraphBase given the model, optimizer and scheduler; a config without
    them gets a plain GraphBase."""
    from libai.models.utils import GraphBase

    key = "train_graph" if is_train else "eval_graph"
    graph_cfg = getattr(cfg, "graph", None) if cfg is not None else None
    lazy = graph_cfg.get(key) if graph_cfg is not None and hasattr(graph_cfg, "get") else None
    if lazy is None:
        return GraphBase(model, optimizer, lr_scheduler, is_train=is_train)
    lazy.model = model
    if is_train:
        lazy.optimizer = optimizer
        lazy.lr_scheduler = lr_scheduler
    return instantiate(lazy)
