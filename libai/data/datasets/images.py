"""Image classification datasets: an ImageNet-style folder, CIFAR-10/100 from their official files,
arrays in memory, and the embedded default (scikit-learn's handwritten digits).

Every dataset returns LiBai's sample, `Instance(images=DistTensorData([C, H, W] float32),
labels=DistTensorData(int64 class id, placement_idx=-1))`, after its `transform` (default:
`ToTensor()`). Random transforms draw from the sample's own generator, seeded with (dataset seed,
epoch, index): `CommonDataLoader` tells a dataset the epoch (`set_epoch`) before each batch, so
augmentations are reproducible, survive a resume, and change from epoch to epoch.
"""
import importlib.util
import os
import pickle

import numpy as np
from PIL import Image

import engine as flow
from libai.data import transforms as T
from libai.data.structures import DistTensorData, Instance

__all__ = ["ImageDataset", "ImageFolder", "CIFAR10Dataset", "CIFAR100Dataset", "ArrayImageDataset",
           "DigitsDataset", "IMG_EXTENSIONS"]

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class ImageDataset:
    """Base: subclasses set `self.num_classes`, implement `__len__` and `_load(i) -> (image, label)`
    with image a PIL image or an HxW(xC) uint8 array."""

    def __init__(self, transform=None, seed=0):
        self.transform = transform if transform is not None else T.ToTensor()
        self.seed = int(seed)
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = int(epoch)

    def _load(self, i):
        raise NotImplementedError

    def __getitem__(self, i):
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"{type(self).__name__}: index {i} out of range for {n} images")
        i %= n
        img, label = self._load(i)
        with T.sample_rng(self.seed, self.epoch, i):
            x = self.transform(img)
        if not isinstance(x, flow.Tensor):
            x = flow.tensor(np.asarray(x, np.float32))
        return Instance(images=DistTensorData(x),
                        labels=DistTensorData(flow.tensor(int(label), dtype=flow.int64), placement_idx=-1))


# ------------------------------------------------------------------ ImageNet-style folder
class ImageFolder(ImageDataset):
    """`root/<class>/<image>`: classes are the sub-folders in sorted order (class id = position),
    images every file with an image extension below them, sorted; decoded with Pillow as RGB.
    A class folder without such a file is an error (as torchvision's): counted as a class, it
    would shift the ids of the classes after it between a train and a val folder."""

    def __init__(self, root, transform=None, extensions=IMG_EXTENSIONS, seed=0):
        super().__init__(transform, seed)
        root = os.path.expanduser(str(root))
        if not os.path.isdir(root):
            raise FileNotFoundError(f"ImageFolder: {root} is not a directory")
        self.root = root
        self.classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
        if not self.classes:
            raise FileNotFoundError(f"ImageFolder: no class folders in {root} (expected root/<class>/<image>)")
        self.class_to_idx = {c: k for k, c in enumerate(self.classes)}
        exts = tuple(e.lower() for e in extensions)
        self.samples = []
        for c in self.classes:
            for dirpath, _, files in sorted(os.walk(os.path.join(root, c), followlinks=True)):
                for f in sorted(files):
                    if f.lower().endswith(exts):
                        self.samples.append((os.path.join(dirpath, f), self.class_to_idx[c]))
        if not self.samples:
            raise FileNotFoundError(f"ImageFolder: no images with extensions {exts} under {root}")
        empty = sorted(set(self.classes) - {self.classes[k] for _, k in self.samples})
        if empty:
            raise FileNotFoundError(
                f"ImageFolder: Found no valid file for the classes {', '.join(empty)}. Supported extensions are: "
                f"{', '.join(exts)} (in {', '.join(os.path.join(root, c) for c in empty)}; remove the folder or "
                f"add its images: a class folder without images would shift the class ids after it)")
        self.num_classes = len(self.classes)
        self.targets = [s[1] for s in self.samples]

    def __len__(self):
        return len(self.samples)

    def _load(self, i):
        path, label = self.samples[i]
        try:
            with Image.open(path) as im:
                return im.convert("RGB"), label
        except Exception as e:
            raise RuntimeError(f"ImageFolder: cannot decode {path}: {e}") from e


# ------------------------------------------------------------------ CIFAR
class _PlainDataUnpickler(pickle.Unpickler):
    """Admits plain containers, bytes, numbers and numpy arrays, nothing else: the CIFAR python
    files are pickles, and unpickling an arbitrary object can run arbitrary code."""

    _ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
                ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
                ("numpy._core.multiarray", "scalar"), ("_codecs", "encode")}

    def __init__(self, f, path):
        super().__init__(f, encoding="bytes")
        self.path = path

    def find_class(self, module, name):
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{self.path}: refusing to unpickle {module}.{name} (only plain data and "
                                     "numpy arrays are allowed in a CIFAR file)")


def _load_pickle(path):
    with open(path, "rb") as f:
        try:
            return _PlainDataUnpickler(f, path).load()
        except pickle.UnpicklingError:
            raise
        except Exception as e:
            raise RuntimeError(f"{path}: not a readable CIFAR python batch ({e})") from e


def _field(d, name, path):
    for key in (name.encode(), name):
        if key in d:
            return d[key]
    raise KeyError(f"{path}: no '{name}' entry (found {sorted(map(str, d))})")


class _CIFAR(ImageDataset):
    """CIFAR from the official files, binary or python version (found under `root`, or `root` is
    the batches folder itself). Images are kept as one uint8 array [N, 32, 32, 3]."""

    _bin_dir = _py_dir = None
    _bin_files = _py_files = None
    _label_bytes = 1
    _label_offset = 0
    _py_label = "labels"
    num_classes = None

    def __init__(self, root, train=True, transform=None, seed=0):
        super().__init__(transform, seed)
        root = os.path.expanduser(str(root))
        split = "train" if train else "test"
        images, labels = self._read(root, split)
        self.images, self.labels = images, labels.astype(np.int64)
        self.train = bool(train)

    def _find(self, root, sub, files):
        for d in (os.path.join(root, sub), root):
            paths = [os.path.join(d, f) for f in files]
            if all(os.path.isfile(p) for p in paths):
                return paths
        return None

    def _read(self, root, split):
        paths = self._find(root, self._bin_dir, self._bin_files[split])
        if paths is not None:
            return self._read_binary(paths)
        paths = self._find(root, self._py_dir, self._py_files[split])
        if paths is not None:
            return self._read_python(paths)
        raise FileNotFoundError(
            f"{type(self).__name__}: no {split} files under {root}: expected the binary version "
            f"({self._bin_dir}/{', '.join(self._bin_files[split])}) or the python version "
            f"({self._py_dir}/{', '.join(self._py_files[split])})")

    def _read_binary(self, paths):
        record = self._label_bytes + 3072
        images, labels = [], []
        for p in paths:
            raw = np.fromfile(p, dtype=np.uint8)
            if raw.size == 0 or raw.size % record:
                raise ValueError(f"{p}: {raw.size} bytes is not a whole number of {record}-byte CIFAR records")
            rows = raw.reshape(-1, record)
            labels.append(rows[:, self._label_offset].astype(np.int64))
            images.append(rows[:, self._label_bytes:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
        return self._checked(np.concatenate(images), np.concatenate(labels), paths)

    def _read_python(self, paths):
        images, labels = [], []
        for p in paths:
            d = _load_pickle(p)
            if not isinstance(d, dict):
                raise ValueError(f"{p}: expected a dict, got {type(d).__name__}")
            data = np.asarray(_field(d, "data", p))
            if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
                raise ValueError(f"{p}: 'data' must be uint8 [N, 3072], got {data.dtype} {data.shape}")
            lab = np.asarray(_field(d, self._py_label, p), dtype=np.int64)
            if lab.shape != (data.shape[0],):
                raise ValueError(f"{p}: {lab.shape[0]} labels for {data.shape[0]} images")
            images.append(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
            labels.append(lab)
        return self._checked(np.concatenate(images), np.concatenate(labels), paths)

    def _checked(self, images, labels, paths):
        bad = (labels < 0) | (labels >= self.num_classes)
        if bad.any():
            raise ValueError(f"{paths[0]}: label {int(labels[bad][0])} outside [0, {self.num_classes})")
        return np.ascontiguousarray(images), labels

    def __len__(self):
        return len(self.labels)

    def _load(self, i):
        return Image.fromarray(self.images[i]), int(self.labels[i])


class CIFAR10Dataset(_CIFAR):
    """CIFAR-10: `cifar-10-batches-bin/` (data_batch_1..5.bin, test_batch.bin) or
    `cifar-10-batches-py/` (data_batch_1..5, test_batch)."""

    num_classes = 10
    _bin_dir, _py_dir = "cifar-10-batches-bin", "cifar-10-batches-py"
    _bin_files = {"train": [f"data_batch_{k}.bin" for k in range(1, 6)], "test": ["test_batch.bin"]}
    _py_files = {"train": [f"data_batch_{k}" for k in range(1, 6)], "test": ["test_batch"]}


class CIFAR100Dataset(_CIFAR):
    """CIFAR-100 fine labels: `cifar-100-binary/` (train.bin, test.bin; records of coarse and fine
    label bytes then the image) or `cifar-100-python/` (train, test)."""

    num_classes = 100
    _bin_dir, _py_dir = "cifar-100-binary", "cifar-100-python"
    _bin_files = {"train": ["train.bin"], "test": ["test.bin"]}
    _py_files = {"train": ["train"], "test": ["test"]}
    _label_bytes, _label_offset = 2, 1
    _py_label = "fine_labels"


# ------------------------------------------------------------------ arrays
class ArrayImageDataset(ImageDataset):
    """Images held in memory: uint8 [N, H, W] or [N, H, W, C], and integer labels [N]."""

    def __init__(self, images, labels, transform=None, num_classes=None, seed=0):
        super().__init__(transform, seed)
        images, labels = np.asarray(images), np.asarray(labels)
        if images.dtype != np.uint8 or images.ndim not in (3, 4):
            raise ValueError(f"ArrayImageDataset: images must be uint8 [N, H, W(, C)], got {images.dtype} "
                             f"{images.shape}")
        if labels.shape != (images.shape[0],) or labels.dtype.kind not in "iu":
            raise ValueError(f"ArrayImageDataset: labels must be integers [{images.shape[0]}], got {labels.dtype} "
                             f"{labels.shape}")
        self.images, self.labels = images, labels.astype(np.int64)
        self.num_classes = int(num_classes if num_classes is not None else self.labels.max() + 1)

    def __len__(self):
        return len(self.labels)

    def _load(self, i):
        return self.images[i], int(self.labels[i])


class DigitsDataset(ArrayImageDataset):
    """The embedded default: scikit-learn's handwritten digits (1,797 real 8x8 grey images of the
    digits 0-9, shipped inside scikit-learn, so nothing is downloaded), as RGB uint8 with pixel
    values 0-255. A fixed shuffle (seed 0) puts 1,500 in "train" and 297 in "test"."""

    TRAIN_SIZE = 1500

    def __init__(self, train=True, transform=None, seed=0):
        images, target = load_digits()
        order = np.random.RandomState(0).permutation(len(target))
        part = order[:self.TRAIN_SIZE] if train else order[self.TRAIN_SIZE:]
        grey = np.round(images[part] * (255.0 / 16.0)).astype(np.uint8)  # values 0..16
        rgb = np.repeat(grey[..., None], 3, axis=-1)
        super().__init__(rgb, target[part], transform=transform, num_classes=10, seed=seed)
        self.train = bool(train)


_DIGITS_SHAPE = (1797, 65)  # 64 pixels and the label per row


def load_digits():
    """scikit-learn's digits as (images float64 [1797, 8, 8] with values 0..16, labels int64
    [1797]), what sklearn.datasets.load_digits returns, read from the file inside scikit-learn
    without importing it: importing scikit-learn (and scipy with it) costs ~3 s in every process
    that builds a vision recipe's data. Where a scikit-learn keeps the file elsewhere, its own
    loader."""
    spec = importlib.util.find_spec("sklearn")
    path = os.path.join(os.path.dirname(spec.origin), "datasets", "data", "digits.csv.gz") \
        if spec is not None and spec.origin else None
    if path is not None and os.path.isfile(path):
        data = np.loadtxt(path, delimiter=",")
        if data.shape == _DIGITS_SHAPE:
            return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits as sklearn_load_digits

    digits = sklearn_load_digits()
    return digits.images, digits.target.astype(np.int64)
