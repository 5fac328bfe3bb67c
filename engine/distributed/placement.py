"""Placement: a device type and a mesh of ranks (`[[0, 1], [2, 3]]` is a 2x2 mesh)."""
import numpy as np


class placement:
    """Where a global tensor lives: `placement("cpu", [0, 1, 2, 3])` or, for a 2-D mesh,
    `placement("cpu", [[0, 1], [2, 3]])` (hierarchy (2, 2)). Equal placements hash equal."""

    __slots__ = ("type", "_mesh", "_key", "_ranks_set", "_coords")

    def __init__(self, type="cpu", ranks=None):
        if type not in ("cpu", "cuda"):
            raise ValueError(f"placement type must be 'cpu' or 'cuda', got {type!r}")
        if ranks is None:
            raise TypeError("placement needs ranks, e.g. placement('cpu', [0, 1])")
        mesh = np.array(ranks, dtype=np.int64)
        if mesh.ndim == 0:
            mesh = mesh.reshape(1)
        if mesh.size == 0:
            raise ValueError("placement needs at least one rank")
        if len(np.unique(mesh)) != mesh.size:
            raise ValueError(f"placement ranks must be distinct, got {mesh.tolist()}")
        if (mesh < 0).any():
            raise ValueError(f"placement ranks must be non-negative, got {mesh.tolist()}")
        self.type = type
        self._mesh = mesh
        self._mesh.setflags(write=False)
        self._key = (type, mesh.shape, tuple(mesh.reshape(-1).tolist()))
        self._ranks_set = frozenset(self._key[2])
        # every op on global tensors asks for its rank's coordinates: a lookup, not an argwhere
        self._coords = {int(mesh[c]): tuple(int(i) for i in c) for c in np.ndindex(mesh.shape)}

    @classmethod
    def all(cls, type="cpu"):
        """All ranks of the job in a 1-D mesh."""
        from . import comm

        return cls(type, list(range(comm.get_world_size())))

    @property
    def ranks(self):
        return self._mesh.tolist()

    @property
    def mesh(self):
        return self._mesh

    @property
    def hierarchy(self):
        return tuple(self._mesh.shape)

    @property
    def ndim(self):
        return self._mesh.ndim

    @property
    def size(self):
        return self._mesh.size

    def has_rank(self, rank):
        return rank in self._ranks_set

    def coords(self, rank):
        """Mesh coordinates of `rank` (a tuple), or None when the rank is not in the placement."""
        return self._coords.get(rank)

    def __eq__(self, other):
        return isinstance(other, placement) and self._key == other._key

    def __hash__(self):
        return hash(self._key)

    def __repr__(self):
        return f'placement(type="{self.type}", ranks={self.ranks})'
