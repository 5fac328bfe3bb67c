"""engine.linalg against torch.linalg: forward values and the gradients of a random weighting of
the outputs, on float64 inputs (well-conditioned; symmetric positive definite where the function
needs it; distinct eigen/singular values). Eigenvectors and singular vectors are compared through
sign-invariant functions of them (products like V W V^T with W diagonal, U S Vh), as their signs
are LAPACK's choice. Every public function of engine.linalg has a case here (tests/ops' harness
only takes ops of engine/ops/)."""
import math

import numpy as np
import pytest
import torch

import engine as flow
import engine.linalg as LA

RNG = np.random.default_rng(0)
A43 = RNG.standard_normal((2, 4, 3))                     # tall, batched
SQ = RNG.standard_normal((2, 3, 3)) + 3 * np.eye(3)      # well-conditioned square
SPD = SQ @ np.swapaxes(SQ, -1, -2)                       # symmetric positive definite
D = np.diag([1.0, 2.0, 3.5])                             # sign-invariant weighting of eigenvectors


def _eigh_inv(lib, r):
    return r.eigenvectors @ lib.tensor(D) @ r.eigenvectors.mT + r.eigenvalues.unsqueeze(-1)


def _svd_inv(lib, r):
    k = r.S.shape[-1]
    Dk = lib.tensor(D[:k, :k])
    parts = ((r.U * r.S.unsqueeze(-2)) @ r.Vh, r.U @ Dk @ r.U.mT, r.Vh.mT @ Dk @ r.Vh)
    return lib.cat([p.reshape(*p.shape[:-2], -1) for p in parts], -1)


def _qr(lib, r):
    return r.Q @ lib.tensor(D) @ r.R


CASES = {
    # name: (fn(lib, linalg, *inputs), inputs)
    "vector_norm-2": (lambda m, L, a: L.vector_norm(a), (A43,)),
    "vector_norm-dim": (lambda m, L, a: L.vector_norm(a, 3, dim=(0, 2), keepdim=True), (A43,)),
    "vector_norm-1": (lambda m, L, a: L.vector_norm(a, 1, dim=-1), (A43,)),
    "vector_norm-0.5": (lambda m, L, a: L.vector_norm(a, 0.5, dim=1), (A43,)),
    "vector_norm-inf": (lambda m, L, a: L.vector_norm(a, math.inf, dim=-1), (A43,)),
    "vector_norm-ninf": (lambda m, L, a: L.vector_norm(a, -math.inf, dim=-1), (A43,)),
    "vector_norm-0": (lambda m, L, a: L.vector_norm(a, 0, dim=-1), (A43,)),
    "matrix_norm-fro": (lambda m, L, a: L.matrix_norm(a), (A43,)),
    "matrix_norm-nuc": (lambda m, L, a: L.matrix_norm(a, "nuc"), (A43,)),
    "matrix_norm-2": (lambda m, L, a: L.matrix_norm(a, 2, keepdim=True), (A43,)),
    "matrix_norm--2": (lambda m, L, a: L.matrix_norm(a, -2), (A43,)),
    "matrix_norm-1": (lambda m, L, a: L.matrix_norm(a, 1), (A43,)),
    "matrix_norm--1": (lambda m, L, a: L.matrix_norm(a, -1, dim=(0, 2)), (A43,)),
    "matrix_norm-inf": (lambda m, L, a: L.matrix_norm(a, math.inf, keepdim=True), (A43,)),
    "matrix_norm--inf": (lambda m, L, a: L.matrix_norm(a, -math.inf), (A43,)),
    "norm": (lambda m, L, a: L.norm(a), (A43,)),
    "norm-vector-dim": (lambda m, L, a: L.norm(a, 3, dim=1), (A43,)),
    "norm-matrix-dim": (lambda m, L, a: L.norm(a, dim=(0, 2), keepdim=True), (A43,)),
    "norm-2d-nuc": (lambda m, L, a: L.norm(a, "nuc"), (A43[0],)),
    "norm-1d": (lambda m, L, a: L.norm(a, 1), (A43[0, 0],)),
    "inv": (lambda m, L, a: L.inv(a), (SQ,)),
    "det": (lambda m, L, a: L.det(a), (SQ,)),
    "slogdet": (lambda m, L, a: L.slogdet(a).logabsdet * L.slogdet(a).sign, (SQ - 3 * np.eye(3),)),
    "solve": (lambda m, L, a, b: L.solve(a, b), (SQ, RNG.standard_normal((2, 3, 2)))),
    "solve-vector": (lambda m, L, a, b: L.solve(a, b), (SQ, RNG.standard_normal((2, 3)))),
    "solve-broadcast": (lambda m, L, a, b: L.solve(a, b), (SQ[0], RNG.standard_normal((2, 3, 2)))),
    "solve-right": (lambda m, L, a, b: L.solve(a, b, left=False), (SQ, RNG.standard_normal((2, 4, 3)))),
    "solve_triangular": (lambda m, L, a, b: L.solve_triangular(a, b, upper=True), (SQ, RNG.standard_normal((2, 3, 2)))),
    "solve_triangular-right-unit": (lambda m, L, a, b: L.solve_triangular(a, b, upper=False, left=False,
                                                                          unitriangular=True),
                                    (SQ, RNG.standard_normal((2, 4, 3)))),
    "cholesky": (lambda m, L, a: L.cholesky(a), (SPD,)),
    "cholesky-upper": (lambda m, L, a: L.cholesky(a, upper=True), (SPD,)),
    "qr": (lambda m, L, a: _qr(m, L.qr(a)), (A43,)),
    "qr-square": (lambda m, L, a: _qr(m, L.qr(a)), (SQ,)),
    "eigh": (lambda m, L, a: _eigh_inv(m, L.eigh(a)), (SPD,)),
    "eigh-U": (lambda m, L, a: _eigh_inv(m, L.eigh(a, UPLO="U")), (SPD,)),
    "eigvalsh": (lambda m, L, a: L.eigvalsh(a), (SPD,)),
    "svd": (lambda m, L, a: _svd_inv(m, L.svd(a, full_matrices=False)), (A43,)),
    "svd-square": (lambda m, L, a: _svd_inv(m, L.svd(a)), (SQ,)),
    "svd-wide": (lambda m, L, a: _svd_inv(m, L.svd(a, full_matrices=False)), (np.swapaxes(A43, -1, -2).copy(),)),
    "svdvals": (lambda m, L, a: L.svdvals(a), (A43,)),
    "pinv": (lambda m, L, a: L.pinv(a), (A43,)),
    "pinv-wide": (lambda m, L, a: L.pinv(a), (np.swapaxes(A43, -1, -2).copy(),)),
    "lstsq": (lambda m, L, a, b: L.lstsq(a, b).solution, (A43, RNG.standard_normal((2, 4, 2)))),
    "cross": (lambda m, L, a, b: L.cross(a, b), (RNG.standard_normal((1, 4, 3)), RNG.standard_normal((2, 1, 3)))),
    "cross-dim": (lambda m, L, a, b: L.cross(a, b, dim=0), (RNG.standard_normal((3, 2)), RNG.standard_normal((3, 2)))),
    "multi_dot": (lambda m, L, a, b, c: L.multi_dot([a, b, c]),
                  (RNG.standard_normal(3), RNG.standard_normal((3, 4)), RNG.standard_normal((4, 2)))),
    "multi_dot-2d": (lambda m, L, a, b: L.multi_dot([a, b]),
                     (RNG.standard_normal((2, 3)), RNG.standard_normal((3, 4)))),
    "matmul": (lambda m, L, a, b: L.matmul(a, b), (A43, SQ)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_torch_forward_and_backward(name):
    fn, inputs = CASES[name]
    te = [torch.tensor(a, requires_grad=True) for a in inputs]
    ee = [flow.tensor(a, requires_grad=True) for a in inputs]
    ot, oe = fn(torch, torch.linalg, *te), fn(flow, LA, *ee)
    assert tuple(oe.shape) == tuple(ot.shape) and oe.dtype == flow.float64
    np.testing.assert_allclose(oe.detach().numpy(), ot.detach().numpy(), rtol=1e-10, atol=1e-11, err_msg="forward")
    w = np.random.default_rng(1).standard_normal(tuple(ot.shape))
    (ot * torch.tensor(w)).sum().backward()
    (oe * flow.tensor(w)).sum().backward()
    for i, (a, b) in enumerate(zip(ee, te)):
        if b.grad is None:  # torch gives ord=0 norms no gradient; the engine's is zero
            assert a.grad is None or not a.grad.numpy().any()
            continue
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-9, atol=1e-10, err_msg=f"grad {i}")


def test_gradients_by_finite_differences():
    """A few factorisations' gradients against central differences (independently of torch)."""
    rng = np.random.default_rng(2)
    for fn, a in ((lambda x: _eigh_inv(flow, LA.eigh(x + x.mT)), SPD[0]),
                  (lambda x: _svd_inv(flow, LA.svd(x, full_matrices=False)), A43[0]),
                  (lambda x: _qr(flow, LA.qr(x)), A43[0]),
                  (lambda x: LA.cholesky(x + x.mT), SPD[0])):
        w = None
        x = flow.tensor(a, requires_grad=True)
        out = fn(x)
        w = rng.standard_normal(tuple(out.shape))
        (out * flow.tensor(w)).sum().backward()
        num = np.zeros_like(a)
        for idx in np.ndindex(a.shape):
            h = np.zeros_like(a)
            h[idx] = 1e-6
            f = lambda v: float((fn(flow.tensor(v)) * flow.tensor(w)).sum())  # noqa: E731
            num[idx] = (f(a + h) - f(a - h)) / 2e-6
        np.testing.assert_allclose(x.grad.numpy(), num, rtol=1e-5, atol=1e-6)


def test_result_types_ranks_and_full_svd():
    a = flow.tensor(A43)
    t = torch.tensor(A43)
    r, rt = LA.lstsq(a, flow.tensor(A43[..., :2])), torch.linalg.lstsq(t, t[..., :2])
    assert r._fields == ("solution", "residuals", "rank", "singular_values")
    assert tuple(r.residuals.shape) == tuple(rt.residuals.shape) and tuple(r.singular_values.shape) == (0,)
    np.testing.assert_array_equal(r.rank.numpy(), rt.rank.numpy())
    low = A43 @ np.diag([1.0, 1.0, 0.0])                 # rank 2
    np.testing.assert_array_equal(LA.matrix_rank(flow.tensor(low)).numpy(), torch.linalg.matrix_rank(torch.tensor(low)))
    np.testing.assert_array_equal(LA.matrix_rank(flow.tensor(low), atol=1e-3, rtol=0.0).numpy(),
                                  torch.linalg.matrix_rank(torch.tensor(low), atol=1e-3, rtol=0.0))
    assert LA.matrix_rank(flow.tensor(low)).dtype == flow.int64
    U, S, Vh = LA.svd(a)                                  # full_matrices=True: U is 4 x 4
    Ut, St, Vht = torch.linalg.svd(t)
    assert tuple(U.shape) == tuple(Ut.shape) and tuple(Vh.shape) == tuple(Vht.shape)
    np.testing.assert_allclose(S.numpy(), St.numpy(), rtol=1e-12)
    Q, R = LA.qr(a, mode="complete")
    np.testing.assert_allclose((Q @ R).numpy(), A43, atol=1e-12)
    assert tuple(Q.shape) == (2, 4, 4) and tuple(LA.qr(a, mode="r").R.shape) == (2, 3, 3)
    sign, logabs = LA.slogdet(flow.tensor(SQ - 3 * np.eye(3)))
    st, lt = torch.linalg.slogdet(torch.tensor(SQ - 3 * np.eye(3)))
    np.testing.assert_array_equal(sign.numpy(), st.numpy())
    assert LA.eigh(flow.tensor(SPD))._fields == ("eigenvalues", "eigenvectors")
    assert LA.svd(a)._fields == ("U", "S", "Vh")


def test_errors_as_in_torch():
    with pytest.raises(RuntimeError, match="must be batches of square matrices"):
        LA.inv(flow.tensor(A43))
    with pytest.raises(RuntimeError, match="singular"):
        LA.inv(flow.zeros(3, 3, dtype=flow.float64))
    with pytest.raises(RuntimeError, match="not positive-definite"):
        LA.cholesky(-flow.eye(3, dtype=flow.float64))
    with pytest.raises(RuntimeError, match="at least 2 dimensions"):
        LA.det(flow.ones(3, dtype=flow.float64))
    with pytest.raises(RuntimeError, match="Incompatible shapes"):
        LA.solve(flow.tensor(SQ), flow.ones(2, 4, 1, dtype=flow.float64))
    with pytest.raises(RuntimeError, match="must have length 3"):
        LA.cross(flow.ones(4), flow.ones(4))
    with pytest.raises(RuntimeError, match="same number of dimensions"):
        LA.cross(flow.ones(3), flow.ones(2, 3))
    with pytest.raises(RuntimeError, match="expected at least 2 tensors"):
        LA.multi_dot([flow.ones(3, 3)])
    with pytest.raises(RuntimeError, match="UPLO"):
        LA.eigh(flow.tensor(SPD), UPLO="X")
    with pytest.raises(RuntimeError, match="unrecognized mode"):
        LA.qr(flow.tensor(SQ), mode="full")
    with pytest.raises(RuntimeError, match="Order"):
        LA.matrix_norm(flow.tensor(SQ), 3)
    with pytest.raises(RuntimeError, match="input must be 1D or 2D"):
        LA.norm(flow.tensor(A43), 2)
    with pytest.raises(TypeError, match="out="):
        LA.inv(flow.tensor(SQ), out=flow.tensor(SQ))
    assert sorted(LA.__all__) == sorted(set(LA.__all__))
    missing = [n for n in LA.__all__ if not hasattr(torch.linalg, n)]
    assert not missing, missing


def test_hermitian_reads_the_lower_triangle_and_drivers_are_torch_s():
    """pinv / matrix_rank(hermitian=True) use the lower triangle only, as torch's (through eigh),
    so a non-symmetric input gives torch's answer; a driver the engine does not implement is
    refused, never ignored."""
    a = RNG.standard_normal((4, 4))
    a[0, 3] = 50.0  # upper triangle: ignored under hermitian=True
    np.testing.assert_allclose(LA.pinv(flow.tensor(a), hermitian=True).numpy(),
                               torch.linalg.pinv(torch.tensor(a), hermitian=True).numpy(), rtol=1e-10, atol=1e-12)
    low = np.tril(np.ones((4, 4)))
    assert int(LA.matrix_rank(flow.tensor(low), hermitian=True)) == int(torch.linalg.matrix_rank(
        torch.tensor(low), hermitian=True))
    with pytest.raises(RuntimeError, match="only supported on CUDA inputs"):
        LA.svd(flow.tensor(SQ), driver="gesvd")
    with pytest.raises(RuntimeError, match="only supported on CUDA inputs"):
        torch.linalg.svd(torch.tensor(SQ), driver="gesvd")
    with pytest.raises(NotImplementedError, match="driver='gelsd'"):
        LA.lstsq(flow.tensor(SQ), flow.tensor(SQ), driver="gelsd")
