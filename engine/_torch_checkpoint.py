"""Reading PyTorch checkpoints (files written by `torch.save`) without torch and without running code.

A torch.save file is a pickle of the saved object whose tensors refer, by key, to raw storages
kept next to it: in the zip format (torch >= 1.6; the .pt / .bin files of HuggingFace and
nanoGPT) the pickle is `<archive>/data.pkl` and storage k is the record `<archive>/data/k`,
stored uncompressed, in the byte order named by `<archive>/byteorder`; in the legacy format
the file is a run of pickles (magic number, protocol, system info, the object, the storage keys)
followed by each storage as an 8-byte little-endian element count and its little-endian bytes.

Unpickling normally imports and calls whatever the file names, so a checkpoint can run any code.
Here the unpickler (a `pickle.Unpickler` with `find_class` and `persistent_load` overridden)
resolves a global only from a fixed table: torch's tensor-rebuild functions, storage classes and
dtypes (replaced by functions and markers of this module that build engine objects from
checked arguments), torch.Size, torch.device, collections.OrderedDict, argparse.Namespace (a bag
of attributes, built by object.__new__ and a __dict__ update), and the few builtins
protocol 2 needs for sets, bytes and complex numbers. Any other global raises CheckpointError
naming it before anything is called. The loaded tree is then checked again: only plain
containers, scalars, strings, dtypes, devices and engine tensors may come out.

Tensors are numpy arrays over the storages: a contiguous tensor, or a strided one whose
elements do not overlap, is a view of its storage, so tensors that shared a storage in torch
(tied weights, slices) still share memory; a tensor with overlapping elements (an expanded
view) gets its own copy. Every view is checked to lie inside its storage. Zip records are
checked against their CRC32 unless mapped with mmap=True (whose point is not to read them).
"""
import _compat_pickle
import argparse
import io
import math
import os
import pickle
import struct
import sys
import zipfile
import zlib
from collections import OrderedDict

import numpy as np

from .backend import CPU, device, dtypes, is_cuda_available, to_device
from .tensor import Parameter, Size, Tensor

__all__ = ["CheckpointError", "detect", "load", "check_options", "placement", "StorageStandIn"]


class CheckpointError(RuntimeError):
    """A checkpoint file that is truncated, corrupted, of an unknown format, or that holds objects
    engine.load refuses to build."""


LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001
_LEGACY_HEAD = b"\x80\x02\x8a\x0a" + LEGACY_MAGIC.to_bytes(10, "little")
_HEAD_BYTES = 512

# torch's typed storage classes -> engine dtype (None: a dtype the engine does not have)
_STORAGE_DTYPES = {
    "DoubleStorage": dtypes.float64, "FloatStorage": dtypes.float32, "HalfStorage": dtypes.float16,
    "BFloat16Storage": dtypes.bfloat16, "LongStorage": dtypes.int64, "IntStorage": dtypes.int32,
    "ShortStorage": dtypes.int16, "CharStorage": dtypes.int8, "ByteStorage": dtypes.uint8,
    "BoolStorage": dtypes.bool_,
    "ComplexFloatStorage": None, "ComplexDoubleStorage": None, "QInt8Storage": None, "QUInt8Storage": None,
    "QInt32Storage": None, "QUInt4x2Storage": None, "QUInt2x4Storage": None,
}
# torch dtype names -> engine dtype (None: no engine equivalent)
_TORCH_DTYPES = {
    "float64": dtypes.float64, "double": dtypes.float64, "float32": dtypes.float32, "float": dtypes.float32,
    "float16": dtypes.float16, "half": dtypes.float16, "bfloat16": dtypes.bfloat16, "int64": dtypes.int64,
    "long": dtypes.int64, "int32": dtypes.int32, "int": dtypes.int32, "int16": dtypes.int16,
    "short": dtypes.int16, "int8": dtypes.int8, "uint8": dtypes.uint8, "bool": dtypes.bool_,
    **{n: None for n in ("complex32", "complex64", "complex128", "cfloat", "cdouble", "chalf", "uint16", "uint32",
                         "uint64", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
                         "float8_e8m0fnu", "float4_e2m1fn_x2", "qint8", "quint8", "qint32", "quint4x2",
                         "quint2x4", "bits8", "bits16", "bits1x8", "bits2x4", "bits4x2")},
}


# ====================================================================== format detection
def _head(source):
    """The first bytes of a path or a binary file object; a file object is rewound to where it was
    (a non-seekable one is read into memory, which then replaces it)."""
    if not hasattr(source, "read"):
        with open(os.fspath(source), "rb") as f:
            return f.read(_HEAD_BYTES), source
    try:
        pos = source.tell()
        head = source.read(_HEAD_BYTES)
        source.seek(pos)
        return head, source
    except (OSError, AttributeError, io.UnsupportedOperation):
        data = source.read()
        replacement = io.BytesIO(data)
        replacement.name = getattr(source, "name", "<file object>")
        return data[:_HEAD_BYTES], replacement


def _kind(head):
    if len(head) > 8 and head[8:9] == b"{":
        return None  # safetensors: 8-byte header length, then the JSON header
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return "zip"
    if head.startswith(_LEGACY_HEAD):
        return "legacy"
    if len(head) >= 262 and head[257:262] == b"ustar":
        return "tar"
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return "pickle"
    return None


def detect(source):
    """('zip' | 'legacy' | None, source): the PyTorch format of a file, by its magic bytes (None:
    an engine / safetensors file, or something the engine reader will report as invalid)."""
    head, source = _head(source)
    kind = _kind(head)
    name = _name(source)
    if kind == "tar":
        raise CheckpointError(f"engine.load: {name} is a PyTorch checkpoint in the tar format of torch < 0.4, "
                              "which is not supported; re-save it with a recent torch (torch.save)")
    if kind == "pickle":
        raise CheckpointError(f"engine.load: {name} is a plain pickle file, not a torch.save checkpoint or an engine "
                              "checkpoint; engine.load never unpickles arbitrary objects")
    return kind, source


def _name(source):
    return os.fspath(source) if not hasattr(source, "read") else getattr(source, "name", "<file object>")


def check_options(weights_only, mmap):
    if weights_only is False:
        raise NotImplementedError(
            "engine.load(weights_only=False) is not supported: engine.load never executes code from a file, so it "
            "only ever reads tensors, dtypes and plain Python containers and scalars (what weights_only=True "
            "admits). Objects of other classes must be rebuilt from such data by your own code.")
    if weights_only not in (True, None):
        raise TypeError(f"engine.load: weights_only must be True (or None), got {weights_only!r}")
    if mmap not in (None, False, True):
        raise TypeError(f"engine.load: mmap must be a bool or None, got {mmap!r}")


class StorageStandIn:
    """What a `map_location` function receives in place of torch's storage (the engine has no
    storage objects): it only records where the function sends it, by `.cpu()`, `.cuda(i)` or
    `.to(device)`; the function returns it (or None: the saved location) and the tensors of that
    storage are built on the device it names."""

    def __init__(self, location):
        self.location = location

    @property
    def device(self):
        return _parse_location(self.location)

    @property
    def is_cuda(self):
        return self.device.type == "cuda"

    def cpu(self):
        return StorageStandIn("cpu")

    def cuda(self, device=None, non_blocking=False):
        if device is None:
            return StorageStandIn("cuda")
        return StorageStandIn(str(device) if not isinstance(device, int) else f"cuda:{device}")

    def to(self, device=None, non_blocking=False, copy=False):
        return StorageStandIn(str(device) if not isinstance(device, int) else f"cuda:{device}")

    def __repr__(self):
        return f"StorageStandIn(location={self.location!r})"


def _parse_location(location):
    """An engine device from a location ('cpu', 'cuda:1', an engine or torch device: str() of it)."""
    if not isinstance(location, (str, device)):
        location = str(location)  # a torch.device (told without importing torch)
    try:
        return device(location)
    except ValueError as e:
        raise RuntimeError(f"engine.load: unknown location {location!r} ({e})") from None


def _device_of(location):
    """`_parse_location`, refusing a CUDA device where CUDA is not available."""
    dev = _parse_location(location)
    if dev.type == "cuda" and not is_cuda_available():
        raise RuntimeError(f"engine.load: a tensor would go to {location!r}, a CUDA device, but CUDA is not available "
                           "here (CuPy or a GPU is missing); use map_location='cpu'")
    return dev


def _is_device(x):
    module = type(x).__module__ or ""
    return isinstance(x, (str, device)) or (type(x).__name__ == "device" and module.split(".")[0] == "torch")


def placement(map_location):
    """fn(saved location) -> the engine device a storage saved there is loaded to, per torch.load's
    `map_location`: None (here: always the CPU, whatever the saved location), a device or its
    name (every tensor there), a dict remapping locations ({'cuda:0': 'cpu'}; others stay where
    they were saved), or a function `f(storage, location)` called once per storage with a
    `StorageStandIn`, returning it moved (`storage.cuda(0)`) or as is, or None (the saved location)."""
    if map_location is None:
        return lambda location: CPU
    if _is_device(map_location):
        dev = _device_of(map_location)
        return lambda location: dev
    if isinstance(map_location, dict):
        if not all(isinstance(k, str) and _is_device(v) for k, v in map_location.items()):
            raise TypeError(f"engine.load: a map_location dict maps location strings to location strings or "
                            f"devices, got {map_location!r}")
        return lambda location: _device_of(map_location.get(location, location))
    if callable(map_location):
        def call(location):
            moved = map_location(StorageStandIn(location), location)
            if moved is None:
                return _device_of(location)
            if not isinstance(moved, StorageStandIn):
                raise TypeError(f"engine.load: the map_location function returned a {type(moved).__name__}; it must "
                                "return the storage it was given (moved with .cpu(), .cuda(i) or .to(device)) or None")
            return _device_of(moved.location)
        return call
    raise TypeError(f"engine.load: map_location of type {type(map_location).__name__} is not supported; pass None, a "
                    "device or its name ('cpu', 'cuda:0'), a dict of locations or a function (storage, location)")


# ====================================================================== storages
class _StorageType:
    """What a torch storage class (torch.FloatStorage, torch.UntypedStorage) stands for."""

    def __init__(self, qualname, dtype):
        self.qualname, self.dtype = qualname, dtype

    def __repr__(self):
        return self.qualname


class _Storage:
    """One storage: its raw bytes (uint8, writable), their byte order, and its element dtype."""

    def __init__(self, raw, byteorder, dtype, key, location="cpu"):
        self.raw, self.byteorder, self.dtype, self.key = raw, byteorder, dtype, key
        self.location = location  # where torch saved it ('cpu', 'cuda:0')
        self._typed = {}

    def typed(self, dtype):
        """The storage as a 1-D native-order array of `dtype` (a view when no byte swap is needed)."""
        if dtype not in self._typed:
            size = dtype.itemsize
            if self.raw.size % size:
                raise CheckpointError(f"storage {self.key!r} of {self.raw.size} bytes does not hold whole {dtype.name} "
                                      "elements")
            if size == 1 or self.byteorder == sys.byteorder:
                arr = self.raw.view(dtype.np)
            else:
                arr = self.raw.view(f"u{size}").byteswap().view(dtype.np)
            if arr.ctypes.data % dtype.np.alignment:  # a record at an odd offset (mmap of a zip not written by torch)
                arr = arr.copy()
            self._typed[dtype] = arr
        return self._typed[dtype]


def _nbytes(dtype, numel, what):
    if not isinstance(numel, int) or isinstance(numel, bool) or numel < 0:
        raise CheckpointError(f"{what}: invalid element count {numel!r}")
    return numel * dtype.itemsize


# ====================================================================== the restricted unpickler
class _Reported(CheckpointError):
    """An error whose message is already complete (it names the file)."""


class _Placing(Exception):
    """Carries an error of `map_location` through the unpickler, which blames the file for others."""

    def __init__(self, error):
        super().__init__(str(error))
        self.error = error


def _ints(value, what):
    if not isinstance(value, (tuple, list)) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                                       for v in value):
        raise CheckpointError(f"invalid tensor {what} {value!r}")
    return tuple(value)


def _no_overlap(shape, strides):
    """Whether distinct indices of a strided view reach distinct elements (sufficient test: with
    dimensions sorted by stride, each stride exceeds the span of the smaller ones)."""
    span = 0
    for n, s in sorted(((n, s) for n, s in zip(shape, strides) if n > 1), key=lambda d: d[1]):
        if s <= span:
            return False
        span += (n - 1) * s
    return True


class _Builder:
    """The functions and markers that the admitted globals resolve to. Each checks its arguments
    and builds engine objects; nothing from the file is ever called."""

    def __init__(self, place, name):
        self.place, self.name = place, name  # place: saved location -> device (`placement`)
        self.devices = {}  # id(storage) -> its device: map_location is asked once per storage
        self.tensor_marker = _TypeMarker("torch.Tensor")
        self.parameter_marker = _TypeMarker("torch.nn.parameter.Parameter")
        self.table = self._table()
        self.tensor_functions = {self.rebuild_tensor, self.rebuild_tensor_v2, self.rebuild_tensor_v3,
                                 self.rebuild_parameter, self.rebuild_parameter_with_state}

    def _table(self):
        t = {
            "collections.OrderedDict": OrderedDict,
            "argparse.Namespace": argparse.Namespace,  # an attribute bag (training args): NEWOBJ + BUILD
            "torch._utils._rebuild_tensor": self.rebuild_tensor,
            "torch._utils._rebuild_tensor_v2": self.rebuild_tensor_v2,
            "torch._utils._rebuild_tensor_v3": self.rebuild_tensor_v3,
            "torch._utils._rebuild_parameter": self.rebuild_parameter,
            "torch._utils._rebuild_parameter_with_state": self.rebuild_parameter_with_state,
            "torch._tensor._rebuild_from_type_v2": self.rebuild_from_type_v2,
            "torch.Tensor": self.tensor_marker,
            "torch.nn.parameter.Parameter": self.parameter_marker,
            "torch.Size": _size,
            "torch.device": _device,
            "_codecs.encode": _encode,
            "builtins.bytes": _bytes,
            "builtins.set": _set,
            "builtins.frozenset": _frozenset,
            "builtins.complex": _complex,
            "builtins.bytearray": _bytearray,
        }
        for name, dt in _STORAGE_DTYPES.items():
            for module in ("torch", "torch.cuda"):
                t[f"{module}.{name}"] = _StorageType(f"torch.{name}", dt)
        for module in ("torch", "torch.storage"):
            t[f"{module}.UntypedStorage"] = _StorageType("torch.UntypedStorage", dtypes.uint8)
        for name, dt in _TORCH_DTYPES.items():
            t[f"torch.{name}"] = dt if dt is not None else _UnsupportedDtype(name)
        return t

    # ---------------------------------------------------------------- tensors
    def rebuild_tensor(self, storage, storage_offset, size, stride):
        return self._tensor(storage, storage_offset, size, stride, False, None, None, None)

    def rebuild_tensor_v2(self, storage, storage_offset, size, stride, requires_grad, backward_hooks, metadata=None):
        return self._tensor(storage, storage_offset, size, stride, requires_grad, backward_hooks, metadata, None)

    def rebuild_tensor_v3(self, storage, storage_offset, size, stride, requires_grad, backward_hooks, dtype,
                          metadata=None):
        if isinstance(dtype, _UnsupportedDtype):
            dtype.fail()
        if not isinstance(dtype, dtypes.dtype):
            raise CheckpointError(f"invalid tensor dtype {dtype!r}")
        return self._tensor(storage, storage_offset, size, stride, requires_grad, backward_hooks, metadata, dtype)

    def _tensor(self, storage, offset, size, stride, requires_grad, hooks, metadata, dtype):
        if not isinstance(storage, _Storage):
            raise CheckpointError(f"a tensor refers to {type(storage).__name__}, not to a storage")
        dtype = dtype or storage.dtype
        size, stride = _ints(size, "size"), _ints(stride, "stride")
        if len(size) != len(stride):
            raise CheckpointError(f"tensor size {size} and stride {stride} differ in length")
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise CheckpointError(f"invalid storage offset {offset!r}")
        if not _empty(hooks):
            raise CheckpointError("a tensor carries backward hooks, which are code; engine.load does not load them")
        if not isinstance(requires_grad, bool):
            raise CheckpointError(f"invalid requires_grad {requires_grad!r}")
        flat = storage.typed(dtype)
        numel = math.prod(size)
        end = offset + sum((n - 1) * s for n, s in zip(size, stride)) + 1 if numel else offset
        if end > flat.size:
            raise CheckpointError(f"a tensor of size {list(size)}, stride {list(stride)} at offset {offset} reaches "
                                  f"element {end - 1} of storage {storage.key!r}, which holds {flat.size}")
        item = flat.itemsize
        a = np.lib.stride_tricks.as_strided(flat[offset:], shape=size, strides=tuple(s * item for s in stride))
        if numel and not _no_overlap(size, stride):
            a = a.copy()  # an expanded view: engine tensors do not alias their own elements
        a = _apply_metadata(a, metadata)
        dev = self.devices.get(id(storage))
        if dev is None:
            try:
                dev = self.devices[id(storage)] = self.place(storage.location)
            except Exception as e:
                raise _Placing(e) from None
        if dev != CPU:
            try:
                a = to_device(a, dev)
            except (TypeError, RuntimeError) as e:  # e.g. CuPy has no bfloat16
                raise _Reported(f"engine.load: {self.name}: cannot place a {dtype.name} tensor on {dev}: "
                                f"{e}") from None
        t = Tensor._make(a, dev)
        if requires_grad:
            t.requires_grad_(True)
        return t

    def rebuild_parameter(self, data, requires_grad, backward_hooks):
        if not isinstance(data, Tensor) or isinstance(data, Parameter):
            raise CheckpointError(f"a Parameter must wrap a tensor, got {type(data).__name__}")
        if not _empty(backward_hooks):
            raise CheckpointError("a Parameter carries backward hooks, which are code; engine.load does not load "
                                  "them")
        return Parameter(data, requires_grad=bool(requires_grad))

    def rebuild_parameter_with_state(self, data, requires_grad, backward_hooks, state):
        _check_no_state(state, "Parameter")
        return self.rebuild_parameter(data, requires_grad, backward_hooks)

    def rebuild_from_type_v2(self, func, new_type, args, state):
        """torch's wrapper for tensors of a subclass or with Python attributes: admitted for plain
        tensors and Parameters without attributes only."""
        if func not in self.tensor_functions:
            raise CheckpointError(f"_rebuild_from_type_v2 with {func!r}: only tensor rebuild functions are admitted")
        if new_type is not self.tensor_marker and new_type is not self.parameter_marker:
            raise CheckpointError(f"a tensor of type {new_type!r}: only torch.Tensor and Parameter are admitted")
        _check_no_state(state, "tensor")
        if not isinstance(args, tuple):
            raise CheckpointError("invalid tensor arguments")
        t = func(*args)
        if new_type is self.parameter_marker and not isinstance(t, Parameter):
            t = Parameter(t, requires_grad=t.requires_grad)
        return t


class _TypeMarker:
    """torch.Tensor / torch.nn.Parameter, admitted only as the type argument of _rebuild_from_type_v2."""

    def __init__(self, qualname):
        self.qualname = qualname

    def __repr__(self):
        return self.qualname


class _UnsupportedDtype:
    def __init__(self, name):
        self.name = name

    def fail(self):
        raise CheckpointError(f"the checkpoint uses torch.{self.name}, a dtype the engine does not have")

    def __repr__(self):
        return f"torch.{self.name}"


def _apply_metadata(a, metadata):
    """torch's per-tensor flags: a negative view (neg bit) is materialised; the conjugate bit
    means nothing for the real dtypes the engine has."""
    if _empty(metadata):
        return a
    if not isinstance(metadata, dict) or not set(metadata) <= {"neg", "conj"}:
        raise CheckpointError(f"unsupported tensor metadata {metadata!r}")
    return -a if metadata.get("neg") else a


def _empty(x):
    """None or an empty plain dict (what torch writes for absent hooks, metadata and state)."""
    return x is None or (type(x) in (dict, OrderedDict) and not x)


def _check_no_state(state, what):
    if not (_empty(state) or (type(state) is tuple and all(_empty(s) for s in state))):
        raise CheckpointError(f"a {what} with Python attributes ({str(state)[:80]}) is not supported")


def _size(dims=()):
    return Size(_ints(dims, "torch.Size"))


def _device(kind, index=None):
    if not isinstance(kind, str) or (index is not None and not isinstance(index, int)):
        raise CheckpointError(f"invalid torch.device({kind!r}, {index!r})")
    try:
        return device(kind, index) if index is not None else device(kind)
    except (ValueError, RuntimeError) as e:
        raise CheckpointError(f"torch.device({kind!r}) has no engine equivalent ({e})") from None


def _encode(text, encoding="utf-8"):  # protocol 2 writes bytes as _codecs.encode(str, 'latin1')
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise CheckpointError(f"_codecs.encode is admitted for latin1 text only, got {encoding!r}")
    return text.encode("latin-1")


def _bytes(*args):  # protocol 2 writes b"" as bytes()
    if args:
        raise CheckpointError("bytes() is admitted without arguments only")
    return b""


def _bytearray(*args):
    if args == () or (len(args) == 1 and isinstance(args[0], bytes)):
        return bytearray(*args)
    return bytearray(_encode(*args))


def _set(items=()):
    return set(_iterable(items))


def _frozenset(items=()):
    return frozenset(_iterable(items))


def _iterable(items):
    if not isinstance(items, (list, tuple, set, frozenset)):
        raise CheckpointError(f"a set built from {type(items).__name__}")
    return items


def _complex(real=0.0, imag=0.0):
    if not all(isinstance(x, (int, float)) for x in (real, imag)):
        raise CheckpointError("complex() of non-numbers")
    return complex(real, imag)


class _Unpickler(pickle.Unpickler):
    """Resolves globals only from the builder's table; storages come from `storage_of(pid)`."""

    def __init__(self, file, builder, storage_of, name):
        super().__init__(file, encoding="utf-8")
        self.builder, self.storage_of, self.name = builder, storage_of, name

    def find_class(self, module, attr):
        if (module, attr) in _compat_pickle.NAME_MAPPING:  # Python 2 names (torch.save uses protocol 2)
            module, attr = _compat_pickle.NAME_MAPPING[(module, attr)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
        found = self.builder.table.get(f"{module}.{attr}")
        if found is None:
            raise _Reported(
                f"engine.load: {self.name} refers to {module}.{attr}, which engine.load refuses to load: only "
                "tensors, Parameters, torch dtypes/Size/device, OrderedDict and plain Python containers and scalars "
                "are admitted, and no code from a checkpoint is ever run. Load such a file with torch if you trust "
                "it, and save its tensors (e.g. a state_dict) instead.")
        return found

    def persistent_load(self, pid):
        return self.storage_of(pid)


def _unpickle(file, builder, storage_of, name):
    try:
        return _Unpickler(file, builder, storage_of, name).load()
    except _Placing as e:  # map_location's own error (a wrong return, CUDA missing): not the file's fault
        raise e.error from None
    except _Reported as e:
        raise CheckpointError(str(e)) from None
    except CheckpointError as e:
        raise CheckpointError(f"engine.load: {name} is not a valid PyTorch checkpoint: {e}") from None
    except Exception as e:  # a truncated or garbled pickle, a wrong argument count, ...
        raise CheckpointError(f"engine.load: {name} is not a valid PyTorch checkpoint (truncated or corrupted?): "
                              f"{type(e).__name__}: {e}") from e


def _location(location):
    """A storage's saved location as a str ('cpu', 'cuda:0'); protocol 2 may give bytes."""
    if isinstance(location, bytes):
        location = location.decode("ascii", "replace")
    if not isinstance(location, str):
        raise CheckpointError(f"invalid storage location {location!r}")
    return location


def _storage_pid(pid, fields):
    """Check a persistent id ('storage', storage_type, key, location, numel[, view]) and return its fields."""
    if not isinstance(pid, tuple) or len(pid) != fields or not pid:
        raise CheckpointError(f"invalid persistent id {str(pid)[:80]}")
    kind = pid[0].decode("ascii") if isinstance(pid[0], bytes) else pid[0]
    if kind != "storage":
        raise CheckpointError(f"unsupported persistent id kind {kind!r} (only storages are admitted)")
    storage_type, key = pid[1], pid[2]
    if not isinstance(storage_type, _StorageType):
        raise CheckpointError(f"invalid storage type {storage_type!r}")
    if storage_type.dtype is None:
        raise CheckpointError(f"the checkpoint holds a {storage_type!r}, whose dtype the engine does not have")
    if not isinstance(key, (str, int)):
        raise CheckpointError(f"invalid storage key {key!r}")
    return (storage_type, str(key)) + tuple(pid[3:])


# ====================================================================== zip format
class _ZipReader:
    def __init__(self, f, name, mmap_path):
        self.f, self.name = f, name
        try:
            self.zf = zipfile.ZipFile(f)
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
            raise self.bad(f"not a readable zip archive ({e})") from None
        self.infos = {i.filename: i for i in self.zf.infolist()}
        self.prefix = self._prefix()
        order = self._read_small("byteorder")
        self.byteorder = order.decode("ascii", "replace").strip() if order is not None else "little"
        if self.byteorder not in ("little", "big"):
            raise self.bad(f"unknown byte order {self.byteorder!r}")
        # copy-on-write: tensors can be changed in memory, the file never is (torch's MAP_PRIVATE)
        self.mm = np.asarray(np.memmap(mmap_path, dtype=np.uint8, mode="c")) if mmap_path is not None else None
        self.storages = {}

    def bad(self, why):
        return _Reported(f"engine.load: {self.name} is not a valid PyTorch checkpoint (truncated or corrupted?): "
                         f"{why}")

    def _prefix(self):
        tops = {n.split("/", 1)[0] for n in self.infos if "/" in n}
        found = [t for t in tops if f"{t}/data.pkl" in self.infos]
        if len(found) != 1:
            raise CheckpointError(f"engine.load: {self.name} is a zip archive but not a torch.save checkpoint "
                                  "(no single <archive>/data.pkl)")
        prefix = found[0]
        if f"{prefix}/constants.pkl" in self.infos or any(n.startswith(f"{prefix}/code/") for n in self.infos):
            raise CheckpointError(f"engine.load: {self.name} is a TorchScript archive (torch.jit.save), which holds "
                                  "code; engine.load reads torch.save checkpoints only")
        return prefix

    def _read_small(self, record):
        info = self.infos.get(f"{self.prefix}/{record}")
        if info is None:
            return None
        try:
            return self.zf.read(info)
        except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as e:
            raise self.bad(f"record {record!r} is unreadable ({e})") from None

    def data_offset(self, info):
        self.f.seek(info.header_offset)
        h = self.f.read(30)
        if len(h) < 30 or h[:4] != b"PK\x03\x04":
            raise self.bad(f"record {info.filename!r} has no local header")
        name_len, extra_len = struct.unpack("<HH", h[26:30])
        return info.header_offset + 30 + name_len + extra_len

    def raw(self, key, nbytes):
        """Storage `key`'s bytes as a writable uint8 array (a copy-on-write map with mmap)."""
        record = f"{self.prefix}/data/{key}"
        info = self.infos.get(record)
        if info is None:
            raise self.bad(f"storage record {record!r} is missing")
        if info.file_size != nbytes:
            raise self.bad(f"storage record {record!r} has {info.file_size} bytes, the tensor needs {nbytes}")
        if info.compress_type != zipfile.ZIP_STORED:
            if self.mm is not None:
                raise _Reported(f"engine.load: {self.name}: mmap=True needs uncompressed storage records "
                                      f"({record!r} is compressed)")
            data = self._read_small(f"data/{key}")
            return np.frombuffer(bytearray(data), dtype=np.uint8)
        start = self.data_offset(info)
        if self.mm is not None:
            if start + nbytes > self.mm.size:
                raise self.bad(f"storage record {record!r} runs past the end of the file")
            return self.mm[start:start + nbytes]
        out = np.empty(nbytes, dtype=np.uint8)
        self.f.seek(start)
        got = self.f.readinto(memoryview(out)) if nbytes else 0
        if got != nbytes:
            raise self.bad(f"storage record {record!r} is cut short ({got} of {nbytes} bytes)")
        if zlib.crc32(out) != info.CRC:
            raise self.bad(f"storage record {record!r} fails its CRC32 check")
        return out

    def storage_of(self, pid):
        storage_type, key, location, numel = _storage_pid(pid, 5)
        nbytes = _nbytes(storage_type.dtype, numel, f"storage {key!r}")
        if key not in self.storages:
            self.storages[key] = _Storage(self.raw(key, nbytes), self.byteorder, storage_type.dtype, key,
                                          _location(location))
        st = self.storages[key]
        if st.raw.size != nbytes:
            raise self.bad(f"storage {key!r} is used with two different sizes")
        return st if st.dtype is storage_type.dtype else _Storage(st.raw, st.byteorder, storage_type.dtype, key,
                                                                  st.location)

    def load(self, builder):
        pkl = self._read_small("data.pkl")
        return _unpickle(io.BytesIO(pkl), builder, self.storage_of, self.name)


# ====================================================================== legacy format
class _LegacyReader:
    """torch.save(..., _use_new_zipfile_serialization=False): pickles, then the storages' bytes."""

    def __init__(self, f, name):
        self.f, self.name = f, name
        self.storages = {}  # root key -> _Storage (allocated now, filled after the object is read)
        self.views = {}

    def bad(self, why):
        return _Reported(f"engine.load: {self.name} is not a valid PyTorch checkpoint (truncated or corrupted?): "
                         f"{why}")

    def storage_of(self, pid):
        storage_type, key, location, numel, view = _storage_pid(pid, 6)
        dtype = storage_type.dtype
        nbytes = _nbytes(dtype, numel, f"storage {key!r}")
        if key not in self.storages:
            self.storages[key] = _Storage(np.zeros(nbytes, dtype=np.uint8), "little", dtype, key, _location(location))
        root = self.storages[key]
        if root.dtype is not dtype or root.raw.size != nbytes:
            raise self.bad(f"storage {key!r} is used with two different types or sizes")
        if view is None:
            return root
        if not isinstance(view, tuple) or len(view) != 3:
            raise self.bad(f"invalid storage view {view!r}")
        view_key, offset, size = view
        if view_key not in self.views:
            lo, n = _nbytes(dtype, offset, "view offset"), _nbytes(dtype, size, "view size")
            if lo + n > nbytes:
                raise self.bad(f"storage view {view_key!r} reaches past its storage {key!r}")
            self.views[view_key] = _Storage(root.raw[lo:lo + n], "little", dtype, str(view_key), root.location)
        return self.views[view_key]

    def load(self, builder):
        if sys.byteorder != "little":
            raise CheckpointError("engine.load: legacy-format PyTorch checkpoints are read on little-endian "
                                  "machines only; re-save the file with torch.save (zip format)")

        def no_storage(pid):
            raise self.bad("a storage reference outside the checkpoint's object")

        def plain():
            return _unpickle(self.f, builder, no_storage, self.name)

        if plain() != LEGACY_MAGIC:
            raise self.bad("invalid magic number")
        protocol = plain()
        if protocol != LEGACY_PROTOCOL:
            raise self.bad(f"invalid protocol version {protocol!r}")
        info = plain()
        if not isinstance(info, dict) or not info.get("little_endian", True):
            raise CheckpointError(f"engine.load: {self.name} was written on a big-endian machine in the legacy "
                                  "format, which is not supported")
        # The storages' bytes follow the object, but tensors are built while it is read (some as
        # copies): read it once to learn its storages and where it ends, fill them, read it again.
        start = self.f.tell()
        _unpickle(self.f, _Builder(lambda location: CPU, self.name), self.storage_of, self.name)
        keys = plain()
        if not isinstance(keys, list):
            raise self.bad("invalid storage key list")
        for key in keys:
            st = self.storages.get(str(key))
            if st is None:
                raise self.bad(f"storage {key!r} is listed but never used")
            head = self.f.read(8)
            if len(head) != 8:
                raise self.bad(f"the file ends before storage {key!r}")
            (numel,) = struct.unpack("<q", head)
            if numel * st.dtype.itemsize != st.raw.size:
                raise self.bad(f"storage {key!r} holds {numel} elements, the tensors need {st.raw.size} bytes")
            got = self.f.readinto(memoryview(st.raw)) if st.raw.size else 0
            if got != st.raw.size:
                raise self.bad(f"storage {key!r} is cut short ({got} of {st.raw.size} bytes)")
        self.f.seek(start)
        return _unpickle(self.f, builder, self.storage_of, self.name)


# ====================================================================== checking the result
_LEAVES = (type(None), bool, int, float, complex, str, bytes, bytearray, dtypes.dtype, device)
_CONTAINERS = (dict, OrderedDict, list, tuple, set, frozenset, Size)


def _check_tree(obj, name):
    """Everything the unpickler returned must be a plain container, a scalar, a dtype, a device
    or a tensor made here (a tensor whose state a BUILD opcode changed is refused too; an
    OrderedDict may carry plain attributes, such as a state_dict's `_metadata`)."""
    stack, seen = [(obj, "object")], set()
    while stack:
        x, where = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        t = type(x)
        if t in (Tensor, Parameter):
            if x.__dict__ or x.grad is not None or x.grad_fn is not None or x._global is not None:
                raise CheckpointError(f"engine.load: {name}: the tensor at {where} carries extra state")
        elif t in _LEAVES:
            pass
        elif t in _CONTAINERS:
            if t is OrderedDict and vars(x):  # a state_dict's `_metadata` (module versions), as torch keeps it
                if not all(isinstance(k, str) for k in vars(x)):
                    raise CheckpointError(f"engine.load: {name}: the OrderedDict at {where} has invalid attributes")
                stack.extend((v, f"{where}.{k}") for k, v in vars(x).items())
            if isinstance(x, dict):
                stack.extend((k, f"{where} (a key)") for k in x)
                stack.extend((v, f"{where}/{k}") for k, v in x.items())
            else:
                stack.extend((v, f"{where}/{i}") for i, v in enumerate(x))
        elif t is argparse.Namespace:  # e.g. DeiT's / MAE's saved `args`
            if not all(isinstance(k, str) for k in vars(x)):
                raise CheckpointError(f"engine.load: {name}: the argparse.Namespace at {where} has invalid attributes")
            stack.extend((v, f"{where}.{k}") for k, v in vars(x).items())
        elif isinstance(x, _Storage):
            raise CheckpointError(f"engine.load: {name}: {where} is a bare storage, not a tensor; the engine has no "
                                  "storage objects")
        elif isinstance(x, _UnsupportedDtype):
            raise CheckpointError(f"engine.load: {name}: {where} is {x!r}, a dtype the engine does not have")
        else:
            raise CheckpointError(f"engine.load: {name}: {where} is a {x!r}, which engine.load does not build")


# ====================================================================== entry point
def load(source, kind, map_location=None, mmap=False):
    """Read a PyTorch checkpoint of format `kind` ('zip' or 'legacy', from `detect`) into engine
    tensors placed as `map_location` says (`placement`; by default on the CPU, whatever device a
    tensor was saved from).

    mmap=True (zip format and a path only) maps the file copy-on-write instead of reading the tensor
    data: tensors are views of the mapping, changed in memory only."""
    name = _name(source)
    builder = _Builder(placement(map_location), name)
    is_path = not hasattr(source, "read")
    if mmap and (kind != "zip" or not is_path):
        raise ValueError(f"engine.load: mmap=True needs the path of a zip-format PyTorch checkpoint ({name} is "
                         f"{'a file object' if not is_path else 'in the legacy format'})")
    f = open(os.fspath(source), "rb") if is_path else source
    try:
        if kind == "zip":
            result = _ZipReader(f, name, os.fspath(source) if mmap else None).load(builder)
        elif kind == "legacy":
            result = _LegacyReader(f, name).load(builder)
        else:
            raise ValueError(f"unknown PyTorch checkpoint kind {kind!r}")
    except _Reported as e:
        raise CheckpointError(str(e)) from None
    finally:
        if is_path:
            f.close()
    _check_tree(result, name)
    return result
