"""`libai.data.data_utils.indexed_dataset` (LiBai's path): the mmap indexed dataset of
libai.data.indexed_dataset; Megatron's older "lazy" and "cached" formats are not implemented."""
from ..indexed_dataset import (MMapIndexedDataset, MMapIndexedDatasetBuilder, best_fitting_dtype,  # noqa: F401
                               data_file_path, get_indexed_dataset, index_file_path, make_builder, make_dataset)

__all__ = ["IndexedDataset", "IndexedCachedDataset", "MMapIndexedDataset", "MMapIndexedDatasetBuilder",
           "best_fitting_dtype", "data_file_path", "get_indexed_dataset", "index_file_path", "make_builder",
           "make_dataset"]


class IndexedDataset:
    """Megatron's "lazy" (non-mmap) indexed dataset format: not implemented."""

    _impl = "lazy"

    def __init__(self, *args, **kwargs):
        raise NotImplementedError(
            f"{type(self).__name__} (the {self._impl!r} indexed dataset format) is not implemented; only the "
            "'mmap' format is (MMapIndexedDataset, get_indexed_dataset(prefix, data_impl='mmap')). Write the data "
            "with tools/preprocess_data.py, which produces it")


class IndexedCachedDataset(IndexedDataset):
    """Megatron's "cached" (non-mmap) indexed dataset format: not implemented."""

    _impl = "cached"
