"""LiBai's GraphBase (the nn.Graph wrapping model, optimizer and scheduler): importable, so that
LiBai configs (configs/common/models/graph.py) load; constructing one raises, because graph mode
is not implemented (libai.utils.graph_mode)."""
from libai.utils.graph_mode import graph_mode_error

__all__ = ["GraphBase"]


class GraphBase:
    """Not implemented: graph mode. Train eagerly with graph.enabled=False."""

    def __init__(self, *args, **kwargs):
        raise graph_mode_error("GraphBase(...)")
