"""Matrix products: matmul (and `@`), mm, bmm, mv, addmm, baddbmm, dot, outer, tensordot, einsum,
linear, and pairwise distances (cdist).

These are the hot path of a transformer, so each forward is one BLAS call (`xp.matmul`) on
float32 arrays that are C- or F-contiguous (a plain transpose is passed as a view: BLAS reads it
with its `trans` flag, no copy). Backwards are written with the same ops (so double backward
works) and flatten batch dims when the other operand is a 2-D weight, turning a batched product
plus a reduction into one large GEMM.
"""
import math
import string

import numpy as np

from .op import Op, autocast_lowers, autocast_unifies, foreign_tensor_error
from ..backend import xp_of
from ..tensor import Tensor, _check_dim, tensor_method
from ._core import broadcast_shapes, broadcast_to, cast, reshape, shape_str, sum_to
from ._kernels import matmul as _matmul
from .indexing import IndexZero
from .shape import cat

__all__ = ["matmul", "mm", "bmm", "mv", "addmm", "baddbmm", "dot", "outer", "tensordot", "einsum", "linear", "cdist"]


# ------------------------------------------------------------------ helpers
class SwapLast(Op):
    """Swap the last two axes (a view): the `mT` used by matmul's backward."""

    name = "TransposeLast"

    @staticmethod
    def forward(ctx, x):
        return x.swapaxes(-1, -2)

    @staticmethod
    def backward(ctx, g):
        return SwapLast.apply(g)


def _mT(t):
    return SwapLast.apply(t)


def _same_dtype(a, b, op):
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        raise foreign_tensor_error(a, op) or foreign_tensor_error(b, op) or TypeError(
            f"{op}: expected Tensors, got {type(a).__name__} and {type(b).__name__}")
    if a._data.dtype != b._data.dtype and not autocast_unifies(a, b):
        raise RuntimeError(f"{op}: expected both operands to have the same dtype, but got "
                           f"{a.dtype.name} != {b.dtype.name}")


def _mismatch(op, a, b, k1, k2):
    return RuntimeError(f"{op}: shapes {shape_str(a.shape)} and {shape_str(b.shape)} cannot be "
                        f"multiplied ({k1} != {k2})")


# ------------------------------------------------------------------ matmul
class Matmul(Op):
    name = "Matmul"
    autocast = "lower"
    save_inputs = (0, 1)

    @staticmethod
    def forward(ctx, a, b, out_dtype=None):
        """`out_dtype` (float32 for half-precision operands, see `matmul_wide`): the product's
        float32 accumulator as the result."""
        xp = xp_of(a)
        ctx.wide = out_dtype is not None and out_dtype != a.dtype
        if b.ndim == 2 and a.ndim > 2:  # fold batch dims into rows: one GEMM instead of a loop
            rows = math.prod(a.shape[:-1])  # not -1: a zero-size inner dim makes -1 ambiguous
            return _matmul(xp, a.reshape(rows, a.shape[-1]), b,
                           out_dtype=out_dtype).reshape(a.shape[:-1] + (b.shape[1],))
        return xp.asarray(_matmul(xp, a, b, out_dtype=out_dtype))  # 1-D @ 1-D gives a numpy scalar

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        need_a, need_b = ctx.needs_input_grad
        if ctx.wide:  # the operands' dtype, as a cast of a half-precision product would pass it back
            g = cast(g, a.dtype)
        if a.ndim == 1 and b.ndim == 1:
            return (g * b if need_a else None), (g * a if need_b else None)
        a2 = a if a.ndim > 1 else reshape(a, (1, a.shape[0]))
        b2 = b if b.ndim > 1 else reshape(b, (b.shape[0], 1))
        g2 = g
        if a.ndim == 1:
            g2 = reshape(g2, tuple(g2.shape[:-1]) + (1, g2.shape[-1]))
        if b.ndim == 1:
            g2 = reshape(g2, tuple(g2.shape) + (1,))
        ga = gb = None
        if need_a:
            if b2.ndim == 2 and a2.ndim > 2:  # weight-like b: one GEMM over all batch rows
                ga = matmul(g2, _mT(b2))
            else:
                ga = sum_to(matmul(g2, _mT(b2)), tuple(a2.shape))
            ga = reshape(ga, tuple(a.shape))
        if need_b:
            if b2.ndim == 2 and a2.ndim > 2:
                k, n = b2.shape
                rows = math.prod(a2.shape[:-1])
                gb = matmul(_mT(reshape(a2, (rows, k))), reshape(g2, (rows, n)))
            else:
                gb = sum_to(matmul(_mT(a2), g2), tuple(b2.shape))
            gb = reshape(gb, tuple(b.shape))
        return ga, gb


def matmul(input, other):
    _same_dtype(input, other, "matmul")
    a, b = input.shape, other.shape  # logical shapes (a global tensor's _data is only its shard)
    if len(a) == 0 or len(b) == 0:
        raise RuntimeError(f"matmul: both arguments need at least 1 dimension, got shapes "
                           f"{shape_str(a)} and {shape_str(b)}")
    k1 = a[-1]
    k2 = b[0] if len(b) == 1 else b[-2]
    if k1 != k2:
        raise _mismatch("matmul", input, other, k1, k2)
    if len(a) > 2 or len(b) > 2:
        try:
            broadcast_shapes(tuple(a[:-2]), tuple(b[:-2]))
        except RuntimeError:
            raise RuntimeError(f"matmul: batch dimensions of shapes {shape_str(a)} and "
                               f"{shape_str(b)} cannot be broadcast") from None
    return Matmul.apply(input, other)


def matmul_wide(input, other, dtype):
    """input @ other of two half-precision tensors, returned in `dtype` (numpy float32) straight
    from the product's float32 accumulator: what casting the half-precision product would give,
    less its rounding, its temporary and the cast (cuBLAS writes float32 from float16 operands)."""
    _same_dtype(input, other, "matmul")
    return Matmul.apply(input, other, out_dtype=np.dtype(dtype))


def mm(input, mat2):
    if input.ndim != 2:
        raise RuntimeError(f"mm: self must be a matrix, got shape {shape_str(input.shape)}")
    if mat2.ndim != 2:
        raise RuntimeError(f"mm: mat2 must be a matrix, got shape {shape_str(mat2.shape)}")
    _same_dtype(input, mat2, "mm")
    if input.shape[1] != mat2.shape[0]:
        raise _mismatch("mm", input, mat2, input.shape[1], mat2.shape[0])
    return Matmul.apply(input, mat2)


def bmm(input, mat2):
    for name, t in (("batch1", input), ("batch2", mat2)):
        if t.ndim != 3:
            raise RuntimeError(f"bmm: {name} must be a 3D tensor, got shape {shape_str(t.shape)}")
    _same_dtype(input, mat2, "bmm")
    if input.shape[0] != mat2.shape[0]:
        raise RuntimeError(f"bmm: batch sizes of shapes {shape_str(input.shape)} and "
                           f"{shape_str(mat2.shape)} differ ({input.shape[0]} != {mat2.shape[0]})")
    if input.shape[2] != mat2.shape[1]:
        raise _mismatch("bmm", input, mat2, input.shape[2], mat2.shape[1])
    return Matmul.apply(input, mat2)


def mv(input, vec):
    if input.ndim != 2 or vec.ndim != 1:
        raise RuntimeError(f"vector + matrix @ vector expected, got 1, {input.ndim}, {vec.ndim}")
    if input.shape[1] != vec.shape[0]:
        raise RuntimeError(f"size mismatch, got input ({input.shape[0]}), mat ({input.shape[0]}x{input.shape[1]}), "
                           f"vec ({vec.shape[0]})")
    _same_dtype(input, vec, "mv")
    return Matmul.apply(input, vec)


def _add_scaled(input, prod, beta, alpha):
    """beta * input + alpha * prod; beta == 0 ignores input (NaNs included), as PyTorch does. An
    integer product keeps its dtype: float factors are truncated to integers first, as torch's."""
    if not prod.is_floating_point():
        alpha, beta = int(alpha), int(beta)
    if alpha != 1:
        prod = prod * alpha
    if beta == 0:  # input still gets a (zero) gradient, as in PyTorch
        return prod + IndexZero.apply(input, key=Ellipsis)
    return prod + (input if beta == 1 else input * beta)


def addmm(input, mat1, mat2, *, beta=1, alpha=1):
    return _add_scaled(input, mm(mat1, mat2), beta, alpha)


def baddbmm(input, batch1, batch2, *, beta=1, alpha=1):
    return _add_scaled(input, bmm(batch1, batch2), beta, alpha)


def dot(input, other):
    if input.ndim != 1 or other.ndim != 1:
        raise RuntimeError(f"dot: 1D tensors expected, but got {input.ndim}D and {other.ndim}D tensors")
    _same_dtype(input, other, "dot")
    if input.shape[0] != other.shape[0]:
        raise RuntimeError(f"dot: inconsistent tensor size, expected tensors {shape_str(input.shape)} and "
                           f"{shape_str(other.shape)} to have the same number of elements")
    return Matmul.apply(input, other)


def outer(input, vec2):
    if input.ndim != 1 or vec2.ndim != 1:
        raise RuntimeError(f"outer: 1D tensors expected, but got {input.ndim}D and {vec2.ndim}D tensors")
    return reshape(input, (input.shape[0], 1)) * reshape(vec2, (1, vec2.shape[0]))


def tensordot(a, b, dims=2):
    """Sum over the last `dims` dims of a and the first `dims` of b, or over the paired dim lists
    `dims=([a dims], [b dims])`: one matrix product of the permuted, flattened operands (a
    contracted dim of size 1 on one side broadcasts, as in torch)."""
    if isinstance(dims, Tensor):
        dims = dims.tolist()
    if isinstance(dims, int):
        if dims < 0:
            raise RuntimeError(f"tensordot expects dims >= 0, but got dims={dims}")
        if dims > a.ndim or dims > b.ndim:
            raise RuntimeError(f"tensordot expects dims < ndim_a or ndim_b, but got dims={dims}")
        dims_a, dims_b = list(range(a.ndim - dims, a.ndim)), list(range(dims))
    else:
        dims_a, dims_b = ([d] if isinstance(d, int) else list(d) for d in dims)
    if len(dims_a) != len(dims_b):
        raise RuntimeError("both dimension lists should have same length")
    if a.dtype != b.dtype:
        raise RuntimeError("both inputs should have same dtype")
    dims_a = [_check_dim(d, a.ndim) for d in dims_a]
    dims_b = [_check_dim(d, b.ndim) for d in dims_b]
    for i, j in zip(dims_a, dims_b):
        if b.shape[j] == 1 and a.shape[i] != 1:  # a size-1 side broadcasts: the other is summed right away
            a = a.sum(i, keepdim=True)
        elif a.shape[i] == 1 and b.shape[j] != 1:
            b = b.sum(j, keepdim=True)
        elif a.shape[i] != b.shape[j]:
            raise RuntimeError(f"contracted dimensions need to match, but first has size {a.shape[i]} in dim {i} "
                               f"and second has size {b.shape[j]} in dim {j}")
    free_a = [i for i in range(a.ndim) if i not in dims_a]
    free_b = [j for j in range(b.ndim) if j not in dims_b]
    k = math.prod(a.shape[i] for i in dims_a)
    out_a, out_b = tuple(a.shape[i] for i in free_a), tuple(b.shape[j] for j in free_b)
    a2 = reshape(a.permute(*free_a, *dims_a), (math.prod(out_a), k))
    b2 = reshape(b.permute(*dims_b, *free_b), (k, math.prod(out_b)))
    return reshape(Matmul.apply(a2, b2), out_a + out_b)


# ------------------------------------------------------------------ cdist
_CDIST_MODES = ("use_mm_for_euclid_dist_if_necessary", "use_mm_for_euclid_dist", "donot_use_mm_for_euclid_dist")
_TORCH_NAMES = {"float16": "Half", "bfloat16": "BFloat16", "float32": "Float", "float64": "Double", "int64": "Long",
                "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte", "bool": "Bool"}


def cdist(x1, x2, p=2.0, compute_mode="use_mm_for_euclid_dist_if_necessary"):
    """The p-norm distance of every row of x1 [..., P, M] to every row of x2 [..., R, M], batch
    dims broadcast: [..., P, R]. For p=2 with more than 25 rows on a side (or when
    `compute_mode` asks) it uses torch's matrix-product form |a|^2 + |b|^2 - 2 a.b, otherwise
    the norm of the differences (whose gradient is 0 at zero distance, as torch's)."""
    for name, t in (("X1", x1), ("X2", x2)):
        if t.ndim < 2:
            raise RuntimeError(f"cdist only supports at least 2D tensors, {name} got: {t.ndim}D")
    if x1.shape[-1] != x2.shape[-1]:
        raise RuntimeError(f"X1 and X2 must have the same number of columns. X1: {x1.shape[-1]} X2: {x2.shape[-1]}")
    for name, t in (("X1", x1), ("X2", x2)):
        if not t.is_floating_point():
            raise RuntimeError(f"cdist only supports floating-point dtypes, {name} got: {_TORCH_NAMES[t.dtype.name]}")
    if x1.dtype != x2.dtype:
        raise RuntimeError(f"expected scalar type {_TORCH_NAMES[x1.dtype.name]} but found "
                           f"{_TORCH_NAMES[x2.dtype.name]}")
    if p < 0:
        raise RuntimeError("cdist only supports non-negative p values")
    if compute_mode is None:
        compute_mode = _CDIST_MODES[0]
    if compute_mode not in _CDIST_MODES:
        raise ValueError(f"{compute_mode} is not a valid value for compute_mode")
    batch = broadcast_shapes(tuple(x1.shape[:-2]), tuple(x2.shape[:-2]))
    x1 = broadcast_to(x1, batch + tuple(x1.shape[-2:]))
    x2 = broadcast_to(x2, batch + tuple(x2.shape[-2:]))
    rows1, rows2 = x1.shape[-2], x2.shape[-2]
    if p == 2 and (compute_mode == _CDIST_MODES[1] or (compute_mode == _CDIST_MODES[0] and max(rows1, rows2) > 25)):
        return _euclidean_dist(x1, x2)
    diff = x1.unsqueeze(-2) - x2.unsqueeze(-3)
    return diff.norm(p, dim=-1)


def _euclidean_dist(x1, x2):
    """torch's _euclidean_dist: one product of [-2 x1, |x1|^2, 1] and [x2, 1, |x2|^2]."""
    n1 = (x1 * x1).sum(-1, keepdim=True)
    n2 = (x2 * x2).sum(-1, keepdim=True)
    a = cat([x1 * -2, n1, n1.new_ones(tuple(n1.shape))], -1)
    b = cat([x2, n2.new_ones(tuple(n2.shape)), n2], -1)
    return matmul(a, _mT(b)).clamp_min(1e-30).sqrt()


# ------------------------------------------------------------------ linear
class Linear(Op):
    """y = x W^T + b: one GEMM on the 2-D view of x, bias added in place.

    `grad_dtype` (set by `linear` under autocast when W and b are float32 master weights that
    autocast lowers): the backward computes W's and b's gradients in float32 straight from the
    half-precision product's float32 accumulator (Megatron's weight gradient into fp32 main_grad).
    Autocast's cast of W passes a float32 gradient through unchanged, so the half-precision
    gradient, its rounding and the cast kernel of each weight and bias disappear from the step."""

    name = "Linear"
    autocast = "lower"
    save_inputs = (0, 1)

    @staticmethod
    def forward(ctx, x, w, b, grad_dtype=None):
        ctx.grad_dtype = grad_dtype
        xp = xp_of(x)
        out_f, in_f = w.shape
        y = _matmul(xp, x.reshape(-1, in_f), w.T, b)  # the bias added piece by piece, in cache
        return y.reshape(x.shape[:-1] + (out_f,))

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad
        out_f, in_f = w.shape
        wide = ctx.grad_dtype
        g2 = reshape(g, (-1, out_f))
        gx = reshape(matmul(g2, w), tuple(x.shape)) if need_x else None
        gw = gb = None
        if need_w:
            x2 = reshape(x, (-1, in_f))
            gw = matmul(_mT(g2), x2) if wide is None else matmul_wide(_mT(g2), x2, wide)
        if need_b:
            gb = sum_to(g2, (out_f,), dtype=wide)
        return gx, gw, gb


def _master_grad_dtype(weight, bias):
    """float32 when an active autocast lowers this linear's float32 weight (and float32 bias):
    their gradients then leave the backward in float32 (see Linear)."""
    if not autocast_lowers(weight) or weight._data.dtype != np.float32:
        return None
    if bias is not None and (bias._data.dtype != np.float32 or not autocast_lowers(bias)):
        return None
    return weight._data.dtype


def linear(input, weight, bias=None):
    if weight.ndim != 2:
        if weight.ndim == 1 and input.ndim >= 1:  # F.linear accepts a vector weight
            out = matmul(input, weight)
            return out + bias if bias is not None else out
        raise RuntimeError(f"linear: weight must be 2-D, got shape {shape_str(weight.shape)}")
    _same_dtype(input, weight, "linear")
    if input.ndim == 0 or input.shape[-1] != weight.shape[1]:
        raise RuntimeError(f"linear: shapes {shape_str(input.shape)} and {shape_str(weight.shape)}^T "
                           f"cannot be multiplied ({input.shape[-1] if input.ndim else 1} != {weight.shape[1]})")
    if bias is not None:
        _same_dtype(input, bias, "linear")
        if tuple(bias.shape) not in ((weight.shape[0],), (1,), ()):
            return _linear(input, weight, None) + bias
        if tuple(bias.shape) != (weight.shape[0],):
            bias = broadcast_to(bias, (weight.shape[0],))
    return _linear(input, weight, bias)


def _linear(input, weight, bias):
    grad_dtype = _master_grad_dtype(weight, bias)
    if grad_dtype is None:
        return Linear.apply(input, weight, bias)
    return Linear.apply(input, weight, bias, grad_dtype=grad_dtype)


# ------------------------------------------------------------------ einsum
class Einsum(Op):
    """xp.einsum on explicit subscripts (no ellipsis): 'ab,bc->ac'."""

    name = "Einsum"
    autocast = "lower"

    @staticmethod
    def forward(ctx, *arrays, equation):
        ctx.equation = equation
        xp = xp_of(arrays[0])
        if len(arrays) == 1:
            out = xp.einsum(equation, arrays[0])
        else:
            out = xp.einsum(equation, *arrays, optimize=True)
        return xp.ascontiguousarray(out) if out.ndim else xp.asarray(out)

    @staticmethod
    def backward(ctx, g):
        ins, out = ctx.equation.split("->")
        subs = ins.split(",")
        operands = ctx.saved_tensors
        grads = []
        for i, s in enumerate(subs):
            if not ctx.needs_input_grad[i]:
                grads.append(None)
                continue
            grads.append(_einsum_grad(g, out, subs, operands, i))
        return tuple(grads)


def _einsum_grad(g, out, subs, operands, i):
    """d/d operand_i: einsum of the gradient with the other operands onto operand i's labels."""
    s = subs[i]
    shape = tuple(operands[i].shape)
    size = dict(zip(s, shape))
    uniq = "".join(dict.fromkeys(s))
    others = [(subs[j], operands[j]) for j in range(len(subs)) if j != i]
    avail = set(out).union(*[set(sj) for sj, _ in others]) if others else set(out)
    target = "".join(c for c in uniq if c in avail)
    eq = ",".join([out] + [sj for sj, _ in others]) + "->" + target
    r = _einsum_explicit(eq, [g] + [t for _, t in others])
    if target != uniq:  # labels summed only inside operand i: the gradient is constant along them
        r = reshape(r, tuple(size[c] if c in avail else 1 for c in uniq))
        r = broadcast_to(r, tuple(size[c] for c in uniq))
    if uniq != s:  # repeated labels (a diagonal): place the gradient on it
        r = DiagEmbed.apply(r, labels=s, uniq=uniq, shape=shape)
    return r


class DiagEmbed(Op):
    """Zeros of `shape` whose generalised diagonal (repeated einsum labels) holds `r`."""

    name = "EinsumDiagEmbed"

    @staticmethod
    def forward(ctx, r, labels, uniq, shape):
        ctx.labels, ctx.uniq = labels, uniq
        xp = xp_of(r)
        out = xp.zeros(shape, dtype=r.dtype)
        strides = [0] * len(uniq)
        for c, st in zip(labels, out.strides):
            strides[uniq.index(c)] += st
        view = xp.lib.stride_tricks.as_strided(out, shape=r.shape, strides=tuple(strides))
        view[...] = r
        return out

    @staticmethod
    def backward(ctx, g):
        return _einsum_explicit(f"{ctx.labels}->{ctx.uniq}", [g])


_EINSUM_OPS = {}


def _einsum_explicit(eq, tensors):
    """Run Einsum; each gradient needs the other operands, so the op saves all n of its inputs."""
    n = len(tensors)
    op = _EINSUM_OPS.get(n)
    if op is None:
        op = _EINSUM_OPS[n] = type(f"Einsum{n}", (Einsum,), {"save_inputs": tuple(range(n))})
    return op.apply(*tensors, equation=eq)


def _expand_ellipsis(lhs, rhs, tensors):
    """Rewrite '...' as explicit letters; operands whose ellipsis dims broadcast are expanded."""
    subs = lhs.split(",")
    used = set(lhs.replace("...", "")) | set((rhs or "").replace("...", ""))
    free = [c for c in string.ascii_letters if c not in used]
    ell = [t.ndim - (len(s) - 3) if "..." in s else 0 for s, t in zip(subs, tensors)]
    n = max(ell) if ell else 0
    letters = "".join(free[:n])
    ell_shapes = [tuple(t.shape[s.index("..."):s.index("...") + k]) if "..." in s else ()
                  for s, t, k in zip(subs, tensors, ell)]
    full = broadcast_shapes(*ell_shapes) if any(ell_shapes) else ()
    new_subs, new_tensors = [], []
    for s, t, k, es in zip(subs, tensors, ell, ell_shapes):
        if "..." in s:
            pos = s.index("...")
            target = full[len(full) - k:] if k else ()
            if es != target:
                t = broadcast_to(t, tuple(t.shape[:pos]) + target + tuple(t.shape[pos + k:]))
            s = s.replace("...", letters[n - k:])
        new_subs.append(s)
        new_tensors.append(t)
    if rhs is not None:
        rhs = rhs.replace("...", letters)
    return new_subs, rhs, new_tensors, letters


def _sublist_label(n):
    """A label of torch's sublist format: 0-25 are 'A'-'Z', 26-51 'a'-'z', Ellipsis '...'."""
    if n is Ellipsis:
        return "..."
    if 0 <= n < 26:
        return chr(ord("A") + n)
    if 26 <= n < 52:
        return chr(ord("a") + n - 26)
    raise ValueError("einsum(): subscript in subscript list is not within the valid range [0, 52)")


def _sublist_equation(args):
    """torch's `einsum(op1, sublist1, op2, sublist2, ..., [sublist_out])` as (equation, operands)."""
    equation = ",".join("".join(_sublist_label(n) for n in sub) for sub in args[1::2])
    if len(args) % 2 == 1:
        return equation + "->" + "".join(_sublist_label(n) for n in args[-1]), args[:-1:2]
    return equation, args[::2]


def einsum(equation, *operands):
    """torch.einsum: `einsum('ij,jk->ik', a, b)`, or the sublist form `einsum(a, [0, 1], b, [1, 2], [0, 2])`."""
    if not operands:
        raise ValueError("einsum(): must specify the equation string and at least one operand, "
                         "or at least one operand and its subscripts list")
    if isinstance(equation, Tensor):
        equation, operands = _sublist_equation((equation,) + operands)
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not operands:
        raise RuntimeError("einsum(): must provide at least one operand")
    eq = equation.replace(" ", "")
    lhs, rhs = eq.split("->") if "->" in eq else (eq, None)
    if len(lhs.split(",")) != len(operands):
        raise RuntimeError(f"einsum(): {len(lhs.split(','))} subscripts in '{equation}' but "
                           f"{len(operands)} operands were given")
    for t in operands[1:]:
        _same_dtype(operands[0], t, "einsum")
    subs, rhs, tensors, ell_letters = _expand_ellipsis(lhs, rhs, list(operands))
    for s, t in zip(subs, tensors):
        if len(s) != t.ndim:
            raise RuntimeError(f"einsum(): the subscript '{s}' has {len(s)} labels but the operand has "
                               f"{t.ndim} dimensions (shape {shape_str(t.shape)})")
    for i, (s, t) in enumerate(zip(subs, tensors)):
        first = {}
        for c, n in zip(s, t.shape):
            if first.setdefault(c, n) != n:
                raise RuntimeError(f"einsum(): subscript {c} is repeated for operand {i} but the sizes don't match, "
                                   f"{n} != {first[c]}")
    if rhs is None:  # implicit mode: ellipsis dims first, then labels seen once, sorted
        counts = {}
        for c in "".join(subs):
            counts[c] = counts.get(c, 0) + 1
        rhs = ell_letters + "".join(sorted(c for c, k in counts.items() if k == 1 and c not in ell_letters))
    return _einsum_explicit(",".join(subs) + "->" + rhs, tensors)


# ------------------------------------------------------------------ Tensor methods
tensor_method("matmul", "__matmul__")(matmul)
tensor_method("__rmatmul__")(lambda self, other: matmul(other, self))
tensor_method("mm")(mm)
tensor_method("bmm")(bmm)
tensor_method("addmm")(addmm)
tensor_method("baddbmm")(baddbmm)
tensor_method("dot")(dot)
tensor_method("mv")(mv)
tensor_method("outer", "ger")(outer)
