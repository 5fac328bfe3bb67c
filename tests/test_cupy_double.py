"""The strict CuPy double enforces what a GPU would: each rule below must hold, or the CPU-side
CI of the CUDA path would let through code that fails on a real GPU."""
import numpy as np
import pytest


def test_no_implicit_conversion_to_host(cuda_double):
    a = cuda_double.arange(4, dtype=np.float32)
    with pytest.raises(TypeError, match="Implicit conversion to a NumPy array is not allowed"):
        np.asarray(a)
    assert a.get().tolist() == [0, 1, 2, 3]


def test_host_arrays_are_refused_as_operands(cuda_double):
    a = cuda_double.ones(3, dtype=np.float32)
    for host in (np.ones(3, np.float32), np.asarray(2.0, np.float32)):
        with pytest.raises(TypeError, match="Unsupported type <class 'numpy.ndarray'>"):
            a * host
        with pytest.raises(TypeError, match="Unsupported type"):
            cuda_double.maximum(host, a)
    assert (a * np.float32(2)).get().tolist() == [2, 2, 2]  # numpy scalars are fine
    assert (2 * a).dtype == np.float32


def test_numpy_functions_dispatch_to_the_device(cuda_double):
    a = cuda_double.arange(3, dtype=np.float32)
    assert isinstance(np.exp(a), cuda_double.ndarray)
    assert isinstance(np.concatenate([a, a]), cuda_double.ndarray)


def test_missing_dtypes_and_names_are_refused(cuda_double):
    import ml_dtypes
    with pytest.raises(TypeError, match="Unsupported dtype bfloat16"):
        cuda_double.zeros(2, dtype=ml_dtypes.bfloat16)
    with pytest.raises(TypeError, match="Unsupported dtype"):
        cuda_double.ones(2).astype(ml_dtypes.bfloat16)
    with pytest.raises(AttributeError):
        cuda_double.random.Generator(cuda_double.random.XORWOW(0)).permutation(3)


def test_launches_and_syncs_are_counted(cuda_double):
    stats = cuda_double._double.stats
    a = cuda_double.ones((4, 4), dtype=np.float32)
    stats.reset()
    b, t = a.reshape(16)[:8], a.T    # views: no launch
    assert stats.launches == 0
    t.reshape(16)                     # a transposed copy: one launch
    assert stats.launches == 1
    c = (a + 1).sum()                 # two kernels
    assert stats.launches == 3
    assert stats.syncs == 0
    float(c), bool(c > 0), c.item()   # three reads back (plus the comparison's launch)
    assert stats.syncs == 3
    b.get()
    assert stats.syncs == 4


def test_operands_on_another_device_are_refused(cuda_double, monkeypatch):
    monkeypatch.setattr(cuda_double._double, "DEVICE_COUNT", 2)
    a = cuda_double.ones(2)
    with cuda_double.cuda.Device(1):
        b = cuda_double.ones(2)
        with pytest.raises(ValueError, match="different from the current device"):
            a + b
    assert b.device.id == 1 and a.device.id == 0


def test_raw_kernel_arguments_are_checked(cuda_double):
    k = cuda_double.RawKernel('extern "C" __global__ void engine_philox_bits(unsigned* o) {}', "engine_philox_bits")
    out = cuda_double.empty(8, dtype=np.uint32)
    null = np.uint64(0)  # the stream-state pointer: null outside a CUDA graph
    with pytest.raises(TypeError, match="Python int"):
        k((1,), (32,), (out, 8, np.uint64(0), np.uint64(0), null))
    with pytest.raises(ValueError, match="not C-contiguous"):
        k((1,), (32,), (cuda_double.empty((4, 4), dtype=np.uint32).T, np.uint64(8), np.uint64(0), np.uint64(0), null))
    with pytest.raises(TypeError, match="numpy array"):
        k((1,), (32,), (np.empty(8, np.uint32), np.uint64(8), np.uint64(0), np.uint64(0), null))
    with pytest.raises(ValueError, match="1024 threads"):
        k((1,), (2048,), (out, np.uint64(8), np.uint64(0), np.uint64(0), null))
    with pytest.raises(TypeError, match="stream state"):
        k((1,), (32,), (out, np.uint64(8), np.uint64(0), np.uint64(0), np.uint64(5)))
    k((1,), (32,), (out, np.uint64(8), np.uint64(0), np.uint64(0), null))
    assert out.get().any()


def test_device_addresses_resolve_to_the_memory(cuda_double):
    a = cuda_double.arange(10, dtype=np.float32)
    v = cuda_double._double.view(a[3:].data.ptr, np.float32, 4)
    assert v.tolist() == [3, 4, 5, 6]
    v[0] = 30
    assert float(a[3]) == 30
    with pytest.raises(ValueError, match="runs past"):
        cuda_double._double.view(a.data.ptr, np.float32, 11)


def test_cublas_routines_are_refused_inside_a_stream_capture(cuda_double):
    """CuPy's cuBLAS wrappers raise while a stream captures; a two-operand einsum is one of them
    (it reaches cupy.matmul), a one-operand einsum is a reduction and runs."""
    a = cuda_double.ones((2, 3), dtype=np.float32)
    stream = cuda_double.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        try:
            for call in (lambda: cuda_double.einsum("ij,ij->i", a, a), lambda: cuda_double.matmul(a, a.T)):
                with pytest.raises(NotImplementedError, match="calling cuBLAS API during stream capture"):
                    call()
            assert cuda_double.einsum("ij->i", a).shape == (2,)
        finally:
            stream.end_capture()
    assert cuda_double.einsum("ij,ij->i", a, a).get().tolist() == [3, 3]


@pytest.mark.parametrize("ufunc", ["maximum", "minimum"])
def test_float64_maximum_and_minimum_at_round_through_float32_as_cupy(cuda_double, ufunc):
    """CuPy 14's atomicMax/atomicMin for double compare with fmaxf/fminf (cupy/atomics.cuh): what
    ufunc.at and scatter_max/min write is rounded to float32 (seen on an H200). Float32 is exact."""
    x = 1 + 1e-12
    for dtype, want in ((np.float64, float(np.float32(x))), (np.float32, float(np.float32(x)))):
        out = cuda_double.zeros(2, dtype=dtype) + (-10.0 if ufunc == "maximum" else 10.0)
        getattr(cuda_double, ufunc).at(out, cuda_double.asarray([0, 0]), cuda_double.asarray([x, x], dtype=dtype))
        assert out.get()[0] == want
        other = cuda_double.zeros(2, dtype=dtype) + (-10.0 if ufunc == "maximum" else 10.0)
        getattr(other, "scatter_max" if ufunc == "maximum" else "scatter_min")(
            cuda_double.asarray([1]), cuda_double.asarray([x], dtype=dtype))
        assert other.get()[1] == want
    nan = cuda_double.asarray([np.nan, 2.0])  # fmaxf / fminf drop a NaN
    out = cuda_double.zeros(1, dtype=np.float32)
    getattr(cuda_double, ufunc).at(out, cuda_double.asarray([0, 0]), nan.astype(np.float32))
    assert out.get()[0] == (2.0 if ufunc == "maximum" else 0.0)


def test_chunked_kernel_launches_must_be_aligned(cuda_double):
    """The 16-byte paths of the row kernels read through aligned vector loads: the emulators
    refuse a chunked launch on an array that does not start on a 16-byte boundary."""
    from engine.kernels import _cuda, bias_add
    y = cuda_double.zeros(17, dtype=np.float16)[1:].reshape(2, 8)
    b = cuda_double.zeros(8, dtype=np.float16)
    assert not bias_add.chunked(y, b)
    kernel = _cuda.raw_kernel(bias_add.SOURCE, _cuda.kernel_name("engine_bias_add", np.float16))
    with pytest.raises(ValueError, match="16-byte path with y at address"):
        kernel((1,), (32,), (y, b, np.uint64(16), np.int32(8), np.int32(1)))
    kernel((1,), (32,), (y, b, np.uint64(16), np.int32(8), np.int32(0)))  # one element per thread: fine


def test_an_allocation_with_permuted_axes_resolves_to_its_memory(cuda_double):
    """astype / copy of a transposed array keep its layout (order "K"): one dense block whose axes
    are neither in C nor F order. Its addresses resolve, and a cuBLAS product reads it (a Swin
    float16 backward hit this: its patch embedding's weight gradient)."""
    cp = cuda_double
    from engine.backend import cublas
    host = np.random.default_rng(0).standard_normal((3, 4, 5)).astype(np.float32)
    a = cp.asarray(host).transpose(1, 2, 0).astype(np.float16)  # [4, 5, 3], strides of a (3, 4, 5) block
    assert not (a.flags.c_contiguous or a.flags.f_contiguous)
    flat = cuda_double._double.view(a.data.ptr, np.float16, a.size)
    np.testing.assert_array_equal(np.sort(flat), np.sort(host.astype(np.float16).reshape(-1)))
    b = cp.asarray(np.ones((4, 3, 2), np.float16))
    want = np.matmul(host.transpose(1, 2, 0).astype(np.float16).astype(np.float32), np.ones((4, 3, 2), np.float32))
    np.testing.assert_allclose(cp.asnumpy(cublas.matmul(a, b)).astype(np.float32), want, rtol=2e-3)


def test_sorts_are_stable_and_synchronise_as_cupys(cuda_double):
    """CuPy sorts with Thrust: stable, and the sort waits for the stream (CuPy issue #9126);
    unique sorts too."""
    cp = cuda_double
    keys = cp.asarray(np.array([2, 1, 2, 1, 0, 2]))
    stats = cuda_double._double.stats
    stats.reset()
    orders = cp.argsort(keys), keys.argsort()
    assert stats.syncs == 2
    assert [cp.asnumpy(o).tolist() for o in orders] == [[4, 1, 3, 0, 2, 5]] * 2
    stats.reset()
    cp.unique(keys)  # a sort, and an output whose size is read back
    assert stats.syncs == 1
