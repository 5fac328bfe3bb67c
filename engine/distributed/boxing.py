"""Boxing: converting the local shards of a global tensor from one SBP (or placement) to another
with the textbook collective for each case (DESIGN.md, "Boxing").

Per mesh axis, inside the sub-group of ranks that differ only on that axis:

    P -> B  all_reduce         S -> B     all_gather        B -> S  local slice
    P -> S  reduce_scatter     S(i)->S(j) all_to_all        B -> P  rank 0 of the axis keeps it
    S -> P  zeros with the own slice written in             P(max) <-> P(sum): through B

An n-D conversion changes one mesh axis at a time: existing splits are changed inner axis
first, new splits are made outer axis first; an inner axis that splits a dimension an outer
step touches is first gathered to B (and re-split afterwards, which is free). Uneven extents follow the balanced
rule (5 over 4 ranks: 2,1,1,1) at every level of the mesh.

Between different placements the source gathers to B, each destination rank receives the whole
tensor from one source rank (point to point, a small header first so that ranks outside the
source placement learn shape and dtype), and slices locally.
"""
import numpy as np

from . import comm
from .sbp import balanced_range, balanced_sizes, broadcast


def level_extent(shape, placement, nd_sbp, coords, k, dim):
    """Extent of tensor `dim` that mesh axis k splits: the logical extent after the splits of
    the mesh axes before k (walked left to right)."""
    extent = shape[dim]
    for j in range(k):
        s = nd_sbp[j]
        if s.is_split and s.axis == dim:
            start, stop = balanced_range(extent, placement.hierarchy[j], coords[j])
            extent = stop - start
    return extent


def local_shape(shape, placement, nd_sbp, coords):
    """Shape of the shard held at mesh `coords`."""
    out = list(shape)
    for k, s in enumerate(nd_sbp):
        if s.is_split:
            start, stop = balanced_range(out[s.axis], placement.hierarchy[k], coords[k])
            out[s.axis] = stop - start
    return tuple(out)


def local_slices(shape, placement, nd_sbp, coords):
    """Slices of the logical tensor that the shard at `coords` holds (ignoring partial-ness)."""
    starts = [0] * len(shape)
    extents = list(shape)
    for k, s in enumerate(nd_sbp):
        if s.is_split:
            a = s.axis
            start, stop = balanced_range(extents[a], placement.hierarchy[k], coords[k])
            starts[a] += start
            extents[a] = stop - start
    return tuple(slice(b, b + e) for b, e in zip(starts, extents))


def _xp(arr):
    from ..backend import xp_of

    return xp_of(arr)


def _convert_axis(arr, shape, placement, cur, k, target, coords):
    """Change mesh axis k of the shard `arr` from cur[k] to `target`."""
    src = cur[k]
    if src == target:
        return arr
    n = placement.hierarchy[k]
    c = coords[k]
    group = comm.mesh_axis_groups(placement.mesh, k)
    xp = _xp(arr)

    def sizes(dim):
        return balanced_sizes(level_extent(shape, placement, cur, coords, k, dim), n)

    if src.is_partial:
        if target.is_broadcast:
            return comm.all_reduce(arr.copy(), op=src.op, group=group)
        if target.is_split:
            return comm.reduce_scatter(arr, group=group, axis=target.axis, op=src.op, sizes=sizes(target.axis))
        # P(max) <-> P(sum)
        full = comm.all_reduce(arr.copy(), op=src.op, group=group)
        return full if c == 0 else xp.zeros_like(full)
    if src.is_split:
        a = src.axis
        if target.is_broadcast:
            return comm.all_gather(arr, group=group, axis=a, sizes=sizes(a))
        if target.is_split:
            return comm.all_to_all(arr, group=group, split_axis=target.axis, concat_axis=a,
                                   split_sizes_=sizes(target.axis), concat_sizes=sizes(a))
        # S -> P: zeros of the level shape with the own slice written in
        level = list(arr.shape)
        level[a] = level_extent(shape, placement, cur, coords, k, a)
        out = xp.zeros(tuple(level), dtype=arr.dtype)
        start, stop = balanced_range(level[a], n, c)
        idx = [slice(None)] * arr.ndim
        idx[a] = slice(start, stop)
        out[tuple(idx)] = arr
        return out
    # broadcast source
    if target.is_split:
        a = target.axis
        start, stop = balanced_range(arr.shape[a], n, c)
        idx = [slice(None)] * arr.ndim
        idx[a] = slice(start, stop)
        return xp.ascontiguousarray(arr[tuple(idx)])
    return arr if c == 0 else xp.zeros_like(arr)  # B -> P


def _touched_dims(*sbps):
    return {s.axis for s in sbps if s.is_split}


def box_local(arr, shape, placement, src, dst, coords):
    """Convert this rank's shard `arr` from nd-SBP `src` to `dst` on the same placement.

    Splits are removed inner mesh axis first and created outer axis first, so that every step
    sees the shard layout the balanced walk describes. An inner axis that splits a dimension an
    outer step must touch is gathered to B first and re-split when its own turn comes.
    """
    cur = list(src)
    dst = tuple(dst)
    if tuple(cur) == dst:
        return arr

    def free_inner(k, dims):
        nonlocal arr
        for j in reversed(range(k + 1, len(cur))):
            if cur[j].is_split and cur[j].axis in dims:
                arr = _convert_axis(arr, shape, placement, cur, j, broadcast, coords)
                cur[j] = broadcast

    # 1. inner to outer: axes that are split now and must change
    for k in reversed(range(len(cur))):
        if cur[k] != dst[k] and cur[k].is_split:
            free_inner(k, _touched_dims(cur[k], dst[k]))
            arr = _convert_axis(arr, shape, placement, cur, k, dst[k], coords)
            cur[k] = dst[k]
    # 2. outer to inner: the rest (B or P now) take their target
    for k in range(len(cur)):
        if cur[k] == dst[k]:
            continue
        if dst[k].is_split:
            free_inner(k, {dst[k].axis})
        elif cur[k].is_partial and dst[k].is_partial:  # P(max) <-> P(sum) goes through B
            arr = _convert_axis(arr, shape, placement, cur, k, broadcast, coords)
            cur[k] = broadcast
        arr = _convert_axis(arr, shape, placement, cur, k, dst[k], coords)
        cur[k] = dst[k]
    return arr


# ------------------------------------------------------------------ across placements
_DTYPES = None


def _dtype_table():
    global _DTYPES
    if _DTYPES is None:
        from ..backend import dtypes

        _DTYPES = [d.np for d in dtypes.ALL_DTYPES]
    return _DTYPES


def box_across(arr, meta_src, placement_dst, sbp_dst, device):
    """Move a global tensor between placements. Every rank calls it; returns (array or None,
    logical shape or None) for this rank in the destination placement."""
    from ..backend import to_device

    me = comm.get_rank()
    src_p = meta_src.placement
    in_src, in_dst = src_p.has_rank(me), placement_dst.has_rank(me)
    full = None
    if in_src:
        coords = src_p.coords(me)
        full = box_local(arr, meta_src.shape, src_p, meta_src.sbp, (broadcast,) * src_p.ndim, coords)
    src_ranks = src_p.mesh.reshape(-1).tolist()
    dst_ranks = placement_dst.mesh.reshape(-1).tolist()
    requests = []
    # sender side: each destination not in the source gets the tensor from one source rank
    if in_src:
        for i, d in enumerate(dst_ranks):
            if d in src_p._ranks_set or src_ranks[i % len(src_ranks)] != me:
                continue
            host = np.ascontiguousarray(full if isinstance(full, np.ndarray) else full.get())
            header = np.array([host.ndim, _dtype_table().index(host.dtype)] + list(host.shape), dtype=np.int64)
            requests.append(comm.isend(np.array([len(header)], dtype=np.int64), d, tag=1001))
            requests.append(comm.isend(header, d, tag=1002))
            requests.append(comm.isend(host.view(np.uint8).reshape(-1), d, tag=1003))
    result = None
    if in_dst:
        if in_src:
            result = full
        else:
            i = dst_ranks.index(me)
            src = src_ranks[i % len(src_ranks)]
            n = np.empty(1, dtype=np.int64)
            comm.recv(n, src, tag=1001)
            header = np.empty(int(n[0]), dtype=np.int64)
            comm.recv(header, src, tag=1002)
            ndim, code = int(header[0]), int(header[1])
            shp = tuple(int(s) for s in header[2:2 + ndim])
            dt = _dtype_table()[code]
            raw = np.empty(int(np.prod(shp, dtype=np.int64)) * np.dtype(dt).itemsize, dtype=np.uint8)
            comm.recv(raw, src, tag=1003)
            result = raw.view(dt).reshape(shp)
        result = to_device(result, device)
    for r in requests:
        r.wait()
    if result is None:
        return None, None
    shape = tuple(result.shape)
    coords = placement_dst.coords(me)
    local = box_local(result, shape, placement_dst, (broadcast,) * placement_dst.ndim, sbp_dst, coords)
    return local, shape

