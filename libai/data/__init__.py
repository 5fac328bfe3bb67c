"""Minimal data pipeline for the trainer: samplers, loaders, collate, a generated dataset."""
from .build import CommonDataLoader, ConcatDataset, build_test_loader, build_train_loader, default_collate
from .samplers import CyclicSampler, SingleRoundSampler
from .utils import progress

__all__ = ["CommonDataLoader", "ConcatDataset", "build_train_loader", "build_test_loader", "default_collate",
           "CyclicSampler", "SingleRoundSampler", "progress"]
