"""engine.utils.data: datasets, samplers, collation and DataLoader, as torch.utils.data.

    dataset.py      Dataset, IterableDataset, TensorDataset, ConcatDataset, ChainDataset, Subset, random_split
    sampler.py      Sampler, SequentialSampler, RandomSampler, SubsetRandomSampler, WeightedRandomSampler,
                    BatchSampler
    distributed.py  DistributedSampler
    collate.py      default_collate, default_convert
    fetch.py        index -> batch, shared by the main process and the workers
    worker.py       the worker process: seeding, get_worker_info, error and batch transport
    dataloader.py   DataLoader and its single- and multi-process iterators
"""
from .collate import default_collate, default_convert
from .dataloader import DataLoader
from .dataset import ChainDataset, ConcatDataset, Dataset, IterableDataset, Subset, TensorDataset, random_split
from .distributed import DistributedSampler
from .sampler import (BatchSampler, RandomSampler, Sampler, SequentialSampler, SubsetRandomSampler,
                      WeightedRandomSampler)
from .worker import WorkerInfo, get_worker_info

__all__ = ["Dataset", "IterableDataset", "TensorDataset", "ConcatDataset", "ChainDataset", "Subset", "random_split",
           "Sampler", "SequentialSampler", "RandomSampler", "SubsetRandomSampler", "WeightedRandomSampler",
           "BatchSampler", "DistributedSampler", "default_collate", "default_convert", "DataLoader",
           "get_worker_info", "WorkerInfo"]
