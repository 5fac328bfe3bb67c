"""`engine.save` / `engine.load`: checkpoints as one safetensors file, never pickle.

A checkpoint is any nesting of dicts (plain or ordered, with str/int/float/bool/None keys), lists,
tuples, sets, frozensets and argparse.Namespace objects whose leaves are tensors, numpy arrays,
ints, floats, strings, bytes, bools and None (a model's state_dict, an optimizer's state_dict, a
training-state dict such as DeiT's `{'model': ..., 'args': args}`).

File layout (the safetensors format, readable by the `safetensors` package and by torch):

    8 bytes   little-endian u64 N: length of the JSON header
    N bytes   JSON header: {name: {"dtype", "shape", "data_offsets"}, ..., "__metadata__": {...}}
    rest      the tensors' raw little-endian bytes, back to back

Tensors are named after their path in the object (`model.fc.weight` for a state_dict under
"model"), so a saved flat state_dict is an ordinary safetensors state dict. `__metadata__`
holds, as JSON strings, the structure of everything that is not a tensor (container kinds, key
order and key types, scalars), each tensor's engine dtype, and CRC32s of the header and of the
data section.
bfloat16 is stored with safetensors dtype "BF16" (raw 16-bit words).

Loading parses only JSON and raw numbers, so it can never execute code. Every length, offset,
dtype and reference is checked, and the data checksum is verified, before any tensor is built:
a truncated or corrupted file raises `CheckpointError` naming the file, never a half-loaded
result. Files are written atomically (temp file in the same directory, fsync, os.replace), so a
crash mid-save leaves the previous checkpoint intact.
"""
import argparse
import base64
import json
import math
import os
import struct
import tempfile
import zlib
from collections import OrderedDict

import numpy as np

from . import _torch_checkpoint
from ._torch_checkpoint import CheckpointError
from .backend import CPU, dtypes, to_device
from .tensor import Parameter, Tensor

__all__ = ["save", "load", "CheckpointError"]

FORMAT = "engine.safetensors/1"
_MAX_HEADER = 100 * 1024 * 1024  # same bound as the safetensors library

# safetensors dtype code <-> numpy dtype (explicitly little endian)
_ST_TO_NP = {
    "BOOL": np.dtype(np.bool_), "U8": np.dtype("u1"), "I8": np.dtype("i1"), "I16": np.dtype("<i2"),
    "U16": np.dtype("<u2"), "I32": np.dtype("<i4"), "U32": np.dtype("<u4"), "I64": np.dtype("<i8"),
    "U64": np.dtype("<u8"), "F16": np.dtype("<f2"), "F32": np.dtype("<f4"), "F64": np.dtype("<f8"),
    "BF16": dtypes.bfloat16.np,
}
_NP_TO_ST = {v: k for k, v in _ST_TO_NP.items()}


# metadata fields engine.save always writes; a file with any of them is checked for all of them
_ENGINE_KEYS = frozenset({"format", "structure", "tensors", "data_crc32", "data_bytes", "header_crc32"})


# ====================================================================== save
class _Writer:
    """Turns an object tree into (structure JSON, named arrays)."""

    def __init__(self):
        self.arrays = []  # (name, host ndarray)
        self.tensor_meta = []  # per-array info: engine dtype name, kind
        self.names = set()
        self.seen = {}  # id(tensor) -> index, so a tensor shared twice is stored once

    def _name(self, path):
        base = ".".join(path) or "tensor"
        name, n = base, 1
        while name in self.names or name == "__metadata__":
            name, n = f"{base}#{n}", n + 1
        self.names.add(name)
        return name

    def _array(self, obj, path, kind):
        key = id(obj)
        if key in self.seen:
            return self.seen[key]
        if kind == "ndarray":
            a, dtype_name = obj, None
        else:
            a = obj._data
            if obj._device != CPU:
                a = to_device(a, CPU)
            dtype_name = obj.dtype.name
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        if a.dtype not in _NP_TO_ST:
            raise TypeError(f"engine.save: {'/'.join(path) or 'object'}: unsupported array dtype {a.dtype}")
        idx = len(self.arrays)
        if not a.flags.c_contiguous:
            a = a.copy(order="C")  # (np.ascontiguousarray would turn a 0-d array into 1-d)
        self.arrays.append((self._name(path), a))
        self.tensor_meta.append(dtype_name)
        self.seen[key] = idx  # obj stays alive (it is part of the tree being saved), so ids are stable
        return idx

    def encode(self, obj, path=()):
        where = "/".join(path) or "object"
        if isinstance(obj, Tensor):
            if obj.is_global:
                raise TypeError(f"engine.save: {where} is a global tensor; save obj.to_local() or gather it first")
            node = {"T": self._array(obj, path, "tensor")}
            if obj._device != CPU:  # where it was saved from: what a map_location dict or function sees
                node["dev"] = str(obj._device)
            if isinstance(obj, Parameter):
                node["param"] = bool(obj.requires_grad)
            elif obj.requires_grad:
                node["rg"] = True
            return node
        if isinstance(obj, np.ndarray):
            return {"A": self._array(obj, path, "ndarray")}
        if obj is None or isinstance(obj, (bool, str)):
            return obj
        if isinstance(obj, (int, np.integer)) and not isinstance(obj, np.bool_):
            return {"i": str(int(obj))} if abs(int(obj)) >= 2**53 else int(obj)
        if isinstance(obj, np.bool_):
            return bool(obj)
        if isinstance(obj, (float, np.floating)):
            f = float(obj)
            return f if math.isfinite(f) else {"f": repr(f)}
        if isinstance(obj, dtypes.dtype):
            return {"dtype": obj.name}
        if isinstance(obj, dict):
            items = []
            for k, v in obj.items():
                items.append([self.encode_key(k, where), self.encode(v, path + (str(k),))])
            return {"OD" if isinstance(obj, OrderedDict) else "D": items}
        if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
            return {"U": [self.encode(v, path + (str(i),)) for i, v in enumerate(obj)]}
        if isinstance(obj, list):
            return {"L": [self.encode(v, path + (str(i),)) for i, v in enumerate(obj)]}
        if isinstance(obj, (set, frozenset)):
            return {"FS" if isinstance(obj, frozenset) else "S":
                    [self.encode(v, path + (str(i),)) for i, v in enumerate(obj)]}
        if isinstance(obj, (bytes, bytearray)):
            return {"B" if isinstance(obj, bytes) else "BA": base64.b64encode(obj).decode("ascii")}
        if type(obj) is argparse.Namespace:  # an attribute bag: its attributes, as a dict's items
            return {"NS": [[k, self.encode(v, path + (k,))] for k, v in vars(obj).items()]}
        raise TypeError(
            f"engine.save: cannot save {where} of type {type(obj).__name__}; supported: tensors, numpy "
            "arrays, dict/OrderedDict, list, tuple, set, frozenset, argparse.Namespace, int, float, str, bytes, "
            "bool, None (no pickle)"
        )

    def encode_key(self, k, where):
        if isinstance(k, (str, bool)) or k is None:
            return k
        if isinstance(k, (int, np.integer)):
            return {"i": str(int(k))}
        if isinstance(k, (float, np.floating)):
            return {"f": repr(float(k))}
        if isinstance(k, tuple):
            return {"U": [self.encode_key(x, where) for x in k]}
        raise TypeError(f"engine.save: {where}: dict key {k!r} of type {type(k).__name__} is not supported "
                        "(use str, int, float, bool, None or tuples of them)")


def _serialize(obj):
    """The complete file contents as a list of byte chunks."""
    w = _Writer()
    structure = w.encode(obj)
    header = {}
    offset = 0
    crc = 0
    for name, a in w.arrays:
        nbytes = a.nbytes
        st = _NP_TO_ST[a.dtype]
        header[name] = {"dtype": st, "shape": list(a.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
        crc = zlib.crc32(_raw(a), crc)
    meta = {
        "format": FORMAT,
        "structure": json.dumps(structure, separators=(",", ":"), allow_nan=False),
        "tensors": json.dumps([[name, d] for (name, _), d in zip(w.arrays, w.tensor_meta)], separators=(",", ":")),
        "data_crc32": str(crc),
        "data_bytes": str(offset),
    }
    header["__metadata__"] = meta
    meta["header_crc32"] = str(_header_crc(header))
    hbytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hbytes += b" " * (-len(hbytes) % 8)  # safetensors aligns the data section to 8 bytes
    chunks = [struct.pack("<Q", len(hbytes)), hbytes]
    chunks += [_raw(a) for _, a in w.arrays if a.nbytes]
    return chunks


def _raw(a):
    """The bytes of a C-contiguous array, without a copy (works for bfloat16, which buffers can't name)."""
    return memoryview(a.reshape(-1).view(np.uint8))


def _header_crc(header):
    """CRC32 of the header's canonical JSON, leaving out the checksum field itself: any edit of the
    header that still parses (a changed digit, shape or name) is caught."""
    meta = {k: v for k, v in header.get("__metadata__", {}).items() if k != "header_crc32"}
    canon = dict(header, __metadata__=meta)
    return zlib.crc32(json.dumps(canon, sort_keys=True, separators=(",", ":")).encode("utf-8"))


def save(obj, path):
    """Save `obj` (tensors in nested dicts/lists/tuples with plain Python values) to `path`.

    `path` is a str / os.PathLike (written atomically) or a binary file object."""
    chunks = _serialize(obj)
    if hasattr(path, "write"):
        for c in chunks:
            path.write(c)
        return
    atomic_write(path, chunks)


def atomic_write(path, chunks):
    """Write `chunks` (bytes) to `path` so that a crash leaves either the old file or the new one:
    a temporary file in the same directory, fsync, rename over `path`, fsync the directory."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        # mkstemp makes the file private (0600); the result gets what open() would give it
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, "wb") as f:
            for c in chunks:
                f.write(c)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(directory)


def current_umask():
    """The process's file-creation mask. Linux reports it in /proc/self/status; elsewhere it is
    read by setting it and restoring it at once (a file another thread creates in between would
    get 0o022, hence /proc first)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def fsync_dir(directory):
    """Make the rename itself durable (POSIX); harmless where directories can't be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ====================================================================== load
def _read_all(path):
    if hasattr(path, "read"):
        data = path.read()
        return bytearray(data), getattr(path, "name", "<file object>")
    path = os.fspath(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        buf = bytearray(size)
        n = f.readinto(buf)
        if n != size:
            del buf[n:]
    return buf, path


def _parse(buf, name):
    """Validate everything about the file before any tensor is built.

    Returns (header without __metadata__, metadata, offset of the data section, engine_file)."""

    def bad(why):
        return CheckpointError(f"engine.load: {name} is not a valid checkpoint (truncated or corrupted?): {why}")

    if len(buf) < 8:
        raise bad(f"file has {len(buf)} bytes, fewer than the 8-byte header length")
    (n,) = struct.unpack_from("<Q", buf, 0)
    if n > _MAX_HEADER or 8 + n > len(buf):
        raise bad(f"header length {n} does not fit in a file of {len(buf)} bytes")
    try:
        header = json.loads(bytes(buf[8:8 + n]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise bad(f"header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise bad("header is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise bad("__metadata__ must map strings to strings")
    engine_file = bool(_ENGINE_KEYS & set(meta))
    if engine_file:  # written by engine.save: every field must be there, and both checksums match
        if not _ENGINE_KEYS <= set(meta) or meta["format"] != FORMAT:
            raise bad(f"engine metadata incomplete or of an unknown format ({sorted(meta)})")
        if str(_header_crc(dict(header, __metadata__=meta))) != meta["header_crc32"]:
            raise bad("header checksum mismatch")
    data_len = len(buf) - 8 - n
    spans = []
    for key, info in header.items():
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise bad(f"entry {key!r} is malformed")
        dt, shape, offs = info["dtype"], info["shape"], info["data_offsets"]
        if dt not in _ST_TO_NP:
            raise bad(f"entry {key!r} has unknown dtype {dt!r}")
        if (not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                                   for s in shape)):
            raise bad(f"entry {key!r} has invalid shape {shape!r}")
        if (not isinstance(offs, list) or len(offs) != 2 or not all(isinstance(o, int) for o in offs)
                or not 0 <= offs[0] <= offs[1]):
            raise bad(f"entry {key!r} has invalid data_offsets {offs!r}")
        expect = math.prod(shape) * _ST_TO_NP[dt].itemsize
        if offs[1] - offs[0] != expect:
            raise bad(f"entry {key!r}: {offs[1] - offs[0]} bytes for shape {shape} of {dt} (needs {expect})")
        if offs[1] > data_len:
            raise bad(f"entry {key!r} ends at byte {offs[1]} of the data section but the file holds only "
                      f"{data_len} data bytes")
        spans.append((offs[0], offs[1]))
    spans.sort()
    pos = 0
    for b, e in spans:
        if b != pos:
            raise bad("tensor data sections overlap or leave gaps")
        pos = e
    if pos != data_len:
        raise bad(f"the data section has {data_len} bytes but the tensors account for {pos}")
    if engine_file:
        crc = zlib.crc32(memoryview(buf)[8 + n:])
        if str(crc) != meta["data_crc32"]:
            raise bad("tensor data checksum mismatch")
    return header, meta, 8 + n, engine_file


class _Reader:
    """Turns a parsed file back into the object tree (the inverse of _Writer). Every reference
    and value is checked; anything malformed raises CheckpointError naming the file."""

    def __init__(self, buf, name, header, base, place):
        self.buf, self.name, self.header, self.base, self.place = buf, name, header, base, place
        self.table = []
        self.built = {}  # table index -> array
        self.tensors = {}  # table index -> Tensor: shared tensors come back shared

    def bad(self, why):
        return CheckpointError(f"engine.load: {self.name} is not a valid checkpoint (corrupted?): {why}")

    def array(self, key):
        info = self.header[key]
        b, _ = info["data_offsets"]
        a = np.frombuffer(self.buf, dtype=_ST_TO_NP[info["dtype"]], count=math.prod(info["shape"]),
                          offset=self.base + b).reshape(info["shape"])
        if a.dtype.byteorder == "<" and not np.little_endian:
            a = a.astype(a.dtype.newbyteorder("="))
        return a

    def tensor(self, a, requires_grad=False, param=False, location="cpu"):
        dev = self.place(location)
        if dev != CPU:
            a = to_device(a, dev)
        t = Tensor._make(a, dev)
        if param:
            return Parameter(t, requires_grad=requires_grad)
        if requires_grad:
            t.requires_grad_(True)
        return t

    def plain_state_dict(self):
        """A plain safetensors file (e.g. written by the safetensors library): name -> tensor."""
        keys = sorted(self.header, key=lambda k: self.header[k]["data_offsets"][0])
        return OrderedDict((k, self.tensor(self.array(k))) for k in keys)

    def engine_object(self, meta):
        """The object tree of a file engine.save wrote."""
        try:
            structure = json.loads(meta["structure"])
            self.table = json.loads(meta["tensors"])
        except (KeyError, ValueError) as e:
            raise self.bad(f"engine metadata is unreadable ({e})") from None
        if not isinstance(self.table, list) or len(self.table) != len(self.header) or any(
                not isinstance(r, list) or len(r) != 2 or r[0] not in self.header for r in self.table):
            raise self.bad("engine tensor table does not match the header")
        try:
            return self.decode(structure)
        except RecursionError:
            raise self.bad("structure nested too deeply") from None

    def get(self, idx, kind):
        """The array of table entry `idx`, viewed as its engine dtype for a tensor ("T")."""
        if not isinstance(idx, int) or not 0 <= idx < len(self.table):
            raise self.bad(f"tensor reference {idx!r} out of range")
        if idx not in self.built:
            key, dtype_name = self.table[idx]
            a = self.array(key)
            if kind == "T":
                if dtype_name not in dtypes._BY_NAME or dtypes._BY_NAME[dtype_name].np.itemsize != a.dtype.itemsize:
                    raise self.bad(f"tensor {key!r} has invalid engine dtype {dtype_name!r}")
                want = dtypes._BY_NAME[dtype_name].np
                if a.dtype != want:
                    a = a.view(want)
            self.built[idx] = a
        return self.built[idx]

    def decode(self, node):
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if isinstance(node, dict) and "T" in node:
            idx = node["T"]
            if idx not in self.tensors:
                location = node.get("dev", "cpu")
                if not isinstance(location, str):
                    raise self.bad(f"invalid tensor location {location!r}")
                self.tensors[idx] = self.tensor(self.get(idx, "T"), param="param" in node, location=location,
                                                requires_grad=node.get("rg", False) or node.get("param", False))
            return self.tensors[idx]
        if isinstance(node, dict) and len(node) == 1:
            (tag, val), = node.items()
            if tag == "A":
                return self.get(val, "A")
            if tag in ("D", "OD") and isinstance(val, list):
                pairs = [self.decode_pair(item) for item in val]
                return OrderedDict(pairs) if tag == "OD" else dict(pairs)
            if tag == "L" and isinstance(val, list):
                return [self.decode(v) for v in val]
            if tag == "U" and isinstance(val, list):
                return tuple(self.decode(v) for v in val)
            if tag in ("S", "FS") and isinstance(val, list):
                try:
                    return (set if tag == "S" else frozenset)(self.decode(v) for v in val)
                except TypeError:
                    raise self.bad("a set holds an unhashable value") from None
            if tag in ("B", "BA") and isinstance(val, str):
                try:
                    raw = base64.b64decode(val.encode("ascii"), validate=True)
                except (ValueError, UnicodeEncodeError):
                    raise self.bad("invalid bytes value") from None
                return raw if tag == "B" else bytearray(raw)
            if tag == "NS" and isinstance(val, list):
                pairs = [self.decode_pair(item) for item in val]
                if not all(isinstance(k, str) for k, _ in pairs):
                    raise self.bad("an argparse.Namespace attribute name is not a string")
                return argparse.Namespace(**dict(pairs))
            if tag in ("i", "f", "dtype") and isinstance(val, str):
                return self.decode_scalar(tag, val)
        raise self.bad(f"unknown structure node {str(node)[:80]}")

    def decode_pair(self, item):
        if not isinstance(item, list) or len(item) != 2:
            raise self.bad("malformed dict entry")
        return self.decode_key(item[0]), self.decode(item[1])

    def decode_scalar(self, tag, val):
        try:
            if tag == "i":
                return int(val)
            if tag == "f":
                return float(val)
            return dtypes._BY_NAME[val]
        except (ValueError, KeyError):
            raise self.bad(f"invalid scalar {val!r}") from None

    def decode_key(self, k):
        if k is None or isinstance(k, (bool, str)):
            return k
        if isinstance(k, dict) and len(k) == 1:
            (tag, val), = k.items()
            if tag in ("i", "f") and isinstance(val, str):
                return self.decode_scalar(tag, val)
            if tag == "U" and isinstance(val, list):
                return tuple(self.decode_key(x) for x in val)
        raise self.bad(f"invalid dict key {k!r}")


def load(path, map_location=None, *, weights_only=True, mmap=None):
    """Load what `save` wrote (or any safetensors file, as a name -> tensor OrderedDict), or a
    PyTorch checkpoint written by torch.save (read by engine._torch_checkpoint, never running code
    from the file); the format is told by the file's first bytes.

    Tensors come back on the CPU unless `map_location` says otherwise, as torch.load's: a device
    ('cuda', 'cuda:1'), a dict remapping saved locations ({'cuda:0': 'cpu'}) or a function
    `f(storage, location)` (`lambda s, loc: s` keeps the CPU here; `s.cuda(0)`), where a tensor's
    location is the device it was saved from ('cpu' for files written before engine.save recorded it).
    `weights_only` can only be True: no file's code is ever executed. `mmap=True` maps a zip-format
    PyTorch checkpoint instead of reading it; an engine file is always read in full (its checksum
    covers every byte)."""
    _torch_checkpoint.check_options(weights_only, mmap)
    kind, path = _torch_checkpoint.detect(path)
    if kind is not None:
        return _torch_checkpoint.load(path, kind, map_location, mmap=bool(mmap))
    buf, name = _read_all(path)
    header, meta, base, engine_file = _parse(buf, name)
    reader = _Reader(buf, name, header, base, _torch_checkpoint.placement(map_location))
    return reader.engine_object(meta) if engine_file else reader.plain_state_dict()
