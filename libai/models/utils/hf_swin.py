"""HuggingFace Swin <-> libai SwinTransformer: config and weight names, loading a folder.

    HF (prefix "swin.")                                        SwinTransformer
    embeddings.patch_embeddings.projection.*                   patch_embed.inner.*
    embeddings.norm.*                                          patch_embed.norm.*
    embeddings.position_embeddings (use_absolute_embeddings)   absolute_pos_embed
    encoder.layers.{i}.blocks.{j}.layernorm_before.*           stages.{i}.{j}.norm1.*
    encoder.layers.{i}.blocks.{j}.attention.self.{query,key,value}.*   stages.{i}.{j}.attn.qkv.*  (fused)
    encoder.layers.{i}.blocks.{j}.attention.self.relative_position_bias_table
                                                               stages.{i}.{j}.attn.relative_position_bias_table
    encoder.layers.{i}.blocks.{j}.attention.output.dense.*     stages.{i}.{j}.attn.proj.*
    encoder.layers.{i}.blocks.{j}.layernorm_after.*            stages.{i}.{j}.norm2.*
    encoder.layers.{i}.blocks.{j}.intermediate.dense.*         stages.{i}.{j}.mlp.dense_h_to_4h.*
    encoder.layers.{i}.blocks.{j}.output.dense.*               stages.{i}.{j}.mlp.dense_4h_to_h.*
    encoder.layers.{i}.downsample.{norm,reduction}.*           merges.{i}.{norm,reduction}.*
    layernorm.*                                                norm.*
    classifier.* (SwinForImageClassification)                  head.*

transformers 5 names some of these differently in memory (`attention.q_proj`, `mlp.fc1`,
`attention.relative_position_bias.relative_position_bias_table`, ...); both spellings are read.
"""
import numpy as np

from .hf_bert import qkv_hf_to_libai
from .hf_gpt2 import HFConfigError
from .hf_vit import TensorReader, hf_num_classes, hf_problem_type, hf_size, load_huggingface_classifier

__all__ = ["swin_kwargs_from_hf_config", "hf_to_libai_swin", "load_huggingface_swin"]


def _check_windows_fit(hf, image_size, patch_size):
    """HFConfigError when a stage's map is smaller than the window: HF's Swin then attends in a
    window of the map's size with position tables sized for the configured window, which fails
    in HF and cannot be loaded here (our tables follow the window the stage uses)."""
    window = int(hf.get("window_size", 7))
    h, w = (image_size, image_size) if isinstance(image_size, int) else image_size
    res = (-(-h // patch_size), -(-w // patch_size))  # the padded patch grid
    for stage in range(len(hf.get("depths", (2, 2, 6, 2)))):
        if min(res) < window:
            raise HFConfigError(f"unsupported config: stage {stage}'s map {res[0]}x{res[1]} is smaller than "
                                f"window_size={window} (image_size={hf.get('image_size')!r}, "
                                f"patch_size={patch_size}); HF's Swin cannot run it either: its position tables "
                                "are sized for the window")
        res = ((res[0] + 1) // 2, (res[1] + 1) // 2)


def swin_kwargs_from_hf_config(hf):
    if hf.get("model_type", "swin") != "swin":
        raise HFConfigError(f"unsupported config: model_type={hf.get('model_type')!r} (only 'swin')")
    if hf.get("hidden_act", "gelu") != "gelu":
        raise HFConfigError(f"unsupported config: hidden_act={hf['hidden_act']!r} (the exact GELU, 'gelu')")
    if not hf.get("qkv_bias", True):
        raise HFConfigError("unsupported config: qkv_bias=False")
    patch_size = hf_size(hf, "patch_size", 4)
    if not isinstance(patch_size, int):
        raise HFConfigError(f"unsupported config: patch_size={hf['patch_size']!r} (square patches only)")
    _check_windows_fit(hf, hf_size(hf, "image_size", 224), patch_size)
    return dict(img_size=hf_size(hf, "image_size", 224), patch_size=patch_size,
                in_chans=int(hf.get("num_channels", 3)), embed_dim=int(hf.get("embed_dim", 96)),
                depths=tuple(hf.get("depths", (2, 2, 6, 2))), num_heads=tuple(hf.get("num_heads", (3, 6, 12, 24))),
                window_size=int(hf.get("window_size", 7)), mlp_ratio=float(hf.get("mlp_ratio", 4.0)),
                drop_rate=float(hf.get("hidden_dropout_prob", 0.0)),
                attn_drop_rate=float(hf.get("attention_probs_dropout_prob", 0.0)),
                drop_path_rate=float(hf.get("drop_path_rate", 0.1)), mlp_drop_path=False,  # HF's SwinLayer
                ape=bool(hf.get("use_absolute_embeddings", False)),
                layernorm_epsilon=float(hf.get("layer_norm_eps", 1e-5)),
                initializer_range=float(hf.get("initializer_range", 0.02)),
                num_classes=hf_num_classes(hf), **hf_problem_type(hf))


_MEMORY_NAMES = [  # transformers 5's in-memory names -> the file names above
    ("attention.relative_position_bias.relative_position_bias_table", "attention.self.relative_position_bias_table"),
    ("attention.q_proj.", "attention.self.query."), ("attention.k_proj.", "attention.self.key."),
    ("attention.v_proj.", "attention.self.value."), ("attention.o_proj.", "attention.output.dense."),
    ("mlp.fc1.", "intermediate.dense."), ("mlp.fc2.", "output.dense."),
]


def _file_name(k):
    k = k[len("swin."):] if k.startswith("swin.") else k
    for a, b in _MEMORY_NAMES:
        k = k.replace(a, b)
    return k


def hf_to_libai_swin(hf_sd, kw, path="<state dict>"):
    """{libai name: array} from a HF Swin state dict (file or transformers 5 in-memory names)."""
    take = TensorReader({_file_name(k): np.asarray(v) for k, v in hf_sd.items()}, path)

    out = {}
    if kw.get("ape"):
        table = take("embeddings.position_embeddings")
        img, patch = kw["img_size"], int(kw["patch_size"])
        grid = [-(-s // patch) for s in ((img, img) if isinstance(img, int) else img)]
        if tuple(table.shape) != (1, grid[0] * grid[1], int(kw["embed_dim"])):
            raise HFConfigError(f"{path}: embeddings.position_embeddings has shape {list(table.shape)}, expected "
                                f"[1, {grid[0] * grid[1]}, {int(kw['embed_dim'])}] (one row per patch of the "
                                f"{grid[0]}x{grid[1]} grid)")
        out["absolute_pos_embed"] = table
    for part in ("weight", "bias"):
        out[f"patch_embed.inner.{part}"] = take(f"embeddings.patch_embeddings.projection.{part}")
        out[f"patch_embed.norm.{part}"] = take(f"embeddings.norm.{part}")
        out[f"norm.{part}"] = take(f"layernorm.{part}")
    for i, (depth, heads) in enumerate(zip(kw["depths"], kw["num_heads"])):
        for j in range(depth):
            hf, lb = f"encoder.layers.{i}.blocks.{j}.", f"stages.{i}.{j}."
            out[f"{lb}attn.relative_position_bias_table"] = take(f"{hf}attention.self.relative_position_bias_table")
            for part in ("weight", "bias"):
                out[f"{lb}norm1.{part}"] = take(f"{hf}layernorm_before.{part}")
                out[f"{lb}attn.qkv.{part}"] = qkv_hf_to_libai(
                    *(take(f"{hf}attention.self.{n}.{part}") for n in ("query", "key", "value")), int(heads))
                out[f"{lb}attn.proj.{part}"] = take(f"{hf}attention.output.dense.{part}")
                out[f"{lb}norm2.{part}"] = take(f"{hf}layernorm_after.{part}")
                out[f"{lb}mlp.dense_h_to_4h.{part}"] = take(f"{hf}intermediate.dense.{part}")
                out[f"{lb}mlp.dense_4h_to_h.{part}"] = take(f"{hf}output.dense.{part}")
        if i < len(kw["depths"]) - 1:
            out[f"merges.{i}.norm.weight"] = take(f"encoder.layers.{i}.downsample.norm.weight")
            out[f"merges.{i}.norm.bias"] = take(f"encoder.layers.{i}.downsample.norm.bias")
            out[f"merges.{i}.reduction.weight"] = take(f"encoder.layers.{i}.downsample.reduction.weight")
    if "classifier.weight" in take:
        out["head.weight"], out["head.bias"] = take("classifier.weight"), take("classifier.bias")
    take.refuse_unused("SwinTransformer",
                       ignore=lambda k: "relative_position_index" in k or k.startswith("pooler."))
    return out


def load_huggingface_swin(model_cls, path, **overrides):
    """`model_cls` (SwinTransformer) from a HF Swin folder (SwinForImageClassification or SwinModel)."""
    return load_huggingface_classifier(model_cls, path, swin_kwargs_from_hf_config, hf_to_libai_swin, **overrides)
