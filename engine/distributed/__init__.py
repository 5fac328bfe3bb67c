"""engine.distributed: processes, collectives and (from the lead's modules) global tensors.

`comm` holds the process layer: MPI on the CPU, NCCL on CUDA, started lazily on first use, so a
plain single process works unchanged (world size 1). Launch many processes with
`python -m engine.distributed.launch --nproc-per-node N script.py`.
"""
from . import comm
from .comm import (  # noqa: F401
    get_local_rank, get_local_world_size, ProcessGroup, mesh_axis_groups, all_gather_into_list,
    reduce_scatter, all_to_all, Request, stats,
)

# torch.distributed's API (c10d.py). Where a name existed here before, the torch version is a
# superset that keeps the engine's callers working: all_reduce/broadcast also take op strings and
# return their tensor; all_gather takes either form (c10d.all_gather_either); send/recv/isend/
# irecv take torch's argument order (callers pass tag= by keyword). is_initialized now means
# "init_process_group was called" (comm.is_initialized: "MPI has started").
from . import c10d
from .c10d import (  # noqa: E402,F401
    ReduceOp, Work, group, GroupMember, init_process_group, destroy_process_group, is_initialized,
    is_available, is_mpi_available, is_gloo_available, is_nccl_available, get_rank, get_world_size,
    get_backend, new_group, barrier, all_reduce, broadcast, all_gather_into_tensor, reduce_scatter_tensor,
    reduce, gather, scatter, send, recv, isend, irecv, all_gather_object, broadcast_object_list,
)
from .c10d import all_gather_either as all_gather  # noqa: E402,F401

from . import sbp  # noqa: E402
from .placement import placement  # noqa: E402
from . import global_tensor  # noqa: E402
from .global_tensor import GlobalMeta, no_grad_sync, sync_grads  # noqa: E402
from . import dispatch, rules, pipeline, zero  # noqa: E402,F401
from ..ops.creation import set_global_factory  # noqa: E402
from ..ops.op import set_global_dispatch  # noqa: E402
from ..amp import set_found_inf_reducer  # noqa: E402
from ..nn.parallel import distributed as _ddp  # noqa: E402
from ..utils.data.distributed import set_world_info_source  # noqa: E402
from ..nn import graph as _graph  # noqa: E402

# What this layer plugs into the layers below it (they never import engine.distributed; per-tensor
# behaviour they reach through the GlobalMeta a global tensor carries):
set_global_dispatch(dispatch.global_apply)  # Op.apply with a global input
set_global_factory(global_tensor.create_global)  # creation with placement= and sbp=
set_found_inf_reducer(comm.max_over_world)  # GradScaler: every rank skips the same steps
_ddp.set_process_group_api(c10d)  # nn.parallel.DistributedDataParallel's collectives
set_world_info_source(  # DistributedSampler's defaults, once MPI is up (the sampler never starts it)
    lambda: (comm.get_world_size(), comm.get_rank()) if comm.is_initialized() else None)
_graph.set_distributed_context(  # nn.Graph: which rank prints its debug output; deferred sync changes a step
    rank=lambda: comm.get_rank() if comm.is_initialized() else 0,
    deferred_grad_sync=lambda: global_tensor._sync["deferred"] > 0)
