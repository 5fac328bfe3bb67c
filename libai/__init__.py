"""libai: distributed Transformer training (layers, configs, trainer, models) on the engine.

The engine (`import engine as flow`) is complete for single-process training; the libai layers,
LazyConfig system, trainer and models arrive with the following issues (docs/roadmap.md).
"""
__version__ = "0.1.0"
