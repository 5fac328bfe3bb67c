"""Shape and layout ops: view/reshape, transpose/permute, squeeze/unsqueeze, expand/repeat/tile,
repeat_interleave, meshgrid, narrow/split/chunk/unbind, unfold, cat/stack, tril/triu, diagonals
(diagonal, diag, diag_embed), roll, flip, clone.

Kernels return numpy (or CuPy) *views* wherever the backend can (permute, transpose, expand,
narrow, split, flip), so these ops cost no copy; each backward is the inverse layout op written in
engine ops, so it works for double backward and for global tensors alike.

`view` is `reshape`: numpy copies when a non-contiguous tensor can't be viewed, where PyTorch would
raise ("view size is not compatible with input tensor's size and stride"). The engine has no
separate storage objects, so the only difference is that in-place writes to such a copied "view"
are not seen by the original; call `.contiguous()` first when that matters.
"""
import numpy as np

from .op import Op, foreign_tensor_error
from ..backend import dtypes, parallel, to_device, xp_of
from ..tensor import Tensor, _check_dim, tensor_method
from . import _core
from ._core import cast, clone, constant_like, infer_shape, replicated, shape_str
from .indexing import index_select

__all__ = ["reshape", "flatten", "unflatten", "transpose", "swapaxes", "swapdims", "permute", "t",
           "movedim", "moveaxis", "squeeze", "unsqueeze", "broadcast_to", "narrow", "chunk", "split",
           "unbind", "cat", "concat", "concatenate", "stack", "hstack", "vstack", "tril", "triu",
           "roll", "flip", "fliplr", "flipud", "clone", "meshgrid", "repeat_interleave", "tile", "diagonal", "diag",
           "diag_embed"]


def _shape_args(args):
    """`f(2, 3)`, `f((2, 3))`, `f([2, 3])` and `f(Size)` all mean the shape (2, 3)."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        return tuple(args[0])
    return tuple(args)


def _dims_arg(dims, ndim, op):
    if isinstance(dims, int):
        dims = (dims,)
    out = tuple(_check_dim(d, ndim) for d in dims)
    if len(set(out)) != len(out):
        raise RuntimeError(f"{op}: dim {list(dims)} appears multiple times in the list of dims")
    return out


# ------------------------------------------------------------------ view / reshape
def _reshape(t, shape, op):
    shape = tuple(int(s) for s in shape)
    try:
        shape = infer_shape(shape, t.numel(), op)
    except RuntimeError:
        raise RuntimeError(
            f"{op}: shape {shape_str(shape)} is invalid for input of shape {shape_str(t.shape)} "
            f"(size {t.numel()})"
        ) from None
    if shape == tuple(t.shape):
        return _alias(t)  # a new view even of the same shape, as torch's
    return _core.Reshape.apply(t, shape=shape)


def _alias(t):
    """A new tensor viewing all of `t` (torch's shape ops return a new view even when nothing
    changes: an in-place shape change or requires_grad_ on it must not reach `t`). A global
    tensor is returned as it is (the global reshape rule handles real changes only)."""
    return t if t._global is not None else _core.Reshape.apply(t, shape=tuple(t._data.shape))


def reshape(input, *shape):
    return _reshape(input, _shape_args(shape), "reshape")


def _viewable(shape, strides, new_shape):
    """Whether an array of `shape` and `strides` (in elements) can be viewed as `new_shape` without
    a copy: torch's rule (computeStride), each run of dims merged or split must be contiguous."""
    if not shape or 0 in shape:
        return True
    view_d = len(new_shape) - 1
    base = strides[-1]
    tensor_numel = view_numel = 1
    for d in range(len(shape) - 1, -1, -1):
        tensor_numel *= shape[d]
        if d == 0 or (shape[d - 1] != 1 and strides[d - 1] != tensor_numel * base):
            while view_d >= 0 and (view_numel < tensor_numel or new_shape[view_d] == 1):
                view_numel *= new_shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return False
            if d > 0:
                base, tensor_numel, view_numel = strides[d - 1], 1, 1
    return view_d == -1


def _strides(a):
    return [s // a.itemsize for s in a.strides]


def _torch_layout(t):
    """The strides torch's `t` would have: its chain of views (engine/ops/inplace.py) taken of a
    row-major root, as torch's kernels return their results. An op output of the engine can be
    laid out otherwise (numpy's reductions of permuted inputs, fancy indexing, stack): there the
    engine's strides say nothing of what torch would allow."""
    from .inplace import view_positions

    return _strides(view_positions(t)[2])


def _view(t, shape, op):
    """`t` viewed as `shape`, sharing memory where its strides allow; otherwise torch's
    RuntimeError when torch's `t` (the same views of a row-major root) allows no view either, and
    a copy when only the engine's layout is at fault (as `reshape`)."""
    out = _reshape(t, shape, op)
    a = t._data
    if (t._global is None and t._view_of is not None and not _viewable(a.shape, _strides(a), tuple(out.shape))
            and not _viewable(a.shape, _torch_layout(t), tuple(out.shape))):
        raise RuntimeError(f"{op}: view size is not compatible with input tensor's size and stride (at least one "
                           f"dimension spans across two contiguous subspaces); {list(t.shape)} -> {list(out.shape)}. "
                           "Use .reshape(...) instead.")
    return out


@tensor_method("view")
def view(self, *shape):
    """`self` as `shape`, sharing its memory; where its strides allow no view (a transposed
    tensor merged across the transposed dims) torch's RuntimeError: `reshape` copies."""
    return _view(self, _shape_args(shape), "view")


@tensor_method("view_as")
def view_as(self, other):
    return _view(self, tuple(other.shape), "view_as")


@tensor_method("reshape_as")
def reshape_as(self, other):
    return _reshape(self, tuple(other.shape), "reshape_as")


def flatten(input, start_dim=0, end_dim=-1):
    shape = tuple(input.shape)
    if not shape:
        return _reshape(input, (1,), "flatten")
    s = _check_dim(start_dim, len(shape))
    e = _check_dim(end_dim, len(shape))
    if s > e:
        raise RuntimeError("flatten() has invalid args: start_dim cannot come after end_dim")
    n = 1
    for d in shape[s:e + 1]:
        n *= d
    return _reshape(input, shape[:s] + (n,) + shape[e + 1:], "flatten")


def unflatten(input, dim, sizes):
    shape = tuple(input.shape)
    d = _check_dim(dim, len(shape))
    sizes = tuple(sizes)
    try:
        sizes = infer_shape(sizes, shape[d], "unflatten")
    except RuntimeError:
        raise RuntimeError(
            f"unflatten: provided sizes {shape_str(sizes)} don't multiply up to the size of dim {dim} "
            f"({shape[d]}) in the input tensor of shape {shape_str(shape)}"
        ) from None
    return _reshape(input, shape[:d] + sizes + shape[d + 1:], "unflatten")


# ------------------------------------------------------------------ permutations
class Permute(Op):
    name = "Permute"

    @staticmethod
    def forward(ctx, x, dims):
        ctx.dims = dims
        return x.transpose(dims)

    @staticmethod
    def backward(ctx, g):
        inv = [0] * len(ctx.dims)
        for i, d in enumerate(ctx.dims):
            inv[d] = i
        return Permute.apply(g, dims=tuple(inv))


def permute(input, *dims):
    dims = _shape_args(dims)
    n = input._data.ndim
    if len(dims) != n:
        raise RuntimeError(
            f"permute(sparse_coo): number of dimensions in the tensor input does not match the length "
            f"of the desired ordering of dimensions i.e. input.dim() = {n} is not equal to len(dims) = {len(dims)}"
        )
    dims = _dims_arg(dims, n, "permute")
    if dims == tuple(range(n)):
        return _alias(input)
    return Permute.apply(input, dims=dims)


def transpose(input, dim0, dim1):
    n = input._data.ndim
    d0, d1 = _check_dim(dim0, n), _check_dim(dim1, n)
    if n == 0 or d0 == d1:  # (a 0-dim tensor takes dims 0 and -1, as torch's)
        return _alias(input)
    dims = list(range(n))
    dims[d0], dims[d1] = d1, d0
    return Permute.apply(input, dims=tuple(dims))


swapaxes = swapdims = transpose


def t(input):
    n = input._data.ndim
    if n > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {n}D")
    return transpose(input, 0, 1) if n == 2 else _alias(input)


def _T(self):
    n = self._data.ndim
    return _alias(self) if n < 2 else Permute.apply(self, dims=tuple(range(n - 1, -1, -1)))


def _mT(self):
    if self._data.ndim < 2:
        raise RuntimeError("tensor.mT is only supported on matrices or batches of matrices. Got 1-D tensor.")
    return transpose(self, -2, -1)


Tensor.T = property(_T)
Tensor.mT = property(_mT)
Tensor.H = property(_T)
Tensor.mH = property(_mT)


def movedim(input, source, destination):
    n = input._data.ndim
    src = (source,) if isinstance(source, int) else tuple(source)
    dst = (destination,) if isinstance(destination, int) else tuple(destination)
    if len(src) != len(dst):
        raise RuntimeError(
            f"movedim: Invalid source or destination dims: source ({list(src)} dims) should contain "
            f"the same number of dims as destination ({list(dst)} dims)"
        )
    src = _dims_arg(src, n, "movedim")
    dst = _dims_arg(dst, n, "movedim")
    if n == 0:
        return _alias(input)
    order = [None] * n
    for s, d in zip(src, dst):
        order[d] = s
    rest = iter(i for i in range(n) if i not in src)
    order = tuple(o if o is not None else next(rest) for o in order)
    return permute(input, order)


moveaxis = movedim


# ------------------------------------------------------------------ squeeze / unsqueeze
def squeeze(input, dim=None):
    shape = tuple(input.shape)
    if dim is None:
        dims = {i for i, s in enumerate(shape) if s == 1}
    else:
        dims = {d for d in _dims_arg(dim, len(shape), "squeeze") if shape and shape[d] == 1}
    return _core.Reshape.apply(input, shape=tuple(s for i, s in enumerate(shape) if i not in dims))


def unsqueeze(input, dim):
    shape = tuple(input.shape)
    d = _check_dim(dim, len(shape) + 1)
    return _core.Reshape.apply(input, shape=shape[:d] + (1,) + shape[d:])


# ------------------------------------------------------------------ expand / repeat
def _expand_shape(shape, sizes):
    sizes = tuple(int(s) for s in sizes)
    if len(sizes) < len(shape):
        raise RuntimeError(
            f"expand: the number of sizes provided ({len(sizes)}) must be greater or equal to the "
            f"number of dimensions in the tensor ({len(shape)})"
        )
    lead = len(sizes) - len(shape)
    out = []
    for i, s in enumerate(sizes):
        if i < lead:
            if s < 0:
                raise RuntimeError(
                    f"expand: the expanded size of the tensor ({s}) isn't allowed in a leading, "
                    f"non-existing dimension {i}"
                )
            out.append(s)
            continue
        cur = shape[i - lead]
        if s == -1:
            out.append(cur)
        elif cur == s or cur == 1:
            if s < 0:
                raise RuntimeError(f"expand: invalid size {s} in {shape_str(sizes)}")
            out.append(s)
        else:
            raise RuntimeError(
                f"expand: the expanded size of the tensor ({s}) must match the existing size ({cur}) "
                f"at non-singleton dimension {i}.  Target sizes: {shape_str(sizes)}.  Tensor sizes: "
                f"{shape_str(shape)}"
            )
    return tuple(out)


@tensor_method("expand")
def expand(self, *sizes):
    shape = _expand_shape(tuple(self.shape), _shape_args(sizes))
    if shape == tuple(self.shape):
        return _alias(self)
    return _core.BroadcastTo.apply(self, shape=shape)


@tensor_method("expand_as")
def expand_as(self, other):
    return expand(self, tuple(other.shape))


def broadcast_to(input, size):
    return expand(input, tuple(size))


class Repeat(Op):
    name = "Repeat"

    @staticmethod
    def forward(ctx, x, reps):
        ctx.in_shape = x.shape
        ctx.reps = reps
        lead = len(reps) - x.ndim
        return xp_of(x).tile(x.reshape((1,) * lead + x.shape), reps)

    @staticmethod
    def backward(ctx, g):
        from .reduction import sum as _sum

        reps, in_shape = ctx.reps, ctx.in_shape
        full = (1,) * (len(reps) - len(in_shape)) + tuple(in_shape)
        split = []
        for r, s in zip(reps, full):
            split += [r, s]
        gs = _sum(_core.reshape(g, split), dim=tuple(range(0, 2 * len(reps), 2)))
        return _core.reshape(gs, in_shape)


@tensor_method("repeat")
def repeat(self, *sizes):
    reps = tuple(int(r) for r in _shape_args(sizes))
    if len(reps) < self._data.ndim:
        raise RuntimeError(
            "repeat: number of dimensions of repeat dims can not be smaller than number of dimensions "
            f"of tensor (got {len(reps)} repeat dims for a tensor of shape {shape_str(self.shape)})"
        )
    if any(r < 0 for r in reps):
        raise RuntimeError(f"repeat: repeats can not be negative, got {list(reps)}")
    return Repeat.apply(self, reps=reps)


def tile(input, dims):
    """`repeat` with `dims` padded by leading 1s to the input's rank (torch.tile)."""
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    return repeat(input, (1,) * (input.ndim - len(dims)) + dims)


@tensor_method("tile")
def _tile_method(self, *dims):
    return tile(self, _shape_args(dims))


def repeat_interleave(input, repeats=None, dim=None, *, output_size=None):
    """Each element (or slice along `dim`) repeated `repeats` times in place: an int or a tensor
    of one count per slice. `dim=None` works on the flattened input. With a single tensor
    argument, `repeat_interleave(r)` is the index vector `[0]*r[0] + [1]*r[1] + ...`."""
    if repeats is None:  # repeat_interleave(repeats): arange(len(repeats)) repeated
        counts = _repeat_counts(input, input.numel() if input.ndim else 1)
        base = constant_like(xp_of(input._data).arange(counts.size, dtype=np.int64), input)
        return repeat_interleave(base, input.reshape(-1), 0, output_size=output_size)
    if dim is None:
        input, dim = reshape(input, -1), 0
    d = _check_dim(dim, max(input.ndim, 1))
    if input.ndim == 0:
        input = reshape(input, 1)
    n = input.shape[d]
    if isinstance(repeats, Tensor) and repeats.numel() != 1:
        counts = _repeat_counts(repeats, n)
        total = int(counts.sum())
        _check_output_size(output_size, total)
        idx = np.repeat(np.arange(n, dtype=np.int64), counts)
        return index_select(input, d, constant_like(to_device(idx, input._device), input))
    r = int(_repeat_counts(repeats, 1)[0]) if isinstance(repeats, Tensor) else int(repeats)
    if r < 0:
        raise RuntimeError("Repeats must be non-negative")
    _check_output_size(output_size, n * r)
    shape = tuple(input.shape)
    wide = expand(unsqueeze(input, d + 1), shape[:d + 1] + (r,) + shape[d + 1:])
    out = reshape(wide, shape[:d] + (n * r,) + shape[d + 1:])
    return _core.Clone.apply(out) if r == 1 else out  # a copy, as torch's (r > 1 copies already)


def _repeat_counts(repeats, n):
    """The host values of a repeats tensor, checked as torch checks them."""
    if repeats.ndim > 1:
        raise RuntimeError("repeats must be 0-dim or 1-dim tensor")
    if repeats._data.dtype.kind not in "iu":
        raise NotImplementedError(f'"repeat_interleave_cpu" not implemented for \'{repeats.dtype.name}\'')
    counts = replicated(repeats)._host().reshape(-1).astype(np.int64)
    if counts.size != n:
        raise RuntimeError(f"repeats must have the same size as input along dim, but got repeats.size(0) = "
                           f"{counts.size} and input.size(0) = {n}")
    if counts.size and counts.min() < 0:
        raise RuntimeError("repeats can not be negative")
    return counts


def _check_output_size(output_size, total):
    if output_size is not None and output_size != total:
        raise RuntimeError(f"repeat_interleave: Invalid output_size, expected {total} but got {output_size}")


def meshgrid(*tensors, indexing=None):
    """Coordinate grids of 0-D/1-D tensors (varargs or one list): with indexing "ij" (the
    default) output i varies along axis i; with "xy" the first two axes are swapped. Outputs are
    broadcast views, so their gradients sum back."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    if indexing is None:
        indexing = "ij"
    if indexing not in ("ij", "xy"):
        raise RuntimeError(f'torch.meshgrid: indexing must be one of "xy" or "ij", but received: {indexing}')
    if not tensors:
        raise RuntimeError("meshgrid expects a non-empty TensorList")
    for t in tensors:
        if t.ndim > 1:
            raise RuntimeError(f"torch.meshgrid: Expected 0D or 1D tensor in the tensor list but got: {t}")
        if t.dtype != tensors[0].dtype:
            raise RuntimeError("meshgrid expects all tensors to have the same dtype")
        if t.device != tensors[0].device:
            raise RuntimeError("meshgrid expects all tensors to have the same device")
    sizes = [t.numel() if t.ndim else 1 for t in tensors]
    axes = list(range(len(tensors)))
    if indexing == "xy" and len(tensors) > 1:
        axes[0], axes[1] = 1, 0
    shape = [0] * len(tensors)
    for a, s in zip(axes, sizes):
        shape[a] = s
    out = []
    for t, a, s in zip(tensors, axes, sizes):
        lone = [1] * len(tensors)
        lone[a] = s
        out.append(expand(reshape(t, lone), shape))
    return tuple(out)


# ------------------------------------------------------------------ slicing along one dim
class Split(Op):
    """Views of consecutive pieces of `x` along `dim`; backward concatenates the gradients
    (zeros stand in for pieces that got none)."""

    name = "Split"

    @staticmethod
    def forward(ctx, x, dim, sizes):
        ctx.dim, ctx.sizes, ctx.shape = dim, sizes, x.shape
        out, start = [], 0
        index = [slice(None)] * x.ndim
        for s in sizes:
            index[dim] = slice(start, start + s)
            out.append(x[tuple(index)])
            start += s
        return tuple(out)

    @staticmethod
    def backward(ctx, *grads):
        like = next(g for g in grads if g is not None)
        parts = []
        for g, s in zip(grads, ctx.sizes):
            if g is None:
                shape = list(ctx.shape)
                shape[ctx.dim] = s
                g = _zeros(shape, like)
            parts.append(g)
        return cat(parts, ctx.dim) if len(parts) > 1 else parts[0]


def _zeros(shape, like):
    xp = xp_of(like._data)
    return Tensor._make(xp.zeros(tuple(shape), dtype=like._data.dtype), like._device)


def narrow(input, dim, start, length):
    n = input._data.ndim
    if n == 0:
        raise RuntimeError("narrow() cannot be applied to a 0-dim tensor.")
    d = _check_dim(dim, n)
    size = input.shape[d]
    if isinstance(start, Tensor) and (start.dim() != 0 or start.is_floating_point() or start.dtype is dtypes.bool_):
        raise RuntimeError(f"narrow: start must be an 0-dim integral Tensor, got shape {shape_str(start.shape)} "
                           f"of dtype {start.dtype.name}")
    start = int(start)
    if not -size <= start <= size:
        raise IndexError(f"narrow: start ({start}) out of range for dimension {dim} of size {size}")
    if start < 0:
        start += size
    if length < 0 or start + length > size:
        raise RuntimeError(f"narrow: start ({start}) + length ({length}) exceeds dimension size ({size}).")
    pieces = Split.apply(input, dim=d, sizes=(start, length, size - start - length))
    return pieces[1]


def split(tensor, split_size_or_sections, dim=0):
    n = tensor._data.ndim
    if n == 0:
        raise RuntimeError("split: expected at least a 1-dimensional tensor")
    d = _check_dim(dim, n)
    size = tensor.shape[d]
    if isinstance(split_size_or_sections, int):
        step = split_size_or_sections
        if step < 0 or (step == 0 and size != 0):
            raise RuntimeError(f"split: split_size can only be 0 if dimension size is 0, but got {step}")
        if step == 0:
            sizes = [0]
        else:
            sizes = [step] * (size // step) + ([size % step] if size % step else [])
            if not sizes:
                sizes = [0]
    else:
        sizes = [int(s) for s in split_size_or_sections]
        if any(s < 0 for s in sizes) or sum(sizes) != size:
            raise RuntimeError(
                f"split_with_sizes expects split_sizes to sum exactly to {size} (input tensor's size at "
                f"dimension {dim}), but got split_sizes={sizes}"
            )
    out = Split.apply(tensor, dim=d, sizes=tuple(sizes))
    return out if isinstance(out, tuple) else (out,)


def chunk(input, chunks, dim=0):
    if not isinstance(chunks, int) or chunks <= 0:
        raise RuntimeError(f"chunk expects `chunks` to be greater than 0, got: {chunks}")
    n = input._data.ndim
    if n == 0:
        raise RuntimeError("chunk expects at least a 1-dimensional tensor")
    d = _check_dim(dim, n)
    size = input.shape[d]
    step = -(-size // chunks)  # torch: ceil(size / chunks) per piece, the last one smaller
    if step == 0:
        return split(input, [0] * chunks if size == 0 else 1, d)
    return split(input, step, d)


class Unbind(Op):
    name = "Unbind"

    @staticmethod
    def forward(ctx, x, dim):
        ctx.dim, ctx.shape = dim, x.shape
        index = [slice(None)] * x.ndim
        out = []
        for i in range(x.shape[dim]):
            index[dim] = i
            out.append(x[tuple(index)])
        return tuple(out)

    @staticmethod
    def backward(ctx, *grads):
        like = next(g for g in grads if g is not None)
        shape = list(ctx.shape)
        del shape[ctx.dim]
        return stack([g if g is not None else _zeros(shape, like) for g in grads], ctx.dim)


def unbind(input, dim=0):
    n = input._data.ndim
    if n == 0:
        raise IndexError("unbind: dimension specified as 0 but tensor has no dimensions")
    d = _check_dim(dim, n)
    if input.shape[d] == 0:
        return ()
    out = Unbind.apply(input, dim=d)
    return out if isinstance(out, tuple) else (out,)


@tensor_method("unfold")
def unfold(self, dimension, size, step):
    """Tensor.unfold: the windows of `size` elements every `step` along `dimension`, as a new last
    dim. The windows are gathered with index_select (a copy where torch gives a strided view);
    its backward adds overlapping windows' gradients."""
    n = self.ndim
    d = _check_dim(dimension, max(n, 1))
    x = self if n else reshape(self, 1)
    length = x.shape[d]
    if size < 0:
        raise RuntimeError(f"size is {size} but must be >= 0")
    if size > length:
        raise RuntimeError(f"maximum size for tensor at dimension {d} is {length} but size is {size}")
    if step <= 0:
        raise RuntimeError(f"step is {step} but must be > 0")
    count = (length - size) // step + 1
    xp = xp_of(x._data)
    idx = (xp.arange(count, dtype=np.int64)[:, None] * step + xp.arange(size, dtype=np.int64)).reshape(-1)
    windows = index_select(x, d, constant_like(idx, x))
    shape = tuple(x.shape)
    out = movedim(reshape(windows, shape[:d] + (count, size) + shape[d + 1:]), d + 1, -1)
    return reshape(out, (size,)) if n == 0 else out


# ------------------------------------------------------------------ cat / stack
class Cat(Op):
    """Concatenation along `dim`. `skip[i]` marks a 1-D empty input that PyTorch's legacy rule
    leaves out whatever its shape; it still gets a (empty) gradient."""

    name = "Cat"

    @staticmethod
    def forward(ctx, *xs, dim, skip):
        ctx.dim, ctx.skip = dim, skip
        kept = [x for x, s in zip(xs, skip) if not s]
        ctx.sizes = tuple(x.shape[dim] for x in kept)
        xp = xp_of(xs[0])
        if xp is np and len(kept) > 1:
            # numpy's concatenate copies the stride order of its inputs: permuted views (e.g.
            # the per-head gradients of attention) would give a permuted result that the next
            # reshape copies again. A C-ordered output costs the same and reshapes for free.
            shape = list(kept[0].shape)
            shape[dim] = sum(ctx.sizes)
            out = np.empty(shape, dtype=np.result_type(*kept))
            return np.concatenate(kept, axis=dim, out=out)
        return xp.concatenate(kept, axis=dim)

    @staticmethod
    def backward(ctx, g):
        out = Split.apply(g, dim=ctx.dim, sizes=ctx.sizes)
        parts = iter(out if isinstance(out, tuple) else (out,))
        return tuple(_zeros((0,), g) if s else next(parts) for s in ctx.skip)


def _promote_all(tensors, op):
    tensors = list(tensors)
    if not tensors:  # torch's types: ValueError from cat, RuntimeError from stack
        raise (ValueError if op == "cat" else RuntimeError)(f"{op}(): expected a non-empty list of Tensors")
    for i, x in enumerate(tensors):
        if not isinstance(x, Tensor):
            raise foreign_tensor_error(x, f"{op}()") or TypeError(
                f"{op}(): expected a sequence of Tensors, but element {i} is {type(x).__name__}")
    res = dtypes.result_type([x.dtype for x in tensors])
    return [cast(x, res) for x in tensors]


def cat(tensors, dim=0):
    tensors = _promote_all(tensors, "cat")
    # PyTorch's legacy rule: 1-D empty tensors are skipped, whatever the other shapes are
    shapes = [x.shape for x in tensors]  # logical shapes (a global tensor's _data is its shard)
    empty = [len(s) == 1 and s[0] == 0 for s in shapes]
    kept = [i for i in range(len(tensors)) if not empty[i]]
    if not kept:
        return tensors[0].clone() if len(tensors) == 1 else Cat.apply(*tensors, dim=0, skip=(False,) * len(tensors))
    ref = shapes[kept[0]]
    n = len(ref)
    if n == 0:
        raise RuntimeError("cat: zero-dimensional tensor (at position 0) cannot be concatenated")
    d = _check_dim(dim, n)
    for i, xs in enumerate(shapes):
        if empty[i]:
            continue
        if len(xs) != n:
            raise RuntimeError(
                f"cat: Tensors must have same number of dimensions: got {n} and {len(xs)} "
                f"(tensor 0 has shape {shape_str(ref)}, tensor {i} has shape {shape_str(xs)})"
            )
        for k in range(n):
            if k != d and xs[k] != ref[k]:
                raise RuntimeError(
                    f"cat: Sizes of tensors must match except in dimension {d}. Expected size "
                    f"{ref[k]} but got size {xs[k]} for tensor number {i} in the "
                    f"list (shapes: {', '.join(shape_str(t) for t in shapes)})"
                )
    if len(tensors) == 1:
        return tensors[0].clone()  # a new tensor, as torch.cat's (never an alias of the input)
    skip = tuple(empty)
    return Cat.apply(*tensors, dim=d, skip=skip)


concat = concatenate = cat


class Stack(Op):
    name = "Stack"

    @staticmethod
    def forward(ctx, *xs, dim):
        ctx.dim = dim
        return xp_of(xs[0]).stack(xs, axis=dim)

    @staticmethod
    def backward(ctx, g):
        out = Unbind.apply(g, dim=ctx.dim)
        return out if isinstance(out, tuple) else (out,)


def stack(tensors, dim=0):
    tensors = _promote_all(tensors, "stack")
    shape = tuple(tensors[0].shape)
    for i, x in enumerate(tensors):
        if tuple(x.shape) != shape:
            raise RuntimeError(
                f"stack expects each tensor to be equal size, but got {shape_str(shape)} at entry 0 "
                f"and {shape_str(x.shape)} at entry {i}"
            )
    d = _check_dim(dim, len(shape) + 1)
    return Stack.apply(*tensors, dim=d)


def hstack(tensors):
    if not len(tensors):
        raise RuntimeError("hstack expects a non-empty TensorList")
    tensors = [x if x.ndim else reshape(x, 1) for x in tensors]
    return cat(tensors, 0 if tensors[0].ndim == 1 else 1)


def vstack(tensors):
    if not len(tensors):
        raise RuntimeError("vstack expects a non-empty TensorList")
    tensors = [x if x.ndim >= 2 else reshape(x, 1, -1) for x in tensors]
    return cat(tensors, 0)


# ------------------------------------------------------------------ diagonals
def _diagonal_view(xp, a, offset, d1, d2):
    """The diagonal `offset` of `a` over dims (d1, d2) as a strided view (writes go to `a`): the
    other dims in order, then the diagonal."""
    rows, cols = a.shape[d1], a.shape[d2]
    r0, c0 = max(-offset, 0), max(offset, 0)
    length = max(0, min(rows - r0, cols - c0))
    start = [slice(None)] * a.ndim
    start[d1], start[d2] = slice(min(r0, rows), None), slice(min(c0, cols), None)
    keep = [i for i in range(a.ndim) if i not in (d1, d2)]
    shape = tuple(a.shape[i] for i in keep) + (length,)
    strides = tuple(a.strides[i] for i in keep) + (a.strides[d1] + a.strides[d2],)
    return xp.lib.stride_tricks.as_strided(a[tuple(start)], shape=shape, strides=strides)


class Diagonal(Op):
    """A diagonal of `x` over dims (d1, d2), a view (as torch's); the backward places the gradient
    on the same diagonal of zeros (DiagonalEmbed, whose backward is this op)."""

    name = "Diagonal"

    @staticmethod
    def forward(ctx, x, offset, d1, d2):
        ctx.shape, ctx.where = x.shape, (offset, d1, d2)
        return _diagonal_view(xp_of(x), x, offset, d1, d2)

    @staticmethod
    def backward(ctx, g):
        offset, d1, d2 = ctx.where
        return DiagonalEmbed.apply(g, shape=ctx.shape, offset=offset, d1=d1, d2=d2)


class DiagonalEmbed(Op):
    """Zeros of `shape` with `r` written on the diagonal `offset` over dims (d1, d2)."""

    name = "DiagonalEmbed"

    @staticmethod
    def forward(ctx, r, shape, offset, d1, d2):
        ctx.where = (offset, d1, d2)
        xp = xp_of(r)
        out = xp.zeros(shape, dtype=r.dtype)
        _diagonal_view(xp, out, offset, d1, d2)[...] = r
        return out

    @staticmethod
    def backward(ctx, g):
        offset, d1, d2 = ctx.where
        return Diagonal.apply(g, offset=offset, d1=d1, d2=d2)


def _diag_dims(dim1, dim2, n):
    d1, d2 = _check_dim(dim1, n), _check_dim(dim2, n)
    if d1 == d2:
        raise RuntimeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    return d1, d2


def diagonal(input, offset=0, dim1=0, dim2=1):
    d1, d2 = _diag_dims(dim1, dim2, input.ndim)
    return Diagonal.apply(input, offset=int(offset), d1=d1, d2=d2)


def diag_embed(input, offset=0, dim1=-2, dim2=-1):
    """A tensor whose diagonal `offset` over the new dims (dim1, dim2) holds the last dim of
    `input` (zeros elsewhere)."""
    n = input.ndim + 1
    d1, d2 = _diag_dims(dim1, dim2, n)
    size = input.shape[-1] + abs(int(offset))
    rest = iter(input.shape[:-1])
    shape = tuple(size if i in (d1, d2) else next(rest) for i in range(n))
    return DiagonalEmbed.apply(input, shape=shape, offset=int(offset), d1=d1, d2=d2)


def diag(input, diagonal=0):
    """A 1-D input: the square matrix with it on diagonal `diagonal`; a 2-D input: that diagonal
    (a new tensor)."""
    if input.ndim == 1:
        return diag_embed(input, diagonal, 0, 1)
    if input.ndim != 2:
        raise RuntimeError(f"diag(): Supports 1D or 2D tensors. Got {input.ndim}D")
    return Diagonal.apply(input, offset=int(diagonal), d1=0, d2=1).clone()


# ------------------------------------------------------------------ triangles, roll, flip
class Tril(Op):
    name = "Tril"

    @staticmethod
    def forward(ctx, x, diagonal, upper):
        ctx.diagonal, ctx.upper = diagonal, upper
        xp = xp_of(x)
        return xp.triu(x, diagonal) if upper else xp.tril(x, diagonal)

    @staticmethod
    def backward(ctx, g):
        return Tril.apply(g, diagonal=ctx.diagonal, upper=ctx.upper)


def _triangle(input, diagonal, upper):
    if input._data.ndim < 2:
        name = "triu" if upper else "tril"
        raise RuntimeError(f"{name}: input tensor must have at least 2 dimensions, got shape {shape_str(input.shape)}")
    return Tril.apply(input, diagonal=int(diagonal), upper=upper)


def tril(input, diagonal=0):
    return _triangle(input, diagonal, False)


def triu(input, diagonal=0):
    return _triangle(input, diagonal, True)


class Roll(Op):
    name = "Roll"

    @staticmethod
    def forward(ctx, x, shifts, dims):
        ctx.shifts, ctx.dims = shifts, dims
        if dims is None:
            return xp_of(x).roll(x.reshape(-1), shifts[0]).reshape(x.shape)
        if isinstance(x, np.ndarray):
            return parallel.roll(x, shifts, dims)
        return xp_of(x).roll(x, shifts, axis=dims)

    @staticmethod
    def backward(ctx, g):
        return Roll.apply(g, shifts=tuple(-s for s in ctx.shifts), dims=ctx.dims)


def roll(input, shifts, dims=None):
    shifts = (int(shifts),) if isinstance(shifts, int) else tuple(int(s) for s in shifts)
    if dims is None:
        if len(shifts) != 1:
            raise RuntimeError(f"roll: shifts {list(shifts)} needs dims of the same length")
        return Roll.apply(input, shifts=shifts, dims=None)
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    if len(shifts) != len(dims):
        raise RuntimeError(f"roll: shifts and dimensions must align. shifts: {len(shifts)}, dims:{len(dims)}")
    dims = tuple(_check_dim(d, input._data.ndim) for d in dims)
    return Roll.apply(input, shifts=shifts, dims=dims)


class Flip(Op):
    name = "Flip"

    @staticmethod
    def forward(ctx, x, dims):
        ctx.dims = dims
        return xp_of(x).flip(x, dims).copy()  # torch.flip copies; numpy's and CuPy's flip are views

    @staticmethod
    def backward(ctx, g):
        return Flip.apply(g, dims=ctx.dims)


def flip(input, *dims, **kwargs):
    """torch.flip(input, dims): the dims as a sequence, varargs (`x.flip(0, 1)`) or `dims=`."""
    if kwargs:
        if set(kwargs) != {"dims"} or dims:
            raise TypeError(f"flip() got an unexpected keyword argument {next(k for k in kwargs if k != 'dims')!r}"
                            if set(kwargs) != {"dims"} else "flip() got multiple values for argument 'dims'")
        dims = (kwargs["dims"],)
    dims = _dims_arg(_shape_args(dims), input._data.ndim, "flip")
    if not dims or input._data.ndim == 0:
        return _core.Clone.apply(input)  # flip always copies, as torch's
    return Flip.apply(input, dims=dims)


def fliplr(input):
    if input._data.ndim < 2:
        raise RuntimeError("fliplr: input tensor must be at least 2-dimensional")
    return flip(input, 1)


def flipud(input):
    if input._data.ndim < 1:
        raise RuntimeError("flipud: input tensor must be at least 1-dimensional")
    return flip(input, 0)


# ------------------------------------------------------------------ Tensor methods
for _name in ("reshape", "flatten", "unflatten", "transpose", "swapaxes", "swapdims", "permute",
              "t", "movedim", "moveaxis", "squeeze", "unsqueeze", "broadcast_to", "narrow", "chunk",
              "split", "unbind", "tril", "triu", "roll", "flip", "fliplr", "flipud", "repeat_interleave",
              "diagonal", "diag", "diag_embed"):
    tensor_method(_name)(globals()[_name])


def _inplace_layout(name, fn):
    def method(self, *args, **kw):
        from . import inplace

        inplace.check_inplace_allowed(self, name)
        res = fn(self, *args, **kw)
        if inplace.records(self):
            return inplace.rebind(self, res, name)
        return inplace.write(self, res._data, name)

    method.__name__ = name
    return method


Tensor.tril_ = _inplace_layout("tril_", tril)
Tensor.triu_ = _inplace_layout("triu_", triu)


def _reshape_inplace(name, fn):
    """`squeeze_`/`unsqueeze_`/`t_`/`transpose_` change the tensor's own shape (metadata only)."""

    def method(self, *args, **kw):
        from . import inplace

        res = fn(self, *args, **kw)
        if inplace.records(self):
            inplace.check_inplace_allowed(self, name)
            self.grad_fn, self._output_nr = res.grad_fn, res._output_nr
        self._data = res._data
        self._bump_version()
        return self

    method.__name__ = name
    return method


Tensor.squeeze_ = _reshape_inplace("squeeze_", squeeze)
Tensor.unsqueeze_ = _reshape_inplace("unsqueeze_", unsqueeze)
Tensor.t_ = _reshape_inplace("t_", t)
Tensor.transpose_ = _reshape_inplace("transpose_", transpose)
