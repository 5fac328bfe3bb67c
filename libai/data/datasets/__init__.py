from libai.utils.libai_names import missing_names_getattr

from .bert_dataset import BertDataset
from .blobs import BlobsDataset
from .gpt_dataset import GPT2Dataset
from .images import (ArrayImageDataset, CIFAR10Dataset, CIFAR100Dataset, DigitsDataset, ImageDataset,
                     ImageFolder)

__all__ = ["ArrayImageDataset", "BertDataset", "BlobsDataset", "CIFAR10Dataset", "CIFAR100Dataset", "DigitsDataset",
           "GPT2Dataset", "ImageDataset", "ImageFolder"]

__getattr__ = missing_names_getattr(__name__, {
    "RobertaDataset": "no RoBERTa here (BertDataset is the masked-LM dataset)",
    "T5Dataset": "no T5 here",
    "ImageNetDataset": "read an ImageNet-style folder with ImageFolder (libai.data.datasets)",
    "MNISTDataset": "the image recipes' embedded data is DigitsDataset; ImageFolder reads a folder of images",
})

