"""`libai.data.data_utils.dataset_utils` (LiBai's path) on this project's data code."""
import logging
import os

import numpy as np

from ..build import get_train_valid_test_split_
from ..datasets.bert_dataset import build_samples_mapping

__all__ = ["compile_helper", "is_shared_folder", "create_masked_lm_predictions", "get_samples_mapping",
           "get_train_valid_test_split_"]

logger = logging.getLogger(__name__)

NETWORK_FS_ROOTS = ("/nfs", "/smb", "/cifs")


def is_shared_folder(filename):
    """Whether `filename` lies on a folder shared between nodes (LiBai's test): environment
    IS_SHARED_FILE=1 says so; otherwise a path on the root file system's device is not shared, and
    one on another device is when its directory is a mount point under /nfs, /smb or /cifs."""
    if os.environ.get("IS_SHARED_FILE") == "1":
        return True
    path = os.path.abspath(filename)
    if os.stat(path).st_dev == os.stat("/").st_dev:
        return False
    directory = os.path.dirname(path)
    return os.path.ismount(directory) and os.path.realpath(directory).startswith(NETWORK_FS_ROOTS)


def compile_helper():
    """LiBai compiles its C++ dataset helpers here; this project's are numpy code: nothing to do."""
    return None


def get_samples_mapping(indexed_dataset, data_prefix, num_epochs, max_num_samples, max_seq_length, short_seq_prob,
                        seed, name, binary_head):
    """BERT's samples mapping with LiBai's signature: int64 rows (first sentence, end sentence,
    target length) over every document of `indexed_dataset`, shuffled, at least `max_num_samples`
    rows (libai.data.datasets.bert_dataset.build_samples_mapping). `max_seq_length` is the
    tokens a sample may hold (LiBai's callers pass max_seq_length - 3); documents need two
    sentences with `binary_head`.

    Differences: only `num_epochs=None` (sizing by samples) is implemented, and the mapping is
    computed in memory: `data_prefix` is not used for an index-map file cache."""
    del data_prefix
    if num_epochs:
        raise NotImplementedError(
            f"get_samples_mapping(num_epochs={num_epochs!r}): sizing the mapping by epochs is not implemented; "
            "pass num_epochs=None and max_num_samples")
    if not max_num_samples:
        raise ValueError("get_samples_mapping: need max_num_samples (num_epochs is not implemented)")
    documents = np.arange(len(indexed_dataset.doc_idx) - 1, dtype=np.int64)
    return build_samples_mapping(indexed_dataset.doc_idx, indexed_dataset.sizes, documents, int(max_num_samples),
                                 int(max_seq_length), float(short_seq_prob), int(seed),
                                 2 if binary_head else 1, name=name)


def create_masked_lm_predictions(*args, **kwargs):
    """LiBai's n-gram masking (max_ngrams, masking_style "bert" / "bert-cn-wwm" / "t5",
    permutation): not implemented."""
    raise NotImplementedError(
        "libai.data.data_utils.create_masked_lm_predictions (LiBai's n-gram span masking) is not implemented; "
        "this project's BertDataset masks single tokens or whole words with "
        "libai.data.datasets.bert_dataset.create_masked_lm_predictions(tokens, special_ids, vocab_ids, "
        "is_continuation, mask_id, masked_lm_prob, max_predictions, np_rng, whole_word_masking)")
