from .bert_dataset import BertDataset
from .blobs import BlobsDataset
from .gpt_dataset import GPT2Dataset
from .images import (ArrayImageDataset, CIFAR10Dataset, CIFAR100Dataset, DigitsDataset, ImageDataset,
                     ImageFolder)

__all__ = ["ArrayImageDataset", "BertDataset", "BlobsDataset", "CIFAR10Dataset", "CIFAR100Dataset", "DigitsDataset",
           "GPT2Dataset", "ImageDataset", "ImageFolder"]
