"""engine.nn.utils.rnn: variable-length sequences, as torch.nn.utils.rnn.

`PackedSequence` holds the time steps of a batch of sequences sorted by decreasing length, one
time step after the other: `data` is (sum of lengths, *) and `batch_sizes[t]` is how many
sequences are still running at step t (a CPU int64 tensor). `sorted_indices[k]` is the batch
index of the k-th longest sequence and `unsorted_indices` its inverse (both None when the batch
was packed already sorted). nn.RNN / LSTM / GRU take one and return one.

Every function that moves values is one `index_select` of rows (from a reshaped input, or from
a concatenation with one row of padding), so autograd gives the backward; the indices are
computed on the host from the lengths, as torch's kernels do.
"""
import math
from collections import namedtuple
from collections.abc import Iterable

import numpy as np

from ...ops.creation import full, tensor
from ...ops.indexing import index_select
from ...ops.shape import cat, transpose
from ...tensor import Tensor

__all__ = ["PackedSequence", "invert_permutation", "pack_padded_sequence", "pad_packed_sequence",
           "pad_sequence", "unpad_sequence", "pack_sequence", "unpack_sequence"]

_PackedSequence = namedtuple("PackedSequence", ["data", "batch_sizes", "sorted_indices", "unsorted_indices"])


def _host_ints(t):
    """The values of an integer tensor (or a list of numbers) as a host int64 array."""
    if isinstance(t, Tensor):
        return np.asarray(t.detach()._host()).astype(np.int64)
    return np.asarray(t).astype(np.int64)


class PackedSequence(_PackedSequence):
    """(data, batch_sizes, sorted_indices, unsorted_indices), as torch's; built by
    `pack_padded_sequence` / `pack_sequence`. PackedSequence(data, batch_sizes,
    sorted_indices=None, unsorted_indices=None); unsorted_indices defaults to the inverse of
    sorted_indices, and PackedSequence((data, batch_sizes)) is accepted as in torch."""

    def __new__(cls, data, batch_sizes=None, sorted_indices=None, unsorted_indices=None):
        if unsorted_indices is None:
            unsorted_indices = invert_permutation(sorted_indices)
        if batch_sizes is None:
            if not (isinstance(data, (list, tuple)) and len(data) == 2):
                raise AssertionError("Expected data to be a list or tuple of length 2")
            data, batch_sizes = data
        if isinstance(batch_sizes, Tensor) and batch_sizes.device.type != "cpu":
            raise ValueError("batch_sizes should always be on CPU. Instances of PackedSequence should never be "
                             "created manually. They should be instantiated by functions like pack_sequence and "
                             "pack_padded_sequences in nn.utils.rnn.")
        return super().__new__(cls, data, batch_sizes, sorted_indices, unsorted_indices)

    def to(self, *args, **kwargs):
        """`data.to(...)`; the index tensors follow data's device, batch_sizes stays on the CPU.
        Returns self when data is unchanged."""
        data = self.data.to(*args, **kwargs)
        if data is self.data:
            return self

        def move(t):
            return None if t is None else t.to(data.device)

        return type(self)(data, self.batch_sizes, move(self.sorted_indices), move(self.unsorted_indices))

    def cuda(self, device=None, non_blocking=False):
        return self.to(device="cuda" if device is None else device, non_blocking=non_blocking)

    def cpu(self):
        return self.to(device="cpu")

    def pin_memory(self):
        """No pinned memory in the engine (as DataLoader(pin_memory=True)): self."""
        return self

    def is_pinned(self):
        return False

    def double(self):
        return self.to(dtype="float64")

    def float(self):
        return self.to(dtype="float32")

    def half(self):
        return self.to(dtype="float16")

    def long(self):
        return self.to(dtype="int64")

    def int(self):
        return self.to(dtype="int32")

    def short(self):
        return self.to(dtype="int16")

    def char(self):
        return self.to(dtype="int8")

    def byte(self):
        return self.to(dtype="uint8")

    @property
    def is_cuda(self):
        return self.data.is_cuda

    @property
    def device(self):
        """data's device (torch's PackedSequence has no such attribute; `.data.device` works in both)."""
        return self.data.device


def invert_permutation(permutation):
    """The inverse of a 1-D permutation tensor (None for None)."""
    if permutation is None:
        return None
    p = _host_ints(permutation).reshape(-1)
    inv = np.empty_like(p)
    inv[p] = np.arange(p.size, dtype=np.int64)
    return tensor(inv, device=permutation.device)


def _lengths_array(lengths):
    if isinstance(lengths, Tensor):
        if lengths.device.type != "cpu" or lengths.dim() != 1:
            raise RuntimeError(f"'lengths' argument should be a 1D CPU int64 tensor, but got {lengths.dim()}D "
                               f"{lengths.device} Long tensor")  # torch casts lengths to int64 first
    arr = _host_ints(lengths)
    if arr.ndim != 1:
        raise RuntimeError(f"'lengths' argument should be a 1D CPU int64 tensor, but got {arr.ndim}D cpu Long tensor")
    return arr


def _rows(x, lead):
    """x viewed as rows: the first `lead` dims flattened into one."""
    return x.reshape((-1,) + tuple(x.shape[lead:]))


def pack_padded_sequence(input, lengths, batch_first=False, enforce_sorted=True):
    """Pack a padded batch (T, B, *) (or (B, T, *) with batch_first) of sequences of the given
    lengths; with enforce_sorted=False the batch is sorted by decreasing length first (stably,
    as torch) and the permutation kept in the result."""
    lengths = _lengths_array(lengths)
    if input.dim() < 2:
        n = max(input.dim(), 1)
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got 1)")
    order = np.arange(lengths.size, dtype=np.int64)
    sorted_indices = None
    if not enforce_sorted:
        order = np.argsort(-lengths, kind="stable").astype(np.int64)
        lengths = lengths[order]
        sorted_indices = tensor(order, device=input.device)
    steps, batch = (input.shape[1], input.shape[0]) if batch_first else (input.shape[0], input.shape[1])
    if input.numel() == 0:
        raise RuntimeError("Cannot pack empty tensors.")
    if lengths.size != batch:
        raise RuntimeError(f"Expected `len(lengths)` to be equal to batch_size, but got {lengths.size} "
                           f"(batch_size={batch})")
    if lengths[-1] <= 0:
        raise RuntimeError("Length of all samples has to be greater than 0, but found an element in 'lengths' "
                           "that is <= 0")
    if np.any(lengths[1:] > lengths[:-1]):
        raise RuntimeError("`lengths` array must be sorted in decreasing order when `enforce_sorted` is True. You "
                           "can pass `enforce_sorted=False` to pack_padded_sequence and/or pack_sequence to "
                           "sidestep this requirement if you do not need ONNX exportability.")
    if lengths[0] > steps:
        # torch packs a truncated data tensor with batch_sizes that do not add up to it here
        raise RuntimeError(f"pack_padded_sequence: a length of {int(lengths[0])} is longer than the "
                           f"{steps} time steps of the input")
    batch_sizes = (lengths[None, :] > np.arange(lengths[0])[:, None]).sum(1)
    t = np.repeat(np.arange(lengths[0]), batch_sizes)
    slot = np.concatenate([np.arange(n) for n in batch_sizes])
    rows = order[slot] * steps + t if batch_first else t * batch + order[slot]
    data = index_select(_rows(input, 2), 0, tensor(rows.astype(np.int64), device=input.device))
    return PackedSequence(data, tensor(batch_sizes.astype(np.int64)), sorted_indices, None)


def _padded(values, source, shape, padding_value):
    """`values` (rows, *) gathered at `source` (-1: padding) and reshaped to `shape` + (*)."""
    pad = full((1,) + tuple(values.shape[1:]), padding_value, dtype=values.dtype, device=values.device)
    source = np.where(source < 0, values.shape[0], source).astype(np.int64)
    out = index_select(cat([values, pad], 0), 0, tensor(source.reshape(-1), device=values.device))
    return out.reshape(tuple(shape) + tuple(values.shape[1:]))


def pad_packed_sequence(sequence, batch_first=False, padding_value=0.0, total_length=None):
    """The inverse of pack_padded_sequence: (padded (T, B, *) or (B, T, *), lengths), the batch
    back in its original order."""
    data = sequence.data
    batch_sizes = _host_ints(sequence.batch_sizes)
    max_len = batch_sizes.size
    if total_length is not None:
        if total_length < max_len:
            raise ValueError("Expected total_length to be at least the length of the longest sequence in input, "
                             f"but got total_length={total_length} and max sequence length being {max_len}")
        max_len = total_length
    batch = int(batch_sizes[0])
    lengths = (batch_sizes[None, :] > np.arange(batch)[:, None]).sum(1)  # per sorted slot
    offsets = np.concatenate([[0], np.cumsum(batch_sizes)[:-1]])
    slots = np.arange(batch)
    if sequence.unsorted_indices is not None:
        slots = _host_ints(sequence.unsorted_indices)
        lengths = lengths[slots]
    t = np.arange(max_len)[:, None]
    src = np.where(t < lengths[None, :], offsets[np.minimum(t, batch_sizes.size - 1)] + slots[None, :], -1)
    if batch_first:
        padded = _padded(data, src.T, (batch, max_len), padding_value)
    else:
        padded = _padded(data, src, (max_len, batch), padding_value)
    return padded, tensor(lengths.astype(np.int64))


def _broadcast_check(shape, target):
    """torch's copy_ into the padded slot broadcasts a sequence to (L, *trailing)."""
    for d in range(1, len(shape) + 1):
        a, b = target[-d], shape[-d]
        if b != a and b != 1:
            raise RuntimeError(f"The size of tensor a ({a}) must match the size of tensor b ({b}) at "
                               f"non-singleton dimension {len(target) - d}")
    if len(shape) > len(target):
        raise RuntimeError(f"pad_sequence: a sequence of shape {list(shape)} does not fit the padded slot "
                           f"{list(target)}")


def pad_sequence(sequences, batch_first=False, padding_value=0.0, padding_side="right"):
    """Stack sequences of shapes (L_i, *) into (T, B, *) (or (B, T, *)), T = max L_i, padded with
    padding_value on the right (or the left)."""
    if not isinstance(sequences, Iterable):
        raise RuntimeError("pad_sequence: Expected iterable for input sequences, but got arg of type: "
                           f"{type(sequences)}")
    sequences = tuple(sequences)
    if not sequences:
        raise RuntimeError("received an empty list of sequences")
    if padding_side not in ("left", "right"):
        raise RuntimeError(f"Expected padding_side to be one of left or right, but got {padding_side}.")
    for s in sequences:
        if not isinstance(s, Tensor):
            raise TypeError(f"pad_sequence: expected a sequence of Tensors, got {type(s).__name__}")
        if s.dim() == 0:
            raise RuntimeError("pad_sequence: every sequence needs a length dimension, got a 0-d tensor")
    first = sequences[0]
    trailing = tuple(first.shape[1:])
    rows = []
    for s in sequences:
        slot = (s.shape[0],) + trailing
        if tuple(s.shape) != slot:
            _broadcast_check(tuple(s.shape), slot)
            s = s.expand(*slot)
        rows.append(s.to(dtype=first.dtype, device=first.device).reshape(s.shape[0], math.prod(trailing)))
    lengths = np.array([s.shape[0] for s in sequences], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    max_len = int(lengths.max())
    t = np.arange(max_len)[:, None]
    shift = (max_len - lengths)[None, :] if padding_side == "left" else np.zeros((1, lengths.size), np.int64)
    pos = t - shift
    src = np.where((pos >= 0) & (pos < lengths[None, :]), starts[None, :] + pos, -1)
    values = cat(rows, 0) if len(rows) > 1 else rows[0]
    if batch_first:
        out = _padded(values, src.T, (lengths.size, max_len), padding_value)
    else:
        out = _padded(values, src, (max_len, lengths.size), padding_value)
    return out.reshape(tuple(out.shape[:2]) + trailing)


def unpad_sequence(padded_sequences, lengths, batch_first=False):
    """The list of sequences padded_sequences[:lengths[i], i] (or [i, :lengths[i]]).

    torch transposes a time-major input in place (padded_sequences.transpose_(0, 1)); the engine
    leaves the argument alone."""
    if not batch_first:
        padded_sequences = transpose(padded_sequences, 0, 1)
    max_length = padded_sequences.shape[1]
    out = []
    for i, length in zip(range(padded_sequences.shape[0]), lengths, strict=True):
        n = min(max(int(math.ceil(float(length))), 0), max_length)  # torch: the rows where arange < length
        out.append(padded_sequences[i, :n])
    return out


def pack_sequence(sequences, enforce_sorted=True):
    """pack_padded_sequence(pad_sequence(sequences), lengths, enforce_sorted=enforce_sorted)."""
    lengths = [v.size(0) for v in sequences]
    return pack_padded_sequence(pad_sequence(sequences), lengths, enforce_sorted=enforce_sorted)


def unpack_sequence(packed_sequences):
    """The list of sequences of a PackedSequence, in their original order."""
    padded, lengths = pad_packed_sequence(packed_sequences, batch_first=True)
    return unpad_sequence(padded, lengths, batch_first=True)
