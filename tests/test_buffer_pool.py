"""engine.backend.buffers: large kernel outputs reuse pooled memory only once nothing refers to it."""
import numpy as np
import pytest

import engine as flow
from engine.backend import buffers

BIG = (512, 1024)  # 2 MiB of float32: pooled


@pytest.fixture
def pool():
    buffers.clear()
    before = buffers._limit
    yield buffers
    buffers.set_limit_mb(before / (1 << 20))
    buffers.clear()


def _addr(a):
    return a.__array_interface__["data"][0]


def test_a_free_buffer_is_reused_and_a_busy_one_is_not(pool):
    a = pool.empty(BIG, np.float32)
    addr = _addr(a)
    b = pool.empty(BIG, np.float32)  # `a` is alive: another buffer
    assert _addr(b) != addr
    del a
    c = pool.empty(BIG, np.float32)  # `a` is gone: its buffer comes back
    assert _addr(c) == addr and c.shape == BIG and c.dtype == np.float32
    assert pool.stats()[1] == 2


VIEWS = {
    "slice": lambda a: a[3:],
    "transpose": lambda a: a.T,
    "reshape": lambda a: a.reshape(-1),
    "dtype view": lambda a: a.view(np.int32).view(np.float32),
    "strided": lambda a: np.asarray(a)[::2],
    "tensor": lambda a: flow.from_numpy(a),
}


@pytest.mark.parametrize("kind", sorted(VIEWS))
def test_any_view_keeps_the_buffer_busy(pool, kind):
    a = pool.empty(BIG, np.float32)
    addr = _addr(a)
    a[...] = 7.0
    v = VIEWS[kind](a)
    del a
    fresh = pool.empty(BIG, np.float32)
    assert _addr(fresh) != addr, "a buffer was handed out while a view of it was alive"
    fresh[...] = -1.0
    del fresh
    values = v.numpy() if isinstance(v, flow.Tensor) else v
    assert np.all(values == 7.0)
    del v, values
    assert pool.stats()[2] == pool.stats()[1] == 2  # both free now


def test_sizes_dtypes_and_small_arrays(pool):
    a = pool.empty((256, 1024), np.float64)  # same bytes as BIG float32
    addr = _addr(a)
    del a
    b = pool.empty(BIG, np.float32)
    assert _addr(b) == addr and b.dtype == np.float32  # keyed by bytes, viewed as asked
    small = pool.empty((10, 10), np.float32)
    assert small.base is None and pool.stats()[1] == 1  # small arrays are numpy's own
    assert pool.empty(5000, np.int64).shape == (5000,)


def test_the_limit_bounds_the_pool_and_releases_least_recently_used(pool):
    pool.set_limit_mb(5)  # room for two 2 MiB buffers
    a, b = pool.empty(BIG, np.float32), pool.empty(BIG, np.float32)
    c = pool.empty(BIG, np.float32)  # over the limit while a, b are busy: not kept
    assert pool.stats()[:2] == (2 * 2 ** 21, 2)
    del a, b, c
    d = pool.empty((3 << 20,), np.uint8)  # 3 MiB: frees one free 2 MiB buffer to fit
    assert pool.stats()[1] == 2 and pool.stats()[0] == 2 ** 21 + 3 * 2 ** 20
    del d
    pool.set_limit_mb(0)  # off
    assert pool.stats()[1] == 0
    assert pool.empty(BIG, np.float32).base is None


def test_tensors_keep_their_values_while_the_pool_recycles(pool):
    """A training-like sequence: results kept as Tensors are never overwritten by later kernels."""
    rng = np.random.default_rng(0)
    w = flow.tensor(rng.standard_normal((512, 512)).astype(np.float32))
    x = flow.tensor(rng.standard_normal((1024, 512)).astype(np.float32))
    kept = []
    want = []
    h = x
    for i in range(6):
        h = flow.nn.functional.gelu(h @ w) * 0.05
        if i % 2 == 0:
            kept.append(h)
            want.append(h.numpy().copy())
        _ = [flow.nn.functional.layer_norm(h, (512,)) for _ in range(3)]  # temporaries, dropped
    for k, v in zip(kept, want):
        np.testing.assert_array_equal(k.numpy(), v)
    assert pool.stats()[1] > 0


def test_a_pooled_gradient_is_adopted_by_the_leaf_and_then_kept_busy(pool):
    x = flow.tensor(np.ones((1024, 512), np.float32), requires_grad=True)
    (x * 3.0).sum().backward()
    grad = x.grad.numpy()
    assert id(grad.base) in pool._pooled_ids, "the pooled gradient was copied instead of adopted"
    assert pool.owns_memory(x.grad._data)
    np.testing.assert_array_equal(grad, 3.0)
    del grad
    for _ in range(3):  # the pool must not hand x.grad's memory to later kernels
        (flow.tensor(np.full((1024, 512), 5.0, np.float32)) * 2.0).numpy()
    np.testing.assert_array_equal(x.grad.numpy(), 3.0)


def test_threads_never_share_a_buffer(pool):
    import threading

    held = [[] for _ in range(4)]
    start = threading.Barrier(4)

    def grab(i):
        start.wait()
        for _ in range(200):
            a = pool.empty(BIG, np.float32)
            held[i].append(a)
            if len(held[i]) > 2:
                held[i].pop(0)

    ts = [threading.Thread(target=grab, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    addrs = [_addr(a) for h in held for a in h]
    assert len(addrs) == len(set(addrs)) == 8
