from .blobs import BlobsDataset
from .gpt_dataset import GPT2Dataset

__all__ = ["BlobsDataset", "GPT2Dataset"]
