"""Creation functions and type promotion against PyTorch."""
import itertools

import numpy as np
import pytest
import torch

import engine as flow

DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"]


def tdt(name):
    return getattr(torch, name)


def fdt(name):
    return getattr(flow, name)


@pytest.mark.parametrize("a,b", list(itertools.combinations_with_replacement(DTYPES, 2)))
def test_promote_types_matches_torch(a, b):
    assert flow.promote_types(fdt(a), fdt(b)).name == str(torch.promote_types(tdt(a), tdt(b))).split(".")[1]


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("scalar", [True, 2, 2.5])
def test_tensor_scalar_promotion_matches_torch(dt, scalar):
    t = torch.ones(3, dtype=tdt(dt))
    f = flow.ones(3, dtype=fdt(dt))
    assert (f * scalar).dtype.name == str((t * scalar).dtype).split(".")[1]
    assert (f + scalar).dtype.name == str((t + scalar).dtype).split(".")[1]


@pytest.mark.parametrize("a,b", [("int64", "float32"), ("float64", "float32"), ("int32", "float16"),
                                 ("bool", "int64"), ("float16", "float32")])
def test_zero_dim_tensor_promotion_matches_torch(a, b):
    t = torch.ones(3, dtype=tdt(a)) * torch.tensor(2, dtype=tdt(b))
    f = flow.ones(3, dtype=fdt(a)) * flow.tensor(2, dtype=fdt(b))
    assert f.dtype.name == str(t.dtype).split(".")[1]


@pytest.mark.parametrize("data", [[1, 2, 3], [1.5, 2], [[True, False]], 3, 2.5, [], np.arange(4, dtype=np.int32)])
def test_tensor_from_data(data):
    f, t = flow.tensor(data), torch.tensor(data)
    assert f.dtype.name == str(t.dtype).split(".")[1]
    assert tuple(f.shape) == tuple(t.shape)
    np.testing.assert_array_equal(f.numpy(), t.numpy())


def test_constant_and_range_creation():
    cases = [
        (lambda m: m.zeros(2, 3), None), (lambda m: m.ones((2, 3), dtype=m.int64), None),
        (lambda m: m.full((2, 2), 7), None), (lambda m: m.full((2,), 1.5), None),
        (lambda m: m.arange(5), None), (lambda m: m.arange(1, 4, 0.5), None), (lambda m: m.arange(0, 1, 0.1), None),
        (lambda m: m.linspace(0, 1, 7), None), (lambda m: m.eye(3), None), (lambda m: m.eye(2, 4), None),
        (lambda m: m.zeros_like(m.ones(2, dtype=m.int32)), None), (lambda m: m.full_like(m.ones(3), 4.0), None),
        (lambda m: m.ones_like(m.zeros(2, 2), dtype=m.float64), None), (lambda m: m.empty(2, 3).shape, None),
    ]
    for fn, _ in cases:
        f, t = fn(flow), fn(torch)
        if isinstance(t, torch.Size):
            assert tuple(f) == tuple(t)
            continue
        assert f.dtype.name == str(t.dtype).split(".")[1]
        np.testing.assert_allclose(f.numpy(), t.numpy(), rtol=1e-6)


def test_from_numpy_shares_memory_and_as_tensor():
    a = np.zeros(3, dtype=np.float32)
    t = flow.from_numpy(a)
    a[0] = 5
    assert t.numpy()[0] == 5
    assert np.shares_memory(flow.as_tensor(a).numpy(), a)
    assert flow.as_tensor(a, dtype=flow.float64).dtype is flow.float64


def test_random_creation_reproducible_and_distributed():
    flow.manual_seed(123)
    a = flow.randn(20000)
    flow.manual_seed(123)
    b = flow.randn(20000)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert a.dtype is flow.float32
    assert abs(a.numpy().mean()) < 0.03 and abs(a.numpy().std() - 1) < 0.03
    u = flow.rand(20000).numpy()
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean() - 0.5) < 0.01
    r = flow.randint(3, 7, (5000,))
    assert r.dtype is flow.int64 and set(np.unique(r.numpy())) == {3, 4, 5, 6}
    assert flow.randint(5, (2, 2)).shape == (2, 2)
    g = flow.Generator().manual_seed(5)
    g2 = flow.Generator().manual_seed(5)
    np.testing.assert_array_equal(flow.rand(4, generator=g).numpy(), flow.rand(4, generator=g2).numpy())
    n = flow.normal(2.0, 0.5, size=(20000,)).numpy()
    assert abs(n.mean() - 2) < 0.02 and abs(n.std() - 0.5) < 0.02
    assert flow.randn_like(flow.zeros(2, 3, dtype=flow.float64)).dtype is flow.float64


def test_generator_state_round_trip():
    flow.manual_seed(7)
    state = flow.get_rng_state()
    a = flow.rand(5).numpy()
    flow.set_rng_state(state)
    np.testing.assert_array_equal(a, flow.rand(5).numpy())


def test_bad_creation_arguments():
    with pytest.raises(RuntimeError, match="negative dimension"):
        flow.zeros(2, -1)
    with pytest.raises(RuntimeError, match="step must be nonzero"):
        flow.arange(0, 5, 0)
    with pytest.raises(ValueError, match="unknown device"):
        flow.zeros(2, device="tpu")


def test_tensor_metadata():
    t = flow.zeros(2, 3, 4)
    assert t.shape == (2, 3, 4) and t.size() == (2, 3, 4) and t.size(-1) == 4
    assert t.ndim == 3 and t.dim() == 3 and t.numel() == 24 and len(t) == 2
    assert t.device == flow.device("cpu") and str(t.device) == "cpu"
    assert t.dtype is flow.float32 and t.is_leaf and t.grad_fn is None
    assert t.to(flow.float64).dtype is flow.float64 and t.half().dtype is flow.float16
    assert t.bfloat16().dtype is flow.bfloat16 and t.long().dtype is flow.int64 and t.int().dtype is flow.int32
    assert t.bool().dtype is flow.bool and t.double().float().dtype is flow.float32
    assert flow.tensor([[1.0, 2.0]]).tolist() == [[1.0, 2.0]]
    assert flow.tensor(3).item() == 3 and isinstance(flow.tensor(3).item(), int)
    assert "tensor(" in repr(flow.ones(2)) and "requires_grad=True" in repr(flow.ones(2, requires_grad=True))
    with pytest.raises(RuntimeError, match="a Tensor with 2 elements cannot be converted to Scalar"):
        flow.ones(2).item()
    with pytest.raises(RuntimeError, match="requires grad"):
        flow.ones(2).requires_grad_().numpy()


def test_cuda_unavailable_is_a_clear_error():
    if flow.cuda.is_available():
        pytest.skip("a GPU is present: the missing-GPU message cannot be produced here")
    with pytest.raises(RuntimeError, match="CuPy|GPU"):
        flow.zeros(2, device="cuda")


def test_arange_gives_positive_zero_like_torch():
    """0 * negative step is -0.0; torch's arange starts at +0.0 (start + i * step), and so must
    ours on every path (the CUDA path skips only exact no-ops)."""
    import torch
    for args in ((0, -3, -1.0), (0.0, 2.0, 0.5), (0, 5)):
        got, want = flow.arange(*args).numpy(), torch.arange(*args).numpy()
        np.testing.assert_array_equal(got, want)
        assert np.signbit(got).tolist() == np.signbit(want).tolist()


def test_integer_ranges_take_torch_integer_bounds():
    """An integer arange counts and steps as torch's (int64 truncates start, end and step first;
    narrower types count from the values as given and step from int(start) by int(step)), and an
    integer linspace runs between the truncated bounds: 4000 random cases against torch."""
    rng = np.random.default_rng(0)
    names = ["int64", "int32", "int16", "uint8"]
    for i in range(4000):
        a, b = (float(v) for v in rng.uniform(-20, 20, 2).round(int(rng.integers(0, 3))))
        name = names[i % 4]
        if name == "uint8":
            a, b = abs(a), abs(b)
        step = float(round(rng.uniform(-5, 5), int(rng.integers(0, 2))))
        args = (a,) if i % 7 == 0 else (a, b, step)

        def run(lib):
            try:
                return lib.arange(*args, dtype=getattr(lib, name)).numpy()
            except (RuntimeError, ValueError) as e:
                return type(e).__name__

        want, got = run(torch), run(flow)
        if isinstance(want, str) or isinstance(got, str):
            assert str(got) == str(want), (args, name, want, got)
        else:
            np.testing.assert_array_equal(got, want, err_msg=f"arange{args} {name}")
    assert flow.arange(3.1, dtype=flow.int64).tolist() == [0, 1, 2]
    assert flow.arange(3.1, dtype=flow.int32).tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="step must be nonzero"):
        flow.arange(0, 2.5, 0.5, dtype=flow.int64)
    for start, end, steps in ((4.3, -3, 8), (0.5, 10.7, 4), (-7.9, 7.9, 3)):
        np.testing.assert_array_equal(flow.linspace(start, end, steps, dtype=flow.int64).numpy(),
                                      torch.linspace(start, end, steps, dtype=torch.int64).numpy())


def test_factory_options_are_torch_s_and_nothing_else():
    """out=, layout=, pin_memory= (and memory_format= where torch takes it) are understood or
    refused by name; a misspelt keyword is a TypeError, never silently dropped."""
    o = flow.ones(2)
    with pytest.raises(TypeError, match=r"zeros\(\): out= is not supported"):
        flow.zeros(2, out=o)
    for call in (lambda: flow.zeros(3, dtpye=flow.int64), lambda: flow.randn(2, requries_grad=True),
                 lambda: o.new_zeros(2, dtpye=flow.int64), lambda: flow.zeros_like(o, dtpye=flow.int64),
                 lambda: flow.full((2,), 1.0, devcie="cpu"), lambda: flow.zeros(2, memory_format=flow.contiguous_format)):
        with pytest.raises(TypeError, match="unexpected keyword argument"):
            call()
    assert flow.zeros(2, layout=flow.strided, pin_memory=True).tolist() == [0.0, 0.0]
    assert flow.empty(2, memory_format=flow.contiguous_format).shape == (2,)
    assert flow.ones_like(o, memory_format=flow.preserve_format).tolist() == [1.0, 1.0]
    x = flow.ones(1, 3, 2, 2)
    for call in (lambda: flow.zeros(2, layout=flow.sparse_coo), lambda: flow.empty_like(x, memory_format=flow.channels_last),
                 lambda: x.contiguous(memory_format=flow.channels_last), lambda: x.to(memory_format=flow.channels_last),
                 lambda: flow.nn.Linear(2, 2).to(memory_format=flow.channels_last)):
        with pytest.raises(NotImplementedError, match="not implemented"):
            call()
    assert x.clone(memory_format=flow.preserve_format).shape == (1, 3, 2, 2)
    import pickle

    assert pickle.loads(pickle.dumps(flow.channels_last)) is flow.channels_last


def test_python_ints_outside_an_integer_type_as_torch():
    """torch wraps negative ints into uint8 (down to -255) and refuses every other overflow."""
    for value, name in (([-1], "uint8"), ([-129, 3], "uint8"), (-1, "uint8"), ([255], "uint8")):
        assert flow.tensor(value, dtype=getattr(flow, name)).tolist() == \
            torch.tensor(value, dtype=getattr(torch, name)).tolist()
    for value, name in (([256], "uint8"), ([-256], "uint8"), ([128], "int8"), ([-129], "int8"),
                        ([70000], "int16"), ([2 ** 31], "int32"), ([2 ** 64], "int64")):
        with pytest.raises(RuntimeError, match=f"value cannot be converted to type {name} without overflow"):
            flow.tensor(value, dtype=getattr(flow, name))
