"""Emulators of the loss and optimizer kernels: engine/kernels/cross_entropy.py, adamw.py and
grad_norm.py. Each checks the launch as the kernel assumes it (1-D grid and block, the block a
whole number of warps, one block per row where a kernel takes a row per block, scalar argument
types, the multi-tensor table consistent with its sizes and pointing into live allocations) and
then computes with the kernel's numpy reference on the memory the kernel would see."""
import numpy as np

from cupy_double import _double
from cupy_double.kernel_emulators import emulates
from engine.kernels import _multi_tensor as mt
from engine.kernels._cuda import CHUNK_BYTES, acc_dtype
from engine.kernels import adamw as _adamw
from engine.kernels import cross_entropy as _ce
from engine.kernels import grad_norm as _gn
from engine.kernels import loss_scale as _ls


_SUFFIX_DTYPES = {"float": np.float32, "double": np.float64, "half": np.float16}


def _dtypes(name):
    """The dtypes named by a kernel's suffixes: engine_x__float -> [float32]; __half_float -> [f16, f32]."""
    return [np.dtype(_SUFFIX_DTYPES[s]) for s in name.split("__", 1)[1].split("_")]


def _linear(name, grid, block, shared_mem=0):
    """A 1-D launch of whole warps (the kernels index with blockIdx.x / threadIdx.x only and reduce
    over warps)."""
    if grid[1:] != (1, 1) or block[1:] != (1, 1):
        raise ValueError(f"{name}: 1-D grid and block expected, got grid {grid} block {block}")
    if block[0] % 32:
        raise ValueError(f"{name}: block of {block[0]} threads is not a whole number of warps")
    if shared_mem:
        raise ValueError(f"{name}: takes no dynamic shared memory, got {shared_mem} bytes")


def _scalar(name, value, dtype, what):
    if not isinstance(value, np.generic) or value.dtype != np.dtype(dtype):
        raise TypeError(f"{name}: {what} must be a {np.dtype(dtype)} scalar, got {value!r} ({type(value).__name__})")
    return value


def _array(name, value, dtype, size, what):
    if not isinstance(value, np.ndarray) or value.dtype != np.dtype(dtype) or value.size < size:
        got = f"{value.dtype} x {value.size}" if isinstance(value, np.ndarray) else type(value).__name__
        raise ValueError(f"{name}: {what} must hold {size} x {np.dtype(dtype)}, got {got}")
    return value


def _table_views(name, table, n, n_chunks, chunk, columns, dtypes):
    """Views of the tensors a multi-tensor table points at: one list per column (None where the
    pointer is 0), after checking the table against its sizes and the chunk arguments."""
    _scalar(name, n, np.int32, "the number of tensors")
    _scalar(name, n_chunks, np.int64, "the number of chunks")
    _scalar(name, chunk, np.int32, "the chunk size")
    if chunk != mt.CHUNK:
        raise ValueError(f"{name}: chunk {chunk}, the tables are built with chunks of {mt.CHUNK}")
    ptrs, sizes, starts = mt.read_table(table, int(n), columns)
    if int(n_chunks) != int(starts[-1]):
        raise ValueError(f"{name}: {n_chunks} chunks passed, the table has {starts[-1]}")
    return [[None if ptr == 0 else _double.view(int(ptr), dtypes[c], int(size)) for ptr, size in zip(ptrs[c], sizes)]
            for c in range(columns)]


@emulates("engine_adamw")
def adamw(name, grid, block, args, shared_mem):
    _linear(name, grid, block, shared_mem)
    dtype, = _dtypes(name)
    table, n, n_chunks, chunk, *scalars, flags, skip = args
    acc = _adamw.compute_dtype(dtype)
    for i, s in enumerate(scalars):
        _scalar(name, s, acc, f"scalar argument {i + 4}")
    _scalar(name, flags, np.int32, "flags")
    _array(name, skip, np.float32, 1, "skip (the inf/nan flag)")
    dtypes = [dtype] * _adamw.COLUMNS
    dtypes[_adamw.HALF_COPY] = np.dtype(np.float16)
    w, g, m, v, vmax, half = _table_views(name, table, n, n_chunks, chunk, _adamw.COLUMNS, dtypes)
    amsgrad = bool(flags & _adamw.AMSGRAD)
    if amsgrad and any(x is None for x in vmax):
        raise ValueError(f"{name}: amsgrad without a max_exp_avg_sq pointer")
    if skip[0] != 0:
        _adamw.adam_update_numpy(w, g, m, v, vmax if amsgrad else None, None, half, skip[0])
        return
    with np.errstate(all="ignore"):
        for i in range(int(n)):
            _adamw.adam_arrays(w[i], g[i], m[i], v[i], vmax[i] if amsgrad else None, tuple(scalars), flags, half[i])


@emulates("engine_grad_norm_partial")
def grad_norm_partial(name, grid, block, args, shared_mem):
    _linear(name, grid, block, shared_mem)
    dtype, acc = _dtypes(name)
    table, n, n_chunks, chunk, partials, mode, p = args
    _scalar(name, mode, np.int32, "mode")
    _scalar(name, p, acc, "p")
    _array(name, partials, acc, grid[0], "partials (one per block)")
    flats, = _table_views(name, table, n, n_chunks, chunk, 1, [dtype])
    partials[: grid[0]] = _gn.chunk_partials(flats, grid[0], int(mode), p, acc)


@emulates("engine_grad_norm_finish")
def grad_norm_finish(name, grid, block, args, shared_mem):
    _linear(name, grid, block, shared_mem)
    if grid[0] != 1:
        raise ValueError(f"{name}: one block combines the partials, got a grid of {grid[0]}")
    acc, = _dtypes(name)
    partials, count, out, mode, p, root = args
    for value, what in ((count, "count"), (mode, "mode"), (root, "root")):
        _scalar(name, value, np.int32, what)
    _scalar(name, p, acc, "p")
    _array(name, partials, acc, int(count), "partials")
    _array(name, out, acc, 1, "out")
    with np.errstate(all="ignore"):
        raw = np.asarray(_gn.combine(partials[: int(count)], int(mode), acc), dtype=acc)
        out[0] = _gn.finish_norm(np, raw, int(mode), p) if root else raw


@emulates("engine_grad_scale")
def grad_scale(name, grid, block, args, shared_mem):
    _linear(name, grid, block, shared_mem)
    dtype, norm = _dtypes(name)
    table, n, n_chunks, chunk, total, max_norm = args
    _array(name, total, norm, 1, "total")
    _scalar(name, max_norm, norm, "max_norm")
    flats, = _table_views(name, table, n, n_chunks, chunk, 1, [dtype])
    _gn.scale_grads_numpy(flats, total[:1].reshape(()), max_norm)


@emulates("engine_grad_unscale")
def grad_unscale(name, grid, block, args, shared_mem):
    _linear(name, grid, block, shared_mem)
    dtype, = _dtypes(name)
    table, n, n_chunks, chunk, scale, found = args
    _array(name, scale, np.float32, 1, "scale")
    _array(name, found, np.float32, 1, "found")
    flats, = _table_views(name, table, n, n_chunks, chunk, 1, [dtype])
    _gn.unscale_grads_numpy(flats, scale[0], found[:1].reshape(()))


@emulates("engine_amp_update_scale")
def amp_update_scale(name, grid, block, args, shared_mem):
    _linear(name, grid, block, shared_mem)
    scale, tracker, found, growth, backoff, interval = args
    _array(name, scale, np.float32, 1, "scale")
    _array(name, tracker, np.int32, 1, "tracker")
    _array(name, found, np.float32, 1, "found")
    _scalar(name, growth, np.float64, "growth")
    _scalar(name, backoff, np.float64, "backoff")
    _scalar(name, interval, np.int32, "interval")
    _ls.update_scale_numpy(scale[:1].reshape(()), tracker[:1].reshape(()), found[0], float(growth), float(backoff),
                           int(interval))


def _rows(name, grid, block, shared_mem, rows):
    """A one-block-per-row launch: at least `rows` blocks (blocks past the last row return)."""
    _linear(name, grid, block, shared_mem)
    if grid[0] < rows:
        raise ValueError(f"{name}: one block per row, {rows} rows, got a grid of {grid[0]}")


def _shape_args(name, rows, cols):
    _scalar(name, rows, np.int32, "rows")
    _scalar(name, cols, np.int32, "cols")
    return int(rows), int(cols)


def _grouped(name, grouped, c, x):
    """The 8-logits-per-thread reading needs rows of a multiple of 8 classes, 16-byte aligned."""
    _scalar(name, grouped, np.int32, "grouped")
    if grouped and c % 8:
        raise ValueError(f"{name}: grouped reading of rows of {c} classes")
    if grouped and _double.address(x) % CHUNK_BYTES:
        raise ValueError(f"{name}: grouped reading of logits at address {_double.address(x):#x}")


@emulates("engine_ce_fwd")
def ce_fwd(name, grid, block, args, shared_mem):
    dtype, = _dtypes(name)
    acc = acc_dtype(dtype)
    x, target, loss, stats, rows, cols, ignore_index, smoothing, grouped = args
    m, c = _shape_args(name, rows, cols)
    _rows(name, grid, block, shared_mem, m)
    _scalar(name, ignore_index, np.int64, "ignore_index")
    _scalar(name, smoothing, np.float64, "smoothing")
    _grouped(name, grouped, c, x)
    x = _array(name, x, dtype, m * c, "x")[: m * c].reshape(m, c)
    target = _array(name, target, np.int64, m, "target")[:m]
    loss_, stats_ = _ce.cross_entropy_fwd_numpy(x, target, int(ignore_index), float(smoothing))
    _array(name, loss, acc, m, "loss")[:m] = loss_
    _array(name, stats, acc, 2 * m, "stats")[: 2 * m] = stats_.reshape(-1)


@emulates("engine_ce_bwd_rows")
def ce_bwd_rows(name, grid, block, args, shared_mem):
    dtype, = _dtypes(name)
    acc = acc_dtype(dtype)
    x, stats, target, scale, dx, rows, cols, ignore_index, smoothing, stride, grouped = args
    m, c = _shape_args(name, rows, cols)
    _rows(name, grid, block, shared_mem, m)
    _scalar(name, ignore_index, np.int64, "ignore_index")
    _scalar(name, smoothing, np.float64, "smoothing")
    _scalar(name, stride, np.int32, "scale_stride")
    _grouped(name, grouped, c, x)
    x = _array(name, x, dtype, m * c, "x")[: m * c].reshape(m, c)
    scale = _array(name, scale, acc, (m - 1) * int(stride) + 1 if m else 0, "scale")
    scale = scale[: m * int(stride): int(stride)] if stride else scale[:1]
    out = _ce.cross_entropy_bwd_rows_numpy(x, _array(name, stats, acc, 2 * m, "stats")[: 2 * m].reshape(m, 2),
                                           _array(name, target, np.int64, m, "target")[:m], scale,
                                           int(ignore_index), float(smoothing), dtype)
    _array(name, dx, dtype, m * c, "dx")[: m * c] = out.reshape(-1)


@emulates("engine_ce_vocab_stats")
def ce_vocab_stats(name, grid, block, args, shared_mem):
    dtype, = _dtypes(name)
    acc = acc_dtype(dtype)
    x, row_max, target, stats, rows, cols, start = args
    m, c = _shape_args(name, rows, cols)
    _rows(name, grid, block, shared_mem, m)
    _scalar(name, start, np.int64, "start")
    x = _array(name, x, dtype, m * c, "x")[: m * c].reshape(m, c)
    out = _ce.vocab_stats_numpy(x, _array(name, row_max, acc, m, "row_max")[:m],
                                _array(name, target, np.int64, m, "target")[:m], int(start))
    _array(name, stats, acc, 3 * m, "stats")[: 3 * m] = out.reshape(-1)


@emulates("engine_ce_vocab_loss")
def ce_vocab_loss(name, grid, block, args, shared_mem):
    dtype, = _dtypes(name)
    acc = acc_dtype(dtype)
    x, row_max, stats, target, loss, dunit, rows, cols, start, classes, ignore_index, smoothing = args
    m, c = _shape_args(name, rows, cols)
    _rows(name, grid, block, shared_mem, m)
    for value, what in ((start, "start"), (classes, "classes"), (ignore_index, "ignore_index")):
        _scalar(name, value, np.int64, what)
    _scalar(name, smoothing, np.float64, "smoothing")
    x = _array(name, x, dtype, m * c, "x")[: m * c].reshape(m, c)
    loss_, dunit_ = _ce.vocab_loss_numpy(x, _array(name, row_max, acc, m, "row_max")[:m],
                                         _array(name, stats, acc, 3 * m, "stats")[: 3 * m].reshape(m, 3),
                                         _array(name, target, np.int64, m, "target")[:m], int(start), int(classes),
                                         int(ignore_index), float(smoothing))
    _array(name, loss, acc, m, "loss")[:m] = loss_
    _array(name, dunit, acc, m * c, "dunit")[: m * c] = dunit_.reshape(-1)


@emulates("engine_ce_bwd")
def ce_bwd(name, grid, block, args, shared_mem):
    _linear(name, grid, block, shared_mem)  # grid-stride: any grid covers the elements
    dtype, = _dtypes(name)
    acc = acc_dtype(dtype)
    dunit, scale, dx, n, cols, stride = args
    _scalar(name, n, np.int64, "n")
    _scalar(name, cols, np.int32, "cols")
    _scalar(name, stride, np.int32, "scale_stride")
    n, c = int(n), int(cols)
    rows = -(-n // c)
    scale = _array(name, scale, acc, (rows - 1) * int(stride) + 1 if rows else 0, "scale")
    scale = scale[: rows * int(stride): int(stride)] if stride else scale[:1]
    dunit = _array(name, dunit, acc, n, "dunit")[:n].reshape(rows, c) if n else np.zeros((0, c), acc)
    _array(name, dx, dtype, n, "dx")[:n] = _ce.cross_entropy_bwd_numpy(dunit, scale, dtype).reshape(-1)
