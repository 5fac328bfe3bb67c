"""Emulators of engine/kernels/{layer_norm,softmax,gelu,dropout_add,bias_add,cast}.py: each checks the launch as
the CUDA kernel reads it (scalar C types, element types, buffer sizes, geometry) and writes the
kernel's numpy reference into the output memory."""
import numpy as np

from cupy_double import _double
from engine.kernels import _cuda, add, bias_add, cast, dropout_add, gelu, layer_norm, philox, softmax

from . import emulates

_SUFFIX = {"half": np.float16, "float": np.float32, "double": np.float64}


def _elem(name):
    """The element type of instantiation `name` (base__half/__float/__double)."""
    return np.dtype(_SUFFIX[name.split("__", 1)[1]])


def _acc(dtype):
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


def _scalars(name, values, types):
    """The scalar arguments as Python numbers, each checked to have the width its C parameter has."""
    out = []
    for i, (v, t) in enumerate(zip(values, types)):
        if type(v) is not t:
            raise TypeError(f"{name}: scalar argument {i} is {type(v).__name__}, the kernel takes {t.__name__}")
        out.append(v.item())
    return out


def stream_position(name, seed, offset, state):
    """The (seed, offset) a kernel that draws its own numbers computes with: as passed, or for a
    draw captured in a CUDA graph (`state` a device uint64 [seed, base offset]) read from device
    memory now, at this launch or replay (engine/kernels/philox.py's stream_position)."""
    if isinstance(state, np.generic):
        if type(state) is not np.uint64 or int(state) != 0:
            raise TypeError(f"{name}: the stream state is {state!r}; a device array or a null pointer (np.uint64(0))")
        return int(seed), int(offset)
    base = _buf(name, "stream state", state, 2, np.uint64)
    return int(base[0]), (int(base[1]) + int(offset)) & philox.MASK64


def _buf(name, what, flat, count, dtype):
    """The first `count` elements of an array argument, which the kernel reads as `dtype`."""
    if flat.dtype != dtype:
        raise TypeError(f"{name}: {what} is {flat.dtype}, the kernel reads it as {np.dtype(dtype)}")
    if flat.size < count:
        raise ValueError(f"{name}: {what} has {flat.size} elements, the kernel touches {count}")
    return flat[:count]


def _warps(name, block):
    if block[0] % 32 or block[0] > 1024 or block[1:] != (1, 1):
        raise ValueError(f"{name}: block {block}; the block reductions need (32k, 1, 1), k <= 32")


def _one_block_per_row(name, grid, block, rows):
    _warps(name, block)
    if grid[0] < rows or grid[1:] != (1, 1):
        raise ValueError(f"{name}: grid {grid} for {rows} rows; the kernel takes one block per row")


# ------------------------------------------------------------------ layer_norm
def _beside(name, t):
    """The dtype of y (`_half_y`) or g (`_half_g`): float16 beside float32 rows, else the rows'."""
    return np.dtype(np.float16) if name.split("__", 1)[0].endswith(("_half_y", "_half_g")) else t


@emulates("engine_layer_norm_fwd_half_y")
@emulates("engine_layer_norm_fwd")
def _layer_norm_fwd(name, grid, block, args, shared_mem):
    x, w, b, y, mean, rstd, *scalars = args
    m, d, eps, has_w, has_b = _scalars(name, scalars, (np.int32, np.int32, np.float64, np.int32, np.int32))
    _one_block_per_row(name, grid, block, m)
    t = _elem(name)
    x2 = _buf(name, "x", x, m * d, t).reshape(m, d)
    w = _buf(name, "weight", w, d, t) if has_w else None
    b = _buf(name, "bias", b, d, t) if has_b else None
    ty = _beside(name, t)
    out = layer_norm.forward_reference(x2, w, b, eps, ty)
    for what, flat, value, dtype in (("y", y, out[0], ty), ("mean", mean, out[1], _acc(t)),
                                     ("rstd", rstd, out[2], _acc(t))):
        _buf(name, what, flat, value.size, dtype)[:] = value.reshape(-1)


@emulates("engine_layer_norm_bwd_half_g")
@emulates("engine_layer_norm_bwd")
def _layer_norm_bwd(name, grid, block, args, shared_mem):
    g, x, mean, rstd, w, dx, part_w, part_b, *scalars = args
    m, d, has_w, has_b = _scalars(name, scalars, (np.int32,) * 4)
    _warps(name, block)
    parts = grid[0]  # a grid-stride loop over rows: any number of blocks covers them
    t, acc = _elem(name), _acc(_elem(name))
    g2 = _buf(name, "g", g, m * d, _beside(name, t)).reshape(m, d)
    x2 = _buf(name, "x", x, m * d, t).reshape(m, d)
    mean, rstd = _buf(name, "mean", mean, m, acc), _buf(name, "rstd", rstd, m, acc)
    w = _buf(name, "weight", w, d, t) if has_w else None
    _buf(name, "dx", dx, m * d, t)[:] = layer_norm.backward_reference(g2, x2, mean, rstd, w, False)[0].reshape(-1)
    rows = -(-m // parts) * parts  # row r adds into block r % parts
    ga = np.zeros((rows, d), acc)
    ga[:m] = g2
    if has_w:
        gx = np.zeros((rows, d), acc)
        gx[:m] = ga[:m] * layer_norm.normalized_rows(x2, mean, rstd)
        _buf(name, "part_w", part_w, parts * d, acc)[:] = gx.reshape(-1, parts, d).sum(0).reshape(-1)
    if has_b:
        _buf(name, "part_b", part_b, parts * d, acc)[:] = ga.reshape(-1, parts, d).sum(0).reshape(-1)


@emulates("engine_layer_norm_bwd_wb")
def _layer_norm_bwd_wb(name, grid, block, args, shared_mem):
    part_w, part_b, dw, db, *scalars = args
    parts, d, has_w, has_b = _scalars(name, scalars, (np.int32,) * 4)
    if grid[0] * block[0] < d:
        raise ValueError(f"{name}: {grid[0]} x {block[0]} threads for {d} columns (one thread per column)")
    t, acc = _elem(name), _acc(_elem(name))
    for flag, what, part, out in ((has_w, "dw", part_w, dw), (has_b, "db", part_b, db)):
        if flag:
            total = _buf(name, f"part of {what}", part, parts * d, acc).reshape(parts, d).sum(0)
            _buf(name, what, out, d, t)[:] = total.astype(t)


# ------------------------------------------------------------------ softmax
_ROW_SCALARS = (np.int32, np.int32, np.int32, np.int64, np.int64, np.int64, np.int64)  # q, l1, l2, t0..tl


def _mask_rows(name, flat, m, d, l1, l2, t0, t1, t2, tl, dtype):
    """The [m, d] mask the kernel reads through its row strides, bounds checked."""
    rows = np.arange(m, dtype=np.int64)
    offset = (rows // (l1 * l2)) * t0 + ((rows // l2) % l1) * t1 + (rows % l2) * t2
    index = offset[:, None] + np.arange(d, dtype=np.int64)[None, :] * tl
    if flat.dtype != dtype:
        raise TypeError(f"{name}: mask is {flat.dtype}, the kernel reads it as {np.dtype(dtype)}")
    if index.min() < 0 or index.max() >= flat.size:
        raise ValueError(f"{name}: mask strides reach element {index.max()} of a mask of {flat.size}")
    return flat[index]


def _softmax_layout(name, m, d, causal, q):
    if causal and (q < 1 or m % q):
        raise ValueError(f"{name}: causal rows come in blocks of q={q}, got {m} rows")
    return (m // q, q, d) if causal else (m, d)


@emulates("engine_softmax_fwd")
def _softmax_fwd(name, grid, block, args, shared_mem):
    x, bmask, amask, y, *scalars = args
    m, d, q, scale, fill, kind, causal, l1, l2, t0, t1, t2, tl = _scalars(
        name, scalars, (np.int32, np.int32, np.int32, np.float64, np.float64, np.int32, np.int32) + _ROW_SCALARS[1:])
    _one_block_per_row(name, grid, block, m)
    t = _elem(name)
    shape = _softmax_layout(name, m, d, causal, q)
    mask = None
    if kind == softmax.MASK_BOOL:
        mask = _mask_rows(name, bmask, m, d, l1, l2, t0, t1, t2, tl, np.bool_).reshape(shape)
    elif kind == softmax.MASK_ADD:
        mask = _mask_rows(name, amask, m, d, l1, l2, t0, t1, t2, tl, _acc(t)).reshape(shape)
    x = _buf(name, "x", x, m * d, t).reshape(shape)
    _buf(name, "y", y, m * d, t)[:] = softmax.forward_reference(x, mask, scale, fill, bool(causal)).reshape(-1)


@emulates("engine_softmax_bwd")
def _softmax_bwd(name, grid, block, args, shared_mem):
    g, y, bmask, dx, *scalars = args
    m, d, q, scale, has_mask, causal, l1, l2, t0, t1, t2, tl = _scalars(
        name, scalars, (np.int32, np.int32, np.int32, np.float64, np.int32, np.int32) + _ROW_SCALARS[1:])
    _one_block_per_row(name, grid, block, m)
    t = _elem(name)
    shape = _softmax_layout(name, m, d, causal, q)
    mask = _mask_rows(name, bmask, m, d, l1, l2, t0, t1, t2, tl, np.bool_).reshape(shape) if has_mask else None
    g = _buf(name, "g", g, m * d, t).reshape(shape)
    y = _buf(name, "y", y, m * d, t).reshape(shape)
    _buf(name, "dx", dx, m * d, t)[:] = softmax.backward_reference(g, y, mask, scale, bool(causal)).reshape(-1)


# ------------------------------------------------------------------ gelu (ElementwiseKernels)
def _same_type(name, arrays):
    """CuPy resolves the kernels' one type T from the inputs: they must agree."""
    if len({a.dtype for a in arrays}) != 1:
        raise TypeError(f"{name}: inputs of types {[str(a.dtype) for a in arrays]} for parameters all typed T")


def _gelu_emulator(name, approximate, backward, with_bias):
    def run(*inputs):
        _same_type(name, inputs)
        g = inputs[0] if backward else None
        x = inputs[1 if backward else 0]
        b = inputs[-1] if with_bias else None
        if backward:
            shape = np.broadcast_shapes(*(a.shape for a in inputs))
            return gelu.gelu_grad_reference(np.broadcast_to(g, shape), np.broadcast_to(x, shape), b, approximate)
        return gelu.gelu_reference(x, b, approximate)

    return run


for _approximate in gelu.APPROXIMATIONS:
    for _backward in (False, True):
        for _with_bias in (False, True):
            _name = gelu.kernel_spec(_approximate, _backward, _with_bias)[0]
            emulates(_name)(_gelu_emulator(_name, _approximate, _backward, _with_bias))


def aligned_chunks(name, chunked, count, arrays):
    """A launch that reads and writes 16 bytes per thread (`chunked`): every array 16-byte
    aligned, and fewer than 2^31 chunks (the kernels' 32-bit grid-stride index)."""
    if not chunked:
        return
    if count >= _cuda.MAX_CHUNKS:
        raise ValueError(f"{name}: {count} chunks of 16 bytes overflow the 32-bit grid-stride index")
    for what, a in arrays.items():
        if _double.address(a) % _cuda.CHUNK_BYTES:
            raise ValueError(f"{name}: the 16-byte path with {what} at address {_double.address(a):#x}")


def _chunked_rows(name, n, d, chunked, arrays):
    """The element type of a kernel over rows of d that moves 16 bytes per thread when `chunked`
    (engine/kernels/bias_add.py, gelu.py), after checking that the launch is consistent."""
    t = _elem(name)
    if d < 1 or n % d:
        raise ValueError(f"{name}: {n} elements are not rows of d={d}")
    if chunked and (d * t.itemsize) % _cuda.CHUNK_BYTES:
        raise ValueError(f"{name}: the 16-byte path with rows of {d * t.itemsize} bytes")
    aligned_chunks(name, chunked, n * t.itemsize // _cuda.CHUNK_BYTES, arrays)
    return t


def _gelu_rows_emulator(name, grid, block, args, shared_mem):
    """engine_gelu_rows_{erf,tanh}_{fwd,bwd}: the raw kernels for C-contiguous operands."""
    g, x, b, out, *scalars = args
    n, d, has_b, chunked = _scalars(name, scalars, (np.uint64, np.int32, np.int32, np.int32))
    _grid_stride(name, grid, block)
    t = _chunked_rows(name, n, d, chunked, dict(g=g, x=x, out=out, **({"bias": b} if has_b else {})))
    approximate = "none" if "_erf_" in name else "tanh"
    xs = _buf(name, "x", x, n, t).reshape(-1, d)
    bias = _buf(name, "bias", b, d, t) if has_b else None
    if "_bwd" in name:
        ref = gelu.gelu_grad_reference(_buf(name, "g", g, n, t).reshape(-1, d), xs, bias, approximate)
    else:
        ref = gelu.gelu_reference(xs, bias, approximate)
    _buf(name, "out", out, n, t)[:] = ref.reshape(-1)


for _kind in ("erf", "tanh"):
    for _direction in ("fwd", "bwd"):
        emulates(f"engine_gelu_rows_{_kind}_{_direction}")(_gelu_rows_emulator)


# ------------------------------------------------------------------ bias + dropout + residual
def _grid_stride(name, grid, block):
    if grid[0] * block[0] < 1 or grid[1:] != (1, 1) or block[1:] != (1, 1):
        raise ValueError(f"{name}: grid {grid}, block {block}; the kernel is a 1-D grid-stride loop")


@emulates("engine_bias_dropout_add")
def _bias_dropout_add(name, grid, block, args, shared_mem):
    x, b, r, y, n, d, seed, offset, state, *scalars = args
    n, d, seed, offset = _scalars(name, (n, d, seed, offset), (np.uint64, np.int32, np.uint64, np.uint64))
    seed, offset = stream_position(name, seed, offset, state)
    p, scale, has_b, has_r = _scalars(name, scalars, (np.float64, np.float64, np.int32, np.int32))
    _grid_stride(name, grid, block)
    if scale != dropout_add.keep_scale(p):
        raise ValueError(f"{name}: scale {scale} for p={p}")
    t = _elem(name)
    if n % d:
        raise ValueError(f"{name}: {n} elements are not rows of d={d}")
    x2 = _buf(name, "x", x, n, t).reshape(-1, d)
    bias = _buf(name, "bias", b, d, t) if has_b else None
    res = _buf(name, "residual", r, n, t).reshape(-1, d) if has_r else None
    out = dropout_add.bias_dropout_add_reference(x2, bias, res, p, seed, offset)
    _buf(name, "y", y, n, t)[:] = out.reshape(-1)


@emulates("engine_dropout_grad")
def _dropout_grad(name, grid, block, args, shared_mem):
    g, dx, n, seed, offset, state, *scalars = args
    n, seed, offset = _scalars(name, (n, seed, offset), (np.uint64, np.uint64, np.uint64))
    seed, offset = stream_position(name, seed, offset, state)
    p, scale = _scalars(name, scalars, (np.float64, np.float64))
    _grid_stride(name, grid, block)
    if scale != dropout_add.keep_scale(p):
        raise ValueError(f"{name}: scale {scale} for p={p}")
    t = _elem(name)
    _buf(name, "dx", dx, n, t)[:] = dropout_add.dropout_grad_reference(_buf(name, "g", g, n, t), p, seed, offset)


# ------------------------------------------------------------------ bias add
@emulates("engine_bias_add")
def _bias_add(name, grid, block, args, shared_mem):
    y, b, *scalars = args
    n, d, chunked = _scalars(name, scalars, (np.uint64, np.int32, np.int32))
    _grid_stride(name, grid, block)
    t = _chunked_rows(name, n, d, chunked, dict(y=y, bias=b))
    out = _buf(name, "y", y, n, t)
    out[:] = bias_add.bias_add_reference(out.reshape(-1, d), _buf(name, "bias", b, d, t)).reshape(-1)


@emulates("engine_add")
def _add(name, grid, block, args, shared_mem):
    a, b, y, *scalars = args
    ta, tb = {v: k for k, v in add.NAMES.items()}[name]
    n, chunked = _scalars(name, scalars, (np.uint64, np.int32))
    _grid_stride(name, grid, block)
    if chunked and (n * ta.itemsize) % _cuda.CHUNK_BYTES:
        raise ValueError(f"{name}: the 16-byte path with {n * ta.itemsize} bytes")
    aligned_chunks(name, chunked, n * ta.itemsize // _cuda.CHUNK_BYTES, dict(a=a, b=b, y=y))
    _buf(name, "y", y, n, ta)[:] = add.add_reference(_buf(name, "a", a, n, ta), _buf(name, "b", b, n, tb))


# ------------------------------------------------------------------ float16 <-> float32 cast
@emulates("engine_cast")
def _cast(name, grid, block, args, shared_mem):
    x, y, *scalars = args
    src, dst = ({v: k for k, v in cast._NAMES.items()})[name]
    n, chunked = _scalars(name, scalars, (np.uint64, np.int32))
    _grid_stride(name, grid, block)
    if chunked and n % cast.GROUP:
        raise ValueError(f"{name}: the 8-element path with {n} elements")
    aligned_chunks(name, chunked, n // cast.GROUP, dict(x=x, y=y))
    _buf(name, "y", y, n, dst)[:] = cast.cast_reference(_buf(name, "x", x, n, src), dst)
