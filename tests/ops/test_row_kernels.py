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
