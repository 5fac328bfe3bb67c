"""The machinery of the strict CuPy double: device arrays over numpy, with CuPy's rules enforced.

What a real GPU would refuse or make slow, the double refuses or counts:
  * a device array never turns into a host array implicitly (`np.asarray(d)` raises, as CuPy's
    `__array__` does); `.get()`, `.item()`, `float(d)`, `bool(d)` ... are allowed and counted as
    host synchronisations;
  * a numpy array (0-d included) is refused as an operand of a device computation, as CuPy's
    ufuncs and routines refuse it; numpy and Python scalars are fine;
  * dtypes CuPy has no kernels for (bfloat16, object, strings) are refused;
  * an operand on another device than the current one is refused;
  * every computation that writes new device memory counts one kernel launch.
The counters are `stats`; kernels (RawKernel, ElementwiseKernel, ReductionKernel) run through the
CPU emulators of tests/cupy_double/kernel_emulators.
"""
import bisect
import collections
import os
import traceback
import weakref

import numpy as np

from ._names import NAMES


class Stats:
    """Counters of one run: kernel launches, host synchronisations (device -> host reads),
    host -> device copies, and the CuPy names used."""

    def __init__(self):
        self.trace = False
        self.names = set()
        self.reset()

    clock = 0  # never reset: the events recorded so far (Event.record stamps each with it)

    def reset(self):
        self.launches = 0
        self.event_waits = []  # the clock stamps of the events the host waited for (Event.synchronize)
        self.async_d2h = 0  # device -> pinned host copies queued without a wait (get(blocking=False))
        self.by_name = collections.Counter()  # launches per routine / kernel name
        self.syncs = 0
        self.h2d = 0
        self.sync_sites = []
        self.capturing = False  # a Stream.begin_capture is open (tests/cupy_double/_cuda.py)
        self.capture_broken = False
        self.captured = []  # the capture's work, as thunks a Graph.launch re-runs (see record)

    def sync(self, what):
        if self.capturing:  # CUDA refuses a synchronisation inside a stream capture
            self.capture_broken = True
            from ._cuda import CUDARuntimeError
            raise CUDARuntimeError(f"cudaErrorStreamCaptureUnsupported: {what}: operation not permitted when "
                                   "stream is capturing")
        self.syncs += 1
        if self.trace:
            self.sync_sites.append((what, _caller()))


_pinned = weakref.WeakValueDictionary()  # id -> the numpy arrays cupyx.empty_pinned made


def empty_pinned(shape, dtype=float, order="C"):
    """cupyx.empty_pinned: a numpy array the double treats as page-locked (an asynchronous copy
    into it does not make the host wait)."""
    a = np.empty(shape, dtype=check_dtype(dtype), order=order)
    _pinned[id(a)] = a
    return a


def is_pinned(a):
    return isinstance(a, np.ndarray) and _pinned.get(id(a)) is a


def _caller():
    """The innermost frame outside the double (where a sync came from)."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if "cupy_double" not in frame.filename:
            return f"{frame.filename}:{frame.lineno} {frame.name}"
    return "?"


stats = Stats()

# ------------------------------------------------------------------ devices
# CUDA_VISIBLE_DEVICES="" hides every GPU from real CuPy; the double follows it
DEVICE_COUNT = 0 if os.environ.get("CUDA_VISIBLE_DEVICES") == "" else int(os.environ.get("CUPY_DOUBLE_DEVICES", "1"))
_current = [0]


def current_device():
    return _current[0]


def set_current_device(i):
    i = int(i)
    if not 0 <= i < DEVICE_COUNT:
        raise RuntimeError(f"cudaErrorInvalidDevice: invalid device ordinal {i} "
                           f"(the CuPy double has {DEVICE_COUNT} device(s))")
    _current[0] = i


# ------------------------------------------------------------------ dtypes
def check_dtype(dt):
    """CuPy's dtypes: bool, integers, floats (float16/32/64) and complex; nothing else."""
    d = np.dtype(dt)
    if d.kind not in "biufc" or d.itemsize > 16 or d == np.longdouble and d.itemsize > 8:
        raise TypeError(f"Unsupported dtype {d}")
    return d


# ------------------------------------------------------------------ fake device addresses
_ALIGN = 512
_next_addr = [1 << 32]
_addr_of = {}        # id(root numpy buffer) -> address
_roots = {}          # address -> weakref to root buffer
_sorted_addrs = []
_device_of = {}      # id(root numpy buffer) -> the device of the arrays whose `.data` was taken


def _root(a):
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _forget(addr, key):
    _roots.pop(addr, None)
    _addr_of.pop(key, None)
    _device_of.pop(key, None)
    i = bisect.bisect_left(_sorted_addrs, addr)
    if i < len(_sorted_addrs) and _sorted_addrs[i] == addr:
        del _sorted_addrs[i]


# CUPY_DOUBLE_RUN_SOURCES=1: raw kernels run their CUDA source on CPU threads (see _kernels.py),
# which dereference the device addresses the engine writes into tables (the multi-tensor
# kernels): addresses are then the numpy buffers' real ones
RUN_SOURCES = os.environ.get("CUPY_DOUBLE_RUN_SOURCES") == "1"


def address(a):
    """The fake device address of numpy array `a`'s first element (root base + byte offset); its
    real address under RUN_SOURCES."""
    root = _root(a)
    key = id(root)
    base = _addr_of.get(key)
    if base is None or _roots[base]() is not root:
        if RUN_SOURCES:
            base = root.__array_interface__["data"][0]
        else:
            base = _next_addr[0]
            _next_addr[0] += (root.nbytes // _ALIGN + 1) * _ALIGN
        _addr_of[key] = base
        _roots[base] = weakref.ref(root, lambda _, b=base, k=key: _forget(b, k))
        bisect.insort(_sorted_addrs, base)
    if a.size == 0:
        return base
    return base + (a.__array_interface__["data"][0] - root.__array_interface__["data"][0])


def view(ptr, dtype, count):
    """A writable flat numpy view of `count` items of `dtype` at fake device address `ptr`."""
    i = bisect.bisect_right(_sorted_addrs, int(ptr)) - 1
    root = _roots[_sorted_addrs[i]]() if i >= 0 else None
    dtype = np.dtype(dtype)
    if root is None:
        raise ValueError(f"address {ptr:#x} is not in any live device allocation")
    offset = int(ptr) - _sorted_addrs[i]
    if offset < 0 or offset + count * dtype.itemsize > root.nbytes:
        raise ValueError(f"{count} x {dtype} at {ptr:#x} runs past its allocation of {root.nbytes} bytes")
    # an allocation owns one block of memory, its axes in C order, F order or any other (astype
    # and copy keep a transposed input's layout, order="K"): the axes sorted by stride are that
    # block in C order
    block = root.transpose(np.argsort([-st for st in root.strides], kind="stable"))
    flat = block.reshape(-1).view(np.uint8) if block.flags.c_contiguous else None
    if flat is None:
        raise ValueError("address lookup into a non-contiguous allocation")
    return flat[offset: offset + count * dtype.itemsize].view(dtype)


def device_at(ptr):
    """The device of the allocation holding fake address `ptr`, when an array of it has handed out
    its `.data` (None if unknown)."""
    i = bisect.bisect_right(_sorted_addrs, int(ptr)) - 1
    root = _roots[_sorted_addrs[i]]() if i >= 0 else None
    return None if root is None else _device_of.get(id(root))


# ------------------------------------------------------------------ arrays
class Device:
    """cupy.cuda.Device: a context manager that makes device `id` current."""

    def __init__(self, device=None):
        self.id = current_device() if device is None else int(getattr(device, "id", device))
        self._prev = []

    def __enter__(self):
        self._prev.append(current_device())
        set_current_device(self.id)
        return self

    def __exit__(self, *exc):
        set_current_device(self._prev.pop())

    def use(self):
        set_current_device(self.id)

    @property
    def pci_bus_id(self):
        """The GPU's PCI bus id, which tells physical GPUs apart where ordinals do not (a rank
        that sees only its own GPU calls it cuda:0). CUPY_DOUBLE_FIRST_BUS offsets the double's
        buses; "local_rank" gives each rank of a node its own, as per-rank CUDA_VISIBLE_DEVICES."""
        first = os.environ.get("CUPY_DOUBLE_FIRST_BUS", "0")
        if first == "local_rank":
            first = os.environ.get("LOCAL_RANK", os.environ.get("MPI_LOCALRANKID", "0"))
        return f"0000:{int(first) + self.id + 1:02X}:00.0"

    def synchronize(self):
        stats.sync("Device.synchronize")

    def __eq__(self, other):
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self):
        return hash(("cuda", self.id))

    def __repr__(self):
        return f"<CUDA Device {self.id}>"


class MemoryPointer:
    """cupy.cuda.MemoryPointer: `mem` is the allocation (the same object for every view of it, as
    CuPy's Memory; here the root numpy array)."""
    __slots__ = ("ptr", "device_id", "mem")

    def __init__(self, ptr, device_id, mem=None):
        self.ptr = ptr
        self.device_id = device_id
        self.mem = mem


_IMPLICIT = ("Implicit conversion to a NumPy array is not allowed. "
             "Please use `.get()` to construct a NumPy array explicitly.")


class ndarray:
    """cupy.ndarray: a numpy array `_a` living on device `_dev`."""

    __slots__ = ("_a", "_dev", "__weakref__")
    __array_priority__ = 100

    def __init__(self, shape, dtype=float, memptr=None, strides=None, order="C"):
        if memptr is not None or strides is not None:
            raise NotImplementedError("the CuPy double does not emulate ndarray(memptr=, strides=)")
        self._a = np.empty(shape, check_dtype(dtype), order=order)
        self._dev = current_device()

    # ---------------------------------------------------------- attributes
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    itemsize = property(lambda self: self._a.itemsize)
    nbytes = property(lambda self: self._a.nbytes)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: wrap(self._a.T, self._dev))
    mT = property(lambda self: wrap(np.swapaxes(self._a, -1, -2), self._dev))
    real = property(lambda self: wrap(self._a.real, self._dev))
    imag = property(lambda self: wrap(self._a.imag, self._dev))
    device = property(lambda self: Device(self._dev))

    @property
    def base(self):
        return None if self._a.base is None else wrap(_root(self._a), self._dev)

    @property
    def data(self):
        root = _root(self._a)
        ptr = address(self._a)
        _device_of[id(root)] = self._dev
        return MemoryPointer(ptr, self._dev, root)

    @property
    def __cuda_array_interface__(self):
        a = self._a
        return {"shape": a.shape, "typestr": a.dtype.str, "version": 3,
                "data": (address(a), False), "strides": None if a.flags.c_contiguous else a.strides}

    # ---------------------------------------------------------- host conversion (counted syncs)
    def __array__(self, *args, **kwargs):
        raise TypeError(_IMPLICIT)

    def get(self, stream=None, order="C", out=None, blocking=True):
        if not blocking and out is not None and is_pinned(out):  # queued; the host does not wait
            if stats.capturing:
                raise NotImplementedError("the CuPy double does not emulate an asynchronous copy inside a capture")
            out[...] = self._a
            stats.async_d2h += 1
            return out
        stats.sync("get")  # blocking, or into pageable memory (CUDA copies that synchronously)
        host = np.array(self._a, order=order if order != "A" else "K")
        if out is not None:
            out[...] = host
            return out
        return host

    def set(self, arr, stream=None):
        if not isinstance(arr, np.ndarray) or arr.shape != self._a.shape:
            raise ValueError("ndarray.set needs a numpy array of the same shape")
        stats.h2d += 1
        self._a[...] = arr

    def item(self, *args):
        stats.sync("item")
        return self._a.item(*args)

    def tolist(self):
        stats.sync("tolist")
        return self._a.tolist()

    def _scalar(self, kind, conv):
        if self._a.size != 1:
            raise TypeError(f"only length-1 arrays can be converted to Python {kind}")
        stats.sync(kind)
        return conv(self._a.reshape(()).item())

    def __float__(self):
        return self._scalar("float", float)

    def __int__(self):
        return self._scalar("int", int)

    def __complex__(self):
        return self._scalar("complex", complex)

    def __bool__(self):
        if self._a.size != 1:
            raise ValueError("The truth value of an array with more than one element is ambiguous.")
        return self._scalar("bool", bool)

    def __repr__(self):
        stats.sync("repr")
        return repr(self._a).replace("array(", "array(", 1)

    def __str__(self):
        stats.sync("str")
        return str(self._a)

    def __format__(self, spec):
        stats.sync("format")
        return format(self._a.item() if self._a.ndim == 0 else self._a, spec)

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        if self._a.ndim == 0:
            raise TypeError("iteration over a 0-d array")
        return (wrap(row, self._dev) for row in self._a)

    def __hash__(self):
        raise TypeError("unhashable type: 'cupy.ndarray'")

    def __copy__(self):
        return self.copy()

    def __deepcopy__(self, memo):
        return self.copy()

    def __reduce__(self):
        stats.sync("pickle")
        return (_from_host, (np.array(self._a), self._dev))

    # ---------------------------------------------------------- indexing
    def __getitem__(self, key):
        k, advanced = unwrap_index(key, self._dev)
        if any(isinstance(p, np.ndarray) and p.dtype == np.bool_ for p in (k if isinstance(k, tuple) else (k,))):
            stats.sync("boolean-mask indexing")  # CuPy reads the mask's count back to size the result
        r = self._a[k]
        if advanced:
            stats.launches += 1
            out, src = wrap(r, self._dev), self._a
            record(lambda: refill([out._a], src[k]))
            return out
        return wrap(r, self._dev)

    def __setitem__(self, key, value):
        k, _ = unwrap_index(key, self._dev)
        if isinstance(value, np.ndarray):
            stats.h2d += 1  # CuPy copies a host value to the device here
            v = value
        else:
            v = unwrap(value, self._dev, "__setitem__")
        check_dtype(np.asarray(v).dtype if not isinstance(v, np.ndarray) else v.dtype)
        self._a[k] = v
        stats.launches += 1
        dst = self._a
        record(lambda: dst.__setitem__(k, v))

    # ---------------------------------------------------------- numpy protocol
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        wrapped = ufuncs.get(ufunc.__name__)
        if wrapped is None:
            return NotImplemented
        fn = wrapped if method == "__call__" else getattr(wrapped, method, None)
        if fn is None:
            return NotImplemented
        return fn(*inputs, **kwargs)

    def __array_function__(self, func, types, args, kwargs):
        import cupy_double
        module = func.__module__.replace("numpy", "cupy", 1)
        scope = NAMES.get(module.replace("cupy.core", "cupy") if module != "cupy" else "cupy", NAMES["cupy"])
        if func.__name__ not in scope:
            return NotImplemented
        target = cupy_double
        for part in module.split(".")[1:]:
            target = getattr(target, part, None)
            if target is None:
                return NotImplemented
        fn = getattr(target, func.__name__, None)
        return NotImplemented if fn is None else fn(*args, **kwargs)

    # ---------------------------------------------------------- cupy-only methods
    def scatter_add(self, slices, value):
        k, _ = unwrap_index(slices, self._dev)
        v, dst = unwrap(value, self._dev, "scatter_add"), self._a
        np.add.at(dst, k, v)
        stats.launches += 1
        record(lambda: np.add.at(dst, k, v))

    def scatter_max(self, slices, value):
        k, _ = unwrap_index(slices, self._dev)
        v, dst = unwrap(value, self._dev, "scatter_max"), self._a
        _extreme_at(np.maximum, dst, k, v)
        stats.launches += 1
        record(lambda: _extreme_at(np.maximum, dst, k, v))

    def scatter_min(self, slices, value):
        k, _ = unwrap_index(slices, self._dev)
        v, dst = unwrap(value, self._dev, "scatter_min"), self._a
        _extreme_at(np.minimum, dst, k, v)
        stats.launches += 1
        record(lambda: _extreme_at(np.minimum, dst, k, v))


def _extreme_at(np_ufunc, dst, k, v):
    """np.maximum/minimum.at as CuPy 14 computes them: its atomicMax/atomicMin for floats compare
    through fmaxf/fminf (cupy/atomics.cuh), which drop a NaN (numpy's fmax/fmin), and for double
    round every value they write to float32 (seen on an H200: the finite-difference checks of
    scatter_reduce amax failed)."""
    if dst.dtype.kind == "f":
        np_ufunc = np.fmax if np_ufunc is np.maximum else np.fmin
    np_ufunc.at(dst, k, v)
    if dst.dtype == np.float64:
        touched = np.zeros(dst.shape, bool)
        touched[k] = True
        dst[touched] = dst[touched].astype(np.float32)


def _from_host(host, dev):
    return wrap(np.array(host), dev)


def wrap(a, dev=None):
    """A double ndarray around numpy array `a` (numpy scalars become 0-d arrays, as CuPy's)."""
    if isinstance(a, np.generic):
        a = np.asarray(a)
    check_dtype(a.dtype)
    d = object.__new__(ndarray)
    d._a = a
    d._dev = current_device() if dev is None else dev
    return d


def wrap_result(r, dev):
    if isinstance(r, (np.ndarray, np.generic)):
        return wrap(r, dev)
    if isinstance(r, tuple):
        return tuple(wrap_result(x, dev) for x in r)
    if isinstance(r, list):
        return [wrap_result(x, dev) for x in r]
    return r


def unwrap(x, dev, what, host_ok=False):
    """The numpy data behind `x` for a device computation named `what`; host arrays refused."""
    if isinstance(x, ndarray):
        if x._dev != dev:
            raise ValueError(f"{what}: the device where the array resides ({x._dev}) is different from "
                             f"the current device ({dev}). Peer access has been activated? No: CuPy refuses this.")
        return x._a
    if isinstance(x, np.ndarray):
        if host_ok:
            stats.h2d += 1
            check_dtype(x.dtype)
            return x
        raise TypeError(f"Unsupported type {type(x)} (cupy.{what} takes device arrays; "
                        "a numpy array must be moved with cupy.asarray first)")
    if isinstance(x, (list, tuple)):
        return type(x)(unwrap(v, dev, what, host_ok) for v in x)
    if isinstance(x, np.generic):
        check_dtype(x.dtype)
    return x


def unwrap_index(key, dev):
    """An index for the numpy data; numpy index arrays are copied to the device (as CuPy does)."""
    parts = key if isinstance(key, tuple) else (key,)
    out, advanced = [], False
    for k in parts:
        if isinstance(k, ndarray):
            if k._dev != dev:
                raise ValueError("index array on another device")
            k, advanced = k._a, True
        elif isinstance(k, np.ndarray):
            stats.h2d += 1
            advanced = True
        elif isinstance(k, list):
            advanced = True
        out.append(k)
    return (tuple(out) if isinstance(key, tuple) else out[0]), advanced


def from_host(x, dtype=None, copy=True, order="K", ndmin=0):
    """cupy.array / cupy.asarray: host data (numpy, lists, scalars) copied to the current device."""
    dev = current_device()
    if isinstance(x, ndarray):
        a = x._a
        if x._dev != dev:
            a = a.copy()  # a peer copy
        r = np.array(a, dtype=dtype, copy=copy or None, order=order, ndmin=ndmin)
        if r is not a and not np.may_share_memory(r, a):
            stats.launches += 1
            record(lambda: refill([r], a.reshape(r.shape)))
        return wrap(r, dev)
    if hasattr(x, "__cuda_array_interface__") or hasattr(x, "__dlpack__") and not isinstance(x, np.ndarray):
        raise TypeError(f"the CuPy double cannot import {type(x)}")
    if stats.capturing:  # CUDA would capture the copy from this host buffer: a replay re-reads it stale
        raise RuntimeError("the CuPy double refuses a host-to-device copy inside a CUDA graph capture (a replay "
                           "would copy from a host buffer that no longer holds this data)")
    stats.h2d += 1
    host = np.array(x, dtype=dtype, copy=True, order=order, ndmin=ndmin)
    if host.dtype == object:
        raise TypeError(f"Unsupported type {type(x)}")
    return wrap(host, dev)


# ------------------------------------------------------------------ wrapping numpy routines
_NO_LAUNCH = {"empty", "empty_like", "shape", "ndim", "size", "result_type", "promote_types", "can_cast",
              "may_share_memory", "shares_memory", "iscomplexobj", "isrealobj", "isscalar", "dtype",
              "finfo", "iinfo", "broadcast_shapes", "min_scalar_type", "common_type"}
_WRITERS = {"copyto", "put_along_axis", "place", "putmask", "fill_diagonal", "put", "fill"}
_HOST_OK = {"ascontiguousarray", "asfortranarray"}


def _launches_for(name, result, inputs, kwargs):
    """One launch when the routine wrote device memory: a result not a view of an input, or `out=`."""
    if name in _NO_LAUNCH:
        return 0
    if name in _WRITERS or kwargs.get("out") is not None:
        return 1
    roots = {id(_root(a)) for a in inputs}
    results = result if isinstance(result, (tuple, list)) else (result,)
    for r in results:
        if isinstance(r, np.generic):
            return 1
        if isinstance(r, np.ndarray) and r.size and id(_root(r)) not in roots:
            return 1
    return 0


def _arrays_in(args):
    for x in args:
        if isinstance(x, np.ndarray):
            yield x
        elif isinstance(x, (list, tuple)):
            yield from _arrays_in(x)


def record(thunk):
    """Inside a capture, keep `thunk` (the work just done, re-doable on the same memory: inputs
    read from the arrays they were read from, outputs written into the arrays the capture made),
    so that Graph.launch replays it as a CUDA graph replays its kernels: the same parameters, the
    same addresses, no Python of the engine's in between."""
    if stats.capturing:
        stats.captured.append(thunk)


def _arrays_of(res):
    """The numpy arrays behind a wrapped routine result (an ndarray or a tuple/list of them)."""
    if isinstance(res, ndarray):
        return [res._a]
    if isinstance(res, (tuple, list)):
        return [a for x in res for a in _arrays_of(x)]
    return []


def refill(dsts, result):
    """Write a re-run's `result` (array, scalar or tuple of them) into the captured outputs."""
    srcs = list(result) if isinstance(result, (tuple, list)) else [result]
    for d, src in zip(dsts, srcs):
        # a view result (read-only broadcast, reshape, slice) aliases its input: nothing to write
        if d is not src and d.flags.writeable and not (isinstance(src, np.ndarray) and np.may_share_memory(d, src)):
            d[...] = src


# routines CuPy computes with cuBLAS (its wrappers refuse to run while a stream captures)
_CUBLAS_ROUTINES = {"matmul", "dot", "vdot", "inner", "outer", "tensordot", "einsum", "kron"}


def routine(name, fn, scope="cupy"):
    """A CuPy routine computing with numpy function `fn`."""
    def call(*args, **kwargs):
        stats.names.add(f"{scope}.{name}")
        if stats.capturing and (name in _CUBLAS_ROUTINES or scope == "cupy.linalg") and not (
                name == "einsum" and sum(isinstance(x, ndarray) for x in args[1:]) < 2):  # one operand: a reduction
            raise NotImplementedError(f"cupy.{name}: calling cuBLAS API during stream capture is currently "
                                      "unsupported (as CuPy's cuBLAS wrappers)")
        dev = current_device()
        host_ok = name in _HOST_OK
        a = unwrap(args, dev, name, host_ok)
        kw = {k: unwrap(v, dev, name, host_ok) for k, v in kwargs.items()}
        if "dtype" in kw and kw["dtype"] is not None:
            check_dtype(kw["dtype"])
        with np.errstate(all="ignore"):  # CuPy's kernels never warn about overflow or NaN
            r = fn(*a, **kw)
        n = _launches_for(name, r, list(_arrays_in(a)) + list(_arrays_in(kw.values())), kw)
        stats.launches += n
        stats.by_name[name] += n
        if name in _NO_LAUNCH and name not in ("empty", "empty_like"):
            return r
        res = wrap_result(r, dev)
        if stats.capturing and name not in _NO_LAUNCH:
            dsts = _arrays_of(res)

            def again():
                with np.errstate(all="ignore"):
                    refill(dsts, fn(*a, **kw))
            record(again)
        return res

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"cupy.{name} (numpy underneath, CuPy's rules on top)"
    return call


class ufunc:
    """A CuPy ufunc: call, and the methods real CuPy's ufuncs have (at, reduce, accumulate, ...)."""

    def __init__(self, np_ufunc):
        self._u = np_ufunc
        self.__name__ = self.name = np_ufunc.__name__
        self.nin, self.nout, self.nargs = np_ufunc.nin, np_ufunc.nout, np_ufunc.nargs
        self.types = np_ufunc.types
        self.__call__ = routine(self.name, np_ufunc)
        self.reduce = routine(self.name + ".reduce", np_ufunc.reduce)
        self.accumulate = routine(self.name + ".accumulate", np_ufunc.accumulate)
        self.reduceat = routine(self.name + ".reduceat", np_ufunc.reduceat)
        self.outer = routine(self.name + ".outer", np_ufunc.outer)

    def __call__(self, *args, **kwargs):
        return self.__dict__["__call__"](*args, **kwargs)

    def at(self, a, indices, b=None):
        stats.names.add(f"cupy.{self.name}.at")
        dev = current_device()
        k, _ = unwrap_index(indices, dev)
        args = (unwrap(a, dev, "at"), k) + (() if b is None else (unwrap(b, dev, "at"),))
        at = (lambda: _extreme_at(self._u, *args)) if self._u in (np.maximum, np.minimum) else \
            (lambda: self._u.at(*args))
        at()
        stats.launches += 1
        record(at)

    def __repr__(self):
        return f"<ufunc 'cupy_double.{self.name}'>"


ufuncs = {}


# ------------------------------------------------------------------ operators and methods
_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "truediv": np.true_divide,
           "floordiv": np.floor_divide, "mod": np.remainder, "pow": np.power, "matmul": np.matmul,
           "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor, "lshift": np.left_shift,
           "rshift": np.right_shift, "divmod": np.divmod}
_COMPARE = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
            "ge": np.greater_equal}
_UNARY = {"neg": np.negative, "pos": np.positive, "abs": np.absolute, "invert": np.invert}


def _binary(name, fn):
    op = routine(fn.__name__, fn)

    def forward(self, other):
        return op(self, other)

    def reflected(self, other):
        return op(other, self)

    def inplace(self, other):
        op(self, other, out=self)
        return self

    return forward, reflected, inplace


for _n, _f in _BINARY.items():
    _fwd, _ref, _inp = _binary(_n, _f)
    setattr(ndarray, f"__{_n}__", _fwd)
    setattr(ndarray, f"__r{_n}__", _ref)
    if _n != "divmod":
        setattr(ndarray, f"__i{_n}__", _inp)
for _n, _f in _COMPARE.items():
    setattr(ndarray, f"__{_n}__", _binary(_n, _f)[0])
for _n, _f in _UNARY.items():
    _op = routine(_f.__name__, _f)
    setattr(ndarray, f"__{_n}__", lambda self, _op=_op: _op(self))


def _method(name):
    fn = routine(name, lambda a, *args, **kwargs: getattr(a, name)(*args, **kwargs), "cupy.ndarray")

    def method(self, *args, **kwargs):
        return fn(self, *args, **kwargs)

    method.__name__ = name
    return method


# CuPy sorts with Thrust, whose sort ends with cudaStreamSynchronize (CuPy issue #9126): a host
# synchronisation at every sort, refused inside a stream capture. Its argsort is always stable.
def _thrust_sort(name, fn):
    def sort(*args, **kwargs):
        stats.sync(f"cupy.{name} (Thrust's sort synchronises the stream)")
        return fn(*args, **kwargs)

    return routine(name, sort)


def _stable_argsort(a, axis=-1, kind=None):
    if kind not in (None, "stable"):
        raise NotImplementedError(f"CuPy's argsort accepts only kind=None or 'stable', got {kind!r}")
    return a.argsort(axis=axis, kind="stable")


def _sort(a, axis=-1, kind=None):
    if kind not in (None, "stable"):
        raise NotImplementedError(f"CuPy's sort accepts only kind=None or 'stable', got {kind!r}")
    return np.sort(a, axis=axis, kind="stable")


def _sort_in_place(a, axis=-1, kind=None):
    a.sort(axis=axis, kind="stable" if kind is None else kind)


SORTS = {"argsort": _thrust_sort("argsort", _stable_argsort), "sort": _thrust_sort("sort", _sort),
         "lexsort": _thrust_sort("lexsort", np.lexsort),
         "unique": _thrust_sort("unique", np.unique)}  # a sort, and a result whose size is read back
ndarray.argsort = lambda self, axis=-1, kind=None: SORTS["argsort"](self, axis, kind)
ndarray.sort = lambda self, axis=-1, kind=None: _sort_in_place_routine(self, axis, kind)
_sort_in_place_routine = _thrust_sort("sort", _sort_in_place)

for _n in NAMES["cupy.ndarray"]:
    if not _n.startswith("_") and not hasattr(ndarray, _n) and callable(getattr(np.ndarray, _n, None)):
        setattr(ndarray, _n, _method(_n))
