from .blobs import BlobsDataset

__all__ = ["BlobsDataset"]
