"""engine.distributed: processes, collectives and (from the lead's modules) global tensors.

`comm` holds the process layer: MPI on the CPU, NCCL on CUDA, started lazily on first use, so a
plain single process works unchanged (world size 1). Launch many processes with
`python -m engine.distributed.launch --nproc-per-node N script.py`.
"""
from . import comm
from .comm import (
    get_rank, get_world_size, get_local_rank, get_local_world_size, barrier, is_initialized,
    new_group, ProcessGroup, mesh_axis_groups, all_reduce, all_gather, all_gather_into_list,
    reduce_scatter, broadcast, all_to_all, send, recv, isend, irecv, Request, stats,
)

from . import sbp  # noqa: E402
from .placement import placement  # noqa: E402
from . import global_tensor  # noqa: E402
from .global_tensor import GlobalMeta, no_grad_sync, sync_grads  # noqa: E402
from . import dispatch, rules, pipeline, zero  # noqa: E402,F401
from ..ops.creation import set_global_factory  # noqa: E402
from ..ops.op import set_global_dispatch  # noqa: E402
from ..amp import set_found_inf_reducer  # noqa: E402

# What this layer plugs into the layers below it (they never import engine.distributed; per-tensor
# behaviour they reach through the GlobalMeta a global tensor carries):
set_global_dispatch(dispatch.global_apply)  # Op.apply with a global input
set_global_factory(global_tensor.create_global)  # creation with placement= and sbp=
set_found_inf_reducer(comm.max_over_world)  # GradScaler: every rank skips the same steps
