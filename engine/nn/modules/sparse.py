"""`Embedding`: a lookup table of `num_embeddings` vectors, initialised N(0, 1) like torch."""
import functools

import numpy as np

from ...autograd.grad_mode import _state as _grad_state
from ...backend import xp_of
from ...ops.creation import empty
from ...tensor import Parameter
from .. import functional as F
from .. import init
from ..module import Module

__all__ = ["Embedding"]


class Embedding(Module):
    """Rows of `weight` picked by integer indices. The `padding_idx` row (negative counts from the
    end) starts at zero and never gets a gradient (F.embedding zeroes that row of the weight
    gradient), so an optimizer leaves it as it is. With max_norm, every looked-up row whose
    norm_type-norm exceeds max_norm is scaled down to it in place before the lookup (torch's
    embedding_renorm_, outside autograd). scale_grad_by_freq and sparse gradients are not
    implemented: they raise NotImplementedError here rather than at the first forward."""

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, max_norm=None, norm_type=2.0,
                 scale_grad_by_freq=False, sparse=False, _weight=None, _freeze=False, device=None, dtype=None):
        super().__init__()
        for name, value in (("scale_grad_by_freq", scale_grad_by_freq), ("sparse", sparse)):
            if value:
                raise NotImplementedError(f"Embedding: {name}={value!r} is not supported")
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        if padding_idx is not None:  # torch raises AssertionError here (explicitly, not with assert)
            if padding_idx > 0:
                if padding_idx >= num_embeddings:
                    raise AssertionError("Padding_idx must be within num_embeddings")
            elif padding_idx < 0:
                if padding_idx < -num_embeddings:
                    raise AssertionError("Padding_idx must be within num_embeddings")
                padding_idx = num_embeddings + padding_idx
        self.padding_idx = padding_idx
        self.max_norm = max_norm
        self.norm_type = norm_type
        self.scale_grad_by_freq = scale_grad_by_freq
        self.sparse = sparse
        if _weight is None:
            self.weight = Parameter(empty(num_embeddings, embedding_dim, device=device, dtype=dtype),
                                    requires_grad=not _freeze)
            self.reset_parameters()
        else:
            if list(_weight.shape) != [num_embeddings, embedding_dim]:
                raise AssertionError("Shape of weight does not match num_embeddings and embedding_dim")
            self.weight = Parameter(_weight.detach(), requires_grad=not _freeze)

    def reset_parameters(self):
        init.normal_(self.weight)
        self._fill_padding_idx_with_zero()

    def _fill_padding_idx_with_zero(self):
        if self.padding_idx is not None:
            self.weight._data[self.padding_idx] = 0
            self.weight._bump_version()

    def forward(self, input):
        if self.max_norm is not None:
            _renorm_rows_(self.weight, input, self.max_norm, self.norm_type)
        return F.embedding(input, self.weight, self.padding_idx, None, self.norm_type, self.scale_grad_by_freq,
                           self.sparse)

    def extra_repr(self):
        s = "{num_embeddings}, {embedding_dim}"
        if self.padding_idx is not None:
            s += ", padding_idx={padding_idx}"
        if self.max_norm is not None:
            s += ", max_norm={max_norm}"
        if self.norm_type != 2:
            s += ", norm_type={norm_type}"
        if self.scale_grad_by_freq is not False:
            s += ", scale_grad_by_freq={scale_grad_by_freq}"
        if self.sparse is not False:
            s += ", sparse=True"
        return s.format(**self.__dict__)

    @classmethod
    def from_pretrained(cls, embeddings, freeze=True, padding_idx=None, max_norm=None, norm_type=2.0,
                        scale_grad_by_freq=False, sparse=False):
        if embeddings.dim() != 2:
            raise ValueError("Embeddings parameter is expected to be 2-dimensional")
        rows, cols = embeddings.shape
        return cls(rows, cols, _weight=embeddings, _freeze=freeze, padding_idx=padding_idx, max_norm=max_norm,
                   norm_type=norm_type, scale_grad_by_freq=scale_grad_by_freq, sparse=sparse)


def _renorm_rows_(weight, input, max_norm, norm_type):
    """torch's embedding_renorm_: rows of `weight` looked up by `input` whose norm exceeds
    max_norm are scaled by max_norm / (norm + 1e-7), in place and without recording a gradient.
    Indices that are not integers or out of range are left for F.embedding to reject. Inside an
    nn.Graph capture the renormalisation is recorded, so that each replay renormalises the rows
    its own input looks up."""
    renorm = functools.partial(_renorm_rows_arrays, max_norm=max_norm, norm_type=float(norm_type))
    renorm(weight._data, input._data)
    weight._bump_version()
    if _grad_state.tracer is not None:
        _grad_state.tracer.call(renorm, (weight._data, input._data), None, "EmbeddingRenorm")


def _renorm_rows_arrays(w, ids, max_norm, norm_type):
    num = w.shape[0]
    if ids.dtype.kind not in "iu" or ids.size == 0 or int(ids.min()) < 0 or int(ids.max()) >= num:
        return
    xp = xp_of(w)
    rows = xp.unique(ids.reshape(-1))
    sel = w[rows].astype(np.float64)
    p = norm_type
    if p == float("inf"):
        norms = xp.abs(sel).max(axis=1)
    elif p == 0:
        norms = (sel != 0).sum(axis=1).astype(np.float64)
    else:
        norms = (xp.abs(sel) ** p).sum(axis=1) ** (1.0 / p)
    # every looked-up row is written, the ones within max_norm with their own values (exactly:
    # through float64 and back), so no host read decides which
    scale = xp.where(norms > max_norm, max_norm / (norms + 1e-7), 1.0)
    w[rows] = (sel * scale[:, None]).astype(w.dtype)
