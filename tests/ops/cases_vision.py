"""Parity cases for engine/ops/vision.py: pixel_shuffle / pixel_unshuffle (batched, unbatched,
extra leading dims, integer dtype, round trip), unfold / fold (kernel, dilation, padding and
stride each as ints and pairs, unbatched inputs, overlapping blocks that fold sums, a 1x1 kernel,
float64, a non-contiguous input, double backward)."""
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
