"""OneFlow's graph mode (nn.Graph: trace the step once, run it as a static graph) is not implemented:
this project trains eagerly. LiBai's graph names (GraphBase, GraphTrainer, build_graph, a config's
`graph.enabled=True`) exist so LiBai code imports and configs load, and each raises the error
below where LiBai would build a graph."""

__all__ = ["GraphModeNotImplemented", "graph_mode_error"]


class GraphModeNotImplemented(NotImplementedError):
    """Raised where LiBai would build or run an nn.Graph."""


def graph_mode_error(what):
    """The error for `what` (e.g. "GraphBase(...)") needing graph mode."""
    return GraphModeNotImplemented(
        f"{what}: graph mode (OneFlow's nn.Graph static execution) is not implemented; this project trains "
        "eagerly. Set graph.enabled=False in the config (or pass graph.enabled=False on the command line); "
        "everything else of the config runs unchanged")
