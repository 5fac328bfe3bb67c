"""Image transforms with torchvision's names and semantics, on Pillow images and numpy arrays.

`Compose, Resize, CenterCrop, RandomResizedCrop, RandomHorizontalFlip, ToTensor, Normalize` do
what torchvision's (v1, PIL backend) do, to the pixel: geometry through the same Pillow calls,
the same rounding of sizes and offsets, the same parameter sampling of the random ones
(tests/data/test_image_transforms.py runs torchvision beside them). `Mixup` (mixup and CutMix
with label smoothing, timm's batch mode) works on a collated batch.

Randomness: a random transform draws from `rng()`, the generator of the sample being loaded.
`ImageDataset.__getitem__` sets it from (dataset seed, epoch, index) with `sample_rng(...)`, so
the augmentation of a sample is the same in every run with that seed and after a resume, and
differs between epochs. Called outside a dataset, transforms draw from a process-wide generator
(`set_default_seed` reseeds it).
"""
import contextlib
import math
import numbers
import threading

import numpy as np
from PIL import Image

import engine as flow

__all__ = ["Compose", "Resize", "CenterCrop", "RandomResizedCrop", "RandomHorizontalFlip", "ToTensor",
           "Normalize", "Mixup", "InterpolationMode", "rng", "sample_rng", "set_default_seed"]


class InterpolationMode:
    """torchvision's interpolation names, as Pillow resampling filters."""

    NEAREST = "nearest"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


_PIL_FILTERS = {"nearest": Image.NEAREST, "bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC,
                "box": Image.BOX, "hamming": Image.HAMMING, "lanczos": Image.LANCZOS}


def _pil_filter(interpolation):
    name = getattr(interpolation, "value", interpolation)  # torchvision's enum, a string, or ours
    if isinstance(name, str) and name.lower() in _PIL_FILTERS:
        return _PIL_FILTERS[name.lower()]
    raise ValueError(f"interpolation must be one of {sorted(_PIL_FILTERS)}, got {interpolation!r}")


# ------------------------------------------------------------------ randomness
_state = threading.local()
_default = np.random.default_rng()


def rng():
    """The generator random transforms draw from: the current sample's, else the default."""
    return getattr(_state, "rng", None) or _default


def set_default_seed(seed):
    global _default
    _default = np.random.default_rng(seed)


@contextlib.contextmanager
def sample_rng(*key):
    """Random transforms inside draw from `np.random.default_rng(key)` (e.g. seed, epoch, index)."""
    before = getattr(_state, "rng", None)
    _state.rng = np.random.default_rng([int(k) for k in key])
    try:
        yield _state.rng
    finally:
        _state.rng = before


# ------------------------------------------------------------------ helpers
def _size_pair(size, name):
    if isinstance(size, numbers.Number):
        return int(size), int(size)
    size = tuple(int(s) for s in size)
    if len(size) == 1:
        return size[0], size[0]
    if len(size) != 2:
        raise ValueError(f"{name}: size must be an int or a (height, width) pair, got {size}")
    return size


def _as_pil(img, name):
    if isinstance(img, Image.Image):
        return img
    if isinstance(img, np.ndarray) and img.ndim in (2, 3) and img.dtype == np.uint8:
        return Image.fromarray(img)
    raise TypeError(f"{name}: expected a PIL image or an HxW(xC) uint8 array, got "
                    f"{type(img).__name__}{'' if not hasattr(img, 'shape') else ' ' + str(img.shape)}")


class Compose:
    def __init__(self, transforms):
        self.transforms = list(transforms)

    def __call__(self, img):
        for t in self.transforms:
            img = t(img)
        return img

    def __repr__(self):
        inner = "".join(f"\n    {t!r}," for t in self.transforms)
        return f"Compose({inner}\n)"


class Resize:
    """Resize to `size` (h, w), or, for an int, the smaller edge to `size` keeping the aspect ratio
    (the longer edge `int(size * long / short)`, capped by `max_size`)."""

    def __init__(self, size, interpolation=InterpolationMode.BILINEAR, max_size=None, antialias=True):
        if not antialias:
            raise NotImplementedError("Resize(antialias=False): Pillow always antialiases; not implemented")
        self.size = size if isinstance(size, numbers.Number) else tuple(size)
        self.resample = _pil_filter(interpolation)
        self.max_size = max_size

    def output_size(self, w, h):
        if not isinstance(self.size, numbers.Number) and len(self.size) == 2:
            return int(self.size[1]), int(self.size[0])
        size = int(self.size if isinstance(self.size, numbers.Number) else self.size[0])
        short, long = (w, h) if w <= h else (h, w)
        new_short, new_long = size, int(size * long / short)
        if self.max_size is not None:
            if self.max_size <= size:
                raise ValueError(f"Resize: max_size ({self.max_size}) must be larger than size ({size})")
            if new_long > self.max_size:
                new_short, new_long = int(self.max_size * new_short / new_long), self.max_size
        return (new_short, new_long) if w <= h else (new_long, new_short)

    def __call__(self, img):
        img = _as_pil(img, "Resize")
        size = self.output_size(*img.size)
        return img if size == img.size else img.resize(size, self.resample)

    def __repr__(self):
        return f"Resize(size={self.size})"


class CenterCrop:
    """Crop the centre (h, w); an image smaller than that is zero-padded first, as torchvision."""

    def __init__(self, size):
        self.size = _size_pair(size, "CenterCrop")

    def __call__(self, img):
        img = _as_pil(img, "CenterCrop")
        th, tw = self.size
        w, h = img.size
        if tw > w or th > h:
            left, top = (tw - w) // 2 if tw > w else 0, (th - h) // 2 if th > h else 0
            right, bottom = (tw - w + 1) // 2 if tw > w else 0, (th - h + 1) // 2 if th > h else 0
            padded = Image.new(img.mode, (w + left + right, h + top + bottom), 0)
            padded.paste(img, (left, top))
            img, (w, h) = padded, padded.size
            if (w, h) == (tw, th):
                return img
        top = int(round((h - th) / 2.0))
        left = int(round((w - tw) / 2.0))
        return img.crop((left, top, left + tw, top + th))

    def __repr__(self):
        return f"CenterCrop(size={self.size})"


class RandomResizedCrop:
    """A crop of random area (`scale` of the image) and aspect ratio (`ratio`, sampled
    log-uniformly), resized to `size`: torchvision's parameter sampling, 10 tries then a centre
    crop clamped to the ratio range."""

    def __init__(self, size, scale=(0.08, 1.0), ratio=(3.0 / 4.0, 4.0 / 3.0),
                 interpolation=InterpolationMode.BILINEAR, antialias=True):
        if not antialias:
            raise NotImplementedError("RandomResizedCrop(antialias=False): not implemented")
        self.size = _size_pair(size, "RandomResizedCrop")
        if scale[0] > scale[1] or ratio[0] > ratio[1]:
            raise ValueError(f"RandomResizedCrop: scale and ratio must be (min, max), got {scale}, {ratio}")
        self.scale, self.ratio = tuple(scale), tuple(ratio)
        self.resample = _pil_filter(interpolation)

    @staticmethod
    def get_params(img_size, scale, ratio, gen=None):
        """(top, left, height, width) of the crop for an image of (width, height) `img_size`."""
        gen = gen or rng()
        width, height = img_size
        area = height * width
        log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
        for _ in range(10):
            target_area = area * gen.uniform(scale[0], scale[1])
            aspect = math.exp(gen.uniform(log_ratio[0], log_ratio[1]))
            w = int(round(math.sqrt(target_area * aspect)))
            h = int(round(math.sqrt(target_area / aspect)))
            if 0 < w <= width and 0 < h <= height:
                i = int(gen.integers(0, height - h + 1))
                j = int(gen.integers(0, width - w + 1))
                return i, j, h, w
        in_ratio = width / height
        if in_ratio < min(ratio):
            w, h = width, int(round(width / min(ratio)))
        elif in_ratio > max(ratio):
            h, w = height, int(round(height * max(ratio)))
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w

    def __call__(self, img):
        img = _as_pil(img, "RandomResizedCrop")
        i, j, h, w = self.get_params(img.size, self.scale, self.ratio)
        return img.crop((j, i, j + w, i + h)).resize((self.size[1], self.size[0]), self.resample)

    def __repr__(self):
        return f"RandomResizedCrop(size={self.size}, scale={self.scale}, ratio={self.ratio})"


class RandomHorizontalFlip:
    def __init__(self, p=0.5):
        self.p = float(p)

    def __call__(self, img):
        flip = rng().random() < self.p
        if isinstance(img, np.ndarray):
            return img[:, ::-1].copy() if flip else img
        img = _as_pil(img, "RandomHorizontalFlip")
        return img.transpose(Image.FLIP_LEFT_RIGHT) if flip else img

    def __repr__(self):
        return f"RandomHorizontalFlip(p={self.p})"


class ToTensor:
    """A PIL image or HxW(xC) uint8 array -> float32 tensor [C, H, W] in [0, 1]."""

    def __call__(self, img):
        if isinstance(img, Image.Image):
            arr = np.asarray(img.convert("RGB") if img.mode in ("P", "CMYK", "YCbCr") else img)
        elif isinstance(img, np.ndarray):
            arr = img
        else:
            raise TypeError(f"ToTensor: expected a PIL image or a numpy array, got {type(img).__name__}")
        if arr.ndim == 2:
            arr = arr[:, :, None]
        if arr.ndim != 3:
            raise ValueError(f"ToTensor: expected HxW or HxWxC, got shape {arr.shape}")
        chw = np.ascontiguousarray(arr.transpose(2, 0, 1))
        if chw.dtype == np.uint8:
            chw = chw.astype(np.float32) / np.float32(255)
        return flow.tensor(chw.astype(np.float32, copy=False))

    def __repr__(self):
        return "ToTensor()"


class Normalize:
    """(x - mean) / std per channel of a [C, H, W] (or [N, C, H, W]) tensor."""

    def __init__(self, mean, std, inplace=False):
        self.mean = np.asarray(mean, np.float32).reshape(-1)
        self.std = np.asarray(std, np.float32).reshape(-1)
        if (self.std == 0).any():
            raise ValueError(f"Normalize: std evaluated to zero ({list(self.std)}), leading to division by zero")

    def __call__(self, t):
        arr = t.numpy() if isinstance(t, flow.Tensor) else np.asarray(t, np.float32)
        c = arr.shape[-3] if arr.ndim >= 3 else None
        if c is None or self.mean.size not in (1, c) or self.std.size not in (1, c):
            raise ValueError(f"Normalize: mean/std of {self.mean.size}/{self.std.size} values for a tensor of "
                             f"shape {tuple(arr.shape)} (channels on axis -3)")
        out = (arr - self.mean[:, None, None]) / self.std[:, None, None]
        return flow.tensor(out.astype(np.float32, copy=False))

    def __repr__(self):
        return f"Normalize(mean={list(self.mean)}, std={list(self.std)})"


# ------------------------------------------------------------------ mixup / cutmix
def _one_hot_smoothed(labels, num_classes, smoothing):
    off = smoothing / num_classes
    out = np.full((labels.shape[0], num_classes), off, np.float32)
    out[np.arange(labels.shape[0]), labels] = 1.0 - smoothing + off
    return out


class Mixup:
    """Mixup and CutMix on a batch with label smoothing (timm's `Mixup`, batch mode): images [N, C,
    H, W] and integer labels [N] -> mixed images and soft targets [N, num_classes] that sum to 1.

    With probability `prob` a batch is mixed with its reverse; when both alphas are > 0, CutMix is
    chosen with probability `switch_prob`. `lam ~ Beta(alpha, alpha)`; CutMix pastes a box of area
    about 1 - lam and then uses the box's true area for lam (`correct_lam`)."""

    def __init__(self, mixup_alpha=1.0, cutmix_alpha=0.0, cutmix_minmax=None, prob=1.0, switch_prob=0.5,
                 mode="batch", correct_lam=True, label_smoothing=0.1, num_classes=1000, seed=None):
        if mode != "batch":
            raise NotImplementedError(f"Mixup(mode={mode!r}): only 'batch' is implemented")
        if cutmix_minmax is not None:
            raise NotImplementedError("Mixup(cutmix_minmax=...): not implemented")
        if mixup_alpha <= 0 and cutmix_alpha <= 0:
            raise ValueError("Mixup: at least one of mixup_alpha and cutmix_alpha must be > 0")
        self.mixup_alpha, self.cutmix_alpha = float(mixup_alpha), float(cutmix_alpha)
        self.prob, self.switch_prob = float(prob), float(switch_prob)
        self.correct_lam, self.label_smoothing = bool(correct_lam), float(label_smoothing)
        self.num_classes = int(num_classes)
        self.gen = np.random.default_rng(seed)

    def _params(self):
        if self.gen.random() >= self.prob:
            return 1.0, False
        use_cutmix = self.cutmix_alpha > 0 and (self.mixup_alpha <= 0 or self.gen.random() < self.switch_prob)
        alpha = self.cutmix_alpha if use_cutmix else self.mixup_alpha
        return float(self.gen.beta(alpha, alpha)), use_cutmix

    def _box(self, h, w, lam):
        cut = math.sqrt(1.0 - lam)
        ch, cw = int(h * cut), int(w * cut)
        cy, cx = int(self.gen.integers(0, h)), int(self.gen.integers(0, w))
        y0, y1 = np.clip(cy - ch // 2, 0, h), np.clip(cy + ch // 2, 0, h)
        x0, x1 = np.clip(cx - cw // 2, 0, w), np.clip(cx + cw // 2, 0, w)
        return int(y0), int(y1), int(x0), int(x1)

    def __call__(self, images, labels):
        x = images.numpy() if isinstance(images, flow.Tensor) else np.asarray(images)
        y = labels.numpy() if isinstance(labels, flow.Tensor) else np.asarray(labels)
        if x.ndim != 4 or x.shape[0] % 2:
            raise ValueError(f"Mixup: expected images [N, C, H, W] with an even N, got shape {tuple(x.shape)}")
        if y.ndim != 1 or y.shape[0] != x.shape[0]:
            raise ValueError(f"Mixup: labels must be [N] integer class ids, got shape {tuple(y.shape)}")
        lam, use_cutmix = self._params()
        x = x.astype(np.float32, copy=True)
        if lam != 1.0:
            flipped = x[::-1].copy()
            if use_cutmix:
                y0, y1, x0, x1 = self._box(x.shape[2], x.shape[3], lam)
                x[:, :, y0:y1, x0:x1] = flipped[:, :, y0:y1, x0:x1]
                if self.correct_lam:
                    lam = 1.0 - (y1 - y0) * (x1 - x0) / float(x.shape[2] * x.shape[3])
            else:
                x = x * np.float32(lam) + flipped * np.float32(1.0 - lam)
        y = y.astype(np.int64)
        soft = (_one_hot_smoothed(y, self.num_classes, self.label_smoothing) * lam
                + _one_hot_smoothed(y[::-1], self.num_classes, self.label_smoothing) * (1.0 - lam))
        return flow.tensor(x), flow.tensor(soft.astype(np.float32))
