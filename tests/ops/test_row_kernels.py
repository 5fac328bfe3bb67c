"""Row kernels of engine/ops/_kernels.py that take another route than numpy's reduction for
speed must give numpy's exact result: row_max (halving on short rows)."""
import numpy as np
import pytest

from engine.ops._kernels import SHORT_ROW, row_max


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 16, 17, 31, SHORT_ROW, SHORT_ROW + 1, 49, 128])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_max_equals_numpy_max(n, dtype):
    rng = np.random.default_rng(n)
    x = rng.standard_normal((3, 11, n)).astype(dtype)
    x[0, 0, -1] = np.nan
    x[1, 2, 0] = np.nan
    x[2, 3, :] = -np.inf
    x[2, 4, n // 2] = np.inf
    got = row_max(x)
    want = x.max(axis=-1, keepdims=True)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)  # nan where numpy gives nan, infinities kept


def test_row_max_on_views_and_empty_arrays():
    x = np.random.default_rng(0).standard_normal((6, 40)).astype(np.float32)
    view = x[::2, 3:23]  # strided rows of 20
    np.testing.assert_array_equal(row_max(view), view.max(axis=-1, keepdims=True))
    assert row_max(np.zeros((0, 8), np.float32)).shape == (0, 1)
    with pytest.raises(ValueError):
        row_max(np.zeros((3, 0), np.float32))  # as numpy: no identity for an empty row


@pytest.mark.parametrize("rows", [1, 7, 5000, 9000])
def test_column_sum_equals_numpy_and_not_the_thread_count(rows):
    """A bias gradient's sum over rows (engine.ops._core.sum_to_array's common case): numpy's
    result, and the same bits for any thread count (the large case runs in fixed blocks)."""
    from engine.backend import parallel
    from engine.ops._core import sum_to_array
    from engine.ops._kernels import PARALLEL_COLUMN_SUM

    x = np.random.default_rng(rows).standard_normal((rows, 300)).astype(np.float32)
    before = parallel.get_num_threads()
    results = []
    try:
        for threads in (1, 2, 3):
            parallel.set_num_threads(threads)
            results.append(sum_to_array(x.reshape(rows, 3, 100).reshape(rows, 300), (300,)))
    finally:
        parallel.set_num_threads(before)
    assert results[0].shape == (300,) and results[0].dtype == np.float32
    # at least as accurate as numpy's own float32 sum over the rows (blocks only shorten the
    # sequential runs); a fixed tolerance would pass or fail with the block sizes' luck
    exact = x.astype(np.float64).sum(0)
    assert np.abs(results[0] - exact).max() <= np.abs(x.sum(axis=0) - exact).max()
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])
    if x.size < PARALLEL_COLUMN_SUM:
        np.testing.assert_array_equal(results[0], x.sum(axis=0))  # one einsum: numpy's own order
    assert sum_to_array(x[None], (1, 1, 300)).shape == (1, 1, 300)
