"""Vision building blocks on global tensors: `PatchEmbedding` (a strided convolution that cuts an
image into patches and projects each) and `DropPath` (stochastic depth).

Both work per sample, so a batch split over data-parallel ranks ([S(0), B]) stays split and
nothing is gathered. DropPath draws its per-sample keep mask with the engine's dropout on a
[batch, 1, 1] tensor laid out like the input's batch: the dropout of a split global tensor
draws one mask per shard and the same mask on ranks that hold the same shard, so the tensor-
parallel ranks of a data-parallel group drop the same samples and their residual streams stay
identical.
"""
import engine as flow
import engine.nn as nn
import engine.nn.functional as F
from libai.utils import distributed as dist

from .utils import make_parameter, to_placement

__all__ = ["PatchEmbedding", "DropPath"]

B = flow.sbp.broadcast


def _pair(v):
    return (int(v), int(v)) if isinstance(v, (int, float)) else tuple(int(x) for x in v)


class PatchEmbedding(nn.Module):
    """[N, C, H, W] images -> [N, (H / p) * (W / p), embed_dim] patch embeddings (row-major over
    the patch grid), through a conv with kernel = stride = patch size; `flatten=False` keeps the
    [N, embed_dim, H / p, W / p] grid. An optional LayerNorm follows (Swin's `patch_norm`)."""

    def __init__(self, img_size=224, patch_size=16, in_chans=3, embed_dim=768, norm_layer=None, flatten=True,
                 *, layer_idx=0):
        super().__init__()
        self.img_size, self.patch_size = _pair(img_size), _pair(patch_size)
        if self.img_size[0] % self.patch_size[0] or self.img_size[1] % self.patch_size[1]:
            raise ValueError(f"PatchEmbedding: img_size {self.img_size} is not a multiple of patch_size "
                             f"{self.patch_size}")
        self.grid_size = (self.img_size[0] // self.patch_size[0], self.img_size[1] // self.patch_size[1])
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.in_chans, self.embed_dim, self.flatten = int(in_chans), int(embed_dim), bool(flatten)
        placement = dist.get_layer_placement(layer_idx)
        sbp = dist.get_nd_sbp([B, B])
        fan_in = self.in_chans * self.patch_size[0] * self.patch_size[1]
        bound = 1.0 / fan_in ** 0.5  # PyTorch's Conv2d default initialisation
        self.weight = make_parameter((self.embed_dim, self.in_chans, *self.patch_size),
                                     lambda t: nn.init.uniform_(t, -bound, bound), placement, sbp)
        self.bias = make_parameter((self.embed_dim,), lambda t: nn.init.uniform_(t, -bound, bound), placement, sbp)
        self.norm = norm_layer(self.embed_dim) if norm_layer is not None else None
        self._placement = placement

    def forward(self, x):
        if x.ndim != 4 or tuple(x.shape[1:]) != (self.in_chans, *self.img_size):
            raise ValueError(f"PatchEmbedding: expected images [N, {self.in_chans}, {self.img_size[0]}, "
                             f"{self.img_size[1]}], got {list(x.shape)}")
        x = to_placement(x, self._placement)
        x = F.conv2d(x, self.weight, self.bias, stride=self.patch_size)  # [N, D, H/p, W/p]
        if self.flatten:
            x = x.flatten(2).transpose(1, 2)  # [N, H/p * W/p, D]
        if self.norm is not None:
            x = self.norm(x)
        return x

    def extra_repr(self):
        return (f"img_size={self.img_size}, patch_size={self.patch_size}, in_chans={self.in_chans}, "
                f"embed_dim={self.embed_dim}")


class DropPath(nn.Module):
    """Stochastic depth: in training, zero a whole sample's residual branch with probability
    `drop_prob` and scale the kept ones by 1 / (1 - drop_prob); identity in eval."""

    def __init__(self, drop_prob=0.0):
        super().__init__()
        if not 0.0 <= drop_prob < 1.0:
            raise ValueError(f"DropPath: drop_prob must be in [0, 1), got {drop_prob}")
        self.drop_prob = float(drop_prob)

    def forward(self, x):
        if not self.training or self.drop_prob == 0.0:
            return x
        shape = (x.shape[0],) + (1,) * (x.ndim - 1)
        if x.is_global:
            # the batch layout of x on every mesh axis; size-1 axes cannot stay split
            sbp = [s if s == flow.sbp.split(0) else B for s in x.sbp]
            ones = flow.ones(*shape, dtype=x.dtype, placement=x.placement, sbp=sbp)
        else:
            ones = flow.ones(*shape, dtype=x.dtype, device=x.device)
        return x * F.dropout(ones, self.drop_prob, training=True)

    def extra_repr(self):
        return f"drop_prob={self.drop_prob}"
