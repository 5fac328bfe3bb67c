"""libai.data.transforms against torchvision: the deterministic transforms give the same pixels on
the same images; the random ones sample the same parameter distributions and, given the same
parameters, the same pixels. Mixup/CutMix soft targets against their definition.

torchvision is an optional oracle (tests/torchvision_oracle.py says why CI does not install it):
the tests marked `needs_torchvision` run beside it where it is installed; the others hold sizes
and pixel sums recorded from torchvision 0.28.0 on the same images, and run everywhere."""
import math

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision_oracle import TV, TVF

import engine as flow
from libai.data import transforms as T

rng = np.random.default_rng(0)


def _images():
    """Real-looking test images of odd sizes and modes: RGB, greyscale, wide, tall, tiny."""
    out = []
    for (h, w), mode in [((37, 53), "RGB"), ((64, 48), "RGB"), ((20, 90), "L"), ((9, 7), "RGB"), ((33, 33), "L")]:
        arr = rng.integers(0, 256, size=(h, w, 3) if mode == "RGB" else (h, w), dtype=np.uint8)
        # smooth a little so resampling filters see structure, not only noise
        arr = ((arr.astype(np.int32) + np.roll(arr, 1, axis=0) + np.roll(arr, 1, axis=1)) // 3).astype(np.uint8)
        out.append(Image.fromarray(arr, mode))
    return out


IMAGES = _images()
needs_torchvision = pytest.mark.skipif(TV is None, reason="torchvision not installed (optional oracle)")

# (image index, transform) -> (output array shape, sum of its pixels), from torchvision 0.28.0
RECORDED = {
    (0, "resize24"): ((24, 34, 3), 311523), (0, "resize20x31"): ((20, 31, 3), 236657),
    (0, "resize9bicubic"): ((9, 12, 3), 41204), (0, "center8"): ((8, 8, 3), 25548),
    (0, "center40x60"): ((40, 60, 3), 748481), (1, "resize24"): ((32, 24, 3), 294566),
    (1, "resize20x31"): ((20, 31, 3), 237566), (1, "resize9bicubic"): ((12, 9, 3), 41417),
    (1, "center8"): ((8, 8, 3), 24070), (1, "center40x60"): ((40, 60, 3), 739797),
    (2, "resize24"): ((24, 108), 324387), (2, "resize20x31"): ((20, 31), 77471),
    (2, "resize9bicubic"): ((9, 40), 44999), (2, "center8"): ((8, 8), 8024),
    (2, "center40x60"): ((40, 60), 149641), (3, "resize24"): ((30, 24, 3), 273954),
    (3, "resize20x31"): ((20, 31, 3), 235930), (3, "resize9bicubic"): ((11, 9, 3), 37627),
    (3, "center8"): ((8, 8, 3), 21455), (3, "center40x60"): ((40, 60, 3), 23958),
    (4, "resize24"): ((24, 24), 72424), (4, "resize20x31"): ((20, 31), 77865),
    (4, "resize9bicubic"): ((9, 9), 10177), (4, "center8"): ((8, 8), 8047),
    (4, "center40x60"): ((40, 60), 136819),
}
OURS = {"resize24": T.Resize(24), "resize20x31": T.Resize((20, 31)), "resize9bicubic": T.Resize(9, "bicubic"),
        "center8": T.CenterCrop(8), "center40x60": T.CenterCrop((40, 60))}


@pytest.mark.parametrize("key", sorted(RECORDED))
def test_resize_and_center_crop_match_values_recorded_from_torchvision(key):
    out = np.asarray(OURS[key[1]](IMAGES[key[0]]))
    assert (out.shape, int(out.astype(np.int64).sum())) == RECORDED[key]


def test_random_resized_crop_parameters_without_torchvision():
    gen = np.random.default_rng(3)
    params = np.array([T.RandomResizedCrop.get_params((120, 80), (0.08, 1.0), (3 / 4, 4 / 3), gen)
                       for _ in range(2000)])
    i, j, h, w = params.T
    assert (i >= 0).all() and (j >= 0).all() and (i + h <= 80).all() and (j + w <= 120).all()
    assert (np.abs(np.log(w / h)) <= np.log(4 / 3) + 0.15).all()
    # square crops of a square image always fit: the area fraction is uniform on [0.08, 1]
    square = np.array([T.RandomResizedCrop.get_params((100, 100), (0.08, 1.0), (1.0, 1.0), gen)
                       for _ in range(2000)])
    area = square[:, 2] * square[:, 3] / 1e4
    assert area.min() >= 0.07 and area.max() <= 1.0 and abs(area.mean() - 0.54) < 0.02
    # torchvision's fallback after 10 misses: the centre crop clamped to the ratio range
    assert T.RandomResizedCrop.get_params((200, 5), (0.9, 1.0), (1.0, 1.0), gen) == (0, 97, 5, 5)


def _same_image(a, b):
    assert a.size == b.size and a.mode == b.mode
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@needs_torchvision
@pytest.mark.parametrize("size", [24, 9, (20, 31), [16], 64])
@pytest.mark.parametrize("interp", ["bilinear", "bicubic", "nearest"])
def test_resize_matches_torchvision(size, interp):
    mode = getattr(TV.InterpolationMode, interp.upper())
    for img in IMAGES:
        _same_image(T.Resize(size, interpolation=interp)(img), TV.Resize(size, interpolation=mode)(img))
    img = IMAGES[0]
    _same_image(T.Resize(20, max_size=25)(img), TV.Resize(20, max_size=25)(img))
    _same_image(T.Resize(20, interpolation=mode)(img), TV.Resize(20, interpolation=mode)(img))  # the enum too


@needs_torchvision
@pytest.mark.parametrize("size", [8, 32, (7, 12), (40, 60), 1])
def test_center_crop_matches_torchvision_including_padding(size):
    for img in IMAGES:
        _same_image(T.CenterCrop(size)(img), TV.CenterCrop(size)(img))


@needs_torchvision
def test_flip_to_tensor_normalize_match_torchvision():
    for img in IMAGES:
        _same_image(T.RandomHorizontalFlip(p=1.0)(img), TV.RandomHorizontalFlip(p=1.0)(img))
        _same_image(T.RandomHorizontalFlip(p=0.0)(img), img)
        ours = T.ToTensor()(img)
        theirs = TV.ToTensor()(img)
        assert isinstance(ours, flow.Tensor) and ours.dtype == flow.float32
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
        c = theirs.shape[0]
        mean, std = [0.485, 0.456, 0.406][:c], [0.229, 0.224, 0.225][:c]
        np.testing.assert_allclose(T.Normalize(mean, std)(ours).numpy(), TV.Normalize(mean, std)(theirs).numpy(),
                                   rtol=1e-6, atol=1e-6)
    arr = np.asarray(IMAGES[0])
    np.testing.assert_array_equal(T.ToTensor()(arr).numpy(), TV.ToTensor()(arr).numpy())


@needs_torchvision
def test_random_resized_crop_same_pixels_for_the_same_parameters():
    for img in IMAGES:
        w, h = img.size
        for _ in range(5):
            i, j, ch, cw = T.RandomResizedCrop.get_params(img.size, (0.08, 1.0), (3 / 4, 4 / 3))
            assert 0 <= i and 0 <= j and 0 < ch <= h and 0 < cw <= w and i + ch <= h and j + cw <= w
            ours = img.crop((j, i, j + cw, i + ch)).resize((17, 13), Image.BILINEAR)
            theirs = TVF.resized_crop(img, i, j, ch, cw, [13, 17], TV.InterpolationMode.BILINEAR)
            _same_image(ours, theirs)
        with T.sample_rng(3, 0, 1):
            out = T.RandomResizedCrop((13, 17))(img)
        assert out.size == (17, 13)


@needs_torchvision
def test_random_resized_crop_parameter_distribution_matches_torchvision():
    """Area fraction and log aspect ratio of 4,000 crops: same means and spreads as torchvision's."""
    img = Image.new("RGB", (120, 80))
    gen = np.random.default_rng(1)
    torch.manual_seed(1)
    ours = np.array([T.RandomResizedCrop.get_params(img.size, (0.08, 1.0), (3 / 4, 4 / 3), gen) for _ in range(4000)])
    theirs = np.array([TV.RandomResizedCrop.get_params(img, [0.08, 1.0], [3 / 4, 4 / 3]) for _ in range(4000)])
    for params in (ours, theirs):
        assert (params[:, 2] > 0).all() and (params[:, 0] + params[:, 2] <= 80).all()
    area = [p[:, 2] * p[:, 3] / (120 * 80) for p in (ours, theirs)]
    logr = [np.log(p[:, 3] / p[:, 2]) for p in (ours, theirs)]
    for a, b in (area, logr):
        assert abs(a.mean() - b.mean()) < 4 * math.sqrt(a.var() / 4000 + b.var() / 4000)
        assert abs(a.std() - b.std()) < 0.1 * b.std()
    # the fallback: an extreme aspect ratio never fits in 10 tries -> the same centre crop
    thin = Image.new("RGB", (200, 5))
    assert T.RandomResizedCrop.get_params(thin.size, (0.9, 1.0), (1.0, 1.0), gen) == \
        tuple(TV.RandomResizedCrop.get_params(thin, [0.9, 1.0], [1.0, 1.0]))


def test_flip_probability_and_sample_rng_determinism():
    img = IMAGES[0]
    flipped = img.transpose(Image.FLIP_LEFT_RIGHT)
    t = T.RandomHorizontalFlip(0.3)
    count = 0
    for k in range(2000):
        with T.sample_rng(0, 0, k):
            count += np.array_equal(np.asarray(t(img)), np.asarray(flipped))
    assert abs(count / 2000 - 0.3) < 4 * math.sqrt(0.3 * 0.7 / 2000)
    pipe = T.Compose([T.RandomResizedCrop(16), T.RandomHorizontalFlip(), T.ToTensor()])
    with T.sample_rng(5, 2, 9):
        a = pipe(img).numpy()
    with T.sample_rng(5, 2, 9):
        b = pipe(img).numpy()
    with T.sample_rng(5, 3, 9):
        c = pipe(img).numpy()
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_to_tensor_and_normalize_without_torchvision():
    for img in IMAGES:
        arr = np.asarray(img)
        chw = (arr if arr.ndim == 3 else arr[:, :, None]).transpose(2, 0, 1)
        t = T.ToTensor()(img)
        np.testing.assert_array_equal(t.numpy(), chw.astype(np.float32) / np.float32(255))
        mean, std = np.array([0.4, 0.5, 0.6][:chw.shape[0]]), np.array([0.2, 0.25, 0.3][:chw.shape[0]])
        want = (t.numpy() - mean[:, None, None].astype(np.float32)) / std[:, None, None].astype(np.float32)
        np.testing.assert_allclose(T.Normalize(mean, std)(t).numpy(), want, rtol=1e-6)
        _same_image(T.RandomHorizontalFlip(1.0)(img), img.transpose(Image.FLIP_LEFT_RIGHT))


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="interpolation must be one of"):
        T.Resize(8, interpolation="cubicle")
    with pytest.raises(NotImplementedError, match="antialias=False"):
        T.Resize(8, antialias=False)
    with pytest.raises(TypeError, match="CenterCrop: expected a PIL image"):
        T.CenterCrop(4)([1, 2, 3])
    with pytest.raises(ValueError, match="std evaluated to zero"):
        T.Normalize([0.5], [0.0])
    with pytest.raises(ValueError, match="mean/std of 3/3 values for a tensor of shape"):
        T.Normalize([0.5] * 3, [0.5] * 3)(flow.zeros(2, 4, 4))


@pytest.mark.parametrize("mix,cut", [(0.8, 0.0), (0.0, 1.0), (0.8, 1.0)])
def test_mixup_and_cutmix_soft_targets(mix, cut):
    x = rng.standard_normal((8, 3, 10, 12)).astype(np.float32)
    y = np.array([0, 1, 2, 3, 4, 0, 1, 2])
    m = T.Mixup(mixup_alpha=mix, cutmix_alpha=cut, label_smoothing=0.1, num_classes=5, seed=0)
    seen_cut = seen_mix = False
    for _ in range(20):
        xm, soft = m(flow.tensor(x), flow.tensor(y))
        xm, soft = xm.numpy(), soft.numpy()
        np.testing.assert_allclose(soft.sum(1), 1.0, rtol=1e-6)
        # the soft target is lam * smooth(y) + (1 - lam) * smooth(y reversed): recover lam from row 0
        on, off = 1 - 0.1 + 0.02, 0.02
        lam = (soft[0, y[0]] - off) / (on - off) if y[0] != y[-1] else 1.0
        changed = ~np.isclose(xm, x)
        if changed.any() and (changed == changed[:, :1, :, :]).all() and not changed.all():
            seen_cut = True  # a box: lam is one minus the box's area fraction
            frac = changed[0, 0].mean()
            assert abs((1 - lam) - frac) < 1e-5
            np.testing.assert_array_equal(xm[changed], x[::-1][changed])
        elif changed.any():
            seen_mix = True
            np.testing.assert_allclose(xm, lam * x + (1 - lam) * x[::-1], rtol=1e-5, atol=1e-5)
    assert seen_cut == (cut > 0) and seen_mix == (mix > 0)
    with pytest.raises(ValueError, match="even N"):
        m(flow.tensor(x[:3]), flow.tensor(y[:3]))
    with pytest.raises(NotImplementedError, match="mode='elem'"):
        T.Mixup(mode="elem")


def test_soft_target_cross_entropy_equals_the_mixup_definition():
    """The loss of mixed labels: -sum(soft * log_softmax(logits)) = lam * CE(y) + (1 - lam) * CE(y')
    when label smoothing is off."""
    logits = rng.standard_normal((6, 4)).astype(np.float32)
    y = np.array([0, 1, 2, 3, 1, 0])
    m = T.Mixup(mixup_alpha=1.0, label_smoothing=0.0, num_classes=4, seed=2)
    _, soft = m(flow.tensor(rng.standard_normal((6, 1, 2, 2)).astype(np.float32)), flow.tensor(y))
    soft = soft.numpy()
    logp = torch.log_softmax(torch.from_numpy(logits), -1).numpy()
    lam = soft[2, y[2]]  # a row whose two labels differ (2 and 3)
    want = lam * -logp[np.arange(6), y] + (1 - lam) * -logp[np.arange(6), y[::-1]]
    np.testing.assert_allclose(-(soft * logp).sum(1), want, rtol=1e-5)
