"""Image datasets on files the tests write in the official layouts (ImageFolder, CIFAR-10/100 binary
and python versions), the embedded digits default, and the image loaders (mixup, epochs, resume)."""
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from libai.data import build_image_test_loader, build_image_train_loader
from libai.data import transforms as T
from libai.data.datasets import (ArrayImageDataset, CIFAR10Dataset, CIFAR100Dataset, DigitsDataset,
                                 ImageFolder)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
rng = np.random.default_rng(0)


def _chw(arr):
    return arr.transpose(2, 0, 1).astype(np.float32) / 255


# ------------------------------------------------------------------ ImageFolder
def test_image_folder_classes_files_and_pixels(tmp_path):
    written = {}
    for cls, n in (("cat", 3), ("dog", 2), ("zebra", 1)):
        os.makedirs(tmp_path / cls / "nested")
        for k in range(n):
            arr = rng.integers(0, 256, (6, 5, 3), dtype=np.uint8)
            sub = "nested" if k == 1 else ""
            path = tmp_path / cls / sub / f"img{k}.PNG"
            Image.fromarray(arr).save(path)
            written[str(path)] = arr
        (tmp_path / cls / "notes.txt").write_text("not an image")
    (tmp_path / "stray.png").write_bytes(b"")  # a file at the top level is not a class
    ds = ImageFolder(tmp_path)
    assert ds.classes == ["cat", "dog", "zebra"] and ds.num_classes == 3 and len(ds) == 6
    assert ds.targets == [0, 0, 0, 1, 1, 2]
    for i, (path, label) in enumerate(ds.samples):
        s = ds[i]
        np.testing.assert_array_equal(s.images.tensor.numpy(), _chw(written[path]))
        assert int(s.labels.tensor.numpy()) == label and s.labels.placement_idx == -1
    grey = tmp_path / "dog" / "grey.png"
    Image.fromarray(rng.integers(0, 256, (4, 4), dtype=np.uint8), "L").save(grey)
    ds = ImageFolder(tmp_path)
    assert ds[[p for p, _ in ds.samples].index(str(grey))].images.tensor.shape == (3, 4, 4)  # decoded as RGB


def test_image_folder_errors_name_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        ImageFolder(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="no class folders"):
        ImageFolder(tmp_path)
    os.makedirs(tmp_path / "a")
    with pytest.raises(FileNotFoundError, match="no images with extensions"):
        ImageFolder(tmp_path)
    bad = tmp_path / "a" / "broken.jpg"
    bad.write_bytes(b"\xff\xd8 not really a jpeg")
    ds = ImageFolder(tmp_path)
    with pytest.raises(RuntimeError, match=r"cannot decode .*broken\.jpg"):
        ds[0]


# ------------------------------------------------------------------ CIFAR
def _cifar_arrays(n, num_classes):
    images = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    return images, rng.integers(0, num_classes, n)


def _records(images):
    return images.transpose(0, 3, 1, 2).reshape(len(images), 3072)  # R plane, G plane, B plane


def _write_cifar10(root, fmt, train_parts, test):
    if fmt == "bin":
        d = root / "cifar-10-batches-bin"
        os.makedirs(d)
        for k, (im, lab) in enumerate(train_parts, 1):
            np.concatenate([lab[:, None].astype(np.uint8), _records(im)], 1).tofile(d / f"data_batch_{k}.bin")
        np.concatenate([test[1][:, None].astype(np.uint8), _records(test[0])], 1).tofile(d / "test_batch.bin")
    else:
        d = root / "cifar-10-batches-py"
        os.makedirs(d)
        for name, (im, lab) in [(f"data_batch_{k}", p) for k, p in enumerate(train_parts, 1)] + [("test_batch", test)]:
            with open(d / name, "wb") as f:
                pickle.dump({b"batch_label": b"x", b"labels": [int(v) for v in lab], b"data": _records(im),
                             b"filenames": [b"f.png"] * len(lab)}, f, protocol=2)


@pytest.mark.parametrize("fmt", ["bin", "py"])
def test_cifar10_both_official_formats(tmp_path, fmt):
    parts = [_cifar_arrays(4, 10) for _ in range(5)]
    test = _cifar_arrays(3, 10)
    _write_cifar10(tmp_path, fmt, parts, test)
    train = CIFAR10Dataset(tmp_path, train=True)
    assert len(train) == 20 and train.num_classes == 10
    np.testing.assert_array_equal(train.images, np.concatenate([p[0] for p in parts]))
    np.testing.assert_array_equal(train.labels, np.concatenate([p[1] for p in parts]))
    s = train[5]
    np.testing.assert_array_equal(s.images.tensor.numpy(), _chw(parts[1][0][1]))
    tst = CIFAR10Dataset(tmp_path / ("cifar-10-batches-" + fmt), train=False)  # root = the folder itself
    np.testing.assert_array_equal(tst.labels, test[1])


@pytest.mark.parametrize("fmt", ["bin", "py"])
def test_cifar100_fine_labels(tmp_path, fmt):
    im, fine = _cifar_arrays(5, 100)
    coarse = fine // 5
    if fmt == "bin":
        d = tmp_path / "cifar-100-binary"
        os.makedirs(d)
        for name in ("train.bin", "test.bin"):
            np.concatenate([coarse[:, None].astype(np.uint8), fine[:, None].astype(np.uint8), _records(im)],
                           1).tofile(d / name)
    else:
        d = tmp_path / "cifar-100-python"
        os.makedirs(d)
        for name in ("train", "test"):
            with open(d / name, "wb") as f:
                pickle.dump({b"fine_labels": list(map(int, fine)), b"coarse_labels": list(map(int, coarse)),
                             b"data": _records(im)}, f, protocol=2)
    ds = CIFAR100Dataset(tmp_path, train=False)
    assert ds.num_classes == 100
    np.testing.assert_array_equal(ds.labels, fine)
    np.testing.assert_array_equal(ds.images, im)


class Payload:
    """Something that is not plain data: unpickling it would import and call this module's code."""

    def __reduce__(self):
        return (os.getcwd, ())


def test_cifar_python_files_admit_plain_data_only(tmp_path):
    d = tmp_path / "cifar-10-batches-py"
    os.makedirs(d)
    for name in [f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]:
        with open(d / name, "wb") as f:
            pickle.dump({b"data": np.zeros((1, 3072), np.uint8), b"labels": [0], b"x": Payload()}, f, protocol=2)
    with pytest.raises(pickle.UnpicklingError, match=r"data_batch_1: refusing to unpickle posix\.getcwd"):
        CIFAR10Dataset(tmp_path, train=True)


def test_cifar_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no train files under .*cifar-10-batches-bin.*cifar-10-batches-py"):
        CIFAR10Dataset(tmp_path)
    d = tmp_path / "cifar-10-batches-bin"
    os.makedirs(d)
    for k in range(1, 6):
        (d / f"data_batch_{k}.bin").write_bytes(b"\x00" * 3073)
    (d / "data_batch_3.bin").write_bytes(b"\x00" * 3000)
    with pytest.raises(ValueError, match=r"data_batch_3.bin: 3000 bytes is not a whole number of 3073-byte"):
        CIFAR10Dataset(tmp_path)
    (d / "data_batch_3.bin").write_bytes(b"\x0b" + b"\x00" * 3072)
    with pytest.raises(ValueError, match=r"label 11 outside \[0, 10\)"):
        CIFAR10Dataset(tmp_path)


# ------------------------------------------------------------------ the embedded default and loaders
def test_digits_default_split():
    train, test = DigitsDataset(train=True), DigitsDataset(train=False)
    assert (len(train), len(test)) == (1500, 297) and train.num_classes == 10
    assert train.images.shape == (1500, 8, 8, 3) and train.images.max() == 255 and train.images.min() == 0
    assert set(np.unique(train.labels)) == set(range(10)) and set(np.unique(test.labels)) == set(range(10))
    # the two splits are disjoint: no test image appears among the training images
    seen = {im.tobytes() + bytes([lab]) for im, lab in zip(train.images, train.labels)}
    dup = sum(im.tobytes() + bytes([lab]) in seen for im, lab in zip(test.images, test.labels))
    assert dup == 0


def test_digits_read_without_scikit_learn_are_scikit_learns(monkeypatch):
    import sklearn.datasets

    from libai.data.datasets import images
    images_, labels = images.load_digits()
    want = sklearn.datasets.load_digits()
    np.testing.assert_array_equal(images_, want.images)
    np.testing.assert_array_equal(labels, want.target)
    # a scikit-learn that keeps the file elsewhere: its own loader
    monkeypatch.setattr(images, "_DIGITS_SHAPE", (0, 0))
    np.testing.assert_array_equal(images.load_digits()[0], want.images)


def test_building_the_digits_does_not_import_scikit_learn():
    code = ("import sys; from libai.data.datasets import DigitsDataset; DigitsDataset(train=False); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sklearn', 'scipy')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def _pipeline():
    return T.Compose([T.Resize(16), T.RandomResizedCrop(16, scale=(0.5, 1.0)), T.RandomHorizontalFlip(),
                      T.ToTensor(), T.Normalize([0.5] * 3, [0.5] * 3)])


def _batches(loader, n):
    it = iter(loader)
    return [next(it) for _ in range(n)]


def test_train_loader_epochs_resume_and_mixup():
    local = np.random.default_rng(7)  # this test's own images, whatever ran before it
    ds = ArrayImageDataset(local.integers(0, 256, (12, 8, 8, 3), dtype=np.uint8), np.arange(12) % 3,
                           transform=_pipeline(), seed=4)
    loader, _, _ = build_image_train_loader(ds, train_batch_size=4, seed=1)
    first = _batches(loader, 6)  # two epochs of three batches
    assert first[0].images.tensor.shape == (4, 3, 16, 16) and first[0].labels.tensor.shape == (4,)
    again = _batches(build_image_train_loader(ds, train_batch_size=4, seed=1)[0], 6)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a.images.tensor.numpy(), b.images.tensor.numpy())
    # epoch 2 sees every image again, augmented differently
    labels = [b.labels.tensor.numpy() for b in first]
    assert sorted(np.concatenate(labels[:3])) == sorted(np.concatenate(labels[3:]))
    ep1 = {tuple(x.reshape(-1)[:8]) for b in first[:3] for x in b.images.tensor.numpy()}
    ep2 = {tuple(x.reshape(-1)[:8]) for b in first[3:] for x in b.images.tensor.numpy()}
    assert len(ep1) == len(ep2) == 12 and len(ep1 & ep2) <= 3  # (a few 16-px crops repeat by chance)
    # resume after 4 batches: the next batches are the uninterrupted run's
    resumed, _, _ = build_image_train_loader(ds, train_batch_size=4, seed=1, consumed_samples=16)
    for a, b in zip(first[4:], _batches(resumed, 2)):
        np.testing.assert_array_equal(a.images.tensor.numpy(), b.images.tensor.numpy())
    mixed, _, _ = build_image_train_loader(ds, train_batch_size=4, seed=1,
                                           mixup_func=T.Mixup(0.8, 1.0, label_smoothing=0.1, num_classes=3, seed=0))
    b = _batches(mixed, 1)[0]
    assert b.labels.tensor.shape == (4, 3)
    np.testing.assert_allclose(b.labels.tensor.numpy().sum(1), 1.0, rtol=1e-6)


def test_test_loader_is_one_ordered_pass():
    ds = DigitsDataset(train=False, transform=T.Compose([T.Resize(16), T.ToTensor()]))
    loader = build_image_test_loader(ds, test_batch_size=100)
    got = np.concatenate([b.labels.tensor.numpy() for b in loader])
    np.testing.assert_array_equal(got, ds.labels[:len(got)])
    assert len(got) >= 200


def test_a_batch_of_unequal_image_shapes_names_the_field_and_the_fix():
    """Resize(32) alone keeps a non-square image non-square: stacking the batch fails, and the
    error names the field and what to add (the recipes' test transform ends with CenterCrop)."""
    import pytest

    import engine as flow
    from libai.data.structures import DistTensorData, Instance

    batch = [Instance(images=DistTensorData(flow.zeros(3, 32, s))) for s in (32, 40)]
    with pytest.raises(ValueError, match=r"tensor shapes differ.*field 'images' must have one shape in a batch.*"
                                         r"CenterCrop"):
        Instance.stack(batch)
