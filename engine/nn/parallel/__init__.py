"""engine.nn.parallel: DistributedDataParallel (torch.nn.parallel's), for scripts written against torch."""
from .distributed import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
