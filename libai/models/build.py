"""LiBai's libai.models.build: build_model (the model a config describes) and build_graph (graph
mode: not implemented, libai.utils.graph_mode)."""
from libai.config import instantiate
from libai.utils.graph_mode import graph_mode_error

__all__ = ["build_model", "build_graph"]


def build_model(cfg):
    """The model `cfg` (a LazyCall config, e.g. cfg.model) describes; no weights are loaded."""
    return instantiate(cfg)


def build_graph(cfg, model, optimizer=None, lr_scheduler=None, is_train=False):
    """LiBai builds the nn.Graph of cfg.graph here: graph mode is not implemented."""
    raise graph_mode_error("build_graph(...)")
