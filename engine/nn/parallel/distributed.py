"""DistributedDataParallel: data parallelism over local tensors, as torch.nn.parallel's.

Every rank holds a full replica of the module and feeds it its own slice of the batch; after
backward every parameter's `.grad` is the average of the ranks' gradients, so identical
optimizer steps keep the replicas identical. The engine's other road to data parallelism,
global tensors with broadcast parameters (engine.distributed), reaches the same gradients
through SBP; this class is for scripts written against torch's DDP.

How gradients are averaged (torch's Reducer, in Python):

* At construction the parameters that require grad are grouped into buckets, walking them in
  reverse registration order (the order backward produces their gradients), one bucket closing
  once it holds `bucket_cap_mb` (the first one 1 MiB when bucket_cap_mb is not given, as torch,
  so the first reduction starts early); dtypes and devices get buckets of their own. Each
  bucket owns one flat buffer. torch re-buckets after the first iteration in the order
  gradients were seen to arrive; this keeps the construction-time order.
* A hook on each parameter (Tensor.register_hook on the leaf: it runs as the parameter's
  gradient arrives, just before the engine accumulates it into `.grad`) writes the value `.grad`
  is about to take, the old `.grad` plus the new gradient, into the parameter's slot of its
  bucket. When every slot of a bucket is written the bucket is divided by the group size and
  all-reduced with a non-blocking MPI_Iallreduce, while backward goes on with earlier layers.
  Buckets are launched strictly in bucket order, so all ranks issue the same collectives in
  the same order even if their gradients arrive in different orders.
* The hook of the last parameter to arrive waits for every bucket, copies the averages into
  the other parameters' `.grad` (their accumulation has already happened), and returns its own
  average, which the engine then stores as that parameter's `.grad`. No hook on the end of the
  backward pass is needed, and `.grad` holds the average as soon as backward returns.
* `require_backward_grad_sync` (set by nanoGPT, and by `no_sync()`) is read at forward time:
  a forward without it makes the next backward accumulate locally only. The synced backward
  then averages the whole accumulated `.grad`, as torch does.
* `find_unused_parameters=True`: after forward the autograd graph is searched from the outputs;
  parameters it does not reach count as ready at once (their slot holds their `.grad`, or
  zeros) and a used-map is summed over the ranks at the end, so a parameter no rank used keeps
  its `.grad` untouched. Without it, a parameter that gets no gradient leaves the reduction
  unfinished, and the next forward raises torch's error.

The collectives come from engine.distributed, which registers its torch.distributed API here
(`set_process_group_api`) when it loads: engine.nn sits below engine.distributed and never
imports it.
"""
import contextlib
import functools

import numpy as np

from ...autograd.grad_mode import is_grad_enabled
from ...autograd.graph import AccumulateGrad
from ...backend import as_device, xp_of
from ...tensor import Tensor
from ..module import Module

__all__ = ["DistributedDataParallel", "set_process_group_api"]

_c10d = None
_MB = 1024 * 1024
_DEFAULT_BUCKET_CAP_MB = 25
_DEFAULT_FIRST_BUCKET_BYTES = 1 * _MB


def set_process_group_api(c10d):
    """Called by engine.distributed when it loads: the module with torch.distributed's functions."""
    global _c10d
    _c10d = c10d


def _api():
    if _c10d is None:
        raise RuntimeError("DistributedDataParallel needs engine.distributed (loaded by `import engine`)")
    return _c10d


def assign_buckets(params, first_cap, cap):
    """Buckets as lists of parameter indices, in the order they are reduced.

    Parameters are taken last to first; each (dtype, device) has an open bucket that closes
    once its bytes reach the limit (`first_cap` for that kind's first bucket, `cap` after).
    Buckets are ordered by their first parameter, i.e. by when their gradients are expected.
    """
    open_, closed = {}, []
    for i in reversed(range(len(params))):
        p = params[i]
        key = (p._data.dtype, p.device)
        indices, nbytes, count = open_.get(key, ([], 0, 0))
        indices.append(i)
        nbytes += p._data.nbytes
        if nbytes >= (first_cap if count == 0 else cap):
            closed.append(indices)
            open_[key] = ([], 0, count + 1)
        else:
            open_[key] = (indices, nbytes, count)
    closed += [indices for indices, _, _ in open_.values() if indices]
    closed.sort(key=lambda b: -b[0])
    return closed


class _Bucket:
    """Parameters reduced together, and the flat buffer their gradients are packed into."""

    def __init__(self, indices, params):
        self.indices = indices
        self.offsets = []
        total = 0
        for i in indices:
            n = params[i]._data.size
            self.offsets.append((total, n))
            total += n
        first = params[indices[0]]._data
        self.flat = xp_of(first).zeros(total, dtype=first.dtype)
        self.ready = 0
        self.work = None

    def slot(self, k, shape):
        start, n = self.offsets[k]
        return self.flat[start:start + n].reshape(shape)


def _tensors_in(obj):
    """The tensors in a forward's output (nested tuples, lists, dicts)."""
    if isinstance(obj, Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors_in(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors_in(o)


def _reachable_leaves(outputs):
    """ids of the leaf tensors the autograd graph of `outputs` leads to."""
    leaves, seen, stack = set(), set(), []
    for t in _tensors_in(outputs):
        if t.grad_fn is not None:
            stack.append(t.grad_fn)
        elif t.requires_grad:
            leaves.add(id(t))
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, AccumulateGrad):
            leaves.add(id(node.variable))
            continue
        stack.extend(e[0] for e in node.next_edges if e is not None)
    return leaves


class DistributedDataParallel(Module):
    """Averages the gradients of `module`'s parameters over `process_group` (the world by default).

    Accepted as in torch: device_ids / output_device (None, or one device equal to the module's:
    the CPU for a CPU module), dim (only used by torch to scatter over several devices, which
    single-device DDP never does), broadcast_buffers (buffers copied from rank 0 before each
    forward), init_sync (parameters and buffers copied from rank 0 at construction),
    process_group, bucket_cap_mb, find_unused_parameters, check_reduction (deprecated in torch,
    no effect). Refused with NotImplementedError when not at their defaults:
    gradient_as_bucket_view (a `.grad` assigned by the engine's accumulation cannot be made a
    view of a bucket), static_graph, delay_all_reduce_named_params, param_to_hook_all_reduce,
    mixed_precision, device_mesh, skip_all_reduce_unused_params, bucket_cap_mb_list,
    batched_grad_copy, forward_sync_buffers.
    """

    def __init__(self, module, device_ids=None, output_device=None, dim=0, broadcast_buffers=None,
                 init_sync=True, process_group=None, bucket_cap_mb=None, find_unused_parameters=False,
                 check_reduction=False, gradient_as_bucket_view=False, static_graph=False,
                 delay_all_reduce_named_params=None, param_to_hook_all_reduce=None, mixed_precision=None,
                 device_mesh=None, skip_all_reduce_unused_params=False, bucket_cap_mb_list=None,
                 batched_grad_copy=False, forward_sync_buffers=None):
        super().__init__()
        _refuse(gradient_as_bucket_view=gradient_as_bucket_view, static_graph=static_graph,
                delay_all_reduce_named_params=delay_all_reduce_named_params,
                param_to_hook_all_reduce=param_to_hook_all_reduce, mixed_precision=mixed_precision,
                device_mesh=device_mesh, skip_all_reduce_unused_params=skip_all_reduce_unused_params,
                bucket_cap_mb_list=bucket_cap_mb_list, batched_grad_copy=batched_grad_copy,
                forward_sync_buffers=forward_sync_buffers)
        if not isinstance(module, Module):
            raise TypeError(f"DistributedDataParallel: module must be an engine.nn.Module, got {type(module).__name__}")
        c10d = _api()
        self.module = module
        self.process_group = c10d.group.WORLD if process_group is None else process_group
        self.dim = dim
        self.broadcast_buffers = True if broadcast_buffers is None else bool(broadcast_buffers)
        self.find_unused_parameters = bool(find_unused_parameters)
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        names = dict(module.named_parameters())
        self._names = list(names)
        params = list(names.values())
        for name, t in list(names.items()) + list(module.named_buffers()):
            if t.is_global:
                raise TypeError(f"DistributedDataParallel: {name} is a global tensor; DDP replicates local tensors "
                                "(global tensors sync their gradients through their SBP)")
        self.device = params[0].device if params else as_device("cpu")
        self.device_ids = _check_devices(device_ids, output_device, {p.device for p in params})
        self.output_device = None if self.device_ids is None else self.device
        self._buffer_list = list(module.buffers())
        if init_sync and self._world_size() > 1:
            self._verify_same_model(params)
            self._broadcast_coalesced(params + self._buffer_list)
        if bucket_cap_mb is None:
            self.bucket_bytes_cap = _DEFAULT_BUCKET_CAP_MB * _MB
            first_cap = _DEFAULT_FIRST_BUCKET_BYTES
        else:
            self.bucket_bytes_cap = first_cap = int(float(bucket_cap_mb) * _MB)
        self._index = [i for i, p in enumerate(params) if p.requires_grad]
        self._params = [params[i] for i in self._index]
        buckets = assign_buckets(self._params, first_cap, self.bucket_bytes_cap)
        self._buckets = [_Bucket(b, self._params) for b in buckets]
        self._where = {}
        for b in self._buckets:
            for k, i in enumerate(b.indices):
                self._where[i] = (b, k)
        self._handles = [p.register_hook(functools.partial(self._grad_ready, i)) for i, p in enumerate(self._params)]
        self._armed = False
        self._hooked = 0

    # ------------------------------------------------------------------ torch's API
    @contextlib.contextmanager
    def no_sync(self):
        """Inside, forwards do not arm gradient averaging: backward accumulates locally (for
        gradient accumulation; the first synced backward afterwards averages the sum)."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def forward(self, *inputs, **kwargs):
        if self._armed and self._hooked:
            for b in self._buckets[:self._next]:  # let the launched reductions end before failing
                b.work.wait()
            self._armed = False
            raise RuntimeError(
                "Expected to have finished reduction in the prior iteration before starting a new one. This "
                "error indicates that your module has parameters that were not used in producing loss: pass "
                "find_unused_parameters=True to DistributedDataParallel, and make sure all forward outputs "
                "take part in calculating the loss. Parameters that received no gradient: "
                f"{self._missing_names()}")
        if self.require_forward_param_sync and self.broadcast_buffers and self._buffer_list \
                and self._world_size() > 1:
            self._broadcast_coalesced(self._buffer_list)
        if self.device_ids is not None and self.device.type != "cpu":
            inputs, kwargs = _to_device((inputs, kwargs), self.device)
        out = self.module(*inputs, **kwargs)
        if is_grad_enabled() and self.require_backward_grad_sync and self._params:
            self._prepare_for_backward(out)
        else:
            self._armed = False
        return out

    # ------------------------------------------------------------------ the reducer
    def _world_size(self):
        return _api().get_world_size(self.process_group)

    def _prepare_for_backward(self, out):
        self._armed = True
        self._hooked = 0
        self._ready = [False] * len(self._params)
        self._n_ready = 0
        self._next = 0
        for b in self._buckets:
            b.ready, b.work = 0, None
        self._unused = set()
        if self.find_unused_parameters:
            reached = _reachable_leaves(out)
            self._used = np.zeros(len(self._params), dtype=np.int32)
            for i, p in enumerate(self._params):
                if id(p) in reached:
                    self._used[i] = 1
                else:
                    self._unused.add(i)
                    self._mark_ready(i)

    def _mark_ready(self, i):
        self._ready[i] = True
        self._n_ready += 1
        self._where[i][0].ready += 1

    def _grad_ready(self, i, grad):
        """The hook on parameter i: pack what its .grad is about to be; launch full buckets."""
        if not self._armed:
            return None
        if self._ready[i]:
            raise RuntimeError(f"Expected to mark a variable ready only once: parameter {self._name(i)} received a "
                               "second gradient in one synced iteration (a second backward through the same "
                               "forward, or an unused parameter found by find_unused_parameters)")
        p = self._params[i]
        b, k = self._where[i]
        slot = b.slot(k, p._data.shape)
        g = grad._data if grad._data.dtype == slot.dtype else grad._data.astype(slot.dtype)
        if p.grad is None:
            slot[...] = g
        else:
            xp_of(slot).add(p.grad._data, g, out=slot)
        self._mark_ready(i)
        self._hooked += 1
        self._launch_ready_buckets()
        if self._n_ready == len(self._params):
            return self._finish(i)
        return None

    def _launch_ready_buckets(self):
        """All-reduce (non-blocking) every complete bucket whose turn has come, in bucket order."""
        c10d, n = _api(), self._world_size()
        while self._next < len(self._buckets):
            b = self._buckets[self._next]
            if b.ready < len(b.indices):
                return
            for k, i in enumerate(b.indices):
                if i in self._unused:  # a parameter this forward did not use: its current .grad, or zeros
                    p = self._params[i]
                    slot = b.slot(k, p._data.shape)
                    slot[...] = 0 if p.grad is None else p.grad._data
            if n > 1:
                b.flat /= n
            b.work = c10d.all_reduce(b.flat, group=self.process_group, async_op=True)
            self._next += 1

    def _finish(self, last):
        """Wait for every bucket and write the averages into .grad; return parameter `last`'s."""
        for b in self._buckets:
            b.work.wait()
        used = None
        if self.find_unused_parameters:
            used = _api().all_reduce(self._used.copy(), group=self.process_group)
        self._armed = False
        result = None
        for b in self._buckets:
            for k, i in enumerate(b.indices):
                if used is not None and not used[i]:
                    continue  # no rank used it: its .grad stays as it was
                p = self._params[i]
                slot = b.slot(k, p._data.shape)
                if i == last:
                    result = Tensor._make(slot.copy(), p.device)
                elif p.grad is None:
                    p.grad = Tensor._make(slot.copy(), p.device)
                else:
                    p.grad._data[...] = slot
                    p.grad._bump_version()
        # The engine stores the returned gradient as .grad when .grad is None (it would add it otherwise).
        self._params[last].grad = None
        return result

    def _name(self, i):
        return self._names[self._index[i]]

    def _missing_names(self):
        return [self._name(i) for i, r in enumerate(self._ready) if not r]

    # ------------------------------------------------------------------ broadcasting from rank 0
    def _broadcast_coalesced(self, tensors):
        """Copy `tensors` from the group's first rank, one flat broadcast per dtype and device."""
        c10d = _api()
        receiving = c10d.get_rank(self.process_group) != 0
        kinds = {}
        for t in tensors:
            kinds.setdefault((t._data.dtype, t.device), []).append(t)
        for ts in kinds.values():
            xp = xp_of(ts[0]._data)
            flat = xp.concatenate([t._data.reshape(-1) for t in ts])
            c10d.broadcast(flat, group=self.process_group, group_src=0)
            if receiving:
                start = 0
                for t in ts:
                    n = t._data.size
                    t._data[...] = flat[start:start + n].reshape(t._data.shape)
                    t._bump_version()
                    start += n

    def _verify_same_model(self, params):
        """RuntimeError when the ranks' modules differ in their parameters' shapes or dtypes."""
        mine = [(tuple(p.shape), str(p.dtype)) for p in params]
        everyone = [None] * self._world_size()
        _api().all_gather_object(everyone, mine, group=self.process_group)
        for r, theirs in enumerate(everyone):
            if theirs != everyone[0]:
                raise RuntimeError(
                    f"DistributedDataParallel expects the same model on every rank, but group rank {r} has "
                    f"{len(theirs)} parameters {theirs[:4]}... while rank 0 has {len(everyone[0])} "
                    f"{everyone[0][:4]}...")


def _refuse(**options):
    defaults = {"gradient_as_bucket_view": False, "static_graph": False, "skip_all_reduce_unused_params": False,
                "batched_grad_copy": False}
    for name, value in options.items():
        if value != defaults.get(name):
            raise NotImplementedError(f"DistributedDataParallel: {name}={value!r} is not supported by the engine")


def _check_devices(device_ids, output_device, devices):
    """device_ids as torch checks them for a single-device module: None, or [the module's device]."""
    devices = devices or {as_device("cpu")}
    if device_ids is None:
        if output_device is not None and len(devices) == 1 and as_device(output_device) not in devices:
            raise ValueError(f"DistributedDataParallel: output_device {output_device} is not the module's device "
                             f"{next(iter(devices))}")
        return None
    device_ids = list(device_ids)
    if len(device_ids) != 1:
        raise ValueError(f"device_ids can only be None or contain a single element, got {device_ids}")
    if len(devices) != 1:
        raise ValueError("DistributedDataParallel device_ids and output_device arguments only work with "
                         f"single-device modules, but got device_ids {device_ids} and module parameters on "
                         f"{sorted(map(str, devices))}")
    (module_device,) = devices
    for what, d in (("device_ids", device_ids[0]), ("output_device", output_device)):
        if d is not None and as_device(d) != module_device:
            raise ValueError(f"DistributedDataParallel: {what} refers to {as_device(d)} but the module's parameters "
                             f"are on {module_device}")
    return device_ids


def _to_device(obj, device):
    """`obj` with every tensor in it (nested tuples, lists, dicts) moved to `device`."""
    if isinstance(obj, Tensor):
        return obj.to(device)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_device(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: _to_device(v, device) for k, v in obj.items()}
    return obj
