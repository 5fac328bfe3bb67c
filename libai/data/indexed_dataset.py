"""Megatron's memory-mapped indexed dataset (`--dataset-impl mmap`): token sequences in a flat
`.bin` file and their lengths/offsets in an `.idx` file.

`PREFIX.idx` (little-endian):

    9 bytes   magic b"MMIDIDX\\x00\\x00"
    uint64    version (1)
    uint8     dtype code (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16)
    uint64    number of sequences N
    uint64    number of document boundaries D (= documents + 1)
    int32[N]  sizes: length of each sequence in tokens
    int64[N]  pointers: byte offset of each sequence in PREFIX.bin
    int64[D]  doc_idx: index of the first sequence of each document, then N

`PREFIX.bin` holds the sequences back to back in that dtype. With one sequence per document
(no sentence splitting, as for GPT) sequence i is document i and doc_idx = [0, 1, ..., N].

Both files are checked when a dataset is opened, and every error names the file (full path) and
what is wrong: an `.idx` too short for its header or for the counts it declares, a bad magic, an
unsupported version or dtype code, a negative size or pointer, a doc_idx that does not rise from 0
to N; a `.bin` shorter than the index describes (the furthest end of a sequence,
`pointer + size * itemsize`). A `.bin` longer than that is accepted,
as Megatron does: the trailing bytes are never read.
"""
import os
import shutil
import struct

import numpy as np

__all__ = ["MMapIndexedDataset", "MMapIndexedDatasetBuilder", "best_fitting_dtype", "index_file_path",
           "data_file_path", "make_builder", "make_dataset", "get_indexed_dataset", "open_indexed_dataset"]

_HDR_MAGIC = b"MMIDIDX\x00\x00"
_VERSION = 1
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
          8: np.uint16}


def code(dtype):
    dtype = np.dtype(dtype)
    for k, v in DTYPES.items():
        if np.dtype(v) == dtype:
            return k
    raise ValueError(f"dtype {dtype} has no MMapIndexedDataset code")


def best_fitting_dtype(vocab_size=None):
    """uint16 for vocabularies below 65500 tokens, else int32 (Megatron's rule)."""
    if vocab_size is not None and vocab_size < 65500:
        return np.uint16
    return np.int32


def index_file_path(prefix_path):
    return prefix_path + ".idx"


def data_file_path(prefix_path):
    return prefix_path + ".bin"


_HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequences N, document boundaries D


def _dtype_codes():
    return ", ".join(f"{k} {np.dtype(v).name}" for k, v in DTYPES.items())


class _Index:
    """The parsed `.idx` file; sizes, pointers and doc_idx are read-only views of a memmap.
    Every failure to parse it raises a ValueError naming the file."""

    def __init__(self, path):
        path = os.path.abspath(str(path))
        self.path = path
        with open(path, "rb") as f:
            header = f.read(_HEADER.size)
        what = f"MMapIndexedDataset index {path}"
        if not _HDR_MAGIC.startswith(header[:9]):
            raise ValueError(f"{what}: bad magic {header[:9]!r}, expected {_HDR_MAGIC!r}: not a Megatron "
                             f"mmap index (was it written with --dataset-impl mmap?)")
        if len(header) < _HEADER.size:
            raise ValueError(f"{what} is truncated: {len(header)} bytes, shorter than the {_HEADER.size}-byte "
                             f"header (magic, version, dtype code, counts)")
        _, version, dtype_code, self._len, self._doc_count = _HEADER.unpack(header)
        if version != _VERSION:
            raise ValueError(f"{what}: unsupported index version {version} (expected {_VERSION})")
        if dtype_code not in DTYPES:
            raise ValueError(f"{what}: unknown dtype code {dtype_code} (known codes: {_dtype_codes()})")
        self.dtype = np.dtype(DTYPES[dtype_code])
        offset = _HEADER.size
        need = offset + self._len * (4 + 8) + self._doc_count * 8
        size = os.path.getsize(path)
        if size < need:
            raise ValueError(f"{what} is truncated: it declares {self._len} sequences and {self._doc_count} document "
                             f"boundaries, which need {need} bytes ({offset} header + {self._len} x (4 + 8) + "
                             f"{self._doc_count} x 8), but the file has {size} bytes")
        self._mmap = np.memmap(path, mode="r", order="C")
        buf = memoryview(self._mmap)
        self.sizes = np.frombuffer(buf, dtype=np.int32, count=self._len, offset=offset)
        offset += self.sizes.nbytes
        self.pointers = np.frombuffer(buf, dtype=np.int64, count=self._len, offset=offset)
        offset += self.pointers.nbytes
        self.doc_idx = np.frombuffer(buf, dtype=np.int64, count=self._doc_count, offset=offset)

    def check_body(self):
        """ValueError naming the file and the first bad entry unless every size and pointer is
        non-negative and doc_idx runs from 0 to N without going back: a damaged body would
        otherwise surface as a bare numpy error at whichever sample first reads it, or not at all."""
        what = f"MMapIndexedDataset index {self.path}"
        for name, values in (("sizes", self.sizes), ("pointers", self.pointers)):
            bad = np.flatnonzero(values < 0)
            if bad.size:
                raise ValueError(f"{what} is damaged: {name}[{bad[0]}] = {values[bad[0]]} is negative "
                                 f"(regenerate it with tools/preprocess_data.py)")
        d = self.doc_idx
        if d.size and (d[0] != 0 or d[-1] != self._len or (d.size > 1 and (np.diff(d) < 0).any())):
            raise ValueError(f"{what} is damaged: doc_idx must rise from 0 to the {self._len} sequences, got "
                             f"{d[:4].tolist()}{' ... ' + str(d[-1]) if d.size > 4 else ''} "
                             f"(regenerate it with tools/preprocess_data.py)")

    def data_nbytes(self):
        """Bytes of `.bin` the index describes: the furthest end of a sequence (the last one's in
        a file written in order)."""
        if not self._len:
            return 0
        return int((self.pointers + self.sizes.astype(np.int64) * self.dtype.itemsize).max())

    def __len__(self):
        return self._len

    @staticmethod
    def write(path, dtype, sizes, doc_idx):
        dtype = np.dtype(dtype)
        sizes = np.asarray(sizes, dtype=np.int32)
        pointers = np.zeros(len(sizes), dtype=np.int64)
        if len(sizes) > 1:
            np.cumsum(sizes[:-1].astype(np.int64) * dtype.itemsize, out=pointers[1:])
        doc_idx = np.asarray(doc_idx, dtype=np.int64)
        with open(path, "wb") as f:
            f.write(_HDR_MAGIC)
            f.write(struct.pack("<Q", _VERSION))
            f.write(struct.pack("<B", code(dtype)))
            f.write(struct.pack("<Q", len(sizes)))
            f.write(struct.pack("<Q", len(doc_idx)))
            f.write(sizes.tobytes(order="C"))
            f.write(pointers.tobytes(order="C"))
            f.write(doc_idx.tobytes(order="C"))


class MMapIndexedDataset:
    """Read-only, memory-mapped sequences of `PREFIX.bin` / `PREFIX.idx`.

    `ds[i]` is sequence i (a numpy array of the stored dtype, a view of the memmap), `ds[a:b]`
    a list of them, `ds.get(i, offset, length)` a part of one; `sizes` (int32 lengths),
    `pointers`, `doc_idx` (document boundaries in sequences) and `dtype` describe the data."""

    def __init__(self, path, skip_warmup=True):
        self._path = str(path)
        full = os.path.abspath(self._path)
        missing = [p for p in (index_file_path(full), data_file_path(full)) if not os.path.isfile(p)]
        if missing:
            raise FileNotFoundError(f"MMapIndexedDataset: {' and '.join(missing)} not found (a dataset is the pair "
                                    f"PREFIX.bin / PREFIX.idx of tools/preprocess_data.py; PREFIX = {full})")
        self._index = _Index(index_file_path(full))
        self._doc_idx_override = None
        bin_path = data_file_path(full)
        self._index.check_body()
        bin_size, expected = os.path.getsize(bin_path), self._index.data_nbytes()
        if bin_size < expected:  # trailing bytes are tolerated (Megatron); missing ones are not
            raise ValueError(f"MMapIndexedDataset: {bin_path} has {bin_size} bytes, but its index {self._index.path} "
                             f"describes {expected} bytes ({len(self._index)} sequences of {self._index.dtype}, the "
                             f"last ending at byte {expected}): the .bin is truncated or belongs to another index; "
                             f"regenerate both (tools/preprocess_data.py)")
        # numpy cannot map an empty file (a dataset of empty sequences)
        self._bin = (np.memmap(bin_path, mode="r", order="C") if bin_size
                     else np.zeros(0, dtype=np.uint8))
        if not skip_warmup:  # touch the pages once (Megatron's warmup)
            _ = int(self._bin.sum(dtype=np.int64)) if self._bin.size else 0

    @staticmethod
    def exists(path):
        path = str(path)
        return os.path.isfile(index_file_path(path)) and os.path.isfile(data_file_path(path))

    @property
    def path_prefix(self):
        return self._path

    @property
    def dtype(self):
        return self._index.dtype

    @property
    def sizes(self):
        return self._index.sizes

    @property
    def pointers(self):
        return self._index.pointers

    @property
    def doc_idx(self):
        return self._index.doc_idx if self._doc_idx_override is None else self._doc_idx_override

    def get_doc_idx(self):
        return self.doc_idx

    def set_doc_idx(self, doc_idx):
        """Override doc_idx (LiBai's split helper); None restores the file's."""
        self._doc_idx_override = None if doc_idx is None else np.asarray(doc_idx, dtype=np.int64)

    @property
    def supports_prefetch(self):
        return False

    def __len__(self):
        return len(self._index)

    def _read(self, i, offset=0, length=None):
        size = int(self._index.sizes[i])
        offset = int(offset)
        if offset < 0 or offset > size:
            raise IndexError(f"offset {offset} outside sequence {i} of length {size}")
        if length is None:
            length = size - offset
        length = int(length)
        if length < 0 or offset + length > size:
            raise IndexError(f"offset {offset} + length {length} exceeds sequence {i} of length {size}")
        ptr = int(self._index.pointers[i]) + offset * self.dtype.itemsize
        return np.frombuffer(self._bin, dtype=self.dtype, count=length, offset=ptr)

    def __getitem__(self, idx):
        if isinstance(idx, (int, np.integer)):
            n = len(self)
            i = int(idx) + n if idx < 0 else int(idx)
            if not 0 <= i < n:
                raise IndexError(f"index {idx} out of range for {n} sequences")
            return self._read(i)
        if isinstance(idx, slice):
            start, stop, step = idx.indices(len(self))
            if step != 1:
                raise ValueError("MMapIndexedDataset slices must be contiguous (step 1)")
            if stop <= start:
                return []
            sizes = self._index.sizes[start:stop]
            flat = np.frombuffer(self._bin, dtype=self.dtype, count=int(np.sum(sizes, dtype=np.int64)),
                                 offset=int(self._index.pointers[start]))
            return np.split(flat, np.cumsum(sizes[:-1], dtype=np.int64))
        raise TypeError(f"MMapIndexedDataset indices must be int or slice, got {type(idx).__name__}")

    def get(self, idx, offset=0, length=None):
        """Tokens [offset, offset + length) of sequence `idx` (to its end when length is None)."""
        i = int(idx)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"index {idx} out of range for {len(self)} sequences")
        return self._read(i, offset, length)

    def __repr__(self):
        return (f"MMapIndexedDataset({self._path!r}, sequences={len(self)}, documents={len(self.doc_idx) - 1}, "
                f"tokens={int(np.sum(self.sizes, dtype=np.int64))}, dtype={self.dtype})")


class MMapIndexedDatasetBuilder:
    """Writes `PREFIX.bin` while sequences are added, and `PREFIX.idx` in `finalize`.

        builder = MMapIndexedDatasetBuilder(data_file_path(prefix), dtype=best_fitting_dtype(len(tok)))
        for doc in docs:
            builder.add_item(token_ids)     # one or more sequences per document
            builder.end_document()
        builder.finalize(index_file_path(prefix))
    """

    def __init__(self, out_file, dtype=np.int64):
        self._out_file = str(out_file)
        self._file = open(self._out_file, "wb")
        self._dtype = np.dtype(dtype)
        code(self._dtype)
        self._sizes = []
        self._doc_idx = [0]

    @property
    def dtype(self):
        return self._dtype

    def add_item(self, tokens):
        if hasattr(tokens, "numpy") and not isinstance(tokens, np.ndarray):
            tokens = tokens.numpy()
        arr = np.asarray(tokens)
        if arr.size and np.issubdtype(arr.dtype, np.integer):
            info = np.iinfo(self._dtype) if np.issubdtype(self._dtype, np.integer) else None
            if info is not None and (arr.min() < info.min or arr.max() > info.max):
                raise ValueError(f"token ids outside the range of {self._dtype} "
                                 f"({int(arr.min())}..{int(arr.max())})")
        arr = arr.astype(self._dtype, copy=False).reshape(-1)
        self._file.write(arr.tobytes(order="C"))
        self._sizes.append(arr.size)

    def end_document(self):
        self._doc_idx.append(len(self._sizes))

    def merge_file_(self, another_prefix):
        """Append the sequences and documents of another mmap dataset of the same dtype."""
        index = MMapIndexedDataset(another_prefix)._index  # both files checked
        if index.dtype != self._dtype:
            raise ValueError(f"cannot merge {another_prefix} ({index.dtype}) into a {self._dtype} dataset")
        offset = len(self._sizes)
        self._sizes.extend(int(s) for s in index.sizes)
        self._doc_idx.extend(offset + int(d) for d in index.doc_idx[1:])
        with open(data_file_path(another_prefix), "rb") as f:
            shutil.copyfileobj(f, self._file)

    def finalize(self, index_file):
        self._file.close()
        _Index.write(str(index_file), self._dtype, self._sizes, self._doc_idx)


def open_indexed_dataset(indexed_dataset=None, data_prefix=None, owner="dataset", skip_warmup=True):
    """(indexed dataset, data prefix) of a dataset's arguments: `indexed_dataset` as given (built
    when it is a LazyCall) or opened from `data_prefix`; the prefix is the dataset's own when only
    the dataset is given. `owner` names the caller in the error when neither is given."""
    if indexed_dataset is None:
        if data_prefix is None:
            raise ValueError(f"{owner} needs data_prefix or indexed_dataset")
        indexed_dataset = MMapIndexedDataset(data_prefix, skip_warmup=skip_warmup)
    elif not isinstance(indexed_dataset, MMapIndexedDataset):
        from libai.config.instantiate import instantiate, is_lazy_node

        if is_lazy_node(indexed_dataset):
            indexed_dataset = instantiate(indexed_dataset)
    if data_prefix is None:
        data_prefix = getattr(indexed_dataset, "path_prefix", None)
    return indexed_dataset, data_prefix


# Megatron's older formats: known names, not implemented (NotImplementedError, not ValueError)
UNIMPLEMENTED_IMPLS = ("lazy", "cached")


def _check_impl(impl, accepted):
    if impl in UNIMPLEMENTED_IMPLS:
        raise NotImplementedError(f"the {impl!r} indexed dataset format is not implemented; only 'mmap' is "
                                  "(tools/preprocess_data.py writes it)")
    if impl not in accepted:
        raise ValueError(f"only the 'mmap' dataset implementation is supported, got {impl!r}")


def make_builder(out_file, impl="mmap", vocab_size=None):
    _check_impl(impl, ("mmap",))
    return MMapIndexedDatasetBuilder(out_file, dtype=best_fitting_dtype(vocab_size))


def make_dataset(path, impl="mmap", skip_warmup=True):
    _check_impl(impl, ("mmap", "infer"))
    return MMapIndexedDataset(path, skip_warmup=skip_warmup)


def get_indexed_dataset(data_prefix, data_impl="mmap", skip_warmup=True):
    """LiBai's helper: open `data_prefix` (PREFIX_text_document) as an indexed dataset."""
    return make_dataset(data_prefix, data_impl, skip_warmup)
