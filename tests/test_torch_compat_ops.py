"""torch names that third-party scripts reach for, beyond the op families' parity cases
(tests/ops/cases_*.py): Tensor-only methods (unfold, stride), dtype limits (finfo/iinfo), the
thread setting, the legacy tensor types, view semantics of diagonal, and the error types of the
new ops' argument checks, each compared with torch.

Device-aware like tests/ops/test_parity.py: ENGINE_TEST_DEVICE=cuda runs the parity cases on the
CuPy backend."""
import numpy as np
import pytest
import torch

import engine as flow
from harness import Input as I, OpCase, run_parity

# ------------------------------------------------------------------ Tensor.unfold
UNFOLD = [
    OpCase("unfold", lambda m, x: x.unfold(0, 2, 1), [I((5,))], name="overlap"),
    OpCase("unfold", lambda m, x: x.unfold(1, 2, 3), [I((3, 7))], name="gaps"),
    OpCase("unfold", lambda m, x: x.unfold(-1, 3, 2), [I((2, 3, 6), noncontig=True)], name="neg-dim-noncontig"),
    OpCase("unfold", lambda m, x: x.unfold(0, 2, 2).unfold(1, 2, 1), [I((4, 5))], name="twice"),
    OpCase("unfold", lambda m, x: x.unfold(0, 1, 1), [I(())], name="0d"),
    OpCase("unfold", lambda m, x: x.unfold(0, 0, 1), [I((4,))], name="size0"),
    OpCase("unfold", lambda m, x: x.unfold(1, 2, 1), [I((0, 3))], name="empty"),
    OpCase("unfold", lambda m, x: x.unfold(0, 3, 1), [I((5, 2), "int64", "int", 0, 9)], name="int"),
]


@pytest.mark.parametrize("case", UNFOLD, ids=[c.id for c in UNFOLD])
def test_unfold_matches_torch(case):
    run_parity(case, seed=0)
    run_parity(case, seed=1)


# ------------------------------------------------------------------ Tensor.stride
LAYOUTS = {
    "contiguous": lambda m: m.zeros(2, 3, 4),
    "permuted": lambda m: m.zeros(2, 3, 4).permute(2, 0, 1),
    "transposed": lambda m: m.zeros(4, 6).t(),
    "sliced": lambda m: m.zeros(4, 6)[::2, 1::3],
    "size1": lambda m: m.zeros(3, 1, 2),
    "empty": lambda m: m.zeros(3, 0),
    "0d": lambda m: m.zeros(()),
    "expanded": lambda m: m.zeros(3).expand(2, 3),
    "diagonal": lambda m: m.zeros(4, 5).diagonal(1),
    "unsqueezed": lambda m: m.zeros(2, 3).unsqueeze(1),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_stride_in_elements_as_torch(layout):
    make = LAYOUTS[layout]
    t, e = make(torch), make(flow)
    assert e.stride() == t.stride()
    for d in range(-t.dim(), t.dim()):
        assert e.stride(d) == t.stride(d)


def test_stride_dim_out_of_range():
    with pytest.raises(IndexError):
        flow.zeros(2, 3).stride(2)


# ------------------------------------------------------------------ finfo / iinfo
@pytest.mark.parametrize("name", ["float16", "bfloat16", "float32", "float64"])
def test_finfo_as_torch(name):
    t, e = torch.finfo(getattr(torch, name)), flow.finfo(getattr(flow, name))
    for attr in ("bits", "eps", "max", "min", "tiny", "smallest_normal", "resolution", "dtype"):
        assert getattr(e, attr) == getattr(t, attr), attr
    assert flow.finfo(getattr(flow, name)) == e


@pytest.mark.parametrize("name", ["uint8", "int8", "int16", "int32", "int64"])
def test_iinfo_as_torch(name):
    t, e = torch.iinfo(getattr(torch, name)), flow.iinfo(getattr(flow, name))
    for attr in ("bits", "max", "min", "dtype"):
        assert getattr(e, attr) == getattr(t, attr), attr


def test_finfo_defaults_and_refusals():
    assert flow.finfo().dtype == torch.finfo().dtype
    for call in (lambda m: m.finfo(m.int32), lambda m: m.iinfo(m.float32), lambda m: m.iinfo(m.bool)):
        with pytest.raises(TypeError):
            call(torch)
        with pytest.raises(TypeError):
            call(flow)


# ------------------------------------------------------------------ threads
def test_set_num_threads_sets_the_engines_threads():
    from engine.backend import parallel

    before = flow.get_num_threads()
    try:
        flow.set_num_threads(3)
        assert flow.get_num_threads() == parallel.get_num_threads() == 3
    finally:
        flow.set_num_threads(before)
    for bad in (0, -1, 2.5):
        with pytest.raises(RuntimeError):
            torch.set_num_threads(bad)
        with pytest.raises(RuntimeError):
            flow.set_num_threads(bad)
    assert flow.get_num_threads() == before


# ------------------------------------------------------------------ legacy tensor types
def test_legacy_tensor_types():
    for name in ("FloatTensor", "DoubleTensor", "LongTensor", "IntTensor", "BoolTensor", "HalfTensor", "ByteTensor"):
        t, e = getattr(torch, name)([1, 0, 2]), getattr(flow, name)([1, 0, 2])
        assert e.dtype.name == str(t.dtype).split(".")[-1]
        assert e.tolist() == t.tolist()
        assert isinstance(e, getattr(flow, name)) and isinstance(e, flow.Tensor)
    assert tuple(flow.FloatTensor(2, 3).shape) == (2, 3)
    assert not isinstance(flow.zeros(2).double(), flow.FloatTensor)
    assert flow.zeros(2).type(flow.LongTensor).dtype is flow.int64
    assert flow.zeros(2).type("torch.DoubleTensor").dtype is flow.float64
    assert flow.zeros(2).type() == "engine.FloatTensor" and torch.zeros(2).type() == "torch.FloatTensor"


# ------------------------------------------------------------------ view semantics
def test_diagonal_is_a_view_as_in_torch():
    outs = []
    for m in (torch, flow):
        x = m.zeros(3, 4)
        with m.no_grad():
            x.diagonal(1).fill_(2.0)
            x.diagonal().add_(1.0)
        outs.append(np.asarray(x.tolist()))
    np.testing.assert_array_equal(outs[1], outs[0])


def test_index_put_writes_into_the_storage():
    outs = []
    for m in (torch, flow):
        x = m.zeros(4, 2)
        view = x[1:]
        x.index_put_((m.tensor([1, 3, 1]),), m.tensor([1.0, 2.0]), accumulate=True)
        outs.append(np.asarray(view.tolist()))
    np.testing.assert_array_equal(outs[1], outs[0])


# ------------------------------------------------------------------ argument checks: torch's exception types
def _t(m, v, dtype=None):
    return m.tensor(v, dtype=None if dtype is None else getattr(m, dtype))


ERRORS = {
    "meshgrid-indexing": lambda m: m.meshgrid(m.zeros(2), m.zeros(3), indexing="yx"),
    "meshgrid-2d": lambda m: m.meshgrid(m.zeros(2, 2), m.zeros(3), indexing="ij"),
    "meshgrid-dtypes": lambda m: m.meshgrid(m.zeros(2), m.zeros(3, dtype=m.int64), indexing="ij"),
    "meshgrid-empty": lambda m: m.meshgrid([], indexing="ij"),
    "repeat_interleave-negative": lambda m: m.repeat_interleave(m.zeros(2), -1),
    "repeat_interleave-counts": lambda m: m.repeat_interleave(m.zeros(2, 2), _t(m, [1, 2, 3]), dim=0),
    "repeat_interleave-negative-counts": lambda m: m.repeat_interleave(m.zeros(2, 2), _t(m, [1, -2]), dim=0),
    "repeat_interleave-float-counts": lambda m: m.repeat_interleave(m.zeros(2, 2), _t(m, [1.0, 2.0]), dim=0),
    "repeat_interleave-2d-counts": lambda m: m.repeat_interleave(m.zeros(2, 2), _t(m, [[1, 2]]), dim=0),
    "repeat_interleave-output_size": lambda m: m.repeat_interleave(m.zeros(2, 2), 2, dim=0, output_size=3),
    "diag-3d": lambda m: m.diag(m.zeros(2, 2, 2)),
    "diag-0d": lambda m: m.diag(m.zeros(())),
    "diagonal-same-dims": lambda m: m.diagonal(m.zeros(2, 3), 0, 1, 1),
    "diagonal-dim": lambda m: m.diagonal(m.zeros(2, 3), 0, 0, 2),
    "diag_embed-same-dims": lambda m: m.diag_embed(m.zeros(2, 3), 0, 0, 0),
    "atan2-scalar": lambda m: m.atan2(m.zeros(2), 2.0),
    "addcdiv-integers": lambda m: m.addcdiv(m.zeros(2), _t(m, [1, 2]), _t(m, [1, 2])),
    "addcmul-shapes": lambda m: m.addcmul(m.zeros(2), m.zeros(3), m.zeros(2)),
    "addcmul_-grows": lambda m: m.ones(2).addcmul_(m.ones(3, 2), m.ones(2)),
    "tensordot-sizes": lambda m: m.tensordot(m.zeros(3, 4), m.zeros(5, 3), dims=([1], [1])),
    "tensordot-negative": lambda m: m.tensordot(m.zeros(3, 4), m.zeros(4, 3), dims=-1),
    "tensordot-too-many": lambda m: m.tensordot(m.zeros(3, 4), m.zeros(4, 3), dims=3),
    "tensordot-lengths": lambda m: m.tensordot(m.zeros(3, 4), m.zeros(4, 3), dims=([0, 1], [0])),
    "tensordot-dtypes": lambda m: m.tensordot(m.zeros(3, 4), m.zeros(4, 3, dtype=m.float64), dims=1),
    "mv-shapes": lambda m: m.mv(m.zeros(2, 3), m.zeros(4)),
    "mv-matrix": lambda m: m.mv(m.zeros(2, 3), m.zeros(3, 1)),
    "mv-dtypes": lambda m: m.mv(m.zeros(2, 3), m.zeros(3, dtype=m.float64)),
    "cdist-1d": lambda m: m.cdist(m.zeros(3), m.zeros(3)),
    "cdist-columns": lambda m: m.cdist(m.zeros(2, 3), m.zeros(2, 4)),
    "cdist-p": lambda m: m.cdist(m.zeros(2, 3), m.zeros(2, 3), p=-1),
    "cdist-int": lambda m: m.cdist(m.zeros(2, 3, dtype=m.int64), m.zeros(2, 3, dtype=m.int64)),
    "cdist-dtypes": lambda m: m.cdist(m.zeros(2, 3), m.zeros(2, 3, dtype=m.float64)),
    "cdist-mode": lambda m: m.cdist(m.zeros(2, 3), m.zeros(2, 3), compute_mode="fast"),
    "searchsorted-side": lambda m: m.searchsorted(m.zeros(3), m.zeros(2), side="middle"),
    "searchsorted-opposites": lambda m: m.searchsorted(m.zeros(3), m.zeros(2), side="left", right=True),
    "searchsorted-0d": lambda m: m.searchsorted(m.zeros(()), m.zeros(2)),
    "searchsorted-rows": lambda m: m.searchsorted(m.zeros(2, 3), m.zeros(3, 2)),
    "bucketize-2d": lambda m: m.bucketize(m.zeros(2), m.zeros(2, 2)),
    "bincount-negative": lambda m: m.bincount(_t(m, [0, -1])),
    "bincount-2d": lambda m: m.bincount(_t(m, [[0, 1]])),
    "bincount-float": lambda m: m.bincount(m.zeros(2)),
    "bincount-minlength": lambda m: m.bincount(_t(m, [0, 1]), minlength=-1),
    "bincount-weights": lambda m: m.bincount(_t(m, [0, 1]), weights=m.zeros(3)),
    "median-empty-dim": lambda m: m.median(m.zeros(0, 3), 0),
    "median-dim": lambda m: m.median(m.zeros(2, 3), 2),
    "logcumsumexp-dim": lambda m: m.logcumsumexp(m.zeros(2), 1),
    "logcumsumexp-int": lambda m: m.logcumsumexp(_t(m, [1, 2]), 0),
    "unique-dim": lambda m: m.unique(m.zeros(2, 3), dim=2),
    "scatter_reduce-reduce": lambda m: m.zeros(3).scatter_reduce(0, _t(m, [0]), m.ones(1), "add"),
    "scatter_reduce-dtypes": lambda m: m.zeros(3).scatter_reduce(0, _t(m, [0]), m.ones(1, dtype=m.float64), "sum"),
    "scatter-reduce-mean": lambda m: m.zeros(3).scatter(0, _t(m, [0]), m.ones(1), reduce="mean"),
    "index_put-dtypes": lambda m: m.zeros(3).index_put((_t(m, [0]),), _t(m, [1])),
    "index_put-values": lambda m: m.zeros(3).index_put((_t(m, [0]),), 1.0),
    "index_put-indices": lambda m: m.zeros(3).index_put((None,), m.ones(1)),
    "index_put-shapes": lambda m: m.zeros(3, 4).index_put((_t(m, [0, 2]),), m.ones(2)),
    "index_put-bounds": lambda m: m.zeros(3).index_put((_t(m, [5]),), m.ones(1)),
    "index_put-float-index": lambda m: m.zeros(3).index_put((_t(m, [1.0]),), m.ones(1)),
    "masked_scatter-short": lambda m: m.zeros(3).masked_scatter(_t(m, [True, True, False]), m.ones(1)),
    "masked_scatter-mask": lambda m: m.zeros(3).masked_scatter(_t(m, [1, 1, 0]), m.ones(3)),
    "masked_scatter-dtypes": lambda m: m.zeros(3).masked_scatter(_t(m, [True, True, False]), m.ones(3, dtype=m.float64)),
    "masked_scatter_-grows": lambda m: m.zeros(3).masked_scatter_(m.ones(2, 3, dtype=m.bool), m.ones(6)),
    "unfold-size": lambda m: m.zeros(3).unfold(0, 4, 1),
    "unfold-step": lambda m: m.zeros(3).unfold(0, 2, 0),
    "unfold-dim": lambda m: m.zeros(3).unfold(1, 1, 1),
    "isin-scalars": lambda m: m.isin(1, 2),
}


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_argument_checks_raise_torchs_exception_type(name):
    call = ERRORS[name]
    with pytest.raises(Exception) as expected:
        call(torch)
    with pytest.raises(Exception) as got:
        call(flow)
    assert isinstance(got.value, type(expected.value)), (
        f"{name}: engine raises {type(got.value).__name__}({got.value}), torch {type(expected.value).__name__}")


@pytest.mark.parametrize("reduce", ["amax", "amin"])
@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "int64"])
def test_scatter_reduce_extremes_on_cuda_equal_the_cpu_exactly(cuda_double, reduce, dtype):
    """Many repeated targets, ties and NaN: CUDA (which cannot use CuPy's maximum/minimum.at for
    floats: its float64 atomics round to float32, modelled by the double) writes what the CPU's
    numpy maximum/minimum.at writes, NaN where they put NaN."""
    rng = np.random.default_rng(3)
    x, src = rng.standard_normal((5, 7)), rng.standard_normal((40, 7))
    idx = rng.integers(0, 5, (40, 7))
    src[4], idx[4] = src[3], idx[3]  # ties on the same targets
    if dtype.startswith("float"):
        src[7, 2] = src[11, 5] = np.nan
    else:
        x, src = np.round(x * 3), np.round(src * 3)
    stats = cuda_double._double.stats
    for include_self in (True, False):
        args = [(flow.tensor(x.astype(dtype), device=dev), flow.tensor(idx, device=dev),
                 flow.tensor(src.astype(dtype), device=dev)) for dev in ("cpu", "cuda")]
        stats.reset()
        flow.scatter_reduce(args[1][0], 0, args[1][1], args[1][2], "sum", include_self=include_self)
        index_checks = stats.syncs  # scatter's own index validation
        stats.reset()
        gpu = flow.scatter_reduce(args[1][0], 0, args[1][1], args[1][2], reduce, include_self=include_self)
        # no boolean compaction reads a count back; the floats' two sorts wait for the stream (Thrust)
        assert stats.syncs == index_checks + (2 if dtype.startswith("float") else 0)
        cpu = flow.scatter_reduce(args[0][0], 0, args[0][1], args[0][2], reduce, include_self=include_self)
        assert gpu.device.type == "cuda"
        np.testing.assert_array_equal(gpu.cpu().numpy(), cpu.numpy())


def test_gelu_of_a_0d_cuda_tensor(cuda_double):
    for approximate in ("none", "tanh"):
        x = flow.tensor(np.float32(0.5), requires_grad=True)
        xc = flow.tensor(np.float32(0.5), device="cuda", requires_grad=True)
        y, yc = (flow.nn.functional.gelu(t, approximate=approximate) for t in (x, xc))
        y.backward(), yc.backward()
        assert yc.shape == () and yc.device.type == "cuda"
        np.testing.assert_allclose(yc.detach().cpu().numpy(), y.detach().numpy(), rtol=1e-6)
        np.testing.assert_allclose(xc.grad.cpu().numpy(), x.grad.numpy(), rtol=1e-6)
