"""Parity cases for engine/ops/conv.py: conv1d/conv2d (stride, padding incl. 'same', dilation,
groups, depthwise, no bias), avg/max/adaptive avg/adaptive max pools, interpolate (nearest, bilinear with both
align_corners), pad (constant with negative crops, reflect, replicate, circular)."""
from harness import Input as I, OpCase


def _nf(m):
    return m.nn.functional


CASES = []


def conv(name, x, w, b=True, **kw):
    if b:
        CASES.append(OpCase("conv2d", lambda m, a, ww, bb: _nf(m).conv2d(a, ww, bb, **kw),
                            [I(x), I(w), I((w[0],))], name=name))
    else:
        CASES.append(OpCase("conv2d", lambda m, a, ww: _nf(m).conv2d(a, ww, **kw), [I(x), I(w)], name=name))


conv("basic", (2, 3, 6, 5), (4, 3, 3, 3))
conv("nobias", (2, 3, 6, 5), (4, 3, 3, 3), b=False)
conv("stride", (2, 3, 7, 8), (4, 3, 3, 2), stride=2)
conv("stride-pad", (1, 2, 7, 6), (3, 2, 3, 3), stride=(2, 3), padding=(1, 2))
conv("dilation", (2, 2, 8, 7), (3, 2, 3, 2), dilation=(2, 1), padding=1)
conv("groups", (2, 4, 5, 5), (6, 2, 3, 3), groups=2, padding=1)
conv("depthwise", (2, 3, 6, 6), (6, 1, 3, 3), groups=3, stride=2, padding=1)
conv("same", (1, 2, 5, 6), (3, 2, 4, 3), padding="same", dilation=(1, 2))
conv("valid", (1, 2, 5, 6), (3, 2, 2, 2), padding="valid")
conv("1x1", (3, 4, 4, 3), (5, 4, 1, 1), b=False)
conv("all", (2, 4, 9, 8), (4, 2, 3, 2), stride=(2, 1), padding=(2, 1), dilation=(1, 2), groups=2)
CASES += [
    OpCase("conv2d", lambda m, a, w: _nf(m).conv2d(a, w, padding=1), [I((2, 3, 5, 4), noncontig=True), I((2, 3, 3, 3))],
           name="noncontig"),
    OpCase("conv2d", lambda m, a, w: _nf(m).conv2d(a, w), [I((3, 5, 4)), I((2, 3, 2, 2))], name="unbatched"),
    OpCase("conv2d", lambda m, a, w: _nf(m).conv2d(a, w), [I((0, 3, 5, 4)), I((2, 3, 2, 2))], name="empty-batch",
           gradcheck=False),
    OpCase("conv2d", lambda m, a, w: _nf(m).conv2d(a, w, padding=1), [I((1, 2, 4, 4), "float64"), I((3, 2, 3, 3), "float64")],
           name="float64"),
    OpCase("conv1d", lambda m, a, w, b: _nf(m).conv1d(a, w, b, stride=2, padding=1), [I((2, 3, 9)), I((4, 3, 3)), I((4,))]),
    OpCase("conv1d", lambda m, a, w: _nf(m).conv1d(a, w, padding="same", dilation=2, groups=3),
           [I((2, 3, 7)), I((6, 1, 3))], name="same-groups"),
    OpCase("conv1d", lambda m, a, w: _nf(m).conv1d(a, w), [I((3, 7)), I((2, 3, 3))], name="unbatched"),
]

# double backward: the gradient of conv2d's gradient, differentiated again (create_graph=True)
def _double(m, a, w):
    with m.enable_grad():  # gradcheck evaluates its finite differences under no_grad
        y = _nf(m).conv2d(a, w, stride=2, padding=1, groups=2)
        ga, gw = m.autograd.grad((y * y).sum(), [a, w], create_graph=True)
    return ga, gw


CASES.append(OpCase("conv2d", _double, [I((1, 4, 5, 5)), I((4, 2, 3, 3))], name="double-backward"))

# ------------------------------------------------------------------ pools
P = (2, 3, 7, 6)
CASES += [
    OpCase("avg_pool2d", lambda m, a: _nf(m).avg_pool2d(a, 2), [I(P)]),
    OpCase("avg_pool2d", lambda m, a: _nf(m).avg_pool2d(a, 3, stride=2, padding=1), [I(P)], name="pad"),
    OpCase("avg_pool2d", lambda m, a: _nf(m).avg_pool2d(a, 3, 2, 1, count_include_pad=False), [I(P)], name="nocount"),
    OpCase("avg_pool2d", lambda m, a: _nf(m).avg_pool2d(a, (3, 2), 2, (1, 0), ceil_mode=True), [I(P)], name="ceil"),
    OpCase("avg_pool2d", lambda m, a: _nf(m).avg_pool2d(a, 3, 2, 1, ceil_mode=True, count_include_pad=False), [I(P)],
           name="ceil-nocount"),
    OpCase("avg_pool2d", lambda m, a: _nf(m).avg_pool2d(a, 2, divisor_override=3), [I(P, noncontig=True)], name="divisor"),
    OpCase("avg_pool2d", lambda m, a: _nf(m).avg_pool2d(a, 2, 1), [I((3, 4, 5))], name="unbatched"),
    # distinct values: no ties, so the argmax and its finite differences are well defined
    OpCase("max_pool2d", lambda m, a: _nf(m).max_pool2d(a, 2), [I(P, kind="distinct")]),
    OpCase("max_pool2d", lambda m, a: _nf(m).max_pool2d(a, 3, 2, 1), [I(P, kind="distinct")], name="pad"),
    OpCase("max_pool2d", lambda m, a: _nf(m).max_pool2d(a, 3, 2, 1, dilation=2, ceil_mode=True),
           [I((2, 2, 9, 8), kind="distinct")], name="dilation-ceil"),
    OpCase("max_pool2d", lambda m, a: _nf(m).max_pool2d(a, (2, 3), (1, 2), return_indices=True),
           [I(P, kind="distinct", noncontig=True)], name="indices"),
    OpCase("max_pool2d", lambda m, a: _nf(m).max_pool2d(a, 2, 1, 1, return_indices=True),
           [I((3, 4, 5), kind="distinct")], name="unbatched"),
    OpCase("max_pool2d", lambda m, a: _nf(m).max_pool2d(a, 3, 2, 1), [I(P, "int64", "int", -50, 50)], name="int"),
    OpCase("adaptive_avg_pool2d", lambda m, a: _nf(m).adaptive_avg_pool2d(a, (3, 2)), [I((2, 3, 6, 4))], name="divisible"),
    OpCase("adaptive_avg_pool2d", lambda m, a: _nf(m).adaptive_avg_pool2d(a, (4, 3)), [I((2, 3, 7, 5))], name="uneven"),
    OpCase("adaptive_avg_pool2d", lambda m, a: _nf(m).adaptive_avg_pool2d(a, 1), [I((2, 3, 5, 5), noncontig=True)],
           name="global"),
    OpCase("adaptive_avg_pool2d", lambda m, a: _nf(m).adaptive_avg_pool2d(a, (None, 5)), [I((2, 3, 4))],
           name="none-upsample"),
]



def _pool_double(m, a):
    with m.enable_grad():
        y, z = _nf(m).max_pool2d(a, 3, 2, 1), _nf(m).avg_pool2d(a * a, 2, 1, ceil_mode=True)
        (ga,) = m.autograd.grad((y * y).sum() + (z * z).sum(), [a], create_graph=True)
    return ga


CASES.append(OpCase("max_pool2d", _pool_double, [I((1, 2, 5, 6), kind="distinct")], name="double-backward"))

# ------------------------------------------------------------------ interpolate
X = (2, 3, 5, 4)
for nm, kw in [
    ("nearest-size", dict(size=(8, 7))),
    ("nearest-down", dict(size=(3, 3))),
    ("nearest-x2", dict(scale_factor=2)),
    ("nearest-scale", dict(scale_factor=(1.7, 0.6))),
    ("bilinear-size", dict(size=(9, 6), mode="bilinear")),
    ("bilinear-ac", dict(size=(9, 6), mode="bilinear", align_corners=True)),
    ("bilinear-down", dict(size=(3, 2), mode="bilinear", align_corners=False)),
    ("bilinear-down-ac", dict(size=(3, 1), mode="bilinear", align_corners=True)),
    ("bilinear-scale", dict(scale_factor=1.5, mode="bilinear")),
    ("bilinear-scale-recompute", dict(scale_factor=1.3, mode="bilinear", recompute_scale_factor=True)),
]:
    CASES.append(OpCase("interpolate", lambda m, a, kw=kw: _nf(m).interpolate(a, **kw), [I(X)], name=nm))
CASES += [
    OpCase("interpolate", lambda m, a: _nf(m).interpolate(a, size=6, mode="bilinear"), [I(X, noncontig=True)],
           name="noncontig"),
    # H stays 3 (floor(3 * 1.3)): torch copies that axis rather than applying the 1/1.3 scale
    OpCase("interpolate", lambda m, a: _nf(m).interpolate(a, scale_factor=1.3, mode="bilinear"), [I((1, 2, 3, 5))],
           name="bilinear-same-axis"),
]

# ------------------------------------------------------------------ pad
CASES += [
    OpCase("pad", lambda m, a: _nf(m).pad(a, (1, 2)), [I((3, 4))], name="last"),
    OpCase("pad", lambda m, a: _nf(m).pad(a, (1, 0, 2, 3), value=1.5), [I((2, 3, 4))], name="value"),
    OpCase("pad", lambda m, a: _nf(m).pad(a, (-1, 2, 1, -2)), [I((2, 3, 4), noncontig=True)], name="negative"),
    OpCase("pad", lambda m, a: _nf(m).pad(a, (0, 0, 0, 0, 1, 1)), [I((2, 3, 4))], name="leading"),
    OpCase("pad", lambda m, a: _nf(m).pad(a, (1, 1)), [I((2, 3), "int64", "int", -5, 5)], name="int"),
    OpCase("pad", lambda m, a: _nf(m).pad(a, (1, 1)), [I((0, 3))], name="empty", gradcheck=False),
    OpCase("pad", lambda m, a: _nf(m).pad(a, (2, 1, 1, 2), mode="reflect"), [I((2, 3, 4, 5))], name="reflect"),
    OpCase("pad", lambda m, a: _nf(m).pad(a, (3, 1), mode="reflect"), [I((2, 3, 5))], name="reflect1d"),
    OpCase("pad", lambda m, a: _nf(m).pad(a, (2, 3, 0, 1), mode="replicate"), [I((2, 3, 4, 5))], name="replicate"),
    OpCase("pad", lambda m, a: _nf(m).pad(a, (2, 1, 1, 3), mode="circular"), [I((1, 2, 4, 5))], name="circular"),
    OpCase("pad", lambda m, a: _nf(m).pad(a, (2, -1, -2, 1), mode="circular"), [I((1, 2, 4, 5))], name="circular-crop"),
    OpCase("pad", lambda m, a: _nf(m).pad(a, (-1, 2, 0, 1), mode="replicate"), [I((1, 2, 4, 5))], name="replicate-crop"),
]

# ------------------------------------------------------------------ transposed convolution, 1-D pools
CASES += [
    OpCase("conv_transpose2d", lambda m, a, w, b: _nf(m).conv_transpose2d(a, w, b), [I((2, 4, 5, 6)), I((4, 3, 3, 2)),
                                                                                     I((3,))]),
    OpCase("conv_transpose2d", lambda m, a, w, b: _nf(m).conv_transpose2d(a, w, b, stride=(2, 3), padding=(1, 2),
                                                                          output_padding=(1, 2)),
           [I((1, 4, 4, 3)), I((4, 3, 3, 4)), I((3,))], name="stride-pad-outpad"),
    OpCase("conv_transpose2d", lambda m, a, w: _nf(m).conv_transpose2d(a, w, stride=2, padding=1, groups=2,
                                                                       dilation=(2, 1)),
           [I((2, 4, 3, 4)), I((4, 3, 3, 3))], name="groups-dilation"),
    # output_padding >= stride is allowed below the dilation: the output's last rows get no input
    OpCase("conv_transpose2d", lambda m, a, w: _nf(m).conv_transpose2d(a, w, dilation=3, output_padding=2),
           [I((1, 2, 3, 3)), I((2, 3, 2, 2))], name="outpad-dilation"),
    OpCase("conv_transpose2d", lambda m, a, w: _nf(m).conv_transpose2d(a, w, stride=2), [I((3, 4, 4)), I((3, 2, 3, 3))],
           name="unbatched"),
    OpCase("conv_transpose2d", lambda m, a, w: _nf(m).conv_transpose2d(a, w, stride=2),
           [I((0, 3, 4, 4)), I((3, 2, 3, 3))], name="empty-batch", gradcheck=False),
    OpCase("conv_transpose1d", lambda m, a, w, b: _nf(m).conv_transpose1d(a, w, b, stride=3, padding=2,
                                                                          output_padding=1, dilation=2),
           [I((2, 4, 7)), I((4, 5, 4)), I((5,))]),
    OpCase("conv_transpose1d", lambda m, a, w: _nf(m).conv_transpose1d(a, w, groups=2), [I((4, 6)), I((4, 1, 3))],
           name="unbatched-groups"),
    OpCase("max_pool1d", lambda m, a: _nf(m).max_pool1d(a, 3, 2, 1, ceil_mode=True), [I((2, 3, 10), kind="distinct")]),
    OpCase("max_pool1d", lambda m, a: _nf(m).max_pool1d(a, 3, 1, 1, dilation=2, return_indices=True),
           [I((3, 11), kind="distinct")], name="dilation-indices"),
    OpCase("max_pool1d", lambda m, a: _nf(m).max_pool1d(a, 2, return_indices=True),
           [I((2, 3, 7), "int64", "int", -9, 9)], name="int-indices"),
    OpCase("avg_pool1d", lambda m, a: _nf(m).avg_pool1d(a, 3, 2, 1, ceil_mode=True, count_include_pad=False),
           [I((2, 3, 10))]),
    OpCase("avg_pool1d", lambda m, a: _nf(m).avg_pool1d(a, 4), [I((3, 9), noncontig=True)], name="unbatched"),
    OpCase("adaptive_avg_pool1d", lambda m, a: _nf(m).adaptive_avg_pool1d(a, 4), [I((2, 3, 10))]),
    OpCase("adaptive_avg_pool1d", lambda m, a: _nf(m).adaptive_avg_pool1d(a, (7,)), [I((3, 5))], name="upsample"),
]

# ------------------------------------------------------------------ adaptive max pools
# distinct values: no ties, so the winner and its finite differences are well defined
CASES += [
    OpCase("adaptive_max_pool2d", lambda m, a: _nf(m).adaptive_max_pool2d(a, (3, 4)),
           [I((2, 3, 7, 9), kind="distinct")], name="uneven"),
    OpCase("adaptive_max_pool2d", lambda m, a: _nf(m).adaptive_max_pool2d(a, (4, 2), return_indices=True),
           [I((2, 3, 8, 6), kind="distinct", noncontig=True)], name="divisible-indices"),
    OpCase("adaptive_max_pool2d", lambda m, a: _nf(m).adaptive_max_pool2d(a, (9, None), True),
           [I((3, 5, 7), kind="distinct")], name="upsample-none-unbatched"),
    OpCase("adaptive_max_pool2d", lambda m, a: _nf(m).adaptive_max_pool2d(a, 1, True),
           [I((2, 2, 5, 5), "float64", kind="distinct")], name="global"),
    OpCase("adaptive_max_pool2d", lambda m, a: _nf(m).adaptive_max_pool2d(a, 2), [I((0, 2, 5, 5))],
           name="empty-batch", gradcheck=False),
    OpCase("adaptive_max_pool1d", lambda m, a: _nf(m).adaptive_max_pool1d(a, 4, True),
           [I((2, 3, 11), kind="distinct")]),
    OpCase("adaptive_max_pool1d", lambda m, a: _nf(m).adaptive_max_pool1d(a, (7,)), [I((3, 5), kind="distinct")],
           name="upsample-unbatched"),
]


# ---------------------------------------------------------------- int64 convolutions and average pools (torch computes
# them on the CPU, avg_pool with C's truncating division; the other integer types: tests/test_op_edge_cases.py)
def _long(shape, lo=-4, hi=5):
    return I(shape, "int64", "int", lo, hi)


CASES += [
    OpCase("conv2d", lambda m, a, w, b: _nf(m).conv2d(a, w, b, stride=(1, 2), padding=1), [_long((2, 2, 5, 4)), _long((3, 2, 2, 2)), _long((3,))],
           name="int64"),
    OpCase("conv2d", lambda m, a, w: _nf(m).conv2d(a, w, dilation=2, groups=2), [_long((1, 4, 6, 6)), _long((2, 2, 2, 2))],
           name="int64-dilated-groups"),
    OpCase("conv2d", lambda m, a, w: _nf(m).conv2d(a, w, padding=1), [I((1, 2, 4, 4), "int32", "int", -4, 5), I((3, 2, 3, 3), "int32", "int", -4, 5)],
           name="int32"),
    OpCase("conv1d", lambda m, a, w: _nf(m).conv1d(a, w, padding="same"), [_long((2, 3, 7)), _long((2, 3, 3))], name="int64"),
    OpCase("conv_transpose2d", lambda m, a, w, b: _nf(m).conv_transpose2d(a, w, b, stride=2, padding=1, output_padding=1, groups=2),
           [_long((1, 4, 3, 3)), _long((4, 1, 3, 3)), _long((2,))], name="int64"),
    OpCase("conv_transpose1d", lambda m, a, w: _nf(m).conv_transpose1d(a, w, dilation=2), [_long((2, 2, 4)), _long((2, 3, 2))], name="int64"),
    OpCase("avg_pool2d", lambda m, a: _nf(m).avg_pool2d(a, 2), [_long((2, 3, 5, 5), -50, 50)], name="int64"),
    OpCase("avg_pool2d", lambda m, a: _nf(m).avg_pool2d(a, 3, 2, 1, ceil_mode=True, count_include_pad=False),
           [_long((2, 6, 7), -50, 50)], name="int64-ceil-no-pad-count"),
    OpCase("avg_pool2d", lambda m, a: _nf(m).avg_pool2d(a, (2, 3), divisor_override=-4), [_long((1, 2, 4, 6), -50, 50)],
           name="int64-negative-divisor"),
    OpCase("avg_pool1d", lambda m, a: _nf(m).avg_pool1d(a, 3, 1, 1), [_long((2, 3, 8), -50, 50)], name="int64"),
]
