"""`engine.linalg`: torch.linalg's commonly used functions.

    norm, vector_norm, matrix_norm, inv, det, slogdet, solve, solve_triangular, cholesky, qr,
    eigh, eigvalsh, svd, svdvals, pinv, lstsq, matrix_rank, cross, multi_dot, matmul

Factorisations run on the backend's LAPACK (`xp.linalg`); each has torch's backward formula
(FunctionsManual.cpp) written in engine ops: inv (-A^-T g A^-T), det and slogdet (through
A^-T), solve, eigh (V (skew(V^T gV) / 2E + diag(gL)) V^T with E_ij = L_j - L_i), svd (torch's
svd_backward, reduced factors), qr (m >= n). As in torch, eigenvectors and singular vectors are
defined up to sign, so their gradients are meaningful for losses invariant to it, and need
distinct eigen/singular values. vector_norm is the engine's Norm op (engine/ops/reduction.py,
behind torch.norm); matrix_norm, norm, pinv, lstsq, cross and multi_dot are composed of these
and of engine ops. cholesky and solve_triangular live in engine/distributions/_linalg.py (the
distributions use them and sit below this module). Real dtypes only.
"""
import math
from collections import namedtuple

from .backend import xp_of
from .distributions._linalg import _check_square, broadcast_batches, cholesky, solve_triangular
from .ops._core import broadcast_shapes
from .ops.comparison import where
from .ops.creation import zeros_like
from .ops.linalg import matmul
from .ops.op import Op
from .ops.reduction import norm as _norm
from .ops.shape import diag_embed, stack, tril
from .tensor import Tensor

__all__ = ["norm", "vector_norm", "matrix_norm", "inv", "det", "slogdet", "solve", "solve_triangular", "cholesky",
           "qr", "eigh", "eigvalsh", "svd", "svdvals", "pinv", "lstsq", "matrix_rank", "cross", "multi_dot",
           "matmul"]

SlogdetResult = namedtuple("linalg_slogdet", ["sign", "logabsdet"])
QRResult = namedtuple("linalg_qr", ["Q", "R"])
EighResult = namedtuple("linalg_eigh", ["eigenvalues", "eigenvectors"])
SVDResult = namedtuple("linalg_svd", ["U", "S", "Vh"])
LstsqResult = namedtuple("linalg_lstsq", ["solution", "residuals", "rank", "singular_values"])


def _mT(t):
    return t.transpose(-2, -1)


def _no_out(name, out):
    if out is not None:
        raise TypeError(f"linalg.{name}(): out= is not supported")


def _check_matrix(name, A):
    if not isinstance(A, Tensor):
        raise TypeError(f"linalg.{name}: expected a Tensor, got {type(A).__name__}")
    if A.ndim < 2:
        raise RuntimeError(f"linalg.{name}: The input tensor A must have at least 2 dimensions.")
    if not A.is_floating_point():
        raise RuntimeError(f"linalg.{name}: Expected a floating point or complex tensor as input. Got {A.dtype}")


# ------------------------------------------------------------------ norms
def _dims(x, dim):
    if dim is None:
        return tuple(range(x.ndim))
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    return tuple(d % max(x.ndim, 1) for d in dims)


def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None, out=None):
    """torch.linalg.vector_norm: the ord-norm of x over `dim` (all elements when None)."""
    _no_out("vector_norm", out)
    if not isinstance(x, Tensor):
        raise TypeError(f"linalg.vector_norm: expected a Tensor, got {type(x).__name__}")
    if dtype is not None:
        x = x.to(dtype)
    if not x.is_floating_point():
        raise RuntimeError(f"linalg.vector_norm: Expected a floating point or complex tensor as input. Got {x.dtype}")
    if x.ndim == 0:  # a 0-d input: its absolute value (keepdim has no dim to keep)
        x, dim, keepdim = x.reshape(1), None, False
    # the engine's Norm op (engine/ops/reduction.py: torch.norm) computes every vector norm
    return _norm(x, float(ord), _dims(x, dim), keepdim)


def matrix_norm(A, ord="fro", dim=(-2, -1), keepdim=False, *, dtype=None, out=None):
    """torch.linalg.matrix_norm: 'fro', 'nuc', 2, -2, 1, -1, inf, -inf over the two dims `dim`."""
    _no_out("matrix_norm", out)
    if dtype is not None:
        A = A.to(dtype)
    _check_matrix("matrix_norm", A)
    d0, d1 = (d % A.ndim for d in dim)
    if d0 == d1:
        raise RuntimeError(f"linalg.matrix_norm: dims must be different. Got ({dim[0]}, {dim[1]})")
    if ord == "fro":
        return vector_norm(A, 2, (d0, d1), keepdim)
    if ord in ("nuc", 2, -2):
        M = A.movedim((d0, d1), (-2, -1))
        S = svdvals(M)
        r = S.sum(-1) if ord == "nuc" else (S.amax(-1) if ord == 2 else S.amin(-1))
        if keepdim:
            for d in sorted((d0, d1)):
                r = r.unsqueeze(d)
        return r
    if ord in (1, -1, math.inf, -math.inf):
        summed, reduced = (d0, d1) if ord in (1, -1) else (d1, d0)
        s = A.abs().sum(dim=summed, keepdim=True)
        r = s.amax(dim=reduced, keepdim=True) if ord > 0 else s.amin(dim=reduced, keepdim=True)
        return r if keepdim else r.squeeze(max(d0, d1)).squeeze(min(d0, d1))
    raise RuntimeError(f"linalg.matrix_norm: Order {ord} not supported.")


def norm(A, ord=None, dim=None, keepdim=False, *, out=None, dtype=None):
    """torch.linalg.norm: a vector norm (1-D input, an int dim, or ord None with dim None) or a
    matrix norm (2-D input with a given ord, or a 2-tuple dim)."""
    _no_out("norm", out)
    if dim is not None:
        dims = (dim,) if isinstance(dim, int) else tuple(dim)
        if len(dims) == 2:
            return matrix_norm(A, "fro" if ord is None else ord, dims, keepdim, dtype=dtype)
        return vector_norm(A, 2 if ord is None else ord, dims, keepdim, dtype=dtype)
    if ord is None:
        return vector_norm(A, 2, None, keepdim, dtype=dtype)
    if A.ndim == 2:
        return matrix_norm(A, ord, (-2, -1), keepdim, dtype=dtype)
    if A.ndim == 1 and not isinstance(ord, str):
        return vector_norm(A, ord, None, keepdim, dtype=dtype)
    raise RuntimeError(f"linalg.norm: If dim is not specified but ord is, the input must be 1D or 2D. "
                       f"Got {A.ndim}D.")


# ------------------------------------------------------------------ inverse, determinants, solve
def _lapack(name, fn, *arrays):
    try:
        return fn(*arrays)
    except Exception as e:  # numpy's LinAlgError: singular input
        raise RuntimeError(f"linalg.{name}: The diagonal element 1 is zero, the inversion could not be "
                           "completed because the input matrix is singular.") from e


class Inv(Op):
    name = "LinalgInv"
    save_outputs = (0,)

    @staticmethod
    def forward(ctx, a):
        return _lapack("inv", xp_of(a).linalg.inv, a)

    @staticmethod
    def backward(ctx, g):
        (Ainv,) = ctx.saved_tensors
        return -matmul(_mT(Ainv), matmul(g, _mT(Ainv)))


def _square_op(name, op, A, out):
    _no_out(name, out)
    _check_square(f"linalg.{name}", A)
    return op.apply(A)


def inv(A, *, out=None):
    """torch.linalg.inv."""
    return _square_op("inv", Inv, A, out)


class LogAbsDet(Op):
    """log |det A| (the sign comes separately, with no gradient); backward g A^-T."""

    name = "LinalgSlogdet"
    save_inputs = (0,)

    @staticmethod
    def forward(ctx, a):
        return xp_of(a).linalg.slogdet(a)[1]

    @staticmethod
    def backward(ctx, g):
        (A,) = ctx.saved_tensors
        return g.unsqueeze(-1).unsqueeze(-1) * _mT(inv(A))


def slogdet(A, *, out=None):
    """torch.linalg.slogdet: (sign, log |det A|)."""
    logabsdet = _square_op("slogdet", LogAbsDet, A, out)
    sign = Tensor._make(xp_of(A._data).linalg.slogdet(A._data)[0], A._device)
    return SlogdetResult(sign, logabsdet)


class Det(Op):
    name = "LinalgDet"
    save_inputs = (0,)
    save_outputs = (0,)

    @staticmethod
    def forward(ctx, a):
        return xp_of(a).asarray(xp_of(a).linalg.det(a))

    @staticmethod
    def backward(ctx, g):
        A, d = ctx.saved_tensors
        return (g * d).unsqueeze(-1).unsqueeze(-1) * _mT(inv(A))


def det(A, *, out=None):
    """torch.linalg.det (its gradient assumes an invertible A)."""
    return _square_op("det", Det, A, out)


class Solve(Op):
    """X = A^-1 B (batch dims already broadcast). Backward: gB = A^-T g, gA = -gB X^T."""

    name = "LinalgSolve"
    save_inputs = (0,)
    save_outputs = (0,)

    @staticmethod
    def forward(ctx, a, b):
        return _lapack("solve", xp_of(a).linalg.solve, a, b)

    @staticmethod
    def backward(ctx, g):
        A, X = ctx.saved_tensors
        gB = solve(_mT(A), g)
        return (-matmul(gB, _mT(X)) if ctx.needs_input_grad[0] else None), gB


def solve(A, B, *, left=True, out=None):
    """torch.linalg.solve: X with A X = B (X A = B when left=False); B may be a (batch of)
    vector(s) as torch decides: B.ndim == 1, or B.shape == A.shape[:-1]."""
    _no_out("solve", out)
    _check_square("linalg.solve", A)
    if A.dtype != B.dtype:
        raise RuntimeError(f"linalg.solve: Expected A and B to have the same dtype, but found A of type {A.dtype} "
                           f"and B of type {B.dtype} instead")
    if not left:
        return _mT(solve(_mT(A), _mT(B)))
    vector = B.ndim == 1 or (B.ndim == A.ndim - 1 and tuple(B.shape) == tuple(A.shape[:-1]))
    if vector:
        B = B.unsqueeze(-1)
    if B.shape[-2] != A.shape[-1]:
        raise RuntimeError(f"linalg.solve: Incompatible shapes of A and B for the equation AX = B "
                           f"({A.shape[-2]}x{A.shape[-1]} and {B.shape[-2]}x{B.shape[-1]})")
    X = Solve.apply(*broadcast_batches(A, B))
    return X.squeeze(-1) if vector else X


# ------------------------------------------------------------------ decompositions
def _skew(X):
    return X - _mT(X)


class Eigh(Op):
    name = "LinalgEigh"
    save_outputs = (0, 1)

    @staticmethod
    def forward(ctx, a, uplo):
        L, V = xp_of(a).linalg.eigh(a, UPLO=uplo)
        return L, V

    @staticmethod
    def backward(ctx, gL, gV):
        L, V = ctx.saved_tensors
        if gV is None:
            inner = diag_embed(gL)
        else:
            E = L.unsqueeze(-2) - L.unsqueeze(-1)  # E_ij = L_j - L_i
            eye = diag_embed(L * 0 + 1)
            inner = (0.5 * _skew(matmul(_mT(V), gV))) / (E + eye)
            if gL is not None:
                inner = inner + diag_embed(gL)
        return matmul(V, matmul(inner, _mT(V)))


def eigh(A, UPLO="L", *, out=None):
    """torch.linalg.eigh: eigenvalues (ascending) and orthonormal eigenvectors of a symmetric A
    (only the `UPLO` triangle is read)."""
    _no_out("eigh", out)
    _check_square("linalg.eigh", A)
    if UPLO not in ("L", "U"):
        raise RuntimeError(f"Expected UPLO argument to be 'L' or 'U', but got {UPLO}")
    return EighResult(*Eigh.apply(A, uplo=UPLO))


def eigvalsh(A, UPLO="L", *, out=None):
    """torch.linalg.eigvalsh: the eigenvalues of eigh."""
    _no_out("eigvalsh", out)
    return eigh(A, UPLO).eigenvalues


class SVD(Op):
    """Reduced SVD (U: m x k, S: k, Vh: k x n). Backward: torch's svd_backward (real case)."""

    name = "LinalgSvd"
    save_outputs = (0, 1, 2)

    @staticmethod
    def forward(ctx, a):
        U, S, Vh = xp_of(a).linalg.svd(a, full_matrices=False)
        return U, S, Vh

    @staticmethod
    def backward(ctx, gU, gS, gVh):
        U, S, Vh = ctx.saved_tensors
        m, n = U.shape[-2], Vh.shape[-1]
        if gU is None and gVh is None:
            return matmul(U * gS.unsqueeze(-2), Vh)
        V = _mT(Vh)
        gV = None if gVh is None else _mT(gVh)
        S2 = S * S
        eye = diag_embed(S * 0 + 1)
        E = S2.unsqueeze(-2) - S2.unsqueeze(-1) + eye   # E_ij = S_j^2 - S_i^2, 1 on the diagonal
        ret = None
        if gU is not None:
            ret = (_skew(matmul(_mT(U), gU)) / E) * S.unsqueeze(-2)
        if gV is not None:
            term = S.unsqueeze(-1) * (_skew(matmul(_mT(V), gV)) / E)
            ret = term if ret is None else ret + term
        if gS is not None:
            ret = ret + diag_embed(gS)
        gA = matmul(U, matmul(ret, Vh))
        if gU is not None and m > S.shape[-1]:
            gUSinv = gU / S.unsqueeze(-2)
            gA = gA + matmul(gUSinv - matmul(U, matmul(_mT(U), gUSinv)), Vh)
        if gV is not None and n > S.shape[-1]:
            gVSinv = gV / S.unsqueeze(-2)
            gA = gA + matmul(U, _mT(gVSinv - matmul(V, matmul(_mT(V), gVSinv))))
        return gA


def _no_driver(name, driver):
    if driver is not None:  # torch's CPU error; the engine has one SVD algorithm on either device
        raise RuntimeError(f"torch.linalg.{name}: keyword argument `driver=` is only supported on CUDA inputs with "
                           "cuSOLVER backend (the engine takes none: leave it None)")


def _lower_symmetric(A):
    """hermitian=True reads the lower triangle only, as torch's (it calls eigh)."""
    return tril(A) + _mT(tril(A, -1))


def svd(A, full_matrices=True, *, driver=None, out=None):
    """torch.linalg.svd: A = U diag(S) Vh. Gradients need full_matrices=False (or a square A), as
    in torch."""
    _no_out("svd", out)
    _no_driver("svd", driver)
    _check_matrix("svd", A)
    if full_matrices and A.shape[-1] != A.shape[-2]:
        xp = xp_of(A._data)
        U, S, Vh = xp.linalg.svd(A._data, full_matrices=True)
        if A.requires_grad:
            raise NotImplementedError("linalg.svd: gradients of full_matrices=True are not implemented for "
                                      "non-square inputs; pass full_matrices=False (as torch requires too)")
        return SVDResult(*(Tensor._make(a, A._device) for a in (U, S, Vh)))
    return SVDResult(*SVD.apply(A))


def svdvals(A, *, driver=None, out=None):
    """torch.linalg.svdvals: the singular values, descending."""
    _no_out("svdvals", out)
    _no_driver("svdvals", driver)
    _check_matrix("svdvals", A)
    return SVD.apply(A)[1]


class QR(Op):
    """Reduced QR (m >= n for the gradient): gA = (gQ + Q copyltu(M)) R^-T, M = R gR^T - gQ^T Q."""

    name = "LinalgQr"
    save_outputs = (0, 1)

    @staticmethod
    def forward(ctx, a, mode):
        return tuple(xp_of(a).linalg.qr(a, mode=mode))

    @staticmethod
    def backward(ctx, gQ, gR):
        Q, R = ctx.saved_tensors
        if Q.shape[-2] < R.shape[-1]:
            raise NotImplementedError("linalg.qr: the gradient of a wide input (m < n) is not implemented")
        M = zeros_like(R)
        if gR is not None:
            M = M + matmul(R, _mT(gR))
        if gQ is not None:
            M = M - matmul(_mT(gQ), Q)
        low = tril(M, -1)
        copyltu = low + _mT(low) + diag_embed(M.diagonal(dim1=-2, dim2=-1))
        b = matmul(Q, copyltu)
        if gQ is not None:
            b = b + gQ
        return _mT(solve_triangular(R, _mT(b), upper=True))


def qr(A, mode="reduced", *, out=None):
    """torch.linalg.qr: mode 'reduced' or 'complete' (Q, R); 'r' gives (empty, R)."""
    _no_out("qr", out)
    _check_matrix("qr", A)
    if mode not in ("reduced", "complete", "r"):
        raise RuntimeError(f"qr received unrecognized mode '{mode}' but expected one of 'reduced' (default), 'r', "
                           "or 'complete'")
    if mode == "r":
        R = QR.apply(A, mode="reduced")[1]
        return QRResult(Tensor._make(xp_of(A._data).zeros((0,), A._data.dtype), A._device), R)
    if mode == "complete" and A.shape[-2] > A.shape[-1]:
        if A.requires_grad:
            raise NotImplementedError("linalg.qr: the gradient of mode='complete' with m > n is not implemented")
        return QRResult(*(Tensor._make(a, A._device) for a in xp_of(A._data).linalg.qr(A._data, mode="complete")))
    return QRResult(*QR.apply(A, mode="reduced"))


# ------------------------------------------------------------------ composites
def _rtol_atol(A, S, atol, rtol):
    """torch's tolerance: max(atol, rtol * S_max); rtol defaults to eps * max(m, n) when neither is given."""
    if rtol is None:
        rtol = 0.0 if atol is not None and atol > 0 else float(xp_of(A._data).finfo(A._data.dtype).eps) * max(
            A.shape[-2], A.shape[-1])
    tol = S.amax(-1, keepdim=True).detach() * rtol
    if atol is not None:
        tol = tol.clamp(min=atol)
    return tol


def pinv(A, *, atol=None, rtol=None, hermitian=False, out=None):
    """torch.linalg.pinv through the SVD: V diag(1/S where S > tol) U^T."""
    _no_out("pinv", out)
    _check_matrix("pinv", A)
    if hermitian:
        A = _lower_symmetric(A)
    U, S, Vh = svd(A, full_matrices=False)
    tol = _rtol_atol(A, S, atol, rtol)
    S_inv = where(S > tol, 1 / S, zeros_like(S))
    return matmul(_mT(Vh) * S_inv.unsqueeze(-2), _mT(U))


def matrix_rank(A, *, atol=None, rtol=None, hermitian=False, out=None):
    """torch.linalg.matrix_rank: the number of singular values above the tolerance (int64)."""
    _no_out("matrix_rank", out)
    _check_matrix("matrix_rank", A)
    S = svdvals(_lower_symmetric(A.detach()) if hermitian else A.detach())
    return (S > _rtol_atol(A, S, atol, rtol)).sum(-1)


def lstsq(A, B, rcond=None, *, driver=None):
    """torch.linalg.lstsq (full-rank A; the solution through pinv, differentiable). As torch's
    default CPU driver 'gelsy': residuals and singular_values are empty, rank is given."""
    _check_matrix("lstsq", A)
    if driver not in (None, "gelsy", "gels", "gelsd", "gelss"):
        raise RuntimeError(f"torch.linalg.lstsq: parameter `driver` should be one of (gels, gelsy, gelsd, gelss), "
                           f"but got {driver}")
    if driver not in (None, "gelsy"):  # their residuals / singular values are not computed here
        raise NotImplementedError(f"linalg.lstsq(driver={driver!r}) is not implemented: the engine computes "
                                  "'gelsy' (the CPU default; empty residuals and singular values)")
    vector = B.ndim == A.ndim - 1
    Bm = B.unsqueeze(-1) if vector else B
    if Bm.shape[-2] != A.shape[-2]:
        raise RuntimeError(f"torch.linalg.lstsq: input.size(-2) should match other.size(-2), got {A.shape[-2]} "
                           f"and {Bm.shape[-2]}")
    X = matmul(pinv(A, rtol=rcond), Bm)
    X = X.squeeze(-1) if vector else X
    xp = xp_of(A._data)
    empty = Tensor._make(xp.zeros((0,), A._data.dtype), A._device)
    return LstsqResult(X, empty, matrix_rank(A, rtol=rcond), empty)


def cross(input, other, *, dim=-1, out=None):
    """torch.linalg.cross: the cross product of 3-vectors along `dim` (inputs broadcast)."""
    _no_out("cross", out)
    if input.ndim != other.ndim:
        raise RuntimeError("linalg.cross: inputs must have the same number of dimensions.")
    if input.shape[dim] != 3 or other.shape[dim] != 3:
        raise RuntimeError(f"linalg.cross: inputs dimension {dim} must have length 3. Got {input.shape[dim]} and "
                           f"{other.shape[dim]}")
    shape = tuple(broadcast_shapes(tuple(input.shape), tuple(other.shape)))
    input, other = input.expand(*shape), other.expand(*shape)
    a = [input.select(dim, i) for i in range(3)]
    b = [other.select(dim, i) for i in range(3)]
    parts = [a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]]
    return stack(parts, dim=dim)


def multi_dot(tensors, *, out=None):
    """torch.linalg.multi_dot: the chained product, the first and last tensors may be 1-D."""
    _no_out("multi_dot", out)
    tensors = list(tensors)
    if len(tensors) < 2:
        raise RuntimeError(f"multi_dot(): expected at least 2 tensors but got {len(tensors)}")
    for i, t in enumerate(tensors):
        ok = t.ndim == 2 or (t.ndim == 1 and i in (0, len(tensors) - 1))
        if not ok:
            raise RuntimeError(f"multi_dot(): tensor {i} must be 2D but got {t.ndim}D" if 0 < i < len(tensors) - 1
                               else f"multi_dot(): the {'first' if i == 0 else 'last'} tensor must be 1D or 2D but "
                               f"got {t.ndim}D")
    result = tensors[0]
    for t in tensors[1:]:
        result = matmul(result, t)
    return result
