"""Vision Transformer (Dosovitskiy et al., 2020) on libai.layers, with LiBai's config keys.

    images [N, C, H, W]
      -> PatchEmbedding (conv, kernel = stride = patch)      [N, P, D]     P = (H/p) * (W/p)
      -> prepend the cls token, add position embeddings      [N, P + 1, D]
      -> depth x pre-LN TransformerLayer (stochastic depth rising linearly to drop_path_rate)
      -> LayerNorm, the cls token's output                   [N, D]
      -> head Linear                                         [N, num_classes]

Training returns {"losses": loss}, eval {"prediction_scores": logits} (LiBai's convention). The
loss is `loss_func(logits, labels)` when given (e.g. `SoftTargetCrossEntropy()` for mixup);
by default the one HuggingFace's `problem_type` names (libai.models.utils.classification):
with None, the cross-entropy of integer labels, or of soft labels [N, num_classes] (Mixup's),
and with num_classes == 1 the mean squared error (regression, as HuggingFace's).

Tensor parallel: the blocks are LiBai's TransformerLayer (heads split over tp, MLP column/row
parallel); the patch embedding, tokens, position embeddings and head are replicated, and the
batch stays split over dp throughout. HuggingFace's `ViTForImageClassification` is the same
network with `layernorm_epsilon=1e-12` (`from_huggingface`, libai.models.utils.hf_vit).
"""
import functools

import numpy as np

import engine as flow
import engine.nn as nn
import engine.nn.functional as F
from libai.config import configurable
from libai.layers import LayerNorm, Linear, PatchEmbedding, TransformerLayer
from libai.layers.utils import init_method_normal, make_parameter
from libai.utils import distributed as dist

from .utils.classification import SoftTargetCrossEntropy, check_problem_type, classification_loss
from .utils.model_config import check_positive_sizes, kwargs_from_config
from .utils.pipeline import PipelineStep

__all__ = ["VisionTransformer", "SoftTargetCrossEntropy"]

B = flow.sbp.broadcast


class VisionTransformer(nn.Module):
    @configurable
    def __init__(self, img_size=224, patch_size=16, in_chans=3, embed_dim=192, depth=12, num_heads=3, mlp_ratio=4.0,
                 drop_rate=0.0, attn_drop_rate=0.0, drop_path_rate=0.0, num_classes=1000, loss_func=None,
                 layernorm_epsilon=1e-6, initializer_range=0.02, problem_type=None):
        super().__init__()
        check_problem_type("VisionTransformer", problem_type)
        hidden = int(embed_dim * mlp_ratio)
        check_positive_sizes("VisionTransformer", embed_dim=embed_dim, num_heads=num_heads, in_chans=in_chans,
                             **{"embed_dim * mlp_ratio": hidden})
        dist.check_tensor_parallel_divisible(num_heads, "VisionTransformer: num_heads")
        dist.check_tensor_parallel_divisible(hidden, "VisionTransformer: embed_dim * mlp_ratio")
        self.num_classes, self.embed_dim = int(num_classes), int(embed_dim)
        self.patch_embed = PatchEmbedding(img_size, patch_size, in_chans, embed_dim, layer_idx=0)
        placement = dist.get_layer_placement(0)
        sbp = dist.get_nd_sbp([B, B])
        init = init_method_normal(initializer_range)
        self.cls_token = make_parameter((1, 1, embed_dim), init, placement, sbp)
        self.pos_embed = make_parameter((1, self.patch_embed.num_patches + 1, embed_dim), init, placement, sbp)
        self.drop_rate = float(drop_rate)
        rates = np.linspace(0, drop_path_rate, depth) if depth else []  # stochastic depth per block
        self.blocks = nn.ModuleList([
            TransformerLayer(embed_dim, hidden, num_heads, attention_dropout_prob=attn_drop_rate,
                             output_dropout_prob=drop_rate, drop_path_prob=float(rates[i]),
                             layernorm_epsilon=layernorm_epsilon, init_method=init, layer_idx=i,
                             layernorm_position="pre", activation="gelu")
            for i in range(depth)
        ])
        self.norm = LayerNorm(embed_dim, eps=layernorm_epsilon, layer_idx=-1)
        self.head = Linear(embed_dim, num_classes, init_method=init, layer_idx=-1) if num_classes > 0 else None
        self.loss_func = loss_func if loss_func is not None else default_loss(problem_type)

    @classmethod
    def from_config(cls, cfg):
        return kwargs_from_config(cls, cfg)

    @classmethod
    def from_huggingface(cls, path, **overrides):
        """A VisionTransformer with the weights of a HuggingFace ViT folder (config.json +
        model.safetensors of `ViTForImageClassification` or `ViTModel`)."""
        from .utils.hf_vit import load_huggingface_vit

        return load_huggingface_vit(cls, path, **overrides)

    def forward_features(self, images):
        x = self._embed(images)
        for block in self.blocks:
            x = block(x)
        return self._pool(x)

    def _embed(self, images):
        x = self.patch_embed(images)  # [N, P, D]
        cls = self.cls_token.expand(x.shape[0], -1, -1)  # [N, 1, D]
        x = flow.cat([cls.to_global(sbp=x.sbp) if x.is_global else cls, x], dim=1)  # [N, P + 1, D]
        return F.dropout(x + self.pos_embed, self.drop_rate, training=self.training)

    def _pool(self, x):
        return self.norm(x)[:, 0]  # [N, D]: the cls token

    def forward(self, images, labels=None):
        return classifier_outputs(self, self.forward_features(images), labels)

    def pipeline_steps(self):
        """Pipeline parallelism (libai.engine.pipeline): the embedding, each block on its layer's
        stage, then the norm, the head and the loss."""
        def block_step(block):
            return lambda carry, batch: {"hidden": block(carry["hidden"])}

        return [PipelineStep(0, lambda carry, batch: {"hidden": self._embed(batch["images"])}),
                *[PipelineStep(block.layer_idx, block_step(block)) for block in self.blocks],
                PipelineStep(-1, lambda carry, batch: classifier_outputs(self, self._pool(carry["hidden"]),
                                                                         batch.get("labels")))]


def default_loss(problem_type):
    """The image classifiers' loss when no `loss_func` is given (libai.models.utils.classification):
    float labels [N, num_classes] are soft targets under problem_type None."""
    return functools.partial(classification_loss, problem_type=problem_type, soft_targets=True)


def classifier_outputs(model, features, labels):
    """LiBai's image-classifier outputs from pooled features [N, D]: {"losses": loss} in training
    with labels, else {"prediction_scores": logits [N, num_classes]} (ViT and Swin)."""
    logits = model.head(features) if model.head is not None else features
    if labels is not None and model.training:
        return {"losses": model.loss_func(logits, labels)}
    return {"prediction_scores": logits}
