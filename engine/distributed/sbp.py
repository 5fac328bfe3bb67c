"""SBP: how one logical tensor is laid out over the ranks of one mesh axis.

* `split(a)`   -- S(a): the logical tensor is the concatenation of the shards along axis a;
                  uneven extents are balanced, the first `n % k` shards one larger (5 over 4: 2,1,1,1).
* `broadcast`  -- B: every shard is the whole logical tensor.
* `partial_sum`-- P: the logical tensor is the elementwise sum of the shards.
* `partial_max`-- internal: the logical tensor is the elementwise max (two-stage reductions).
"""


class _Sbp:
    __slots__ = ()
    is_split = is_broadcast = is_partial = False

    def __reduce__(self):
        return (_named, (repr(self),))


class split(_Sbp):
    __slots__ = ("axis",)
    is_split = True

    def __init__(self, axis):
        if not isinstance(axis, int) or isinstance(axis, bool):
            raise TypeError(f"sbp.split(axis) needs an int axis, got {axis!r}")
        self.axis = axis

    def __eq__(self, other):
        return isinstance(other, split) and other.axis == self.axis

    def __hash__(self):
        return hash(("S", self.axis))

    def __repr__(self):
        return f"S({self.axis})"

    def __reduce__(self):
        return (split, (self.axis,))


class _Broadcast(_Sbp):
    is_broadcast = True

    def __repr__(self):
        return "B"


class _Partial(_Sbp):
    __slots__ = ("op",)
    is_partial = True

    def __init__(self, op):
        self.op = op

    def __eq__(self, other):
        return isinstance(other, _Partial) and other.op == self.op

    def __hash__(self):
        return hash(("P", self.op))

    def __repr__(self):
        return "P" if self.op == "sum" else f"P({self.op})"


broadcast = _Broadcast()
partial_sum = _Partial("sum")
partial_max = _Partial("max")

_BY_NAME = {"B": broadcast, "P": partial_sum, "P(max)": partial_max}


def _named(name):
    return _BY_NAME[name]


def as_sbp_tuple(sbp, ndim_mesh):
    """Normalise `sbp` (one SBP or a sequence, one per mesh axis) to a tuple."""
    if isinstance(sbp, _Sbp):
        sbp = (sbp,)
    sbp = tuple(sbp)
    for s in sbp:
        if not isinstance(s, _Sbp):
            raise TypeError(f"sbp entries must be flow.sbp.split(i), broadcast or partial_sum, got {s!r}")
    if len(sbp) != ndim_mesh:
        raise ValueError(f"sbp {sbp} has {len(sbp)} entries but the placement's mesh has {ndim_mesh} axes")
    return sbp


def balanced_sizes(extent, parts):
    """Extents of the `parts` shards of `extent` (first extent % parts one larger)."""
    q, r = divmod(extent, parts)
    return [q + (1 if i < r else 0) for i in range(parts)]


def balanced_range(extent, parts, index):
    """[start, stop) of shard `index` of `extent` split over `parts`."""
    q, r = divmod(extent, parts)
    start = index * q + min(index, r)
    return start, start + q + (1 if index < r else 0)


class Signature:
    """One 1-D SBP signature: an SBP per input (None for absent inputs) and per output."""

    __slots__ = ("ins", "outs")

    def __init__(self, ins, outs):
        self.ins = tuple(ins)
        self.outs = tuple(outs)

    @property
    def all_broadcast(self):
        return all(s is None or s.is_broadcast for s in self.ins + self.outs)

    def __repr__(self):
        return f"{self.ins} -> {self.outs}"
