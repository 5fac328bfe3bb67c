"""Boxing: converting the local shards of a global tensor from one SBP (or placement) to another
with the textbook collective for each case (docs/global_tensor.md, "The boxing table").

Per mesh axis, inside the sub-group of ranks that differ only on that axis:

    P -> B  all_reduce         S -> B     all_gather        B -> S  local slice
    P -> S  reduce_scatter     S(i)->S(j) all_to_all        B -> P  rank 0 of the axis keeps it
    S -> P  zeros with the own slice written in             P(max) <-> P(sum): through B

An n-D conversion changes one mesh axis at a time, along the cheapest valid sequence of 1-D
steps (`_plan`: a shortest path over nd-SBPs; cyclic cases pass through an intermediate SBP,
an inner axis re-split on another dim or gathered to B). Uneven extents follow
the balanced rule (5 over 4 ranks: 2,1,1,1) at every level of the mesh.

Between different placements the source gathers to B, each destination rank receives the whole
tensor from one source rank (point to point, a small header first so that ranks outside the
source placement learn shape and dtype), and slices locally.
"""
import functools
import heapq
import itertools

import numpy as np

from . import comm
from .sbp import balanced_range, balanced_sizes, broadcast, split


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
    n = placement.hierarchy[k]
    if src == target or n == 1:
        # one rank along this axis: split, broadcast and partial all hold the whole value (a
        # partial sum of one term is the sum); no collective, and no copy of the shard (the
        # P -> B all-reduce below copied a row-parallel Linear's output on every single-process
        # step: ~1 ms each on ViT's [32, 65, 1536] activations)
        return arr
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
        # P(max) <-> P(sum): reduce to B, then B -> P
        full = comm.all_reduce(arr.copy(), op=src.op, group=group)
        return _b_to_p(full, target, c, xp)
    if src.is_split:
        a = src.axis
        if target.is_broadcast:
            return comm.all_gather(arr, group=group, axis=a, sizes=sizes(a))
        if target.is_split:
            return comm.all_to_all(arr, group=group, split_axis=target.axis, concat_axis=a,
                                   split_sizes_=sizes(target.axis), concat_sizes=sizes(a))
        # S -> P: the identity of the reduction (0, or -inf for max) with the own slice written in
        level = list(arr.shape)
        level[a] = level_extent(shape, placement, cur, coords, k, a)
        out = xp.full(tuple(level), _identity(target, arr.dtype), dtype=arr.dtype)
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
    return _b_to_p(arr, target, c, xp)


def _identity(partial, dtype):
    """The value that does not change a reduction: 0 for sum, the lowest value for max."""
    if partial.op != "max":
        return 0
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return -np.inf
    if dtype.kind == "b":
        return False
    return np.iinfo(dtype).min


def _b_to_p(arr, target, c, xp):
    """B -> P: for a sum, rank 0 of the axis keeps the value and the others hold zeros; for a
    max, every rank may keep it (max of equal copies is the value)."""
    if target.op == "max" or c == 0:
        return arr
    return xp.zeros_like(arr)


def _touched_dims(*sbps):
    return {s.axis for s in sbps if s.is_split}


def _step_cost(src, dst, nbytes, n):
    """Bytes one rank sends for a 1-D conversion of a shard of `nbytes` over `n` ranks."""
    if src == dst or n == 1:
        return 0.0
    if src.is_partial:
        return nbytes * (n - 1) / n * (1.0 if dst.is_split else 2.0)
    if src.is_split:
        if dst.is_broadcast:
            return nbytes * (n - 1)
        if dst.is_split:
            return nbytes * (n - 1) / n
    return 0.0  # B -> S, B -> P, S -> P: local


@functools.lru_cache(maxsize=4096)
def _plan(shape, hierarchy, src, dst):
    """The cheapest sequence of 1-D steps `(mesh axis, target SBP)` from nd-SBP `src` to `dst`,
    each step one collective (or a local slice) inside one mesh axis' sub-group.

    Converting axis k is valid while no inner axis j > k splits a tensor dim that the step
    touches (the inner shards would straddle the new boundaries). A shortest path (bytes sent,
    estimated from the even split of the logical shape so that every rank picks the same plan)
    over the nd-SBPs whose entries are the target, B or a split; a partial may only be kept or
    become the target, never created on the way. Cyclic cases such as (S(0), S(1)) -> (S(1),
    S(0)) go through such an intermediate (an inner axis re-split on another dim, or gathered
    to B). Returns None beyond a few mesh axes (box_local then uses its fixed order)."""
    nd = len(src)
    if nd > 3:
        return None
    numel = 1
    for e in shape:
        numel *= e

    def fits(state):
        for d in range(len(shape)):
            parts = 1
            for j, s in enumerate(state):
                if s.is_split and s.axis == d:
                    parts *= hierarchy[j]
            if parts > 1 and shape[d] < parts:
                return False
        return True

    def candidates(k):
        out = [dst[k], broadcast] + [split(d) for d in range(len(shape))]
        seen = []
        for t in out:
            if t not in seen:
                seen.append(t)
        return seen

    cands = [candidates(k) for k in range(nd)]
    tick = itertools.count()
    heap = [(0.0, 0, next(tick), tuple(src), ())]
    done = set()
    while heap:
        cost, nsteps, _, state, path = heapq.heappop(heap)
        if state == dst:
            return path
        if state in done:
            continue
        done.add(state)
        parts = 1
        for j, s in enumerate(state):
            if s.is_split:
                parts *= hierarchy[j]
        for k in range(nd):
            cur = state[k]
            for t in cands[k]:
                if t == cur or (cur.is_partial and t.is_partial and t != dst[k]):
                    continue
                touched = _touched_dims(cur, t)
                if any(state[j].is_split and state[j].axis in touched for j in range(k + 1, nd)):
                    continue
                nxt = state[:k] + (t,) + state[k + 1:]
                if nxt in done or not fits(nxt):
                    continue
                step = _step_cost(cur, t, numel / parts, hierarchy[k])
                heapq.heappush(heap, (cost + step, nsteps + 1, next(tick), nxt, path + ((k, t),)))
    return None


def box_local(arr, shape, placement, src, dst, coords):
    """Convert this rank's shard `arr` from nd-SBP `src` to `dst` on the same placement.

    Mesh axes change one at a time, each with its 1-D collective, following the cheapest valid
    plan (`_plan`, cached). Without one (meshes of more than 3 axes), splits are removed inner
    mesh axis first and created outer axis first, and an inner axis that splits a dimension an
    outer step must touch is gathered to B first and re-split, for free, when its own turn comes.
    """
    cur = list(src)
    dst = tuple(dst)
    if tuple(cur) == dst:
        return arr
    plan = _plan(tuple(shape), placement.hierarchy, tuple(cur), dst)
    if plan is not None:
        for k, target in plan:
            arr = _convert_axis(arr, shape, placement, cur, k, target, coords)
            cur[k] = target
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
    logical shape or None) for this rank in the destination placement. A rank outside the
    destination gets None and the source's logical shape (None when it does not know it)."""
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
            host = comm.host_contiguous(full)
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
    if result is None:  # not in the destination: keep the logical shape when this rank knows it
        return None, meta_src.shape
    shape = tuple(result.shape)
    coords = placement_dst.coords(me)
    local = box_local(result, shape, placement_dst, (broadcast,) * placement_dst.ndim, sbp_dst, coords)
    return local, shape

