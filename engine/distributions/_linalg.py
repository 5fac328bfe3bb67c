"""The two factorisation ops MultivariateNormal needs, with their gradients: `cholesky` and
`solve_triangular` (torch.linalg's). They live here, below engine/linalg.py, because
engine.distributions (the nn/optim layer) cannot import the engine namespace's modules;
engine.linalg re-exports them.

Backward formulas (torch's, FunctionsManual.cpp), written in engine ops:
    L = cholesky(A):           gA = L^-H Phi(L^H gL) L^-1,  Phi(X) = (tril(X) + tril(X, -1)^H) / 2
    X = solve_triangular(A, B) (A X = B, or X A = B with left=False):
                               gB = A^-H gX (left),  gA = -gB X^H, kept on A's triangle
"""
from ..backend import xp_of
from ..ops._core import broadcast_shapes
from ..ops.linalg import matmul
from ..ops.op import Op
from ..ops.shape import tril, triu
from ..tensor import Tensor

__all__ = ["cholesky", "solve_triangular", "broadcast_batches"]


def _mH(t):
    return t.transpose(-2, -1)


def _check_square(name, A, what="A"):
    if not isinstance(A, Tensor):
        raise TypeError(f"{name}: expected a Tensor, got {type(A).__name__}")
    if A.ndim < 2:
        raise RuntimeError(f"{name}: The input tensor {what} must have at least 2 dimensions.")
    if A.shape[-1] != A.shape[-2]:
        raise RuntimeError(f"{name}: {what} must be batches of square matrices, but they are "
                           f"{A.shape[-2]} by {A.shape[-1]} matrices")
    if not A.is_floating_point():
        raise RuntimeError(f"{name}: Expected a floating point or complex tensor as input. Got {A.dtype}")


class Cholesky(Op):
    name = "LinalgCholesky"
    save_outputs = (0,)

    @staticmethod
    def forward(ctx, a, upper=False):
        xp = xp_of(a)
        ctx.upper = upper
        try:
            L = xp.linalg.cholesky(a)
        except Exception as e:  # numpy's LinAlgError
            raise RuntimeError("linalg.cholesky: The factorization could not be completed because the input is "
                               "not positive-definite.") from e
        if not bool(xp.isfinite(L).all()):  # CuPy returns NaNs instead of raising
            raise RuntimeError("linalg.cholesky: The factorization could not be completed because the input is "
                               "not positive-definite.")
        return L.swapaxes(-1, -2).copy() if upper else L

    @staticmethod
    def backward(ctx, g):
        (L,) = ctx.saved_tensors
        if ctx.upper:
            L, g = _mH(L), _mH(g)
        gA = tril(matmul(_mH(L), g))
        gA = 0.5 * (gA + _mH(tril(gA, -1)))
        gA = solve_triangular(_mH(L), gA, upper=True, left=True)
        return solve_triangular(L, gA, upper=False, left=False)


def cholesky(A, *, upper=False, out=None):
    """torch.linalg.cholesky: the lower (or upper) Cholesky factor of symmetric positive-definite A."""
    if out is not None:
        raise TypeError("linalg.cholesky(): out= is not supported")
    _check_square("linalg.cholesky", A)
    return Cholesky.apply(A, upper=bool(upper))


class SolveTriangular(Op):
    name = "LinalgSolveTriangular"
    save_inputs = (0,)
    save_outputs = (0,)

    @staticmethod
    def forward(ctx, a, b, upper, left, unitriangular):
        xp = xp_of(a)
        ctx.upper, ctx.left, ctx.unitriangular = upper, left, unitriangular
        n = a.shape[-1]
        tri = xp.triu(a) if upper else xp.tril(a)
        if unitriangular:
            tri = tri.copy()
            idx = xp.arange(n)
            tri[..., idx, idx] = 1
        if not left:  # X A = B  <=>  A^T X^T = B^T
            return xp.linalg.solve(tri.swapaxes(-1, -2), b.swapaxes(-1, -2)).swapaxes(-1, -2)
        return xp.linalg.solve(tri, b)

    @staticmethod
    def backward(ctx, g):
        A, X = ctx.saved_tensors
        need_a, need_b = ctx.needs_input_grad
        upper, left, unit = ctx.upper, ctx.left, ctx.unitriangular
        gB = solve_triangular(_mH(A), g, upper=not upper, left=left, unitriangular=unit)
        gA = None
        if need_a:
            gA = -matmul(gB, _mH(X)) if left else -matmul(_mH(X), gB)
            gA = triu(gA, 1 if unit else 0) if upper else tril(gA, -1 if unit else 0)
        return gA, (gB if need_b else None)


def solve_triangular(A, B, *, upper, left=True, unitriangular=False, out=None):
    """torch.linalg.solve_triangular: X with A X = B (X A = B when left=False), A triangular
    (only its upper or lower triangle is read); batch dims broadcast."""
    if out is not None:
        raise TypeError("linalg.solve_triangular(): out= is not supported")
    _check_square("linalg.solve_triangular", A)
    if not isinstance(B, Tensor) or B.ndim < 2:
        raise RuntimeError("linalg.solve_triangular: The input tensor B must have at least 2 dimensions.")
    if A.dtype != B.dtype:
        raise RuntimeError(f"linalg.solve_triangular: Expected A and B to have the same dtype, but found A of "
                           f"type {A.dtype} and B of type {B.dtype} instead")
    k = B.shape[-2] if left else B.shape[-1]
    if k != A.shape[-1]:
        raise RuntimeError(f"linalg.solve_triangular: Incompatible shapes of A and B for the equation "
                           f"{'AX = B' if left else 'XA = B'} ({A.shape[-2]}x{A.shape[-1]} and "
                           f"{B.shape[-2]}x{B.shape[-1]})")
    A, B = broadcast_batches(A, B)
    return SolveTriangular.apply(A, B, upper=bool(upper), left=bool(left), unitriangular=bool(unitriangular))


def broadcast_batches(A, B):
    """A and B (matrices, batch dims first) expanded to their common batch dims; expand's
    backward sums the gradients back."""
    batch = tuple(broadcast_shapes(tuple(A.shape[:-2]), tuple(B.shape[:-2])))
    A = A.expand(*batch, *A.shape[-2:]) if tuple(A.shape[:-2]) != batch else A
    B = B.expand(*batch, *B.shape[-2:]) if tuple(B.shape[:-2]) != batch else B
    return A, B
