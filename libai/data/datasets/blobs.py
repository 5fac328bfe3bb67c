"""A generated classification dataset: Gaussian blobs, deterministic from a seed (no download)."""
import numpy as np

__all__ = ["BlobsDataset"]


class BlobsDataset:
    """`num_samples` points in `dim` dimensions around `num_classes` centers.

    Sample i is {"images": float32[dim], "labels": int}. The centers depend only on
    `center_seed` (so a train and a test split share them) and the points on `seed`."""

    def __init__(self, num_samples=512, dim=16, num_classes=4, noise=1.0, seed=0, center_seed=1234,
                 center_scale=2.0):
        from libai.data.utils import progress

        rng_c = np.random.RandomState(center_seed)
        centers = rng_c.randn(num_classes, dim) * center_scale
        rng = np.random.RandomState(seed)
        labels = rng.randint(0, num_classes, size=num_samples)
        points = np.empty((num_samples, dim), dtype=np.float32)
        noise_all = rng.randn(num_samples, dim) * noise
        for i in progress(range(num_samples), desc="generating blobs", mininterval=1.0):
            points[i] = centers[labels[i]] + noise_all[i]
        self.images = points
        self.labels = labels.astype(np.int64)
        self.num_classes = num_classes

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"images": self.images[i], "labels": int(self.labels[i])}
