"""LiBai's `libai.data.data_utils` module path (configs import `get_indexed_dataset` from here),
mapped to this project's implementations in libai.data.

    indexed datasets     libai.data.indexed_dataset (the Megatron mmap format)
    split boundaries     libai.data.build.get_train_valid_test_split_
    BERT samples mapping libai.data.datasets.bert_dataset.build_samples_mapping

Not implemented here, with errors that say so: the non-mmap "lazy"/"cached" dataset formats
(IndexedDataset, IndexedCachedDataset) and LiBai's n-gram `create_masked_lm_predictions` (this
project's BERT masking is libai.data.datasets.bert_dataset.create_masked_lm_predictions, with its
own signature). `compile_helper` has nothing to compile: the helpers are numpy code.
"""
from .dataset_utils import (compile_helper, create_masked_lm_predictions, get_samples_mapping,
                            get_train_valid_test_split_, is_shared_folder)
from .indexed_dataset import (IndexedCachedDataset, IndexedDataset, MMapIndexedDataset, get_indexed_dataset,
                              make_builder, make_dataset)

__all__ = ["compile_helper", "is_shared_folder", "create_masked_lm_predictions", "get_samples_mapping",
           "get_train_valid_test_split_", "IndexedCachedDataset", "IndexedDataset", "MMapIndexedDataset",
           "get_indexed_dataset", "make_builder", "make_dataset"]
