"""The distributed topology of a job: data, tensor and pipeline parallel sizes over the world.

As LiBai's `libai.utils.distributed`: the ranks are laid out stage-major,

    rank = stage * (dp * tp) + dp_rank * tp + tp_rank

so a pipeline stage owns a contiguous block of `dp * tp` ranks, arranged as a (dp, tp) mesh (a
2-D placement when both dp and tp are > 1, else 1-D), tensor-parallel peers are adjacent ranks,
and data-parallel peers are `tp` apart. Layers are mapped to stages by
`train.dist.custom_pipeline_stage_id` or, by default, evenly with the remainder on stage 0.

`setup_dist_util(cfg.train.dist)` builds the topology (validated against the world size) and
`get_dist_util()` returns it (a single-process default if none was set up).
"""
import logging

import numpy as np

import engine as flow
import engine.distributed as _edist

__all__ = [
    "DistributedTopology", "setup_dist_util", "get_dist_util", "get_rank", "get_world_size",
    "get_local_rank", "is_main_process", "synchronize", "get_data_parallel_rank",
    "get_data_parallel_size", "get_tensor_parallel_rank", "get_tensor_parallel_size",
    "get_pipeline_parallel_size", "get_pipeline_stage", "get_layer_placement",
    "get_layer_ranks", "get_layer_stage_id", "get_nd_sbp", "get_hidden_sbp",
    "is_data_parallel", "is_tensor_model_parallel", "is_pipeline_model_parallel",
    "is_data_model_parallel", "all_reduce_sum_numpy", "check_tensor_parallel_divisible",
    "get_world_placement", "broadcast_object", "all_gather_object", "max_over_ranks",
    # LiBai's remaining helpers
    "same_sbp", "is_last_process", "get_num_nodes", "set_device_type", "broadcast_py_object",
    "convert_to_distributed_default_setting", "ttol", "tton", "tensor_to_rank0",
]

DEVICE_TYPES = ("cpu", "cuda")

logger = logging.getLogger(__name__)


def get_rank():
    return _edist.get_rank()


def get_world_size():
    return _edist.get_world_size()


def get_local_rank():
    return _edist.get_local_rank()


def is_main_process():
    return get_rank() == 0


def synchronize():
    """A barrier over all ranks (nothing in a single process)."""
    if get_world_size() > 1:
        _edist.barrier()


def broadcast_object(obj, src=0):
    """Rank `src`'s picklable `obj` on every rank (`obj` itself in one process)."""
    if get_world_size() == 1:
        return obj
    return _edist.comm.get_world_group().comm.bcast(obj, root=src)


def all_gather_object(obj):
    """Every rank's picklable `obj`, in rank order (`[obj]` in one process)."""
    if get_world_size() == 1:
        return [obj]
    return _edist.comm.get_world_group().comm.allgather(obj)


def max_over_ranks(value):
    """The largest of every rank's int `value` (collective; `value` itself in one process)."""
    if get_world_size() == 1:
        return int(value)
    return int(_edist.comm.get_world_group().comm.allreduce(int(value), op=_edist.comm.MPI.MAX))


def _cfg_get(cfg, key, default=None):
    if cfg is None:
        return default
    try:
        value = cfg.get(key, default) if hasattr(cfg, "get") else getattr(cfg, key, default)
    except Exception:
        value = getattr(cfg, key, default)
    return default if value is None else value


class DistributedTopology:
    """dp x tp x pp over `world_size` ranks, stage-major (see the module docstring).

    Args:
        data_parallel_size, tensor_parallel_size, pipeline_parallel_size: the sizes; a
            data_parallel_size of None (or <= 0) is inferred as world // (tp * pp).
        pipeline_num_layers: number of layers mapped to stages (defaults to pp).
        custom_pipeline_stage_id: explicit stage of each layer (length pipeline_num_layers).
        world_size, rank: default to engine.distributed's.
    """

    def __init__(self, data_parallel_size=None, tensor_parallel_size=1, pipeline_parallel_size=1,
                 pipeline_num_layers=None, custom_pipeline_stage_id=None, world_size=None, rank=None):
        world = get_world_size() if world_size is None else int(world_size)
        self.rank = get_rank() if rank is None else int(rank)
        tp = int(tensor_parallel_size or 1)
        pp = int(pipeline_parallel_size or 1)
        if tp < 1 or pp < 1:
            raise ValueError(f"tensor_parallel_size ({tp}) and pipeline_parallel_size ({pp}) must be >= 1")
        if data_parallel_size is None or int(data_parallel_size) <= 0:
            if world % (tp * pp) != 0:
                raise ValueError(
                    f"world size {world} is not divisible by tensor_parallel_size * "
                    f"pipeline_parallel_size = {tp} * {pp}")
            dp = world // (tp * pp)
        else:
            dp = int(data_parallel_size)
        if dp * tp * pp != world:
            raise ValueError(
                f"train.dist: data_parallel_size * tensor_parallel_size * pipeline_parallel_size = "
                f"{dp} * {tp} * {pp} = {dp * tp * pp} does not match the world size {world}")
        if not 0 <= self.rank < world:
            raise ValueError(f"rank {self.rank} is outside the world of size {world}")
        self.world_size = world
        self.data_parallel_size = dp
        self.tensor_parallel_size = tp
        self.pipeline_parallel_size = pp
        # ranks[stage, dp_rank, tp_rank]
        self.ranks = np.arange(world, dtype=np.int64).reshape(pp, dp, tp)
        stage, dpr, tpr = (int(i) for i in np.argwhere(self.ranks == self.rank)[0])
        self.pipeline_stage, self.data_parallel_rank, self.tensor_parallel_rank = stage, dpr, tpr

        n_layers = int(pipeline_num_layers) if pipeline_num_layers else pp
        if custom_pipeline_stage_id is not None:
            ids = [int(s) for s in custom_pipeline_stage_id]
            if len(ids) != n_layers:
                raise ValueError(
                    f"custom_pipeline_stage_id has {len(ids)} entries but pipeline_num_layers is {n_layers}")
            if any(s < 0 or s >= pp for s in ids):
                raise ValueError(f"custom_pipeline_stage_id entries must be in [0, {pp}), got {ids}")
            if ids != sorted(ids):
                raise ValueError(f"custom_pipeline_stage_id must be non-decreasing, got {ids}")
        else:
            if n_layers < pp:
                raise ValueError(
                    f"pipeline_num_layers ({n_layers}) must be >= pipeline_parallel_size ({pp})")
            per, rem = divmod(n_layers, pp)
            ids = [0] * rem + [s for s in range(pp) for _ in range(per)]
        self.pipeline_num_layers = n_layers
        self.layer_stage_ids = ids
        self._device_type = None

    @property
    def device_type(self):
        """The device type of layer placements: the one set by `set_device_type` (the trainer sets
        train.dist.device_type, or else train.input_placement_device), "cpu" until then; never
        "cuda" just because a GPU is visible."""
        return self._device_type or "cpu"

    def set_device_type(self, device_type):
        if device_type not in DEVICE_TYPES:
            if isinstance(device_type, str) and device_type in ("npu", "xpu"):
                raise NotImplementedError(f"device type {device_type!r} (LiBai's npu/xpu backends) is not implemented; "
                                          f"use one of {DEVICE_TYPES}")
            raise ValueError(f"device_type must be one of {DEVICE_TYPES}, got {device_type!r}")
        self._device_type = device_type

    @classmethod
    def from_config(cls, dist_cfg, world_size=None, rank=None):
        return cls(
            data_parallel_size=_cfg_get(dist_cfg, "data_parallel_size"),
            tensor_parallel_size=_cfg_get(dist_cfg, "tensor_parallel_size", 1),
            pipeline_parallel_size=_cfg_get(dist_cfg, "pipeline_parallel_size", 1),
            pipeline_num_layers=_cfg_get(dist_cfg, "pipeline_num_layers"),
            custom_pipeline_stage_id=_cfg_get(dist_cfg, "custom_pipeline_stage_id"),
            world_size=world_size, rank=rank,
        )

    # ------------------------------------------------------------------ predicates
    def is_data_parallel(self):
        return self.data_parallel_size > 1

    def is_tensor_model_parallel(self):
        return self.tensor_parallel_size > 1

    def is_pipeline_model_parallel(self):
        return self.pipeline_parallel_size > 1

    def is_data_model_parallel(self):
        return self.is_data_parallel() and self.is_tensor_model_parallel()

    # ------------------------------------------------------------------ layers and placements
    def get_layer_stage_id(self, layer_idx):
        """Stage of layer `layer_idx`: negative indices count from the end (-1 is the last
        stage's last layer, as LiBai uses for the final norm and the LM head); with one stage
        every index maps to stage 0."""
        if self.pipeline_parallel_size == 1:
            return 0
        n = len(self.layer_stage_ids)
        if not -n <= int(layer_idx) < n:
            raise IndexError(
                f"layer_idx {layer_idx} is outside the {n} layers mapped to pipeline stages "
                f"(train.dist.pipeline_num_layers={self.pipeline_num_layers})")
        return self.layer_stage_ids[int(layer_idx)]

    def get_stage_ranks(self, stage):
        """The stage's ranks as a mesh: [[dp x tp]] when both > 1, else a flat list."""
        block = self.ranks[stage]
        if self.is_data_model_parallel():
            return block.tolist()
        return block.reshape(-1).tolist()

    def get_layer_ranks(self, layer_idx):
        return self.get_stage_ranks(self.get_layer_stage_id(layer_idx))

    def get_layer_placement(self, layer_idx, device_type=None):
        return flow.placement(device_type or self.device_type, self.get_layer_ranks(layer_idx))

    def get_nd_sbp(self, sbp_list):
        """Pick the SBPs matching the stage mesh from `[dp_sbp, tp_sbp]` (as LiBai)."""
        if len(sbp_list) != 2:
            raise ValueError(f"get_nd_sbp expects [data_parallel_sbp, tensor_parallel_sbp], got {sbp_list}")
        if self.is_data_model_parallel():
            return list(sbp_list)
        if self.is_data_parallel():
            return list(sbp_list[:1])
        if self.is_tensor_model_parallel():
            return list(sbp_list[1:])
        return [flow.sbp.broadcast]

    def check_tensor_parallel_divisible(self, value, what):
        """Raise a ValueError naming `what` and both sizes unless tp divides `value`."""
        tp = self.tensor_parallel_size
        if int(value) % tp != 0:
            raise ValueError(f"{what} ({value}) must be divisible by tensor_parallel_size ({tp})")

    def get_hidden_sbp(self):
        """SBP of activations between layers: split on the batch over dp, broadcast over tp."""
        return self.get_nd_sbp([flow.sbp.split(0), flow.sbp.broadcast])

    def is_first_stage(self):
        return self.pipeline_stage == 0

    def is_last_stage(self):
        return self.pipeline_stage == self.pipeline_parallel_size - 1

    def __repr__(self):
        return (f"DistributedTopology(world={self.world_size}, dp={self.data_parallel_size}, "
                f"tp={self.tensor_parallel_size}, pp={self.pipeline_parallel_size}, rank={self.rank} "
                f"-> stage {self.pipeline_stage}, dp_rank {self.data_parallel_rank}, "
                f"tp_rank {self.tensor_parallel_rank})")


_DIST_UTIL = None


def setup_dist_util(dist_cfg):
    """Build the job's topology from `cfg.train.dist` (validated against the world size)."""
    global _DIST_UTIL
    _DIST_UTIL = DistributedTopology.from_config(dist_cfg)
    logger.info(repr(_DIST_UTIL))
    return _DIST_UTIL


def get_dist_util():
    """The topology set up by `setup_dist_util`, or a pure data-parallel one over the world."""
    global _DIST_UTIL
    if _DIST_UTIL is None:
        _DIST_UTIL = DistributedTopology()
    return _DIST_UTIL


def _reset_dist_util():  # tests
    global _DIST_UTIL
    _DIST_UTIL = None


def get_data_parallel_rank():
    return get_dist_util().data_parallel_rank


def get_data_parallel_size():
    return get_dist_util().data_parallel_size


def get_tensor_parallel_rank():
    return get_dist_util().tensor_parallel_rank


def get_tensor_parallel_size():
    return get_dist_util().tensor_parallel_size


def get_pipeline_parallel_size():
    return get_dist_util().pipeline_parallel_size


def get_pipeline_stage():
    return get_dist_util().pipeline_stage


def is_data_parallel():
    return get_dist_util().is_data_parallel()


def is_tensor_model_parallel():
    return get_dist_util().is_tensor_model_parallel()


def is_pipeline_model_parallel():
    return get_dist_util().is_pipeline_model_parallel()


def is_data_model_parallel():
    return get_dist_util().is_data_model_parallel()


def get_layer_stage_id(layer_idx):
    return get_dist_util().get_layer_stage_id(layer_idx)


def get_layer_ranks(layer_idx):
    return get_dist_util().get_layer_ranks(layer_idx)


def get_layer_placement(layer_idx, device_type=None):
    return get_dist_util().get_layer_placement(layer_idx, device_type)


def get_nd_sbp(sbp_list):
    return get_dist_util().get_nd_sbp(sbp_list)


def get_hidden_sbp():
    return get_dist_util().get_hidden_sbp()


def check_tensor_parallel_divisible(value, what):
    """ValueError naming `what`, its value and the tensor-parallel size unless tp divides it."""
    get_dist_util().check_tensor_parallel_divisible(value, what)


def get_world_placement(device_type=None):
    """All ranks of the job, flat (e.g. for a tensor every rank must hold)."""
    return flow.placement(device_type or get_dist_util().device_type, list(range(get_world_size())))


def all_reduce_sum_numpy(array):
    """Sum a float64/int64 numpy array over all ranks (a copy; identity in one process)."""
    array = np.array(array, copy=True)
    if get_world_size() == 1:
        return array
    t = flow.tensor(array)
    _edist.all_reduce(t, op="sum")
    return t.numpy()


# ---------------------------------------------------------------------------------------------
# LiBai's remaining helpers
# ---------------------------------------------------------------------------------------------
def same_sbp(lhs_sbp, rhs_sbp):
    """Whether two SBP signatures (one SBP per mesh axis) are equal; ValueError when their lengths
    differ (LiBai asserts)."""
    lhs_sbp, rhs_sbp = tuple(lhs_sbp), tuple(rhs_sbp)
    if len(lhs_sbp) != len(rhs_sbp):
        raise ValueError(f"same_sbp: the signatures have different lengths: {lhs_sbp} vs {rhs_sbp}")
    return all(a == b for a, b in zip(lhs_sbp, rhs_sbp))


def is_last_process():
    return get_rank() == get_world_size() - 1


def get_num_nodes():
    """The number of machines of the job: world size / processes per machine (the launcher starts
    the same number on each)."""
    return max(1, get_world_size() // max(1, _edist.get_local_world_size()))


def set_device_type(device_type):
    """The device type ("cpu" or "cuda") of the placements get_layer_placement returns."""
    get_dist_util().set_device_type(device_type)


def broadcast_py_object(obj, src=0):
    """Rank `src`'s picklable `obj` on every rank (LiBai's name for broadcast_object)."""
    return broadcast_object(obj, src)


def _broadcast_sbp():
    return get_nd_sbp([flow.sbp.broadcast, flow.sbp.broadcast])


def convert_to_distributed_default_setting(t):
    """For `model._apply(...)`, as LiBai's build_model: a local tensor becomes a global one
    replicated (broadcast) over the first layer's placement; a global one moves to the topology's
    device type on its own ranks, keeping its SBP."""
    if not t.is_global:
        return t.to_global(placement=get_layer_placement(0), sbp=_broadcast_sbp())
    return t.to_global(placement=flow.placement(get_dist_util().device_type, t.placement.ranks), sbp=t.sbp)


def ttol(tensor, pure_local=False, device=None, ranks=None):
    """A global tensor as a local one (a local tensor is returned as it is): the whole logical
    tensor (made broadcast first), or with `pure_local` this rank's shard as it is. `ranks` (and
    `device`, default the tensor's own device type) move it to another placement first. Every rank
    of the placements takes part; a rank outside the final placement gets an empty local tensor."""
    if not tensor.is_global:
        return tensor
    placement = tensor.placement
    if ranks:
        placement = flow.placement(device or placement.type, ranks)
    if pure_local:
        return tensor.to_global(placement=placement, sbp=tensor.sbp).to_local()
    return tensor.to_global(placement=placement, sbp=_broadcast_sbp_for(placement)).to_local()


def tton(tensor, local_only=False, ranks=None):
    """A tensor as a numpy array: for a global tensor the whole logical value (or with
    `local_only` this rank's shard), see `ttol`."""
    if tensor.is_global:
        tensor = ttol(tensor, pure_local=local_only, ranks=ranks)
    return tensor.numpy()


def tensor_to_rank0(tensor, device=None, to_local=False):
    """A global tensor gathered (broadcast SBP) onto rank 0 alone (a 1x1 mesh for a 2-D
    placement); with `to_local` as a local tensor (empty on the other ranks). `device` defaults to
    the tensor's own device type. A local tensor is returned as it is."""
    if not tensor.is_global:
        return tensor
    placement = flow.placement(device or tensor.placement.type, [0] if tensor.placement.ndim == 1 else [[0]])
    tensor = tensor.to_global(placement=placement, sbp=_broadcast_sbp_for(placement))
    return ttol(tensor) if to_local else tensor


def _broadcast_sbp_for(placement):
    return [flow.sbp.broadcast] * placement.ndim

