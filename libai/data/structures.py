"""LiBai's sample containers: `DistTensorData` (a tensor and how its batch becomes global) and
`Instance` (named fields of a sample or of a batch).

A dataset returns `Instance(input_ids=DistTensorData(t), labels=DistTensorData(l, placement_idx=-1))`;
the collate (`Instance.stack`) stacks the samples of a micro-batch field by field; the trainer then
calls `batch.to_model_inputs(device_type)`, which makes each field global:

    tensor.to_global(placement=dist.get_layer_placement(placement_idx),
                     sbp=dist.get_nd_sbp([S(0), B]))    # from sbp_list ["split_0", "broadcast"]

The local batch is this data-parallel rank's micro-batch, so on the (dp, tp) mesh of the layer's
pipeline stage the global tensor is the global batch split over dp and replicated over tp (1-D
[S(0)] or [B] when only one of dp/tp is > 1, [B] on placement [0] in a single process).
"""
from collections import OrderedDict

import numpy as np

import engine as flow
from libai.utils import distributed as dist

__all__ = ["DistTensorData", "Instance", "parse_sbp"]


def parse_sbp(name):
    """"split_0" -> sbp.split(0), "broadcast" -> sbp.broadcast, "partial_sum" -> sbp.partial_sum
    (an sbp object is returned as is)."""
    if not isinstance(name, str):
        return name
    parts = name.split("_")
    if parts[0] == "split" and len(parts) == 2:
        return flow.sbp.split(int(parts[1]))
    if name in ("broadcast", "partial_sum"):
        return getattr(flow.sbp, name)
    raise ValueError(f"unknown sbp {name!r} (expected 'split_<axis>', 'broadcast' or 'partial_sum')")


class DistTensorData:
    """A tensor plus its global layout: `sbp_list` ([data-parallel sbp, tensor-parallel sbp], as
    strings) and `placement_idx` (the layer whose pipeline stage receives it: 0 for inputs, -1
    for labels)."""

    def __init__(self, tensor, sbp_list=None, placement_idx=0):
        if isinstance(tensor, np.ndarray):
            tensor = flow.tensor(tensor)
        self.tensor = tensor
        self.sbp_list = list(sbp_list) if sbp_list is not None else ["split_0", "broadcast"]
        self.placement_idx = int(placement_idx)

    def __repr__(self):
        shape = tuple(self.tensor.shape) if hasattr(self.tensor, "shape") else None
        return f"DistTensorData(shape={shape}, sbp_list={self.sbp_list}, placement_idx={self.placement_idx})"

    def __eq__(self, other):  # dataclass-like comparison (for tests)
        if not isinstance(other, DistTensorData):
            return NotImplemented
        return (self.sbp_list == other.sbp_list and self.placement_idx == other.placement_idx
                and np.array_equal(_np(self.tensor), _np(other.tensor)))

    @property
    def sbp(self):
        """The nd-sbp this data gets on the current topology."""
        return dist.get_nd_sbp([parse_sbp(s) for s in self.sbp_list])

    def placement(self, device_type=None):
        return dist.get_layer_placement(self.placement_idx, device_type)

    def to_global(self, placement=None, sbp=None, device_type=None):
        """Make `self.tensor` global in place (and return self): the local tensor is this rank's
        shard of `sbp` (default from sbp_list via get_nd_sbp) on `placement` (default
        get_layer_placement(placement_idx, device_type)). Collective over the placement's ranks."""
        t = self.tensor
        if getattr(t, "is_global", False):
            return self
        if placement is None:
            placement = self.placement(device_type)
        if sbp is None:
            sbp = self.sbp
        if placement.type == "cuda" and t.device.type != "cuda":
            t = t.to("cuda")
        elif placement.type == "cpu" and t.device.type != "cpu":
            t = t.to("cpu")
        self.tensor = t.to_global(placement=placement, sbp=sbp)
        return self

    to_consistent = to_global  # the old OneFlow name

    @staticmethod
    def stack(dist_tensor_list):
        """Stack the tensors of a micro-batch along a new first axis (same shapes, sbp_list and
        placement_idx required)."""
        if not dist_tensor_list:
            raise ValueError("DistTensorData.stack: empty list")
        first = dist_tensor_list[0]
        if not isinstance(first.tensor, flow.Tensor):
            raise TypeError(f"DistTensorData.tensor must be an engine tensor, got {type(first.tensor).__name__}; "
                            f"check the dataset's __getitem__")
        shape = tuple(first.tensor.shape)
        for d in dist_tensor_list[1:]:
            if tuple(d.tensor.shape) != shape:
                raise ValueError(f"DistTensorData.stack: tensor shapes differ, {tuple(d.tensor.shape)} != {shape}")
            if d.sbp_list != first.sbp_list:
                raise ValueError(f"DistTensorData.stack: sbp_list differs, {d.sbp_list} != {first.sbp_list}")
            if d.placement_idx != first.placement_idx:
                raise ValueError(f"DistTensorData.stack: placement_idx differs, {d.placement_idx} != "
                                 f"{first.placement_idx}")
        tensors = flow.stack([d.tensor for d in dist_tensor_list], dim=0)
        return DistTensorData(tensors, sbp_list=list(first.sbp_list), placement_idx=first.placement_idx)


def _np(t):
    return t.numpy() if hasattr(t, "numpy") else np.asarray(t)


class Instance:
    """Named fields of one sample (or, after `Instance.stack`, of a micro-batch).

        inst = Instance(input_ids=DistTensorData(...), labels=DistTensorData(...))
        inst.input_ids, inst.has("labels"), inst.get_fields()

    Attributes starting with "_" are private; every other attribute is a field."""

    def __init__(self, **kwargs):
        self._fields = OrderedDict()
        for k, v in kwargs.items():
            self.set(k, v)

    def __setattr__(self, name, value):
        if name.startswith("_"):
            super().__setattr__(name, value)
        else:
            self.set(name, value)

    def __getattr__(self, name):
        if name == "_fields" or name.startswith("__") or name not in self._fields:
            raise AttributeError(f"Cannot find field '{name}' in the given Instance!")
        return self._fields[name]

    def __getstate__(self):
        return {"_fields": self._fields}

    def __setstate__(self, state):
        object.__setattr__(self, "_fields", state["_fields"])

    def set(self, name, value):
        self._fields[name] = value

    def has(self, name):
        return name in self._fields

    def remove(self, name):
        del self._fields[name]

    def get(self, name):
        return self._fields[name]

    def get_fields(self):
        return self._fields

    def keys(self):
        return self._fields.keys()

    def __contains__(self, name):
        return name in self._fields

    def __len__(self):
        return len(self._fields)

    def __iter__(self):
        raise NotImplementedError("`Instance` object is not iterable!")

    @staticmethod
    def stack(instance_list):
        """Field by field: DistTensorData (and any type with a `stack`) via its `stack`, engine
        tensors via flow.stack, numpy arrays / numbers via np.stack into an engine tensor, lists
        and other values kept as a list."""
        if not instance_list:
            raise ValueError("Instance.stack: empty batch")
        if not all(isinstance(i, Instance) for i in instance_list):
            raise TypeError("Instance.stack expects Instance samples")
        ret = Instance()
        for k in instance_list[0]._fields:
            values = [i.get(k) for i in instance_list]
            v0 = values[0]
            if isinstance(v0, flow.Tensor):
                values = flow.stack(values, dim=0)
            elif hasattr(type(v0), "stack"):
                try:
                    values = type(v0).stack(values)
                except ValueError as e:
                    if "shapes differ" not in str(e):
                        raise
                    raise ValueError(f"{e}: the samples' field {k!r} must have one shape in a batch (images: end the "
                                     "dataset's transform with a crop to a fixed size, e.g. CenterCrop after "
                                     "Resize)") from e
            elif isinstance(v0, (np.ndarray, np.number, int, float)) and not isinstance(v0, bool):
                values = flow.tensor(np.stack([np.asarray(v) for v in values], axis=0))
            ret.set(k, values)
        return ret

    def to_global(self, device_type=None, placement=None):
        """Make every DistTensorData field global (see DistTensorData.to_global), on its layer
        placement or on `placement` (a pipeline stage: every field there); returns self."""
        for v in self._fields.values():
            if isinstance(v, DistTensorData):
                v.to_global(placement=placement, device_type=device_type)
        return self

    def to_model_inputs(self, device_type=None, placement=None):
        """The trainer hook: {field: global tensor} for the model's keyword arguments
        (DistTensorData fields made global on their layer placement, or all on `placement`;
        other fields as they are)."""
        self.to_global(device_type=device_type, placement=placement)
        return {k: (v.tensor if isinstance(v, DistTensorData) else v) for k, v in self._fields.items()}

    def __str__(self):
        return f"{self.__class__.__name__}(fields=[{', '.join(f'{k}: {v}' for k, v in self._fields.items())}])"

    __repr__ = __str__
