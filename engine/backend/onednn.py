"""oneDNN (Intel's deep-learning kernel library) through ctypes: the CPU backend's convolutions.

Why: conv2d as im2col + one matrix product (engine/ops/conv.py) took about twice PyTorch's time
on small 3x3 convolutions ([8,16,16,16] x [32,16,3,3]: forward 0.47 ms against 0.20-0.33), and
no product-based convolution gets closer: the im2col copy, the product and the layout shuffle
around it are each a pass that a direct convolution never makes. PyTorch's CPU convolutions are
oneDNN's direct (JIT-compiled) kernels; this module calls the same library.

How: `libdnnl` from the `onednn-cpu-gomp` wheel (x86-64 Linux; installed with the project
there), loaded with ctypes, so nothing is compiled here. Each distinct convolution pass (forward,
input gradient, weight gradient; shapes, stride, padding, dilation, groups) gets a *plan* once:
its primitive descriptor with memory format `any`, so that oneDNN picks its blocked layout and
its direct kernel, the primitive, and reorders between the caller's plain NCHW / OIHW numpy
arrays and blocked buffers. A call then sets the arrays' addresses (the blocked ones are the
call's own buffers), runs the reorders and the primitive, and returns a fresh array. Only float32 C-contiguous numpy
arrays go here; anything else (float64, half types, empty tensors, a convolution oneDNN
refuses) returns None and the caller runs the numpy kernels, which stay the reference this is
tested against (tests/test_onednn_backend.py).

Threads: oneDNN runs on OpenMP (GNU libgomp) threads, as many as the engine's own pool
(`engine.backend.parallel.get_num_threads()`; the calling thread's OpenMP setting is put back
after each call, since PyTorch's libgomp, when torch is imported first, is the same library).
How long an idle OpenMP thread spins before it sleeps is a trade, measured on the 2-vCPU VM
(conv forward, then a product on the engine's pool): sleeping at once (OMP_WAIT_POLICY=PASSIVE)
made every convolution wait for a wake-up (0.61 against 0.27 ms); libgomp's default of 300,000
spins kept a core busy through the next op (the product 2x slower). So, unless OMP_WAIT_POLICY
or GOMP_SPINCOUNT is set, libgomp loads here with GOMP_SPINCOUNT=3000 (the environment is put
back right after). If torch loaded libgomp first, its settings stand.

Off switch: `ENGINE_ONEDNN=0` (or the library missing, or any other machine), or
`engine.backends.mkldnn.enabled = False` as in PyTorch: convolutions then run on numpy.
`available()` says whether the library loaded; `why_unavailable()` why not.
"""
import collections
import ctypes
import os
import threading

import numpy as np

from . import buffers
from ._native import library_candidates, switched_off
from .parallel import get_num_threads

_lib = None
_omp_set_num_threads = _omp_get_max_threads = None
_why_not = "not loaded yet"
_engine = None
_stream = None
enabled = True  # engine.backends.mkldnn.enabled

# oneDNN's C enums (oneapi/dnnl/dnnl_types.h, v3)
_CPU = 1
_IN_ORDER = 1
_F32 = 3
_TAG_ANY = 1
_TAG_PLAIN = {1: 2, 4: 5, 5: 6}  # ndims -> dnnl_a / dnnl_abcd / dnnl_abcde
_FORWARD_TRAINING = 64
_CONVOLUTION_DIRECT = 1
_QUERY_IMPL_INFO = 8
_QUERY_SRC, _QUERY_DIFF_SRC, _QUERY_WEIGHTS, _QUERY_DIFF_WEIGHTS, _QUERY_DST, _QUERY_DIFF_DST = 129, 130, 131, 132, \
    133, 134
_ARG_SRC, _ARG_DST, _ARG_WEIGHTS, _ARG_BIAS = 1, 17, 33, 41
_ARG_DIFF_SRC, _ARG_DIFF_DST, _ARG_DIFF_WEIGHTS = 129, 145, 161

_Dims = ctypes.c_int64 * 12
_VP = ctypes.c_void_p


class _ExecArg(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_int), ("memory", _VP)]


def _candidates():
    return library_candidates("ENGINE_ONEDNN_LIBRARY", "libdnnl.so.3*", ["libdnnl.so.3"])


def _load():
    """Load libdnnl and make its CPU engine and stream once; on any failure leave `_lib` None and
    say why."""
    global _lib, _why_not, _engine, _stream, _omp_set_num_threads, _omp_get_max_threads
    if switched_off("ENGINE_ONEDNN"):
        _why_not = "turned off by ENGINE_ONEDNN=0"
        return
    lib = _load_library()
    if lib is None:
        _why_not = "libdnnl not found (pip install onednn-cpu-gomp; x86-64 Linux only)"
        return
    path = lib._name
    try:
        lib.dnnl_primitive_desc_query_md.restype = _VP
        lib.dnnl_primitive_desc_query_md.argtypes = [_VP, ctypes.c_int, ctypes.c_int]
        lib.dnnl_memory_desc_get_size.restype = ctypes.c_size_t
        lib.dnnl_memory_desc_get_size.argtypes = [_VP]
        lib.dnnl_memory_desc_equal.argtypes = [_VP, _VP]
        lib.dnnl_memory_set_data_handle.argtypes = [_VP, _VP]
        lib.dnnl_primitive_execute.argtypes = [_VP, _VP, ctypes.c_int, _VP]
        lib.dnnl_stream_wait.argtypes = [_VP]
        engine, stream = _VP(), _VP()
        _ok(lib.dnnl_engine_create(ctypes.byref(engine), _CPU, ctypes.c_size_t(0)), "dnnl_engine_create")
        _ok(lib.dnnl_stream_create(ctypes.byref(stream), engine, _IN_ORDER), "dnnl_stream_create")
        omp = ctypes.CDLL("libgomp.so.1")  # the OpenMP runtime libdnnl is linked against (loaded by now)
        omp.omp_set_num_threads.argtypes = [ctypes.c_int]
    except (AttributeError, OSError, RuntimeError) as e:
        _why_not = f"{path}: {e}"
        return
    _lib, _engine, _stream = lib, engine, stream
    _omp_set_num_threads, _omp_get_max_threads = omp.omp_set_num_threads, omp.omp_get_max_threads
    _why_not = None


def _load_library():
    """libdnnl loaded (libgomp with it, under the spin count the module docstring explains), or
    None."""
    spin = "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ
    if spin:
        os.environ["GOMP_SPINCOUNT"] = "3000"  # read by libgomp when it loads
    try:
        for path in _candidates():
            try:
                return ctypes.CDLL(path)
            except OSError:
                continue
        return None
    finally:
        if spin:
            del os.environ["GOMP_SPINCOUNT"]


class _Error(RuntimeError):
    pass


def _ok(status, what):
    if status != 0:
        raise _Error(f"{what} failed (dnnl_status_t {status})")


def available():
    return _lib is not None


def why_unavailable():
    """None when oneDNN is in use, else the reason."""
    return _why_not


def in_use():
    """Whether convolutions go to oneDNN now: loaded, not switched off by
    engine.backends.mkldnn.enabled, and not in a child forked after it loaded (libgomp's threads
    do not survive a fork: a forked DataLoader worker convolves on numpy)."""
    return _lib is not None and enabled and not _forked


_forked = False


def _after_fork_in_child():
    global _forked
    _forked = _lib is not None


def implementation(kind, *args):
    """oneDNN's name for the kernel a plan runs (e.g. 'jit:avx2'), or None without a plan;
    `kind` and `args` as `_plan` takes them. For tests and the benchmark notes."""
    plan = _plan(kind, *args)
    return None if plan is None else plan.impl


# ------------------------------------------------------------------ oneDNN objects
class _Scope:
    """Descriptors made while planning, destroyed when planning ends: memory objects, primitives
    and reorder descriptors copy what they need from them (oneDNN v3)."""

    def __init__(self):
        self.mds, self.pds = [], []

    def md(self, shape, tag):
        md = _VP()
        _ok(_lib.dnnl_memory_desc_create_with_tag(ctypes.byref(md), len(shape), _Dims(*shape), _F32, tag),
            "dnnl_memory_desc_create_with_tag")
        self.mds.append(md)
        return md

    def plain(self, shape):
        return self.md(shape, _TAG_PLAIN[len(shape)])

    def any(self, shape):
        return self.md(shape, _TAG_ANY)

    def pd(self, create, what, *args):
        pd = _VP()
        self.pds.append(pd)
        _ok(create(ctypes.byref(pd), *args), what)
        return pd

    def close(self):
        for pd in self.pds:
            if pd.value:
                _lib.dnnl_primitive_desc_destroy(pd)
        for md in self.mds:
            _lib.dnnl_memory_desc_destroy(md)


class _Plan:
    """One convolution pass: the primitive, its arguments bound to memory objects, and the
    reorders between the caller's plain arrays and the blocked buffers the primitive reads and
    writes. `slots` are the user arrays in call order: (exec arg, plain shape, the query for the
    layout the primitive wants (None: plain), is output); the last one is the pass's output."""

    def __init__(self, scope, pd, slots):
        name = ctypes.c_char_p()
        _lib.dnnl_primitive_desc_query(pd, _QUERY_IMPL_INFO, 0, ctypes.byref(name))
        self.impl = name.value.decode() if name.value else "?"
        self.memories, self.primitives = [], []  # owned: destroyed by close()
        self.user = []  # memory objects whose handle is each call's array
        self.blocked = []  # (memory object, float32 count): a pooled buffer per call, not kept
        self.out_shape = slots[-1][1]
        self.closed = False
        self.lock = threading.Lock()
        try:
            self._build(scope, pd, slots)
        except BaseException:
            self.close()  # what was made before the failure
            raise

    def _build(self, scope, pd, slots):
        before, after, prim_args = [], [], []
        for arg, shape, query, is_out in slots:
            plain = scope.plain(shape)
            user = self._memory(plain, 1)  # any non-null handle; set per call
            self.user.append(user)
            want = None if query is None else _lib.dnnl_primitive_desc_query_md(pd, query, 0)
            if not want or _lib.dnnl_memory_desc_equal(want, plain):
                prim_args.append((arg, user))
                continue
            want = _VP(want)  # owned by pd (a bare int would pass as a 32-bit C int)
            blocked = self._memory(want, 1)
            self.blocked.append((blocked, -(-_lib.dnnl_memory_desc_get_size(want) // 4)))
            prim_args.append((arg, blocked))
            src, dst = (blocked, user) if is_out else (user, blocked)
            src_md, dst_md = (want, plain) if is_out else (plain, want)
            rpd = scope.pd(_lib.dnnl_reorder_primitive_desc_create, "dnnl_reorder_primitive_desc_create", src_md,
                           _engine, dst_md, _engine, None)
            (after if is_out else before).append((self._primitive(rpd), _args([(_ARG_SRC, src), (_ARG_DST, dst)])))
        self.steps = before + [(self._primitive(pd), _args(prim_args))] + after

    def _memory(self, md, handle):
        mem = _VP()
        _ok(_lib.dnnl_memory_create(ctypes.byref(mem), md, _engine, _VP(handle)), "dnnl_memory_create")
        self.memories.append(mem)
        return mem

    def _primitive(self, pd):
        prim = _VP()
        _ok(_lib.dnnl_primitive_create(ctypes.byref(prim), pd), "dnnl_primitive_create")
        self.primitives.append(prim)
        return prim

    def run(self, *inputs):
        """The output (a fresh array) for `inputs` (C-contiguous float32, in slot order); None
        when the plan was closed meanwhile (evicted from the cache by another thread)."""
        out = buffers.empty(self.out_shape, np.float32)
        # the blocked copies live for this call only (a plan keeps no activation-sized memory)
        handles = list(zip(self.user, inputs + (out,))) + [(mem, _aligned(n)) for mem, n in self.blocked]
        with self.lock:
            if self.closed:
                return None
            for mem, a in handles:
                _ok(_lib.dnnl_memory_set_data_handle(mem, a.ctypes.data), "dnnl_memory_set_data_handle")
            threads, before = get_num_threads(), _omp_get_max_threads()
            if threads != before:
                _omp_set_num_threads(threads)
            try:
                for prim, (args, n) in self.steps:
                    _ok(_lib.dnnl_primitive_execute(prim, _stream, n, args), "dnnl_primitive_execute")
                _ok(_lib.dnnl_stream_wait(_stream), "dnnl_stream_wait")
            finally:
                if threads != before:
                    _omp_set_num_threads(before)
        return out

    def close(self):
        with self.lock:  # (a call still running on another thread finishes first; later ones see `closed`)
            self.closed = True
            for prim in self.primitives:
                _lib.dnnl_primitive_destroy(prim)
            for mem in self.memories:
                _lib.dnnl_memory_destroy(mem)
            self.primitives, self.memories, self.user, self.blocked, self.steps = [], [], [], [], []


def _aligned(n):
    """n float32s on a 64-byte boundary (oneDNN's blocked kernels load whole cache lines); large
    ones from the buffer pool, which aligns them."""
    if 4 * n >= buffers.MIN_BYTES:
        return buffers.empty(n, np.float32)
    buf = np.empty(n + 16, np.float32)
    start = -buf.ctypes.data % 64 // 4
    return buf[start:start + n]


def _args(pairs):
    return (_ExecArg * len(pairs))(*[_ExecArg(a, m) for a, m in pairs]), len(pairs)


# ------------------------------------------------------------------ convolution plans
MAX_PLANS = 256  # least recently used plans beyond this are destroyed (varying image sizes)
_plans = collections.OrderedDict()
_plans_lock = threading.Lock()


def _geometry(stride, pads, dilation):
    pt, pb, pl, pr = pads
    return (_Dims(*stride), _Dims(dilation[0] - 1, dilation[1] - 1), _Dims(pt, pl), _Dims(pb, pr))


def _weights_shape(w_shape, groups):
    o, cg, kh, kw = w_shape
    return w_shape if groups == 1 else (groups, o // groups, cg, kh, kw)


def _make_plan(scope, kind, x_shape, w_shape, y_shape, bias, stride, pads, dilation, groups):
    ws = _weights_shape(w_shape, groups)
    geometry = _geometry(stride, pads, dilation)
    hint = scope.pd(_lib.dnnl_convolution_forward_primitive_desc_create, "convolution forward", _engine,
                    _FORWARD_TRAINING, _CONVOLUTION_DIRECT, scope.any(x_shape), scope.any(ws),
                    scope.plain((w_shape[0],)) if bias else None, scope.any(y_shape), *geometry, None)
    if kind == "forward":
        slots = [(_ARG_SRC, x_shape, _QUERY_SRC, False), (_ARG_WEIGHTS, ws, _QUERY_WEIGHTS, False)]
        if bias:
            slots.append((_ARG_BIAS, (w_shape[0],), None, False))  # given plain above
        return _Plan(scope, hint, slots + [(_ARG_DST, y_shape, _QUERY_DST, True)])
    if kind == "grad_input":
        pd = scope.pd(_lib.dnnl_convolution_backward_data_primitive_desc_create, "convolution backward data",
                      _engine, _CONVOLUTION_DIRECT, scope.any(x_shape), scope.any(ws), scope.any(y_shape),
                      *geometry, hint, None)
        return _Plan(scope, pd, [(_ARG_DIFF_DST, y_shape, _QUERY_DIFF_DST, False),
                                 (_ARG_WEIGHTS, ws, _QUERY_WEIGHTS, False),
                                 (_ARG_DIFF_SRC, x_shape, _QUERY_DIFF_SRC, True)])
    pd = scope.pd(_lib.dnnl_convolution_backward_weights_primitive_desc_create, "convolution backward weights",
                  _engine, _CONVOLUTION_DIRECT, scope.any(x_shape), scope.any(ws), None, scope.any(y_shape),
                  *geometry, hint, None)
    return _Plan(scope, pd, [(_ARG_DIFF_DST, y_shape, _QUERY_DIFF_DST, False),
                             (_ARG_SRC, x_shape, _QUERY_SRC, False),
                             (_ARG_DIFF_WEIGHTS, ws, _QUERY_DIFF_WEIGHTS, True)])


def _plan(kind, x_shape, w_shape, y_shape, bias, stride, pads, dilation, groups):
    """The cached plan of one pass, or None where oneDNN cannot run it (then numpy does)."""
    if not in_use():
        return None
    key = (kind, x_shape, w_shape, y_shape, bias, stride, pads, dilation, groups)
    with _plans_lock:
        plan = _plans.get(key, False)
        if plan is not False:
            _plans.move_to_end(key)
            return plan
        scope = _Scope()
        try:
            plan = _make_plan(scope, *key)
        except _Error:
            plan = None  # e.g. a geometry this oneDNN version refuses
        finally:
            scope.close()
        _plans[key] = plan
        while len(_plans) > MAX_PLANS:
            _, old = _plans.popitem(last=False)
            if old is not None:
                old.close()
        return plan


def _takes(*arrays):
    return all(type(a) is np.ndarray and a.dtype == np.float32 and a.size for a in arrays)


def _c(a):
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def conv2d(x, w, b, y_hw, stride, pads, dilation, groups):
    """conv2d's output (N, O, OH, OW) through oneDNN, or None (the caller computes it)."""
    if not _takes(x, w) or (b is not None and not _takes(b)):
        return None
    y_shape = (x.shape[0], w.shape[0]) + tuple(y_hw)
    plan = _plan("forward", x.shape, w.shape, y_shape, b is not None, stride, pads, dilation, groups)
    if plan is None:
        return None
    inputs = (_c(x), _c(w).reshape(_weights_shape(w.shape, groups))) + ((_c(b),) if b is not None else ())
    return plan.run(*inputs)


def conv2d_grad_input(dy, w, x_shape, stride, pads, dilation, groups):
    """dL/dinput of conv2d through oneDNN, or None."""
    if not _takes(dy, w):
        return None
    plan = _plan("grad_input", tuple(x_shape), w.shape, dy.shape, False, stride, pads, dilation, groups)
    if plan is None:
        return None
    return plan.run(_c(dy), _c(w).reshape(_weights_shape(w.shape, groups)))


def conv2d_grad_weight(dy, x, w_shape, stride, pads, dilation, groups):
    """dL/dweight of conv2d through oneDNN, or None."""
    if not _takes(dy, x):
        return None
    w_shape = tuple(w_shape)
    plan = _plan("grad_weight", x.shape, w_shape, dy.shape, False, stride, pads, dilation, groups)
    if plan is None:
        return None
    dw = plan.run(_c(dy), _c(x))
    return None if dw is None else dw.reshape(w_shape)


_load()
os.register_at_fork(after_in_child=_after_fork_in_child)
