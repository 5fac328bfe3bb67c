"""Checkpoints: a directory per checkpoint, written completely before it is pointed to.

Layout (`save_dir/model_0000009/` for the checkpoint taken after iteration 9):

    model.safetensors            the model's state_dict
    optimizer.safetensors        one file per checkpointable (optimizer, lr_scheduler,
    lr_scheduler.safetensors     train_loader = the data sampler's position, ...)
    train_loader.safetensors
    trainer_state.safetensors    the trainer's state_dict() ({"iteration": 9, "hooks": {...}}) and
                                 the extra keys of the save
    rng_state_rank{r}.safetensors engine / numpy / python RNG states of rank r
    config.yaml                  the resolved config the model was trained with (the trainer's
                                 cfg: model sizes, padded vocab_size, tokenizer files), as
                                 LazyConfig.save writes it; `load_checkpoint_config` reads it
    save_dir/last_checkpoint     text file: the name of the latest complete checkpoint

Global (tensor-/data-parallel) models and optimizers are saved in their *logical* form: every
global tensor is gathered (a collective: every rank takes part in `save`) and only rank 0
writes, so a checkpoint is the same whatever the dp/tp layout that wrote it. Loading lays each
logical tensor out like the parameter (or the parameter's optimizer state) it replaces
(`flow.tensor(array, placement=p.placement, sbp=p.sbp)`: every rank keeps its shard), so a
checkpoint written under one layout loads under any other (or in one process).

Every file is written with `engine.save` (temp file + fsync + os.replace). The checkpoint is
assembled in a hidden temp directory `.model_0000009.tmp` and renamed into place only when
complete; only then is `last_checkpoint` replaced (atomically). A crash at any moment leaves
either the previous state or the new one, never a pointer to a partial checkpoint.

Loading reads and verifies *everything* first (every file's checksum via engine.load, model
keys and shapes), then assigns; if assignment fails the previous states are restored, so a
truncated or corrupted checkpoint raises an error naming the file and changes nothing.
"""
import logging
import os
import random
import re
import shutil

import numpy as np

import engine as flow
from engine.serialization import CheckpointError, atomic_write, fsync_dir

from . import distributed as dist

__all__ = ["Checkpointer", "PeriodicCheckpointer", "CheckpointError", "get_rng_states", "set_rng_states", "to_logical",
           "model_state_like_params", "optimizer_state_like_params", "CONFIG_FILE", "config_yaml",
           "write_checkpoint_config", "checkpoint_config_file", "load_checkpoint_config"]

MODEL_FILE = "model.safetensors"
STATE_FILE = "trainer_state.safetensors"
CONFIG_FILE = "config.yaml"
LAST_CHECKPOINT = "last_checkpoint"
_PERIODIC_RE = re.compile(r"^(?P<prefix>.+)_(?P<iter>\d{7})$")


def get_rng_states():
    """Engine, numpy-global and python `random` states of this process (plain values + arrays)."""
    np_state = np.random.get_state()
    py_state = random.getstate()
    return {
        "engine": flow.get_rng_state(),
        "numpy": [np_state[0], np.asarray(np_state[1]), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "python": [py_state[0], [int(x) for x in py_state[1]], py_state[2]],
    }


def set_rng_states(states):
    flow.set_rng_state(states["engine"])
    n = states["numpy"]
    np.random.set_state((str(n[0]), np.asarray(n[1], dtype=np.uint32), int(n[2]), int(n[3]), float(n[4])))
    p = states["python"]
    random.setstate((int(p[0]), tuple(int(x) for x in p[1]), p[2]))


def _write_text_atomic(path, text):
    atomic_write(path, [text.encode("utf-8")])


def config_yaml(cfg):
    """`cfg` (a LazyConfig DictConfig or a plain dict) as the YAML text `LazyConfig.save` writes
    (targets as dotted strings; a value with no YAML form becomes a descriptive string, without
    a warning: the trainer's `save_config` already named it)."""
    import warnings

    from libai.config import LazyConfig
    from libai.config.lazy import plain_to_yaml

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        plain = LazyConfig.to_plain(cfg)
    return plain_to_yaml(plain)


def write_checkpoint_config(cfg, directory):
    """Write `cfg` as `directory/config.yaml`, atomically (temp file, fsync, rename); returns the path."""
    path = os.path.join(directory, CONFIG_FILE)
    _write_text_atomic(path, config_yaml(cfg))
    return path


def checkpoint_config_file(path):
    """The config.yaml that checkpoint `path` (a checkpoint directory or its model file) carries:
    the one beside the weights; for a training checkpoint written before checkpoints carried one
    (a directory with trainer_state.safetensors), its output directory's config.yaml (the
    trainer's `save_config`). None when there is none."""
    d = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    own = os.path.join(d, CONFIG_FILE)
    if os.path.isfile(own):
        return own
    parent = os.path.join(os.path.dirname(os.path.abspath(d)), CONFIG_FILE)
    if os.path.isfile(os.path.join(d, STATE_FILE)) and os.path.isfile(parent):
        return parent
    return None


_TOKENIZER_FILE_KEYS = ("vocab_file", "merges_file", "tokenizer_file")


def _tokenizer_files(cfg):
    """(cfg's `tokenization.tokenizer` node, [(key, path)] of the vocab_file, merges_file and
    tokenizer_file it names by a non-empty string); (None, []) when it has no tokenizer node."""
    from libai.config import try_get_key

    tok = try_get_key(cfg, "tokenization.tokenizer", default=None)
    if tok is None or not hasattr(tok, "keys"):
        return None, []
    values = ((key, tok[key] if key in tok else None) for key in _TOKENIZER_FILE_KEYS)
    return tok, [(key, value) for key, value in values if isinstance(value, str) and value]


def load_checkpoint_config(path):
    """The config (a LazyConfig DictConfig) that checkpoint `path` carries (see
    `checkpoint_config_file`), or None. A tokenizer file of `tokenization.tokenizer`
    (vocab_file, merges_file, tokenizer_file) given by a relative name, or not found where the
    config says (a checkpoint copied to another machine), is taken from the config's directory
    when it is there."""
    f = checkpoint_config_file(path)
    if f is None:
        return None
    from libai.config import LazyConfig

    cfg = LazyConfig.load(f)
    d = os.path.dirname(os.path.abspath(f))
    tok, files = _tokenizer_files(cfg)
    for key, value in files:
        if os.path.isabs(value) and os.path.isfile(value):
            continue
        near = [] if os.path.isabs(value) else [os.path.join(d, value)]
        near.append(os.path.join(d, os.path.basename(value)))
        found = [c for c in near if os.path.isfile(c)]
        if found:
            tok[key] = found[0]
    return cfg


def model_settings(cfg):
    """({key: value} of the model's scalar settings in `cfg` (model.cfg, or the `model` node's
    arguments), and where they live: "model.cfg" or "model")."""
    from omegaconf import OmegaConf

    from libai.config import try_get_key

    node = try_get_key(cfg, "model.cfg", default=None)
    if node is None:
        node = try_get_key(cfg, "model", default=None)
    if node is None or not hasattr(node, "keys"):
        return {}, "model"
    plain = OmegaConf.to_container(node, resolve=False) if OmegaConf.is_config(node) else dict(node)
    where = "model.cfg" if try_get_key(cfg, "model.cfg", default=None) is not None else "model"
    return {k: v for k, v in plain.items() if k != "_target_" and not isinstance(v, (dict, list))}, where


def model_setting_differences(cfg, ckpt_cfg):
    """[(dotted key, value in `cfg`, value in `ckpt_cfg`)] for the model settings
    (`model_settings`) both configs hold with different values, keyed as in `ckpt_cfg`;
    vocab_size is left out (the tokenizer and the tensor-parallel padding decide it)."""
    ours, _ = model_settings(cfg)
    theirs, where = model_settings(ckpt_cfg)
    return [(f"{where}.{k}", ours[k], v) for k, v in theirs.items() if k in ours and ours[k] != v and k != "vocab_size"]


def is_model_size(value):
    """Whether a model setting is a size (an integer, not a flag): one that decides the weights' shapes."""
    return isinstance(value, int) and not isinstance(value, bool)


def model_settings_hint(cfg, path):
    """For an error about loading checkpoint `path` into the model `cfg` describes: the model
    sizes (integer settings) the checkpoint's config.yaml has that `cfg` does not, as `key=value`
    overrides (vocab_size excepted: the tokenizer decides it), or "" when it carries no config or
    they agree."""
    try:
        ckpt_cfg = load_checkpoint_config(path)
    except Exception:  # a hint must never hide the error it completes
        return ""
    if ckpt_cfg is None:
        return ""
    differ = [f"{key}={theirs}" for key, _, theirs in model_setting_differences(cfg, ckpt_cfg) if is_model_size(theirs)]
    if not differ:
        return ""
    return (f"; {path} was trained with {' '.join(differ)} (its config.yaml): pass those overrides "
            "(and its tokenizer) to load it")


def _huggingface_model_type(path):
    """model_type of a Hugging Face folder's config.json (None when `path` is not one: a libai
    checkpoint has no config.json)."""
    import json

    try:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return None
    return cfg.get("model_type") if isinstance(cfg, dict) and cfg.get("model_type") else None


# keys that say where and how a run starts, not what it computes: a resume may change them
_RUN_KEYS = ("train.output_dir", "train.resume", "train.overwrite_output_dir", "train.load_weight")


def _flat_settings(cfg):
    """{dotted key: value} of a config's leaves as LazyConfig saves them (targets as dotted
    paths, interpolations as written)."""
    import warnings

    from libai.config import LazyConfig

    out = {}

    def walk(node, prefix):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}.{k}" if prefix else str(k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{prefix}.{i}")
        else:
            out[prefix] = node

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # to_plain's notes on callables are for saving
        walk(LazyConfig.to_plain(cfg), "")
    return out


def config_changes(cfg, path, limit=6):
    """The settings of `cfg` that differ from the config checkpoint `path` carries, as
    "key: saved -> now; ..." (the run's location keys left out), or "" when it carries none or
    they agree; a config file that cannot be read says so (the comparison was not made)."""
    f = None
    try:
        f = checkpoint_config_file(path)  # as saved: load_checkpoint_config relocates tokenizer files
        if f is None:
            return ""
        from libai.config import LazyConfig

        ours, theirs = _flat_settings(cfg), _flat_settings(LazyConfig.load(f))
    except Exception as e:  # a hint must never hide what it completes: say it, do not raise
        return f"its config {f or CONFIG_FILE} could not be read to compare ({type(e).__name__}: {str(e)[:200]})"
    differ = [f"{k}: {theirs.get(k, '(absent)')!r} -> {ours.get(k, '(absent)')!r}"
              for k in sorted(set(ours) | set(theirs))
              if k not in _RUN_KEYS and ours.get(k, "(absent)") != theirs.get(k, "(absent)")]
    more = f" and {len(differ) - limit} more" if len(differ) > limit else ""
    return "; ".join(differ[:limit]) + more


def config_change_hint(cfg, path):
    """For a resume that found no checkpoint it could load: which settings changed since
    checkpoint `path` was saved, and what to do ("" when none did). A checkpoint of another
    train_iter, global batch or model size does not load, and that is not damage."""
    changed = config_changes(cfg, path)
    if not changed:
        return ""
    return (f"{os.path.basename(path)} was saved with another config ({changed}): to continue that run, "
            f"resume with the config it was saved with ({checkpoint_config_file(path)}). ")


def _clone_state(sd):
    return {k: (v.detach().clone() if isinstance(v, flow.Tensor) else v) for k, v in sd.items()}


def _logical_array(t):
    """The whole value of tensor `t` as a numpy array (a global tensor is gathered: collective)."""
    return np.array(t.detach()._host(), copy=True)


_TAG_TO_WRITER = 7201


def _first_rank(placement):
    return int(np.asarray(placement.mesh).reshape(-1)[0])


def _to_writer(placement, make):
    """`make()` (a picklable value computed by the ranks of `placement`: a collective among
    them) on rank 0, the writer, also when `placement` does not hold it (a pipeline stage);
    None on the other ranks outside `placement`."""
    me = dist.get_rank()
    here = placement.has_rank(me)
    value = make() if here else None
    if placement.has_rank(0):
        return value
    comm = flow.distributed.comm.get_world_group().comm
    if me == _first_rank(placement):
        comm.send(value, dest=0, tag=_TAG_TO_WRITER)
    elif me == 0:
        value = comm.recv(source=_first_rank(placement), tag=_TAG_TO_WRITER)
    return value if me == 0 else None


def to_logical(obj):
    """`obj` (a state dict: nested dicts / lists / tuples of tensors and plain values) with every
    tensor replaced by a local CPU tensor of its logical value. Global tensors are gathered, so
    every rank must call this (in the same order); rank 0 gets every value, also of a tensor
    whose placement (a pipeline stage) does not hold it, and a rank outside a tensor's
    placement gets None for it."""
    if isinstance(obj, flow.Tensor):
        if obj._global is None and obj.device.type == "cpu":
            return obj.detach()
        if obj._global is None:
            return flow.tensor(_logical_array(obj), dtype=obj.dtype)
        arr = _to_writer(obj.placement, lambda: _logical_array(obj))
        return None if arr is None else flow.tensor(arr, dtype=obj.dtype)
    if isinstance(obj, dict):
        items = [(k, to_logical(v)) for k, v in obj.items()]
        try:
            return type(obj)(items)
        except TypeError:
            return dict(items)
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_logical(v) for v in obj)
    return obj


def _like(value, target):
    """Logical tensor/array `value` laid out like tensor `target` (its placement and SBP when
    global, its device otherwise); floating values take target's dtype."""
    if not isinstance(target, flow.Tensor):
        return value
    if isinstance(value, flow.Tensor):
        if value._global is not None:
            return value
        arr = np.asarray(value.detach()._host())
    else:
        arr = np.asarray(value)
    dtype = target.dtype if (np.issubdtype(arr.dtype, np.floating) and target.is_floating_point()) else None
    if target._global is not None:
        if tuple(arr.shape) != tuple(target.shape):
            raise CheckpointError(f"shape {tuple(arr.shape)} in the checkpoint vs {tuple(target.shape)} in the model")
        return flow.tensor(arr, dtype=dtype, placement=target.placement, sbp=target.sbp)
    t = flow.tensor(arr, dtype=dtype)
    return t.to(target.device) if target.device.type != "cpu" else t


def optimizer_logical_state(optimizer):
    """`to_logical(optimizer.state_dict())`, complete on rank 0 also under pipeline parallelism,
    where each stage's ranks hold the states of their own parameters only: the entries of the
    parameters of a stage without rank 0 are gathered there and sent to rank 0."""
    sd = optimizer.state_dict()
    params = [p for g in optimizer.param_groups for p in g["params"]]
    index, ordered = {}, []
    for p in params:
        if id(p) not in index:
            index[id(p)] = len(index)
            ordered.append(p)
    stage_local = [p for p in ordered if p._global is not None and not p._global.placement.has_rank(0)]
    if not stage_local:
        return to_logical(sd)
    state = {}
    for i, p in enumerate(ordered):
        if p._global is None:
            if i in sd["state"]:
                state[i] = to_logical(sd["state"][i])
            continue

        def entry(i=i):
            e = sd["state"].get(i)
            return None if not e else {k: (v.detach().numpy() if isinstance(v, flow.Tensor) and v._global is None
                                           else _logical_array(v) if isinstance(v, flow.Tensor) else v)
                                       for k, v in e.items()}

        value = _to_writer(p.placement, entry)
        if value is not None:
            state[i] = {k: (flow.tensor(v) if isinstance(v, np.ndarray) else v) for k, v in value.items()}
    return {"state": state, "param_groups": sd["param_groups"]}


def _optimizer_params_by_saved_index(optimizer, state_dict):
    """{saved parameter index: parameter} pairing the saved groups with the optimizer's (as
    Optimizer.load_state_dict does)."""
    out = {}
    groups = getattr(optimizer, "param_groups", None) or []
    saved = state_dict.get("param_groups", []) if isinstance(state_dict, dict) else []
    for g, sg in zip(groups, saved):
        for idx, p in zip(sg.get("params", []), g["params"]):
            out[int(idx) if isinstance(idx, (int, np.integer)) or str(idx).lstrip("-").isdigit() else idx] = p
    return out


def optimizer_state_like_params(optimizer, state_dict):
    """A logical optimizer state dict with each per-parameter tensor (exp_avg, ...) laid out like
    its parameter (global placement/SBP), ready for `optimizer.load_state_dict`."""
    if not (isinstance(state_dict, dict) and "state" in state_dict and hasattr(optimizer, "param_groups")):
        return state_dict
    params = _optimizer_params_by_saved_index(optimizer, state_dict)
    if not any(p._global is not None or p.device.type != "cpu" for p in params.values()):
        return state_dict
    new_state = {}
    for key, entry in state_dict["state"].items():
        k = int(key) if str(key).lstrip("-").isdigit() else key
        p = params.get(k)
        if p is None or not isinstance(entry, dict):
            new_state[key] = entry
            continue
        new_state[key] = {
            name: (_like(v, p) if isinstance(v, flow.Tensor) and v.ndim > 0 and tuple(v.shape) == tuple(p.shape)
                   else v)
            for name, v in entry.items()}
    out = dict(state_dict)
    out["state"] = new_state
    return out


def model_state_like_params(model, state_dict):
    """Logical model state (`{name: tensor}`) with each entry laid out like the model's own
    tensor of that name (global placement/SBP or device); unknown names are kept as they are."""
    own = model.state_dict()
    return {k: (_like(v, own[k]) if k in own and (own[k]._global is not None or own[k].device.type != "cpu")
                and tuple(getattr(v, "shape", ())) == tuple(own[k].shape) else v)
            for k, v in state_dict.items()}


class Checkpointer:
    """Saves and loads a model with any number of checkpointable objects.

    Args:
        model: an engine nn.Module.
        save_dir: where checkpoints go.
        save_to_disk: whether this process writes the shared files (default: rank 0).
        trainer: an object with state_dict()/load_state_dict() (a TrainerBase, as a weak proxy)
            whose state is the trainer_state file: saved with every checkpoint, restored by a
            full `load` (not by a weights-only one).
        enabled: False makes `save` write nothing (DefaultTrainer: train.checkpointer.period <= 0
            disables every checkpoint, model_best included).
        config: the config written as config.yaml into every checkpoint (a LazyConfig DictConfig
            or a dict); None: the trainer's `cfg` when it has one (DefaultTrainer: the resolved
            config, vocab_size padded, tokenizer paths filled in), else no config.yaml.
        **checkpointables: objects with state_dict()/load_state_dict() (optimizer=...,
            lr_scheduler=..., train_loader=...).
    """

    def __init__(self, model, save_dir="", *, save_to_disk=None, trainer=None, enabled=True, config=None,
                 **checkpointables):
        self.model = model
        self.config = config
        self.save_dir = save_dir
        self.save_to_disk = dist.is_main_process() if save_to_disk is None else save_to_disk
        self.trainer = trainer
        self.enabled = bool(enabled)
        self.checkpointables = {}
        for k, v in checkpointables.items():
            self.add_checkpointable(k, v)
        self.logger = logging.getLogger(__name__)
        self.resume_notes = []  # set by resume(): the checkpoints passed over, and why
        self.resume_partial = False

    def add_checkpointable(self, key, obj):
        if key in self.checkpointables or key in ("model", "trainer_state") or key.startswith("rng_state"):
            raise KeyError(f"Checkpointer: key {key!r} is already used")
        if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
            raise TypeError(f"Checkpointer: {key!r} has no state_dict()/load_state_dict()")
        self.checkpointables[key] = obj

    # ------------------------------------------------------------------ saving
    def save(self, name, tag_last=True, **kwargs):
        """Write checkpoint `save_dir/name/` (extra `kwargs`, e.g. iteration=..., go to
        trainer_state, over the trainer's own keys). With `tag_last`, `last_checkpoint` then
        points to it. Does nothing when not `enabled` or without a save_dir."""
        if not (self.enabled and self.save_dir):
            return
        final = os.path.join(self.save_dir, name)
        tmp = os.path.join(self.save_dir, f".{name}.tmp")
        if self.save_to_disk:
            os.makedirs(self.save_dir, exist_ok=True)
            if os.path.exists(tmp):
                shutil.rmtree(tmp)
            os.makedirs(tmp)
        dist.synchronize()
        # logical states: gathering global tensors is collective, so every rank takes part
        model_sd = to_logical(self.model.state_dict())
        others = {key: (optimizer_logical_state(obj) if isinstance(obj, flow.optim.Optimizer)
                        else to_logical(obj.state_dict())) for key, obj in self.checkpointables.items()}
        try:
            if self.save_to_disk:
                flow.save(model_sd, os.path.join(tmp, MODEL_FILE))
                for key, sd in others.items():
                    flow.save(sd, os.path.join(tmp, f"{key}.safetensors"))
                flow.save(self._trainer_state(kwargs), os.path.join(tmp, STATE_FILE))
                cfg = self._config()
                config_text = self._config_text(cfg)
                if config_text is not None:
                    _write_text_atomic(os.path.join(tmp, CONFIG_FILE), config_text)
                    self._copy_tokenizer_files(cfg, tmp)
            flow.save(get_rng_states(), os.path.join(tmp, f"rng_state_rank{dist.get_rank()}.safetensors"))
        except OSError as e:  # a full disk's write error names no file
            raise OSError(e.errno, f"{e.strerror or e}: writing checkpoint {final} failed (left unfinished in {tmp}; "
                                   f"last_checkpoint still names the previous checkpoint)") from e
        dist.synchronize()
        if self.save_to_disk:
            fsync_dir(tmp)
            old = None
            if os.path.exists(final):
                old = os.path.join(self.save_dir, f".{name}.old")
                if os.path.exists(old):
                    shutil.rmtree(old)
                os.replace(final, old)
            os.replace(tmp, final)
            fsync_dir(self.save_dir)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
            if tag_last:
                self.tag_last_checkpoint(name)
            self.logger.info(f"Saved checkpoint to {final}")
        dist.synchronize()

    def _config(self):
        """The config saved with each checkpoint: `config`, else the trainer's cfg, else None."""
        cfg = self.config
        if cfg is None and self.trainer is not None:
            try:
                cfg = getattr(self.trainer, "cfg", None)
            except ReferenceError:  # a weak proxy of a trainer gone
                cfg = None
        return cfg

    def _config_text(self, cfg):
        """The YAML of `cfg`, the config saved with each checkpoint (`_config()`), or None; a
        config that cannot be written is logged and left out."""
        from omegaconf import OmegaConf

        if cfg is None or not (OmegaConf.is_config(cfg) or isinstance(cfg, dict)):
            return None
        try:
            return config_yaml(cfg)
        except Exception as e:  # noqa: BLE001 (the weights are saved regardless)
            self.logger.warning(f"the checkpoint is saved without {CONFIG_FILE}: {e}")
            return None

    def _copy_tokenizer_files(self, cfg, directory):
        """Copy the tokenizer files `cfg` names (tokenization.tokenizer's vocab_file, merges_file,
        tokenizer_file) beside config.yaml, so that a checkpoint moved to another machine still
        has its tokenizer (`load_checkpoint_config` looks there when the configured path is
        gone). A file that cannot be copied is logged; the weights are saved regardless."""
        for _, src in _tokenizer_files(cfg)[1]:
            if not os.path.isfile(src):
                continue
            name = os.path.basename(src)
            if name in (MODEL_FILE, STATE_FILE, CONFIG_FILE) or name.endswith(".safetensors"):
                continue
            try:
                shutil.copyfile(src, os.path.join(directory, name))
            except OSError as e:
                self.logger.warning(f"the checkpoint is saved without its tokenizer file {src}: {e}")

    def _trainer_state(self, extra):
        state = self.trainer.state_dict() if self.trainer is not None else {}
        state.update(extra)
        state["checkpointables"] = sorted(self.checkpointables)
        state["world_size"] = dist.get_world_size()
        return state

    def tag_last_checkpoint(self, name):
        _write_text_atomic(os.path.join(self.save_dir, LAST_CHECKPOINT), name)

    # ------------------------------------------------------------------ finding
    def has_checkpoint(self):
        path = self.get_checkpoint_file()
        return path is not None and os.path.isdir(path)

    def get_checkpoint_file(self):
        """The directory named by `last_checkpoint`, or None."""
        try:
            with open(os.path.join(self.save_dir, LAST_CHECKPOINT)) as f:
                name = f.read().strip()
        except OSError:
            return None
        return os.path.join(self.save_dir, name) if name else None

    def get_all_checkpoint_files(self):
        if not os.path.isdir(self.save_dir):
            return []
        return sorted(
            os.path.join(self.save_dir, d) for d in os.listdir(self.save_dir)
            if not d.startswith(".") and os.path.isfile(os.path.join(self.save_dir, d, MODEL_FILE)))

    # ------------------------------------------------------------------ resuming
    def _pointer_problem(self):
        """Why `last_checkpoint` cannot be followed (None when it names a checkpoint directory)."""
        pointer = os.path.join(self.save_dir, LAST_CHECKPOINT)
        if not os.path.exists(pointer):
            return f"{pointer} does not exist"
        try:
            with open(pointer, encoding="utf-8") as f:
                name = f.read().strip()
        except (OSError, UnicodeDecodeError) as e:
            return f"{pointer} cannot be read ({e})"
        if not name or os.sep in name or "\n" in name or not os.path.isfile(os.path.join(self.save_dir, name,
                                                                                           MODEL_FILE)):
            return f"{pointer} names {name[:80]!r}, which is not a checkpoint directory in {self.save_dir}"
        return None

    def _saved_iteration(self, path):
        """The iteration in `path`'s trainer state; raises when it is missing or unreadable."""
        state_file = os.path.join(path, STATE_FILE)
        if not os.path.isfile(os.path.join(path, MODEL_FILE)) or not os.path.isfile(state_file):
            raise CheckpointError(f"incomplete: no {MODEL_FILE} or {STATE_FILE}")
        iteration = flow.load(state_file).get("iteration")
        if not isinstance(iteration, int):
            raise CheckpointError(f"{state_file} holds no iteration")
        return iteration

    def resume_candidates(self):
        """(checkpoint directories to resume from, best first; notes on what was passed over).

        The one `last_checkpoint` names comes first; then every other complete checkpoint,
        newest iteration first (periodic and final before `model_best` of the same iteration).
        Computed on rank 0 and broadcast, so every rank tries the same sequence."""
        result = None
        if dist.is_main_process():
            notes, found = [], []
            problem = self._pointer_problem()
            pointed = None if problem else self.get_checkpoint_file()
            if problem and os.path.exists(os.path.join(self.save_dir, LAST_CHECKPOINT)):
                notes.append(problem)
            for path in self.get_all_checkpoint_files():
                try:
                    iteration = self._saved_iteration(path)
                except Exception as e:  # any unreadable state: passed over, with the reason
                    notes.append(f"{path}: {e}")
                    continue
                first = pointed is not None and os.path.abspath(path) == os.path.abspath(pointed)
                found.append((not first, -iteration, os.path.basename(path).startswith("model_best"), path))
            result = ([f[-1] for f in sorted(found)], notes, problem)
        return dist.broadcast_object(result, src=0)

    def resume(self):
        """Load the newest complete, valid checkpoint of save_dir (see `resume_candidates`).

        Each candidate is verified completely by `load` (every checksum, every key and shape);
        one that fails on any rank is passed over on every rank, with the reason logged, and
        the next is tried (a failed `load` changes nothing). Returns (path, extra state), or
        (None, {}) when none loads; `self.resume_notes` then says what was found and why it
        was not used, and `self.resume_partial` whether this rank loaded a checkpoint that
        another rank rejected (its state is then that checkpoint's, not the initial one)."""
        candidates, notes, pointer_problem = self.resume_candidates()
        self.resume_notes = list(notes)
        self.resume_partial = False
        for path in candidates:
            error = None
            try:
                extra = self.load(path)
            except Exception as e:  # CheckpointError, a file gone meanwhile, a bad state
                error = e
            if dist.max_over_ranks(error is not None):
                # this rank may hold that checkpoint's state while another rank does not
                self.resume_partial = self.resume_partial or error is None
                self.resume_notes.append(f"{path}: {error or 'failed to load on another rank'}")
                self.logger.warning(f"not resuming from {path}: {error or 'failed to load on another rank'}")
                continue
            if pointer_problem or path != candidates[0] or self.resume_notes:  # something was passed over
                why = pointer_problem or "; ".join(self.resume_notes)
                self.logger.warning(f"last_checkpoint was not used ({why}): resumed from {path}, the newest valid "
                                    f"checkpoint (iteration {extra.get('iteration')})")
            return path, extra
        return None, {}

    # ------------------------------------------------------------------ loading
    def resume_or_load(self, path, *, resume=True):
        """With `resume`, load everything from the newest valid checkpoint (`resume`: exact
        resume); with no checkpoint at all, or without `resume`, load model weights from
        `path` (if given). Returns the extra state ({"iteration": ...} after a resume, {}
        otherwise). Raises CheckpointError when there are checkpoints but none is valid."""
        if resume:
            found, extra = self.resume()
            if found is not None:
                return extra
            if self.resume_notes:
                raise CheckpointError(f"Checkpointer: no valid checkpoint in {self.save_dir}: "
                                      + "; ".join(self.resume_notes))
        if path:
            return self.load(path, checkpointables=[])
        return {}

    def _model_file(self, path):
        if os.path.isdir(path):
            hf = _huggingface_model_type(path)
            if hf is not None:
                raise CheckpointError(
                    f"Checkpointer: {path} is a Hugging Face folder (config.json, model_type {hf!r}), not a libai "
                    f"checkpoint: convert it first (python tools/convert_checkpoint.py --from-hf {path} --to CKPT), "
                    "then load CKPT; a checkpoint converted with its tokenizer's exact vocabulary needs "
                    "tokenization.make_vocab_size_divisible_by=1 to match its embedding rows")
            f = os.path.join(path, MODEL_FILE)
            if not os.path.isfile(f):
                raise FileNotFoundError(f"Checkpointer: {path} has no {MODEL_FILE}")
            return f
        if os.path.isfile(path):
            return path
        raise FileNotFoundError(f"Checkpointer: checkpoint {path} not found")

    def load(self, path, checkpointables=None):
        """Load checkpoint `path` (a checkpoint directory, or a model .safetensors file).

        checkpointables: the names to restore besides the model (None: all registered ones, the
        trainer state and the RNG states; []: model weights only, reporting missing/unexpected
        keys). Everything is read and verified before anything is assigned. Returns the extra
        state (the trainer_state file without the checkpointer's bookkeeping)."""
        weights_only = checkpointables is not None and len(checkpointables) == 0
        names = list(self.checkpointables) if checkpointables is None else list(checkpointables)
        model_file = self._model_file(path)
        is_dir = os.path.isdir(path)
        self.logger.info(f"Loading {'model weights' if weights_only else 'checkpoint'} from {path}")

        # ---- 1. read every file (engine.load verifies each checksum and names a bad file)
        model_sd = flow.load(model_file)
        if not isinstance(model_sd, dict):
            raise CheckpointError(f"Checkpointer: {model_file} does not hold a state_dict")
        loaded = {}
        for key in names:
            if key not in self.checkpointables:
                raise KeyError(f"Checkpointer: unknown checkpointable {key!r}")
            f = os.path.join(path, f"{key}.safetensors") if is_dir else None
            if f is None or not os.path.isfile(f):
                raise CheckpointError(f"Checkpointer: checkpoint {path} has no {key}.safetensors "
                                      f"(needed to resume {key})")
            loaded[key] = flow.load(f)
        extra = {}
        rng = None
        if is_dir and os.path.isfile(os.path.join(path, STATE_FILE)):
            extra = dict(flow.load(os.path.join(path, STATE_FILE)))
        if not weights_only and is_dir:
            rng_file = os.path.join(path, f"rng_state_rank{dist.get_rank()}.safetensors")
            if os.path.isfile(rng_file):
                rng = flow.load(rng_file)
            elif int(extra.get("world_size", -1)) == dist.get_world_size():
                # saved by as many ranks: the file was written and is lost (a damaged checkpoint)
                raise CheckpointError(f"Checkpointer: {rng_file} is missing from a checkpoint saved by "
                                      f"{dist.get_world_size()} ranks (needed to resume this rank's RNG states)")
            else:
                self.logger.warning(f"{rng_file} not found: RNG states are not restored "
                                    "(the resumed run will not repeat the original bit for bit)")

        # ---- 2. verify the model's keys and shapes
        expected = self.model.state_dict()
        missing = [k for k in expected if k not in model_sd]
        unexpected = [k for k in model_sd if k not in expected]
        mismatched = [
            f"{k}: checkpoint {tuple(model_sd[k].shape)} vs model {tuple(v.shape)}"
            for k, v in expected.items()
            if k in model_sd and tuple(getattr(model_sd[k], "shape", ())) != tuple(v.shape)
        ]
        if mismatched:
            vocab_rows = any("embeddings" in k and len(v.shape) == 2 and tuple(model_sd[k].shape)[1:] == tuple(v.shape)[1:]
                             for k, v in expected.items() if k in model_sd and tuple(model_sd[k].shape) != tuple(v.shape))
            hint = ("\n(the vocabulary rows differ: the model pads its tokenizer's vocabulary to a multiple of "
                    "tokenization.make_vocab_size_divisible_by x tensor_parallel_size; give the value the checkpoint "
                    "was made with, e.g. 1 for one converted from Hugging Face with its tokenizer)") if vocab_rows else ""
            raise CheckpointError(f"Checkpointer: shape mismatch loading {model_file}:\n  " + "\n  ".join(mismatched)
                                  + hint)
        if expected and len(missing) == len(expected):  # nothing would be loaded: a checkpoint of another model
            raise CheckpointError(f"Checkpointer: none of the {len(model_sd)} tensors of {model_file} is a parameter or "
                                  f"buffer of the model ({type(self.model).__name__}: {sorted(expected)[:4]}...; "
                                  f"the file has {sorted(model_sd)[:4]}...): a checkpoint of another model?")
        if missing:
            msg = f"Some model parameters or buffers are not found in {model_file}:\n  " + "\n  ".join(missing)
            if not weights_only:
                raise CheckpointError("Checkpointer: cannot resume. " + msg)
            self.logger.warning(msg)
        if unexpected:
            msg = f"{model_file} contains keys not used by the model:\n  " + "\n  ".join(unexpected)
            if not weights_only:
                raise CheckpointError("Checkpointer: cannot resume. " + msg)
            self.logger.warning(msg)

        # ---- 3. assign, restoring the previous states if anything fails
        backup_model = _clone_state(expected)
        backups = {k: self.checkpointables[k].state_dict() for k in loaded}
        backup_rng = get_rng_states()
        trainer = self.trainer if (not weights_only and "iteration" in extra) else None
        backup_trainer = trainer.state_dict() if trainer is not None else None
        done = []
        try:
            self.model.load_state_dict(model_state_like_params(
                self.model, {k: v for k, v in model_sd.items() if k in expected}), strict=False)
            for key, sd in loaded.items():
                self.checkpointables[key].load_state_dict(
                    optimizer_state_like_params(self.checkpointables[key], sd))
                done.append(key)
            if trainer is not None:
                trainer.load_state_dict(extra)
            if rng is not None:
                set_rng_states(rng)
        except Exception as e:
            self.model.load_state_dict(backup_model, strict=False)
            for key in done:
                self.checkpointables[key].load_state_dict(backups[key])
            if trainer is not None:
                trainer.load_state_dict(backup_trainer)
            set_rng_states(backup_rng)
            raise CheckpointError(f"Checkpointer: failed to load {path} (nothing was changed): {e}") from e
        extra.pop("checkpointables", None)
        extra.pop("world_size", None)
        return extra


class PeriodicCheckpointer:
    """Saves `{prefix}_{iteration:07d}` every `period` iterations (and `{prefix}_final` at the
    last iteration), keeping at most `max_to_keep` of the periodic ones (oldest removed first).
    With `adopt_existing` (a resumed run) the periodic checkpoints already in save_dir count
    too, so the bound holds across resumes; otherwise only what this object saved is ever
    pruned."""

    def __init__(self, checkpointer, period, max_iter=None, max_to_keep=None, file_prefix="model",
                 adopt_existing=False):
        self.checkpointer = checkpointer
        self.period = int(period)
        self.max_iter = max_iter
        if max_to_keep is not None and max_to_keep <= 0:
            max_to_keep = None
        self.max_to_keep = max_to_keep
        self.file_prefix = file_prefix
        self.recent_checkpoints = self._existing() if adopt_existing else []
        self.last_saved_iter = None

    def _existing(self):
        found = []
        save_dir = self.checkpointer.save_dir
        if save_dir and os.path.isdir(save_dir):
            for d in os.listdir(save_dir):
                m = _PERIODIC_RE.match(d)
                if m and m.group("prefix") == self.file_prefix and os.path.isdir(os.path.join(save_dir, d)):
                    found.append(d)
        return sorted(found)

    def save(self, name, iteration, **kwargs):
        self.checkpointer.save(name, iteration=int(iteration), **kwargs)
        self.last_saved_iter = int(iteration)

    def save_periodic(self, iteration, **kwargs):
        """Save `{prefix}_{iteration:07d}` now (whether or not the period falls on it: the
        trainer's hook also calls it when a run stops early), then prune to max_to_keep."""
        name = f"{self.file_prefix}_{int(iteration):07d}"
        self.save(name, iteration, **kwargs)
        if name in self.recent_checkpoints:
            self.recent_checkpoints.remove(name)
        self.recent_checkpoints.append(name)
        self.prune()

    def step(self, iteration, **kwargs):
        iteration = int(iteration)
        if self.period <= 0:
            return
        if (iteration + 1) % self.period == 0:
            self.save_periodic(iteration, **kwargs)
        if self.max_iter is not None and iteration >= self.max_iter - 1:
            self.save(f"{self.file_prefix}_final", iteration, **kwargs)

    def prune(self):
        """Delete the oldest periodic checkpoints beyond max_to_keep (never the one that
        `last_checkpoint` points to)."""
        if self.max_to_keep is None or not self.checkpointer.save_to_disk:
            return
        last = self.checkpointer.get_checkpoint_file()
        while len(self.recent_checkpoints) > self.max_to_keep:
            name = self.recent_checkpoints.pop(0)
            path = os.path.join(self.checkpointer.save_dir, name)
            if last is not None and os.path.abspath(path) == os.path.abspath(last):
                continue
            shutil.rmtree(path, ignore_errors=True)
