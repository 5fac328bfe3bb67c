"""`Independent` and `MultivariateNormal` (torch.distributions'), in engine ops.

`Independent(base, n)` reinterprets the rightmost `n` batch dims of `base` as event dims: its
log_prob and entropy are the base's summed over them. `MultivariateNormal(loc, covariance_matrix
| precision_matrix | scale_tril)` keeps torch's unbroadcast Cholesky factor L (from the covariance
by `cholesky`, from the precision by torch's flip-Cholesky-invert) and computes everything from
it as torch does: rsample = loc + L eps, log_prob = -(n log 2pi + |L^-1 (x - loc)|^2) / 2 - sum log
diag L, entropy = n (1 + log 2pi) / 2 + sum log diag L. The factorisations are differentiable
(`_linalg.py`), so gradients reach loc and whichever matrix was given.
"""
import math
from functools import cached_property

from ..autograd.grad_mode import no_grad
from ..ops._core import broadcast_shapes
from ..ops.creation import eye, randn
from ..tensor import Size, Tensor
from ._linalg import cholesky, solve_triangular
from .distribution import Distribution

__all__ = ["Independent", "MultivariateNormal"]


def _sum_rightmost(value, dim):
    """Sum over the rightmost `dim` dims (torch.distributions.utils._sum_rightmost)."""
    if dim == 0:
        return value
    return value.reshape(*value.shape[:value.ndim - dim], -1).sum(-1)


def _expand(dist, batch_shape):
    """`dist.expand(batch_shape)`, or for the package's distributions (which have no `expand`) a
    copy whose parameter tensors (batch_shape + a parameter tail) are expanded to it."""
    if hasattr(dist, "expand"):
        return dist.expand(batch_shape)
    batch_shape = tuple(batch_shape)
    old = len(dist.batch_shape)
    new = object.__new__(type(dist))
    for k, v in vars(dist).items():
        if isinstance(v, Tensor):
            v = v.expand(*batch_shape, *v.shape[old:])
        setattr(new, k, v)
    new._batch_shape = Size(batch_shape)
    return new


class Independent(Distribution):
    """torch.distributions.Independent: the rightmost `reinterpreted_batch_ndims` batch dims of
    `base_distribution` become event dims."""

    def __init__(self, base_distribution, reinterpreted_batch_ndims, validate_args=None):
        n = len(base_distribution.batch_shape)
        if reinterpreted_batch_ndims > n:
            raise ValueError("Expected reinterpreted_batch_ndims <= len(base_distribution.batch_shape), "
                             f"actual {reinterpreted_batch_ndims} vs {n}")
        shape = tuple(base_distribution.batch_shape) + tuple(base_distribution.event_shape)
        event_dim = reinterpreted_batch_ndims + len(base_distribution.event_shape)
        self.base_dist = base_distribution
        self.reinterpreted_batch_ndims = reinterpreted_batch_ndims
        super().__init__(shape[:len(shape) - event_dim], shape[len(shape) - event_dim:])

    @property
    def has_rsample(self):
        return self.base_dist.has_rsample

    @property
    def has_enumerate_support(self):
        return self.reinterpreted_batch_ndims == 0 and getattr(self.base_dist, "has_enumerate_support", False)

    def expand(self, batch_shape, _instance=None):
        batch_shape = tuple(batch_shape)
        base = _expand(self.base_dist, batch_shape + tuple(self.event_shape[:self.reinterpreted_batch_ndims]))
        return Independent(base, self.reinterpreted_batch_ndims)

    @property
    def mean(self):
        return self.base_dist.mean

    @property
    def mode(self):
        return self.base_dist.mode

    @property
    def variance(self):
        return self.base_dist.variance

    def sample(self, sample_shape=()):
        return self.base_dist.sample(sample_shape)

    def rsample(self, sample_shape=()):
        return self.base_dist.rsample(sample_shape)

    def log_prob(self, value):
        return _sum_rightmost(self.base_dist.log_prob(value), self.reinterpreted_batch_ndims)

    def entropy(self):
        return _sum_rightmost(self.base_dist.entropy(), self.reinterpreted_batch_ndims)

    def enumerate_support(self, expand=True):
        if self.reinterpreted_batch_ndims > 0:
            raise NotImplementedError("Enumeration over cartesian product is not implemented")
        return self.base_dist.enumerate_support(expand=expand)

    def __repr__(self):
        return f"Independent({self.base_dist!r}, {self.reinterpreted_batch_ndims})"


def _precision_to_scale_tril(P):
    """torch's: the Cholesky factor of P^-1 from a Cholesky of P with rows and columns reversed."""
    Lf = cholesky(P.flip(-2, -1))
    L_inv = Lf.flip(-2, -1).transpose(-2, -1)
    Id = eye(P.shape[-1], dtype=P.dtype, device=P.device)
    return solve_triangular(L_inv, Id, upper=False)


def _batch_mahalanobis(L, x):
    """|L^-1 x|^2 over the last dim, L and x broadcast over their batch dims."""
    n = x.shape[-1]
    batch = tuple(broadcast_shapes(tuple(L.shape[:-2]), tuple(x.shape[:-1])))
    L = L.expand(*batch, n, n)
    x = x.expand(*batch, n).unsqueeze(-1)
    return solve_triangular(L, x, upper=False).squeeze(-1).pow(2).sum(-1)


def _not_nan(t):
    """torch's constraints.real: no NaN."""
    return bool((t == t).all())


def _constraint_error(name, value, constraint, dist):
    return ValueError(f"Expected parameter {name} (Tensor of shape {tuple(value.shape)}) of distribution "
                      f"{dist} to satisfy the constraint {constraint}, but found invalid values:\n{value}")


class MultivariateNormal(Distribution):
    """torch.distributions.MultivariateNormal: exactly one of covariance_matrix, precision_matrix
    and scale_tril (lower triangular with a positive diagonal)."""

    has_rsample = True

    def __init__(self, loc, covariance_matrix=None, precision_matrix=None, scale_tril=None, validate_args=None):
        if loc.dim() < 1:
            raise ValueError("loc must be at least one-dimensional.")
        if (covariance_matrix is not None) + (scale_tril is not None) + (precision_matrix is not None) != 1:
            raise ValueError("Exactly one of covariance_matrix or precision_matrix or scale_tril may be specified.")
        name, matrix = next((k, v) for k, v in (("scale_tril", scale_tril), ("covariance_matrix", covariance_matrix),
                                                ("precision_matrix", precision_matrix)) if v is not None)
        if matrix.dim() < 2:
            raise ValueError(f"{name} matrix must be at least two-dimensional, with optional leading batch dimensions"
                             if name == "scale_tril" else
                             f"{name} must be at least two-dimensional, with optional leading batch dimensions")
        batch_shape = tuple(broadcast_shapes(tuple(matrix.shape[:-2]), tuple(loc.shape[:-1])))
        self.__dict__[name] = matrix.expand(*batch_shape, -1, -1)
        self.loc = loc.expand(*batch_shape, -1)
        super().__init__(batch_shape, self.loc.shape[-1:])
        self._validate_args = validate_args is not False
        if self._validate_args:
            self._validate(name, matrix)
        if scale_tril is not None:
            self._unbroadcasted_scale_tril = scale_tril
        elif covariance_matrix is not None:
            self._unbroadcasted_scale_tril = cholesky(covariance_matrix)
        else:
            self._unbroadcasted_scale_tril = _precision_to_scale_tril(precision_matrix)

    def _validate(self, name, matrix):
        with no_grad():
            if not _not_nan(self.loc):
                raise _constraint_error("loc", self.loc, "IndependentConstraint(Real(), 1)", self)
            if name == "scale_tril":
                diag = matrix.diagonal(dim1=-2, dim2=-1)
                if not (bool((matrix.tril() == matrix).all()) and bool((diag > 0).all())):
                    raise _constraint_error(name, matrix, "LowerCholesky()", self)
                return
            mT = matrix.transpose(-2, -1)  # torch's Symmetric: isclose(m, m.mT, atol=1e-6)
            ok = bool(((matrix - mT).abs() <= 1e-6 + 1e-5 * mT.abs()).all())
            if ok:
                try:
                    cholesky(matrix)
                except RuntimeError:
                    ok = False
            if not ok:
                raise _constraint_error(name, matrix, "PositiveDefinite()", self)

    def __repr__(self):
        given = next(k for k in ("covariance_matrix", "precision_matrix", "scale_tril") if k in self.__dict__)
        return f"MultivariateNormal(loc: {self.loc.shape}, {given}: {self.__dict__[given].shape})"

    def expand(self, batch_shape, _instance=None):
        batch_shape = tuple(batch_shape)
        n = self._event_shape[0]
        new = object.__new__(MultivariateNormal)
        new.loc = self.loc.expand(*batch_shape, n)
        new._unbroadcasted_scale_tril = self._unbroadcasted_scale_tril
        for k in ("covariance_matrix", "scale_tril", "precision_matrix"):
            if k in self.__dict__:
                new.__dict__[k] = self.__dict__[k].expand(*batch_shape, n, n)
        Distribution.__init__(new, batch_shape, self._event_shape)
        new._validate_args = self._validate_args
        return new

    def _matrix_shape(self):
        return (*self._batch_shape, *self._event_shape, *self._event_shape)

    @cached_property
    def scale_tril(self):
        return self._unbroadcasted_scale_tril.expand(*self._matrix_shape())

    @cached_property
    def covariance_matrix(self):
        L = self._unbroadcasted_scale_tril
        return (L @ L.transpose(-2, -1)).expand(*self._matrix_shape())

    @cached_property
    def precision_matrix(self):
        L = self._unbroadcasted_scale_tril
        Id = eye(L.shape[-1], dtype=L.dtype, device=L.device)
        L_inv = solve_triangular(L, Id, upper=False)
        return (L_inv.transpose(-2, -1) @ L_inv).expand(*self._matrix_shape())

    @property
    def mean(self):
        return self.loc

    @property
    def mode(self):
        return self.loc

    @property
    def variance(self):
        return self._unbroadcasted_scale_tril.pow(2).sum(-1).expand(*self._batch_shape, *self._event_shape)

    def rsample(self, sample_shape=()):
        eps = randn(*self._extended_shape(sample_shape), dtype=self.loc.dtype, device=self.loc.device)
        return self.loc + (self._unbroadcasted_scale_tril @ eps.unsqueeze(-1)).squeeze(-1)

    def _half_log_det(self):
        return self._unbroadcasted_scale_tril.diagonal(dim1=-2, dim2=-1).log().sum(-1)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        M = _batch_mahalanobis(self._unbroadcasted_scale_tril, value - self.loc)
        return -0.5 * (self._event_shape[0] * math.log(2 * math.pi) + M) - self._half_log_det()

    def _validate_sample(self, value):
        if not isinstance(value, Tensor):
            raise ValueError("The value argument to log_prob must be a Tensor")
        event = len(self._event_shape)
        if tuple(value.shape[value.ndim - event:]) != tuple(self._event_shape):
            raise ValueError(f"The right-most size of value must match event_shape: {tuple(value.shape)} vs "
                             f"{tuple(self._event_shape)}.")
        try:
            broadcast_shapes(tuple(value.shape), tuple(self._batch_shape) + tuple(self._event_shape))
        except (RuntimeError, ValueError) as e:
            raise ValueError(f"Value is not broadcastable with batch_shape+event_shape: {tuple(value.shape)} vs "
                             f"{tuple(self._batch_shape) + tuple(self._event_shape)}.") from e
        with no_grad():
            if not bool((value == value).all()):
                raise ValueError(f"Expected value argument (Tensor of shape {tuple(value.shape)}) to be within the "
                                 f"support (IndependentConstraint(Real(), 1)) of the distribution {self}, but found "
                                 f"invalid values:\n{value}")

    def entropy(self):
        H = 0.5 * self._event_shape[0] * (1.0 + math.log(2 * math.pi)) + self._half_log_det()
        return H if len(self._batch_shape) == 0 else H.expand(*self._batch_shape)
