"""What the loaders are given: build_train_loader's list of datasets as the trainer passes it (an
omegaconf ListConfig, since the loader node is instantiated with `_recursive_=False`), and an
ImageFolder whose class folders hold no image (refused, as torchvision does, instead of counting
as a class and shifting the labels of the classes after it)."""
import os
import re

import numpy as np
import pytest
from omegaconf import ListConfig
from PIL import Image

from libai.config import LazyCall, LazyConfig
from libai.data import build_train_loader
from libai.data.datasets import BlobsDataset, ImageFolder
from libai.data.datasets.images import IMG_EXTENSIONS
from libai.engine import DefaultTrainer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ------------------------------------------------------------------ build_train_loader(dataset=[...])
def mlp_config(*datasets):
    """configs/mlp_classifier.py with its train dataset replaced by the list `datasets` (LazyCalls)."""
    cfg = LazyConfig.load(os.path.join(ROOT, "configs", "mlp_classifier.py"))
    cfg.dataloader.train.dataset = list(datasets)
    cfg.train.train_micro_batch_size = 8
    return cfg


def blobs(n, seed):
    return LazyCall(BlobsDataset)(num_samples=n, dim=4, num_classes=2, seed=seed)


def test_config_list_of_one_dataset():
    cfg = mlp_config(blobs(40, 0))
    assert isinstance(cfg.dataloader.train.dataset, ListConfig)
    loader, valid, test = DefaultTrainer.build_train_loader(cfg)
    assert valid is None and test is None
    assert len(loader.dataset) == 40
    batch = next(iter(loader))
    assert tuple(batch["images"].shape) == (8, 4)


def test_config_list_of_datasets_is_concatenated():
    cfg = mlp_config(blobs(40, 0), blobs(24, 1))
    loader, _, _ = DefaultTrainer.build_train_loader(cfg)
    assert len(loader.dataset) == 64
    second = BlobsDataset(num_samples=24, dim=4, num_classes=2, seed=1)
    np.testing.assert_array_equal(loader.dataset[40]["images"], second[0]["images"])


@pytest.mark.parametrize("wrap", [list, tuple, ListConfig])
def test_builder_takes_any_sequence_of_datasets(wrap):
    datasets = wrap([blobs(16, 0), blobs(8, 1)])
    loader, _, _ = build_train_loader(datasets, 4)
    assert len(loader.dataset) == 24
    if wrap is not ListConfig:  # which holds config values only
        built = BlobsDataset(num_samples=16, dim=4, num_classes=2, seed=0)
        loader, _, _ = build_train_loader(wrap([built]), 4)  # built datasets too
        assert loader.dataset is built


# ------------------------------------------------------------------ ImageFolder: classes without images
def image(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.zeros((4, 4, 3), dtype=np.uint8)).save(path)


@pytest.mark.parametrize("content", [None, "notes.txt"])
def test_image_folder_class_without_images_is_refused(tmp_path, content):
    image(tmp_path / "ant" / "a.png")
    os.makedirs(tmp_path / "empty_class" / "sub")
    if content:
        (tmp_path / "empty_class" / content).write_text("not an image")
    image(tmp_path / "zebra" / "z.png")
    with pytest.raises(FileNotFoundError) as e:
        ImageFolder(tmp_path)
    msg = str(e.value)
    assert "Found no valid file for the classes empty_class" in msg, msg
    assert str(tmp_path / "empty_class") in msg, msg
    assert "Supported extensions are: " + ", ".join(IMG_EXTENSIONS) in msg, msg


def test_image_folder_names_every_empty_class(tmp_path):
    image(tmp_path / "b" / "x.jpg")
    os.makedirs(tmp_path / "a")
    os.makedirs(tmp_path / "c")
    with pytest.raises(FileNotFoundError, match=re.escape("Found no valid file for the classes a, c.")):
        ImageFolder(tmp_path)
    image(tmp_path / "d" / "y.png")
    with pytest.raises(FileNotFoundError, match=re.escape("classes a, b, c. Supported extensions are: .png")):
        ImageFolder(tmp_path, extensions=(".png",))  # b holds a .jpg only
