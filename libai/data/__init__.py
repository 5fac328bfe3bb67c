"""Data pipeline: samplers, loaders, collate, generated datasets, the text pipelines (mmap
indexed datasets, GPT2Dataset, BertDataset, Instance / DistTensorData, the default corpus) and the
image pipeline (libai.data.datasets.images, libai.data.transforms)."""
from .build import (CommonDataLoader, ConcatDataset, MixupCollator, build_image_test_loader,
                    build_image_train_loader, build_nlp_test_loader, build_nlp_train_loader,
                    build_nlp_train_val_test_loader, build_test_loader, build_train_loader, default_collate,
                    get_train_valid_test_split_, train_val_test_num_samples, trivial_batch_collator)
from .datasets.bert_dataset import BertDataset
from .datasets.gpt_dataset import GPT2Dataset
from .indexed_dataset import MMapIndexedDataset, MMapIndexedDatasetBuilder, best_fitting_dtype, get_indexed_dataset
from .samplers import CyclicSampler, SingleRoundSampler
from .structures import DistTensorData, Instance
from .utils import progress

__all__ = ["CommonDataLoader", "ConcatDataset", "build_train_loader", "build_test_loader", "default_collate",
           "CyclicSampler", "SingleRoundSampler", "progress",
           "build_nlp_train_loader", "build_nlp_test_loader", "build_nlp_train_val_test_loader",
           "trivial_batch_collator", "get_train_valid_test_split_", "train_val_test_num_samples",
           "GPT2Dataset", "MMapIndexedDataset", "MMapIndexedDatasetBuilder", "best_fitting_dtype",
           "get_indexed_dataset", "DistTensorData", "Instance", "default_gpt2_corpus", "default_bert_corpus",
           "BertDataset", "build_image_train_loader", "build_image_test_loader", "MixupCollator"]


def __getattr__(name):  # the corpus module is imported on first use
    if name in ("default_gpt2_corpus", "default_bert_corpus"):
        from . import corpus

        return getattr(corpus, name)
    raise AttributeError(f"module 'libai.data' has no attribute {name!r}")
