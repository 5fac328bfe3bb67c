"""Swin Transformer (Liu et al., 2021) on libai.layers, with LiBai's config keys.

    images [N, C, H, W]
      -> PatchEmbedding (+ LayerNorm), optional absolute position embedding   [N, H/4 * W/4, D]
      -> stages: depths[i] Swin blocks at width D * 2^i, heads num_heads[i], then (but for the
         last stage) PatchMerging: 2x2 neighbours concatenated, LayerNorm, Linear 4C -> 2C
      -> LayerNorm, mean over the tokens, head Linear                          [N, num_classes]

A Swin block is pre-LN: x + attn(ln(x)), then x + mlp(ln(x)), both branches through stochastic
depth (the attention branch only with `mlp_drop_path=False`, HuggingFace's SwinLayer). The attention works inside windows of window_size x window_size tokens (the map padded at
the bottom/right to a multiple of the window), with a learned relative position bias per head;
every second block shifts the map by window_size // 2 first (a cyclic roll) and masks the token
pairs that the roll brought together (-100 added to their scores). When a stage's map is no
larger than the window, the window is the map (its bias table sized for it) and there is no
shift, as in the original Swin.

Tensor parallel: the q/k/v projection is column parallel with each head's q, k, v rows together
(so a shard holds whole heads), the relative position bias table is split over the same heads,
the window attention runs on each rank's local heads, and the output projection is row
parallel; MLPs are column/row parallel. Patch merging, norms and the head are replicated; the
batch stays split over data parallel throughout.

Training returns {"losses": loss}, eval {"prediction_scores": logits}. HuggingFace's
`SwinForImageClassification` is the same network (libai.models.utils.hf_swin, which loads it with
`mlp_drop_path=False`). `layernorm_epsilon` is the blocks' and the final LayerNorm's (HF's
`layer_norm_eps`); the patch embedding's and the patch mergings' LayerNorms use 1e-5 whatever it
is, as in HF, the original Swin and LiBai.
"""
import numpy as np

import engine as flow
import engine.nn as nn
import engine.nn.functional as F
from libai.config import configurable
from libai.layers import MLP, DropPath, LayerNorm, Linear, PatchEmbedding
from libai.layers.utils import Recomputable, init_method_normal, make_parameter, split_on_dp, to_placement
from libai.utils import distributed as dist

from .utils.model_config import check_positive_sizes, kwargs_from_config
from .utils.pipeline import PipelineStep
from .utils.classification import check_problem_type
from .vision_transformer import classifier_outputs, default_loss

__all__ = ["SwinTransformer"]

B = flow.sbp.broadcast
S = flow.sbp.split
PATCH_NORM_EPS = 1e-5  # the patch embedding's and the patch mergings' LayerNorms (see the docstring)


def relative_position_index(window):
    """[window^2, window^2] index into the ((2w - 1)^2, heads) bias table: the row-major offset of
    (dy, dx) between two positions of a window."""
    coords = np.stack(np.meshgrid(np.arange(window), np.arange(window), indexing="ij")).reshape(2, -1)
    rel = (coords[:, :, None] - coords[:, None, :]).transpose(1, 2, 0) + (window - 1)  # [w^2, w^2, 2]
    return (rel[..., 0] * (2 * window - 1) + rel[..., 1]).astype(np.int64)


def shift_mask(height, width, window, shift):
    """[windows, window^2, window^2] additive mask of a shifted (padded) map: -100 between tokens
    that the cyclic roll brought from different regions of the map, 0 elsewhere."""
    def regions(n):
        idx = np.arange(n)
        return (idx >= n - window).astype(np.int64) + (idx >= n - shift)

    img = (regions(height)[:, None] * 3 + regions(width)[None, :]).astype(np.float32)  # [H, W]
    win = img.reshape(height // window, window, width // window, window).transpose(0, 2, 1, 3)
    win = win.reshape(-1, window * window)  # [windows, w^2]
    diff = win[:, None, :] - win[:, :, None]
    return np.where(diff != 0, np.float32(-100.0), np.float32(0.0))


def _partition(x, window):
    """[n, H, W, C] -> [n * windows, window^2, C] (windows in row-major order)."""
    n, h, w, c = x.shape
    x = x.view(n, h // window, window, w // window, window, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, window * window, c)


def _merge(windows, window, n, h, w):
    """The inverse of _partition: [n * windows, window^2, C] -> [n, H, W, C]."""
    c = windows.shape[-1]
    x = windows.view(n, h // window, w // window, window, window, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(n, h, w, c)


class WindowAttention(nn.Module):
    """Multi-head self-attention inside windows with a relative position bias (see the module
    docstring for its tensor-parallel layout)."""

    def __init__(self, dim, num_heads, window_size, attn_drop=0.0, proj_drop=0.0, init_method=None, *,
                 layer_idx=0):
        super().__init__()
        dist.check_tensor_parallel_divisible(num_heads, "SwinTransformer: num_heads of every stage")
        self.dim, self.num_heads, self.window_size = int(dim), int(num_heads), int(window_size)
        self.head_size = self.dim // self.num_heads
        self.scale = self.head_size ** -0.5
        self.attn_drop = float(attn_drop)
        init_method = init_method or init_method_normal(0.02)
        self.qkv = Linear(dim, 3 * dim, parallel="col", init_method=init_method, layer_idx=layer_idx)
        self.proj = Linear(dim, dim, parallel="row", init_method=init_method, layer_idx=layer_idx,
                           output_dropout_prob=proj_drop)
        placement = dist.get_layer_placement(layer_idx)
        table = ((2 * self.window_size - 1) ** 2, self.num_heads)
        self.relative_position_bias_table = make_parameter(table, init_method_normal(0.02), placement,
                                                           dist.get_nd_sbp([B, S(1)]))
        # a non-persistent buffer: moves with the module, not in its state dict (as HF's)
        self.register_buffer("relative_position_index",
                             flow.tensor(relative_position_index(self.window_size).reshape(-1)), persistent=False)
        self._masks = {}  # (padded height, padded width, shift) -> the shift mask, built once

    def forward(self, x, height, width, shift):
        """x [n, H*W, C] (already normalised) -> [n, H*W, C]; windows of `self.window_size`
        (clamped to the map), shifted by `shift`."""
        c = x.shape[2]
        window = self.window_size
        pad_b, pad_r = (-height) % window, (-width) % window
        hp, wp = height + pad_b, width + pad_r
        placement = x.placement
        dp_sbp = S(0) if split_on_dp(x.shape) else B
        # the windows are cut before the q/k/v projection (a per-token map, so it commutes with
        # the pad, the shift and the partition): those copies move C channels instead of 3C
        tokens = x.to_global(sbp=dist.get_nd_sbp([dp_sbp, B])).to_local()  # [n_l, H*W, C]: this rank's samples
        n_l = tokens.shape[0]
        tokens = tokens.view(n_l, height, width, c)
        if pad_b or pad_r:  # zero tokens at the bottom/right (their q, k, v are the biases)
            tokens = F.pad(tokens, (0, 0, 0, pad_r, 0, pad_b))  # [n_l, Hp, Wp, C]
        if shift:
            tokens = flow.roll(tokens, shifts=(-shift, -shift), dims=(1, 2))
        tokens = _partition(tokens, window).view(n_l, hp * wp, c)  # [n_l, nW * w^2, C] in window order
        x = tokens.to_global(placement=placement, sbp=dist.get_nd_sbp([dp_sbp, B]))
        qkv = self.qkv(x)  # [n, nW * w^2, 3C] split over tp by heads
        sbp = dist.get_nd_sbp([dp_sbp, S(2)])
        win = qkv.to_global(sbp=sbp).to_local()  # [n_l, nW * w^2, 3 C_l]: this rank's samples and heads
        heads = win.shape[2] // (3 * self.head_size)
        nw = (hp // window) * (wp // window)
        # [(2w-1)^2, h_l]: this rank's heads (boxed to its declared layout first: ZeRO-3 stores
        # it split over the data-parallel ranks too, and to_local() would read that shard)
        table = self.relative_position_bias_table.to_global(sbp=dist.get_nd_sbp([B, S(1)])).to_local()
        bias = table[self.relative_position_index].view(window * window, window * window, heads)
        bias = bias.permute(2, 0, 1)  # [h_l, w^2, w^2]
        if shift:
            key = (hp, wp, shift)
            if key not in self._masks:
                mask = shift_mask(hp, wp, window, shift)
                self._masks[key] = flow.tensor(mask, device=bias.device)  # [nW, w^2, w^2]
            bias = bias + self._masks[key].view(nw, 1, window * window, window * window)  # [nW, h_l, w^2, w^2]
        # the attention core as one op: scores + bias, softmax, dropout, @ v, per image and window
        ctx = F.packed_qkv_attention(win.view(n_l, nw, window * window, win.shape[-1]), heads, scale=self.scale,
                                     bias=bias, dropout_p=self.attn_drop, training=self.training)
        ctx = ctx.view(n_l * nw, window * window, heads * self.head_size)  # [n_l * nW, w^2, C_l]
        ctx = _merge(ctx, window, n_l, hp, wp)  # [n_l, H', W', C_l]
        if shift:
            ctx = flow.roll(ctx, shifts=(shift, shift), dims=(1, 2))
        if pad_b or pad_r:
            ctx = ctx[:, :height, :width]
        ctx = ctx.reshape(n_l, height * width, heads * self.head_size)
        ctx = ctx.to_global(placement=placement, sbp=sbp)
        return self.proj(ctx)  # row parallel: [n, L, C]


class SwinBlock(Recomputable, nn.Module):
    """One Swin block on a map of `resolution`; a map no larger than the window is one window
    (the window shrinks to it, with its own bias table) and is not shifted, as in the original."""

    def __init__(self, dim, num_heads, resolution, window_size, shift, mlp_ratio, drop, attn_drop, drop_path, eps,
                 init_method, *, layer_idx=0, mlp_drop_path=True):
        super().__init__()
        self.layer_idx = layer_idx
        if min(resolution) <= window_size:
            window_size, shift = min(resolution), 0
        self.window_size, self.shift = int(window_size), int(shift)
        # norm1's and norm2's outputs feed only products (qkv after exact moves: pad, roll, window
        # partition; the MLP): in the autocast dtype (libai.layers.LayerNorm's autocast_output)
        self.norm1 = LayerNorm(dim, eps=eps, layer_idx=layer_idx, autocast_output=True)
        self.attn = WindowAttention(dim, num_heads, window_size, attn_drop, drop, init_method, layer_idx=layer_idx)
        self.norm2 = LayerNorm(dim, eps=eps, layer_idx=layer_idx, autocast_output=True)
        self.mlp = MLP(dim, int(dim * mlp_ratio), output_dropout_prob=drop, init_method=init_method,
                       layer_idx=layer_idx, activation="gelu")
        self.drop_path = DropPath(drop_path) if drop_path > 0 else None
        self.mlp_drop_path = bool(mlp_drop_path)

    def _branch(self, y):
        return self.drop_path(y) if self.drop_path is not None else y

    def forward(self, x, height, width):
        x = x + self._branch(self.attn(self.norm1(x), height, width, self.shift))
        y = self.mlp(self.norm2(x))
        return x + (self._branch(y) if self.mlp_drop_path else y)


class PatchMerging(nn.Module):
    """[n, H*W, C] -> [n, ceil(H/2) * ceil(W/2), 2C]: each 2x2 neighbourhood (the map padded to even
    sizes) concatenated as [(0,0), (1,0), (0,1), (1,1)], normalised, projected without bias."""

    def __init__(self, dim, init_method, *, layer_idx=0):
        super().__init__()
        self.norm = LayerNorm(4 * dim, eps=PATCH_NORM_EPS, layer_idx=layer_idx, autocast_output=True)
        self.reduction = Linear(4 * dim, 2 * dim, bias=False, init_method=init_method, layer_idx=layer_idx)

    def forward(self, x, height, width):
        n, c = x.shape[0], x.shape[2]
        x = x.view(n, height, width, c)
        if height % 2 or width % 2:
            x = F.pad(x, (0, 0, 0, width % 2, 0, height % 2))
        h2, w2 = (height + 1) // 2, (width + 1) // 2
        # the four strided slices [0::2, 0::2], [1::2, 0::2], [0::2, 1::2], [1::2, 1::2] side by
        # side are one copy: channel block k = 2 * column offset + row offset
        x = x.view(n, h2, 2, w2, 2, c)  # [n, H/2, row offset, W/2, column offset, C]
        x = x.permute(0, 1, 3, 4, 2, 5)  # [n, H/2, W/2, column offset, row offset, C]
        x = x.reshape(n, h2 * w2, 4 * c)
        return self.reduction(self.norm(x))


class SwinTransformer(nn.Module):
    @configurable
    def __init__(self, img_size=224, patch_size=4, in_chans=3, num_classes=1000, embed_dim=96, depths=(2, 2, 6, 2),
                 num_heads=(3, 6, 12, 24), window_size=7, mlp_ratio=4.0, qkv_bias=True, qk_scale=None, drop_rate=0.0,
                 attn_drop_rate=0.0, drop_path_rate=0.1, ape=False, patch_norm=True, loss_func=None,
                 layernorm_epsilon=1e-5, initializer_range=0.02, mlp_drop_path=True, problem_type=None):
        super().__init__()
        check_problem_type("SwinTransformer", problem_type)
        if not qkv_bias:
            raise NotImplementedError("SwinTransformer(qkv_bias=False): not implemented")
        if qk_scale is not None:
            raise NotImplementedError("SwinTransformer(qk_scale=...): not implemented (the scale is head_size^-0.5)")
        check_positive_sizes("SwinTransformer", embed_dim=embed_dim, depths=depths, num_heads=num_heads,
                             window_size=window_size, patch_size=patch_size, in_chans=in_chans)
        if len(depths) != len(num_heads):
            raise ValueError(f"SwinTransformer: depths {list(depths)} and num_heads {list(num_heads)} differ in length")
        init = init_method_normal(initializer_range)
        eps = layernorm_epsilon
        self.num_classes, self.embed_dim = int(num_classes), int(embed_dim)
        self.patch_embed = _PaddedPatchEmbedding(img_size, patch_size, in_chans, embed_dim,
                                                 PATCH_NORM_EPS if patch_norm else None)
        self.grid = self.patch_embed.grid
        placement = dist.get_layer_placement(0)
        self.absolute_pos_embed = make_parameter((1, self.grid[0] * self.grid[1], embed_dim), init, placement,
                                                 dist.get_nd_sbp([B, B])) if ape else None
        self.drop_rate = float(drop_rate)
        rates = np.linspace(0, drop_path_rate, sum(depths)).tolist()
        self.stages = nn.ModuleList()
        self.merges = nn.ModuleList()
        k = 0
        res = self.grid
        for i, (depth, heads) in enumerate(zip(depths, num_heads)):
            dim = embed_dim * 2 ** i
            # blocks are layers k .. k+depth-1 of the pipeline (train.dist.pipeline_num_layers =
            # sum(depths)); a stage's patch merging runs with its last block
            self.stages.append(nn.ModuleList([
                SwinBlock(dim, heads, res, window_size, 0 if j % 2 == 0 else window_size // 2, mlp_ratio,
                          drop_rate, attn_drop_rate, rates[k + j], eps, init, layer_idx=k + j,
                          mlp_drop_path=mlp_drop_path)
                for j in range(depth)]))
            res = ((res[0] + 1) // 2, (res[1] + 1) // 2)
            k += depth
            if i < len(depths) - 1:
                self.merges.append(PatchMerging(dim, init, layer_idx=k - 1))
        self.num_features = embed_dim * 2 ** (len(depths) - 1)
        self.norm = LayerNorm(self.num_features, eps=eps, layer_idx=-1)
        self.head = Linear(self.num_features, num_classes, init_method=init, layer_idx=-1) if num_classes > 0 else None
        self.loss_func = loss_func if loss_func is not None else default_loss(problem_type)

    @classmethod
    def from_config(cls, cfg):
        return kwargs_from_config(cls, cfg)

    @classmethod
    def from_huggingface(cls, path, **overrides):
        """A SwinTransformer with the weights of a HuggingFace Swin folder (SwinForImageClassification
        or SwinModel)."""
        from .utils.hf_swin import load_huggingface_swin

        return load_huggingface_swin(cls, path, **overrides)

    def forward_features(self, images):
        x = self._embed(images)
        for run_block in self._block_runs():
            x = run_block(x)
        return self._pool(x)

    def _embed(self, images):
        x = self.patch_embed(images)  # [N, H/p * W/p, D]
        if self.absolute_pos_embed is not None:
            x = x + self.absolute_pos_embed
        return F.dropout(x, self.drop_rate, training=self.training)

    def _block_runs(self):
        """One function per block, in order: the block on its map size, followed by its stage's
        patch merging after the stage's last block."""
        runs = []
        h, w = self.grid
        for i, blocks in enumerate(self.stages):
            for j, block in enumerate(blocks):
                merge = self.merges[i] if i < len(self.merges) and j == len(blocks) - 1 else None
                runs.append(_BlockRun(block, merge, h, w))
            h, w = (h + 1) // 2, (w + 1) // 2
        return runs

    def _pool(self, x):
        return self.norm(x).mean(dim=1)  # [N, C]

    def forward(self, images, labels=None):
        return classifier_outputs(self, self.forward_features(images), labels)

    def pipeline_steps(self):
        """Pipeline parallelism (libai.engine.pipeline): the embedding, each block (with its
        stage's patch merging after the last) on its layer's stage, then norm, head and loss."""
        def block_step(run):
            return lambda carry, batch: {"hidden": run(carry["hidden"])}

        return [PipelineStep(0, lambda carry, batch: {"hidden": self._embed(batch["images"])}),
                *[PipelineStep(run.block.layer_idx, block_step(run)) for run in self._block_runs()],
                PipelineStep(-1, lambda carry, batch: classifier_outputs(self, self._pool(carry["hidden"]),
                                                                         batch.get("labels")))]


class _BlockRun:
    """A Swin block on an h x w map, then (the last block of a stage) the patch merging."""

    def __init__(self, block, merge, h, w):
        self.block, self.merge, self.h, self.w = block, merge, h, w

    def __call__(self, x):
        x = self.block(x, self.h, self.w)
        if self.merge is not None:
            x = self.merge(x, self.h, self.w)  # [N, ceil(h/2) * ceil(w/2), 2C]
        return x


class _PaddedPatchEmbedding(nn.Module):
    """Swin's patch embedding: images padded at the bottom/right to a multiple of the patch size,
    a PatchEmbedding, then (patch_norm) a LayerNorm."""

    def __init__(self, img_size, patch_size, in_chans, embed_dim, norm_eps):
        super().__init__()
        img = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        self.patch = int(patch_size)
        self.img = img
        padded = tuple(-(-s // self.patch) * self.patch for s in img)
        self.inner = PatchEmbedding(padded, self.patch, in_chans, embed_dim)
        self.grid = self.inner.grid_size
        self.norm = LayerNorm(embed_dim, eps=norm_eps) if norm_eps is not None else None

    def forward(self, images):
        if images.ndim != 4 or tuple(images.shape[2:]) != self.img:
            raise ValueError(f"SwinTransformer: expected images [N, C, {self.img[0]}, {self.img[1]}], "
                             f"got {list(images.shape)}")
        ph, pw = (-self.img[0]) % self.patch, (-self.img[1]) % self.patch
        if ph or pw:
            images = F.pad(to_placement(images, dist.get_layer_placement(0)), (0, pw, 0, ph))
        x = self.inner(images)
        return self.norm(x) if self.norm is not None else x
