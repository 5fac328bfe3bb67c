"""What third-party PyTorch scripts run into, against torch itself: the legacy `Tensor(data)`
constructor's float dtype, `Tensor.new_*`, in-place true division of integers refused, and
stacked convolutions under autocast (a probe of real training scripts found each)."""
import numpy as np
import pytest
import torch

import engine as flow
import engine.nn as nn


@pytest.mark.parametrize("data", [[1, 2], [[True, False]], np.array([3, 4], np.int64), [1.5, 2]])
def test_legacy_tensor_constructor_is_float(data):
    ours, ref = flow.Tensor(data), torch.Tensor(data)
    assert str(ours.dtype).split(".")[1] == str(ref.dtype).split(".")[1] == "float32"
    np.testing.assert_array_equal(ours.numpy(), ref.numpy())
    assert flow.Tensor(data, dtype=flow.int64).dtype is flow.int64
    assert flow.Tensor(flow.tensor([1, 2])).dtype is flow.int64  # a tensor keeps its dtype
    assert flow.Tensor().shape == tuple(torch.Tensor().shape) == (0,)


@pytest.mark.parametrize("source", [lambda m: m.tensor([1, 2]), lambda m: m.zeros(2, dtype=m.float16)],
                         ids=["int64", "float16"])
def test_new_factories_take_the_tensors_dtype(source):
    ours, ref = source(flow), source(torch)
    pairs = [(ours.new_zeros(2, 3), ref.new_zeros(2, 3)), (ours.new_ones((4,)), ref.new_ones((4,))),
             (ours.new_full((2,), 7), ref.new_full((2,), 7)), (ours.new_tensor([1, 2]), ref.new_tensor([1, 2])),
             (ours.new_zeros(3, dtype=flow.float64), ref.new_zeros(3, dtype=torch.float64)),
             (ours.new_empty(0, 2), ref.new_empty(0, 2))]
    for mine, theirs in pairs:
        assert str(mine.dtype).split(".")[1] == str(theirs.dtype).split(".")[1]
        assert tuple(mine.shape) == tuple(theirs.shape)
        if mine.numel():
            np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
    grad = ours.new_zeros(2, dtype=flow.float32, requires_grad=True)
    assert grad.requires_grad and grad.is_leaf


def test_new_factories_of_a_global_tensor_are_replicated_on_its_placement():
    x = flow.randn(4, 3).to_global(placement=flow.placement("cpu", [0]), sbp=flow.sbp.split(0))
    for y in (x.new_zeros(2, 5), x.new_full((3,), 2.0), x.new_tensor([[1.0, 2.0]])):
        assert y.is_global and y.placement == x.placement and y.sbp == (flow.sbp.broadcast,)
    np.testing.assert_array_equal(x.new_tensor([[1.0, 2.0]]).numpy(), [[1.0, 2.0]])


def test_inplace_true_division_of_integers_is_refused_as_in_torch():
    for m in (torch, flow):
        t = m.tensor([5, 7])
        for fn in (lambda: t.div_(2), lambda: t.__itruediv__(2)):
            with pytest.raises(RuntimeError, match="result type Float can't be cast to the desired output type"):
                fn()
        np.testing.assert_array_equal(t.div_(2, rounding_mode="floor").numpy(), [2, 3])  # an integer result
    x = flow.tensor([5.0, 7.0])
    x /= 2
    np.testing.assert_array_equal(x.numpy(), [2.5, 3.5])


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("kind", ["Conv1d", "Conv2d", "ConvTranspose2d"])
def test_stacked_convolutions_under_autocast(kind, dtype):
    """The second conv's input is already in the low dtype, its weight float32: autocast casts
    both (torch's), so the dtype check must not refuse the pair first."""
    shape = (1, 2, 9) if kind == "Conv1d" else (1, 2, 9, 9)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    ref_conv = getattr(torch.nn, kind)(2, 2, 3)
    conv = getattr(nn, kind)(2, 2, 3)
    conv.load_state_dict({k: flow.tensor(v.detach().numpy()) for k, v in ref_conv.state_dict().items()})
    with flow.autocast("cpu", dtype=getattr(flow, dtype)):
        y = conv(conv(flow.tensor(x)))
    with torch.autocast("cpu", dtype=getattr(torch, dtype)):
        ref = ref_conv(ref_conv(torch.from_numpy(x)))
    assert str(y.dtype).split(".")[1] == str(ref.dtype).split(".")[1] == dtype
    np.testing.assert_allclose(y.float().detach().numpy(), ref.float().detach().numpy(), rtol=0.05, atol=0.05)
    with pytest.raises(RuntimeError, match="input type \\(float16\\), weight type \\(float32\\)"):
        conv(flow.tensor(x).half())  # without autocast the mix is still an error
