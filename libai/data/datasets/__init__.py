from .bert_dataset import BertDataset
from .blobs import BlobsDataset
from .gpt_dataset import GPT2Dataset

__all__ = ["BertDataset", "BlobsDataset", "GPT2Dataset"]
