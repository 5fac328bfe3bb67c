"""Parity cases for engine/ops/vision.py: pixel_shuffle / pixel_unshuffle (batched, unbatched,
extra leading dims, integer dtype, round trip), unfold / fold (kernel, dilation, padding and
stride each as ints and pairs, unbatched inputs, overlapping blocks that fold sums, a 1x1 kernel,
float64, a non-contiguous input, double backward), affine_grid (2-D and 3-D, align_corners both
ways, unit sizes) and grid_sample (every mode x padding_mode x align_corners on odd sizes, 5-D,
grids reaching outside [-1, 1], unit spatial sizes, empty batch and grid, float32, affine_grid
feeding grid_sample)."""
import itertools
from harness import Input as I, OpCase


def _nf(m):
    return m.nn.functional


CASES = [
    OpCase("pixel_shuffle", lambda m, a: _nf(m).pixel_shuffle(a, 3), [I((2, 18, 3, 5))]),
    OpCase("pixel_shuffle", lambda m, a: _nf(m).pixel_shuffle(a, 2), [I((8, 3, 5), noncontig=True)], name="unbatched"),
    OpCase("pixel_shuffle", lambda m, a: _nf(m).pixel_shuffle(a, 2), [I((2, 1, 4, 3, 1))], name="5d"),
    OpCase("pixel_shuffle", lambda m, a: _nf(m).pixel_shuffle(a, 1), [I((2, 3, 4, 5))], name="factor1"),
    OpCase("pixel_shuffle", lambda m, a: _nf(m).pixel_shuffle(a, 2), [I((2, 4, 3, 3), "int64", "int", -9, 9)],
           name="int"),
    OpCase("pixel_shuffle", lambda m, a: _nf(m).pixel_shuffle(a, 2), [I((0, 4, 3, 3))], name="empty-batch",
           backward=False),  # torch's own PixelShuffleBackward0 fails on an empty batch
    OpCase("pixel_unshuffle", lambda m, a: _nf(m).pixel_unshuffle(a, 2), [I((2, 3, 6, 4))]),
    OpCase("pixel_unshuffle", lambda m, a: _nf(m).pixel_unshuffle(a, 3), [I((1, 9, 3), noncontig=True)],
           name="unbatched"),
    OpCase("pixel_unshuffle", lambda m, a: _nf(m).pixel_unshuffle(_nf(m).pixel_shuffle(a, 2), 2),
           [I((2, 1, 12, 3, 5), "float64")], name="round-trip"),
    OpCase("unfold", lambda m, a: _nf(m).unfold(a, 3), [I((2, 3, 7, 6))]),
    OpCase("unfold", lambda m, a: _nf(m).unfold(a, (2, 3), dilation=(2, 1), padding=(1, 2), stride=(2, 3)),
           [I((2, 2, 9, 8))], name="all-args"),
    OpCase("unfold", lambda m, a: _nf(m).unfold(a, 2, padding=1, stride=2), [I((3, 5, 7), noncontig=True)],
           name="unbatched"),
    OpCase("unfold", lambda m, a: _nf(m).unfold(a, 1), [I((2, 4, 3, 5), "float64")], name="1x1"),
    OpCase("unfold", lambda m, a: _nf(m).unfold(a, (5, 1)), [I((1, 2, 5, 3))], name="whole-height"),
    OpCase("fold", lambda m, a: _nf(m).fold(a, (4, 5), 2), [I((2, 12, 12))]),
    OpCase("fold", lambda m, a: _nf(m).fold(a, (7, 6), (2, 3), dilation=(2, 1), padding=1, stride=(2, 1)),
           [I((2, 18, 24))], name="all-args"),
    OpCase("fold", lambda m, a: _nf(m).fold(a, 5, 3, stride=2), [I((9, 4), noncontig=True)], name="unbatched"),
    OpCase("fold", lambda m, a: _nf(m).fold(a, (3, 4), 1), [I((2, 3, 12), "float64")], name="1x1"),
    OpCase("fold", lambda m, a: _nf(m).fold(_nf(m).unfold(a, 3, padding=1), (5, 6), 3, padding=1),
           [I((2, 3, 5, 6))], name="fold-of-unfold"),
]


def _double(m, a):
    """The gradient of unfold's gradient (fold), differentiated again (create_graph=True)."""
    with m.enable_grad():
        y = _nf(m).unfold(a, 2, padding=1, stride=(1, 2))
        (ga,) = m.autograd.grad((y * y).sum(), [a], create_graph=True)
    return ga


CASES.append(OpCase("unfold", _double, [I((1, 2, 4, 5))], name="double-backward"))


def _sample(mode, padding_mode, align_corners):
    return lambda m, a, g: _nf(m).grid_sample(a, g, mode=mode, padding_mode=padding_mode, align_corners=align_corners)


def _grid(shape):
    """Grid values reaching past [-1, 1] on every side (padding decides what is read there)."""
    return I(shape, "float64", "uniform", -1.4, 1.4)


for _mode, _pad, _ac in itertools.product(("bilinear", "nearest", "bicubic"), ("zeros", "border", "reflection"),
                                          (False, True)):
    CASES.append(OpCase("grid_sample", _sample(_mode, _pad, _ac), [I((2, 3, 5, 7), "float64"), _grid((2, 4, 3, 2))],
                        name=f"{_mode}-{_pad}-{'ac' if _ac else 'noac'}"))
for _mode, _pad in itertools.product(("bilinear", "nearest"), ("zeros", "border", "reflection")):
    CASES.append(OpCase("grid_sample", _sample(_mode, _pad, _pad == "border"),
                        [I((2, 2, 3, 4, 5), "float64"), _grid((2, 2, 3, 2, 3))], name=f"5d-{_mode}-{_pad}"))
CASES += [
    OpCase("grid_sample", _sample("bilinear", "reflection", True), [I((1, 2, 1, 4), "float64"), _grid((1, 3, 2, 2))],
           name="unit-height-ac"),
    OpCase("grid_sample", _sample("bicubic", "reflection", False), [I((1, 2, 1, 1), "float64"), _grid((1, 2, 2, 2))],
           name="one-pixel-bicubic"),
    OpCase("grid_sample", _sample("bilinear", "zeros", False), [I((2, 3, 4, 5), noncontig=True),
                                                                I((2, 3, 3, 2), "float32", "uniform", -1.2, 1.2)],
           name="float32"),
    OpCase("grid_sample", _sample("bilinear", "border", False), [I((0, 2, 3, 4), "float64"), _grid((0, 2, 2, 2))],
           name="empty-batch"),
    OpCase("grid_sample", _sample("bicubic", "zeros", True), [I((2, 2, 3, 4), "float64"), _grid((2, 0, 3, 2))],
           name="empty-grid"),
    OpCase("grid_sample", lambda m, a, g: _nf(m).grid_sample(a, g), [I((1, 2, 3, 4), "float64"), _grid((1, 2, 2, 2))],
           name="defaults"),
]


def _affine(size, align_corners):
    return lambda m, t: _nf(m).affine_grid(t, size, align_corners=align_corners)


for _ac in (False, True):
    _tag = "ac" if _ac else "noac"
    CASES += [
        OpCase("affine_grid", _affine((2, 3, 5, 4), _ac), [I((2, 2, 3), "float64")], name=f"2d-{_tag}"),
        OpCase("affine_grid", _affine((2, 1, 3, 2, 5), _ac), [I((2, 3, 4), "float64")], name=f"3d-{_tag}"),
        OpCase("affine_grid", _affine((1, 1, 1, 3), _ac), [I((1, 2, 3), "float64")], name=f"unit-height-{_tag}"),
    ]
CASES += [
    OpCase("affine_grid", _affine((3, 2, 4, 3), False), [I((3, 2, 3))], name="float32"),
    OpCase("affine_grid", lambda m, t, x: _nf(m).grid_sample(x, _nf(m).affine_grid(t, (2, 3, 4, 6), False), "bilinear",
                                                              "zeros", False),
           [I((2, 2, 3), "float64", "uniform", -1, 1), I((2, 3, 5, 5), "float64")], name="into-grid_sample"),
]
