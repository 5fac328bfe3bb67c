"""Hugging Face GPT-2 <-> libai GPTModel: configs, weight layouts, safetensors files.

Weight mapping (HF GPT2LMHeadModel name -> GPTModel name; `T` = transposed, HF's Conv1D keeps
weights as [in, out] where libai's Linear keeps [out, in]):

    transformer.wte.weight             embeddings.token_embeddings.weight        (also the tied lm_head)
    transformer.wpe.weight             embeddings.position_embeddings.weight
    transformer.h.{i}.ln_1.*           transformer.layers.{i}.input_layernorm.*
    transformer.h.{i}.attn.c_attn.*    transformer.layers.{i}.self_attention.query_key_value.*   T + qkv reorder
    transformer.h.{i}.attn.c_proj.*    transformer.layers.{i}.self_attention.dense.*             T
    transformer.h.{i}.ln_2.*           transformer.layers.{i}.post_attention_layernorm.*
    transformer.h.{i}.mlp.c_fc.*       transformer.layers.{i}.mlp.dense_h_to_4h.*                T
    transformer.h.{i}.mlp.c_proj.*     transformer.layers.{i}.mlp.dense_4h_to_h.*                T
    transformer.ln_f.*                 transformer.layernorm_f.*

qkv reorder: HF's fused c_attn output features are [q | k | v], each head-major
([3, heads, head_size]); libai orders them per head, [heads, 3, head_size], so that a
tensor-parallel shard of the rows holds whole heads with their q, k and v.
"""
import json
import os
import struct

import numpy as np

__all__ = [
    "HFConfigError", "read_safetensors", "write_safetensors", "gpt_kwargs_from_hf_config",
    "hf_config_from_gpt_kwargs", "hf_to_libai_gpt2", "libai_to_hf_gpt2", "load_huggingface_gpt2",
    "qkv_hf_to_libai", "qkv_libai_to_hf", "read_hf_folder",
]

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


class HFConfigError(ValueError):
    """A Hugging Face config this loader cannot reproduce exactly."""


# ------------------------------------------------------------------ safetensors (numpy)
_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
           "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
_CODES = {np.dtype(v).str: k for k, v in _DTYPES.items()}


def read_safetensors(path):
    """{name: numpy array} of a safetensors file (BF16 is widened to float32)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"safetensors file not found: {path}")
    with open(path, "rb") as f:
        buf = f.read()
    if len(buf) < 8:
        raise ValueError(f"{path}: not a safetensors file (too short)")
    (n,) = struct.unpack("<Q", buf[:8])
    if n > len(buf) - 8:
        raise ValueError(f"{path}: not a safetensors file (header length {n} beyond the file)")
    header = json.loads(buf[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, stop = info["data_offsets"]
        raw = buf[base + start:base + stop]
        code = info["dtype"]
        if code == "BF16":
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = bits.view(np.float32)
        elif code in _DTYPES:
            arr = np.frombuffer(raw, dtype=np.dtype(_DTYPES[code]).newbyteorder("<"))
        else:
            raise ValueError(f"{path}: tensor {name} has unsupported dtype {code}")
        out[name] = arr.reshape(info["shape"]).copy()
    return out


def write_safetensors(tensors, path, metadata=None):
    """Write {name: numpy array} as a safetensors file (metadata {"format": "pt"} by default,
    which transformers expects)."""
    metadata = {"format": "pt"} if metadata is None else dict(metadata)
    header, chunks, offset = {}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
        code = _CODES.get(np.dtype(a.dtype).newbyteorder("<").str)
        if code is None:
            raise ValueError(f"write_safetensors: unsupported dtype {a.dtype} for {name}")
        data = a.tobytes()
        header[name] = {"dtype": code, "shape": list(a.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hbytes = json.dumps(header, separators=(",", ":")).encode()
    hbytes += b" " * (-len(hbytes) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hbytes)))
        f.write(hbytes)
        for c in chunks:
            f.write(c)
    os.replace(tmp, path)


# ------------------------------------------------------------------ configs
# keys whose non-default value changes the computation in ways GPTModel does not implement
_UNSUPPORTED = {
    "scale_attn_by_inverse_layer_idx": False,
    "reorder_and_upcast_attn": False,
    "add_cross_attention": False,
    "scale_attn_weights": True,
    "tie_word_embeddings": True,
}
_ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")


def gpt_kwargs_from_hf_config(hf):
    """GPTModel keyword arguments from a HF GPT-2 config dict; HFConfigError naming the key for
    settings GPTModel cannot reproduce."""
    model_type = hf.get("model_type", "gpt2")
    if model_type != "gpt2":
        raise HFConfigError(f"unsupported config: model_type={model_type!r} (only 'gpt2')")
    for key, ok in _UNSUPPORTED.items():
        if key in hf and hf[key] is not None and bool(hf[key]) != ok:
            raise HFConfigError(f"unsupported config: {key}={hf[key]!r} (GPTModel supports {key}={ok})")
    act = hf.get("activation_function", "gelu_new")
    if act not in _ACTIVATIONS:
        raise HFConfigError(f"unsupported config: activation_function={act!r} (GPTModel uses tanh GELU, "
                            f"one of {_ACTIVATIONS})")
    for key in ("n_embd", "n_layer", "n_head", "vocab_size"):
        if key not in hf:
            raise HFConfigError(f"config is missing {key!r}")
    n_embd = int(hf["n_embd"])
    n_inner = hf.get("n_inner")
    return dict(
        hidden_layers=int(hf["n_layer"]),
        vocab_size=int(hf["vocab_size"]),
        hidden_size=n_embd,
        ffn_hidden_size=4 * n_embd if n_inner is None else int(n_inner),
        num_attention_heads=int(hf["n_head"]),
        max_seq_length=int(hf.get("n_positions", hf.get("n_ctx", 1024))),
        embedding_dropout_prob=float(hf.get("embd_pdrop", 0.1)),
        attention_dropout_prob=float(hf.get("attn_pdrop", 0.1)),
        output_dropout_prob=float(hf.get("resid_pdrop", 0.1)),
        layernorm_epsilon=float(hf.get("layer_norm_epsilon", 1e-5)),
        initializer_range=float(hf.get("initializer_range", 0.02)),
    )


def hf_config_from_gpt_kwargs(kw, base=None):
    """A HF GPT-2 config dict for GPTModel kwargs `kw` (`base`: an original HF config whose other
    entries, e.g. token ids, are kept)."""
    cfg = dict(base or {})
    ffn = kw.get("ffn_hidden_size") or 4 * kw["hidden_size"]
    cfg.update(
        model_type="gpt2", architectures=cfg.get("architectures", ["GPT2LMHeadModel"]),
        n_layer=int(kw["hidden_layers"]), n_embd=int(kw["hidden_size"]), n_head=int(kw["num_attention_heads"]),
        vocab_size=int(kw["vocab_size"]), n_positions=int(kw.get("max_seq_length", 1024)),
        n_inner=None if ffn == 4 * kw["hidden_size"] else int(ffn),
        activation_function=cfg.get("activation_function", "gelu_new"),
        layer_norm_epsilon=float(kw.get("layernorm_epsilon", 1e-5)),
        initializer_range=float(kw.get("initializer_range", 0.02)),
        embd_pdrop=float(kw.get("embedding_dropout_prob", 0.0)),
        attn_pdrop=float(kw.get("attention_dropout_prob", 0.0)),
        resid_pdrop=float(kw.get("output_dropout_prob", 0.0)),
        tie_word_embeddings=True,
    )
    cfg.setdefault("n_ctx", cfg["n_positions"])
    return cfg


# ------------------------------------------------------------------ weight layouts
def qkv_hf_to_libai(w, b, num_heads):
    """HF c_attn weight [h, 3h] ([in, out], out = [3, heads, d]) and bias [3h] -> libai
    query_key_value weight [3h, h] (rows [heads, 3, d]) and bias."""
    h = w.shape[0]
    d = h // num_heads
    wt = w.T.reshape(3, num_heads, d, h).transpose(1, 0, 2, 3).reshape(3 * h, h)
    bt = None if b is None else b.reshape(3, num_heads, d).transpose(1, 0, 2).reshape(3 * h)
    return np.ascontiguousarray(wt), None if bt is None else np.ascontiguousarray(bt)


def qkv_libai_to_hf(w, b, num_heads):
    h = w.shape[1]
    d = h // num_heads
    wh = w.reshape(num_heads, 3, d, h).transpose(1, 0, 2, 3).reshape(3 * h, h).T
    bh = None if b is None else b.reshape(num_heads, 3, d).transpose(1, 0, 2).reshape(3 * h)
    return np.ascontiguousarray(wh), None if bh is None else np.ascontiguousarray(bh)


_LAYER_MAP = [  # (hf suffix, libai suffix, transpose)
    ("ln_1", "input_layernorm", False),
    ("attn.c_proj", "self_attention.dense", True),
    ("ln_2", "post_attention_layernorm", False),
    ("mlp.c_fc", "mlp.dense_h_to_4h", True),
    ("mlp.c_proj", "mlp.dense_4h_to_h", True),
]
_IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")


def _strip_prefix(sd):
    """HF GPT2LMHeadModel keys start with 'transformer.'; GPT2Model and the original hub files
    have none."""
    out = {}
    for k, v in sd.items():
        if k.endswith(_IGNORED_SUFFIXES):
            continue
        out[k[len("transformer."):] if k.startswith("transformer.") else k] = v
    return out


def hf_to_libai_gpt2(hf_sd, num_layers, num_heads, path="<state dict>"):
    """{HF name: array} -> {GPTModel name: logical array}."""
    sd = _strip_prefix(hf_sd)

    def take(name):
        if name not in sd:
            raise KeyError(f"{path}: missing tensor {name!r} (have {sorted(sd)[:8]}...)")
        return np.asarray(sd.pop(name), dtype=np.float32)

    out = {
        "embeddings.token_embeddings.weight": take("wte.weight"),
        "embeddings.position_embeddings.weight": take("wpe.weight"),
    }
    lm = sd.pop("lm_head.weight", None)
    if lm is not None and not np.array_equal(np.asarray(lm, np.float32), out["embeddings.token_embeddings.weight"]):
        raise HFConfigError(f"{path}: lm_head.weight differs from transformer.wte.weight; GPTModel ties them")
    for i in range(num_layers):
        src, dst = f"h.{i}.", f"transformer.layers.{i}."
        w, b = qkv_hf_to_libai(take(src + "attn.c_attn.weight"), take(src + "attn.c_attn.bias"), num_heads)
        out[dst + "self_attention.query_key_value.weight"] = w
        out[dst + "self_attention.query_key_value.bias"] = b
        for hf_name, name, transpose in _LAYER_MAP:
            w = take(src + hf_name + ".weight")
            out[dst + name + ".weight"] = np.ascontiguousarray(w.T) if transpose else w
            out[dst + name + ".bias"] = take(src + hf_name + ".bias")
    out["transformer.layernorm_f.weight"] = take("ln_f.weight")
    out["transformer.layernorm_f.bias"] = take("ln_f.bias")
    if sd:
        raise KeyError(f"{path}: tensors not used by GPTModel: {sorted(sd)}")
    return out


def libai_to_hf_gpt2(sd, num_layers, num_heads, prefix="transformer."):
    """{GPTModel name: logical array} -> {HF GPT2LMHeadModel name: array} (without the tied
    lm_head.weight, as save_pretrained writes it)."""
    sd = {k[len("GPT_model."):] if k.startswith("GPT_model.") else k: np.asarray(v) for k, v in sd.items()}
    out = {prefix + "wte.weight": sd["embeddings.token_embeddings.weight"],
           prefix + "wpe.weight": sd["embeddings.position_embeddings.weight"]}
    for i in range(num_layers):
        src, dst = f"transformer.layers.{i}.", f"{prefix}h.{i}."
        w, b = qkv_libai_to_hf(sd[src + "self_attention.query_key_value.weight"],
                               sd[src + "self_attention.query_key_value.bias"], num_heads)
        out[dst + "attn.c_attn.weight"] = w
        out[dst + "attn.c_attn.bias"] = b
        for hf_name, name, transpose in _LAYER_MAP:
            w = sd[src + name + ".weight"]
            out[dst + hf_name + ".weight"] = np.ascontiguousarray(w.T) if transpose else w
            out[dst + hf_name + ".bias"] = sd[src + name + ".bias"]
    out[prefix + "ln_f.weight"] = sd["transformer.layernorm_f.weight"]
    out[prefix + "ln_f.bias"] = sd["transformer.layernorm_f.bias"]
    return out


# ------------------------------------------------------------------ loading a folder
def read_hf_folder(path):
    """(config dict, {name: array}) of a HF model folder; FileNotFoundError naming the missing file."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"Hugging Face model folder not found: {path}")
    cfg_file = os.path.join(path, CONFIG_FILE)
    if not os.path.isfile(cfg_file):
        raise FileNotFoundError(f"{cfg_file} not found (a Hugging Face model folder needs {CONFIG_FILE})")
    weights = os.path.join(path, WEIGHTS_FILE)
    if not os.path.isfile(weights):
        other = [f for f in ("pytorch_model.bin", "model.safetensors.index.json")
                 if os.path.isfile(os.path.join(path, f))]
        hint = f" (found {other}: only a single safetensors file is supported)" if other else ""
        raise FileNotFoundError(f"{weights} not found{hint}")
    with open(cfg_file) as f:
        cfg = json.load(f)
    return cfg, read_safetensors(weights)


def take_new_classifier(model, sd, keys, path, ignore_mismatched_sizes):
    """Put the model's own (freshly initialised) classifier tensors `keys` into the state dict
    `sd` where the folder has none (a backbone), or, with `ignore_mismatched_sizes` (the flag of
    HF's from_pretrained), where the folder's are for another number of labels: a new task. Any
    other size mismatch is an HFConfigError naming both shapes. Returns the keys taken."""
    own = dict(model.named_parameters())
    taken = []
    for k in keys:
        if k not in own:
            continue
        if k in sd and tuple(sd[k].shape) != tuple(own[k].shape):
            if not ignore_mismatched_sizes:
                raise HFConfigError(f"{path}: the folder's {k} is {list(sd[k].shape)}, the model's "
                                    f"{list(own[k].shape)}: another number of labels than the folder's classifier; "
                                    "pass ignore_mismatched_sizes=True for a new classifier, initialised afresh "
                                    "(as HF's from_pretrained)")
            taken.append(k)
        elif k not in sd:
            taken.append(k)
    for k in taken:
        sd[k] = own[k].detach().numpy()
    return taken


def load_huggingface_gpt2(model_cls, path, **overrides):
    """Build `model_cls` (GPTModel) from a HF folder and load its weights (laid out on each
    parameter's placement/SBP, so tensor-parallel models get their shards)."""
    from .weights import load_logical_state_dict

    hf_cfg, hf_sd = read_hf_folder(path)
    kwargs = gpt_kwargs_from_hf_config(hf_cfg)
    kwargs.update(overrides)
    model = model_cls(**kwargs)
    sd = hf_to_libai_gpt2(hf_sd, kwargs["hidden_layers"], kwargs["num_attention_heads"],
                          path=os.path.join(path, WEIGHTS_FILE))
    load_logical_state_dict(model, sd)
    model.hf_config = hf_cfg
    return model
