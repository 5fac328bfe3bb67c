"""DefaultTrainer, default_setup and default_argument_parser (LiBai's libai/engine/default.py)."""
import argparse
import contextlib
import json
import logging
import math
import os
import random
import re
import signal
import weakref
from collections import OrderedDict

import numpy as np
from omegaconf import OmegaConf

import engine as flow
from libai.config import LazyConfig, instantiate, locate, resolve_batch_sizes, resolve_train_config, try_get_key
from libai.config import default_argument_parser as _config_argument_parser
from libai.evaluation import inference_on_dataset, print_csv_format
from libai.evaluation.utils import flatten_results_dict
from libai.utils import distributed as dist
from libai.utils.checkpoint import Checkpointer, CheckpointError, config_change_hint, config_changes, model_settings_hint
from libai.utils.events import CommonMetricPrinter, EventStorage, JSONWriter, TensorboardXWriter
from libai.utils.logger import setup_logger
from libai.utils.output_dir import (OutputDirError, check_previous_run, describe, prepare_output_dir,
                                    previous_run_artifacts)

from . import hooks
from .trainer import CUDAGraphTrainer, EagerTrainer, GraphTrainer, TrainerBase

__all__ = ["default_argument_parser", "default_setup", "DefaultTrainer", "write_eval_results", "save_config",
           "eval_result_prefixes"]

FAST_DEV_RUN_ITERS = 20


def default_argument_parser(epilog=None):
    """libai.config's parser (--config-file, --resume, --eval-only, --fast-dev-run, opts) plus
    --stop-iter N: end this run after N iterations in total, as if it were interrupted (a
    checkpoint is written; `--resume` continues the same schedule)."""
    parser = _config_argument_parser(epilog)
    parser.add_argument("--stop-iter", type=_positive_int, default=None, metavar="N",
                        help="stop after iteration N-1 (as if interrupted), keeping train.train_iter's schedule")
    return parser


def _positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive iteration count, got {value}")
    return value


def _apply_fast_dev_run(cfg):
    """A few iterations of training and evaluation, no checkpoints, written into
    `output_dir/fast_dev_run` (replacing the previous fast-dev-run there, never touching the
    recipe's real run). `cfg.train` is resolved; a train_iter of 0 (a recipe sized by epochs)
    and an eval_iter of None (every batch) count as unbounded. Returns the log line."""
    train, ev = cfg.train, cfg.train.evaluation
    train_iter = min(train.train_iter or FAST_DEV_RUN_ITERS, FAST_DEV_RUN_ITERS)
    train.update(train_epoch=0, train_iter=train_iter, log_period=1, resume=False, overwrite_output_dir=True,
                 output_dir=os.path.join(train.output_dir, "fast_dev_run"))
    train.checkpointer.period = 0
    ev.update(eval_period=max(1, train_iter // 2), eval_iter=min(ev.eval_iter or 5, 5))
    return (f"--fast-dev-run: train.output_dir={train.output_dir}, train.train_epoch=0, "
            f"train.train_iter={train_iter}, train.log_period=1, train.checkpointer.period=0, "
            f"train.evaluation.eval_period={ev.eval_period}, train.evaluation.eval_iter={ev.eval_iter}")


def _flat_config(cfg):
    """{dotted key: a text of its value} of `cfg` (interpolations unresolved)."""
    plain = OmegaConf.to_container(cfg, resolve=False) if OmegaConf.is_config(cfg) else cfg
    flat = {}

    def text(node):  # object addresses and set orders (the hash seed) differ between processes, not configs
        if isinstance(node, (set, frozenset)):
            return "{" + ", ".join(sorted(text(v) for v in node)) + "}"
        if isinstance(node, (list, tuple)):
            return "[" + ", ".join(text(v) for v in node) + "]"
        return re.sub(r"0x[0-9a-fA-F]+", "0x...", repr(node))

    def walk(node, prefix):
        if isinstance(node, dict) and node:
            for k, v in node.items():
                walk(v, f"{prefix}.{k}" if prefix else str(k))
        else:
            flat[prefix] = text(node)

    walk(plain, "")
    return flat


def check_same_config_on_every_rank(cfg):
    """RuntimeError on every rank, naming the keys and ranks, unless all ranks hold the same
    config. A key that differs (a config reading an environment variable, a per-rank override)
    made ranks disagree on collectives: a checkpoint period hung the job, a seed or learning rate
    trained silently differently on each rank."""
    if dist.get_world_size() == 1:
        return
    configs = dist.all_gather_object(_flat_config(cfg))
    keys = sorted(set().union(*configs))
    differ = [k for k in keys if len({c.get(k, "<missing>") for c in configs}) > 1]
    if differ:
        lines = [f"  {k}: " + ", ".join(f"rank {r}: {c.get(k, '<missing>')[:80]}" for r, c in enumerate(configs))
                 for k in differ[:10]]
        more = f"\n  ... and {len(differ) - 10} more keys" if len(differ) > 10 else ""
        raise RuntimeError(f"the ranks were given different configs ({len(differ)} keys differ); every rank must run "
                           "the same config:\n" + "\n".join(lines) + more)


def default_setup(cfg, args):
    """The common start of a job:

    0. resolve cfg.train against configs/common/train.py (libai.config.resolve_train_config:
       defaults filled in, unknown keys, bad values and unimplemented values refused); refuse
       graph mode (train.graph.enabled, or LiBai's graph.enabled) with what it does not capture;
       apply --resume / --overwrite-output-dir / --fast-dev-run to the config
    1. claim train.output_dir (libai.utils.output_dir.prepare_output_dir): it must be a
       writable directory, no other live run may hold its lock, and a training run that does
       not resume refuses a previous run there (or deletes it with --overwrite-output-dir);
       set up the `libai` logger (console on rank 0 + output_dir/log.txt)
    2. log rank/world size, the command line and the config file
    3. build the distributed topology from cfg.train.dist (checked against the world size)
    4. resolve the batch sizes (libai.config.resolve_batch_sizes with the data-parallel size);
       with a `tokenization` section: fill unset GPT-2 data paths with the default corpus and
       set model.cfg.vocab_size to the tokenizer's padded size (DefaultTrainer.build_tokenizer)
    5. save the full config to output_dir/config.yaml (`save_config`; not for --eval-only,
       which must not replace the training run's config, and for --resume only once the
       trainer has found a checkpoint to resume from: a refused resume changes nothing)
    6. seed the RNGs: numpy and python `random` with train.seed + rank (LiBai's per-rank
       offset, for data-side randomness); engine's generator with train.seed on every rank,
       because the engine's global tensors draw random values in lockstep on all ranks (a
       per-rank engine seed would make replicated parameters differ between ranks)
    """
    resolve_train_config(cfg)
    check_graph_mode(cfg)
    check_cuda_graph_mode(cfg)
    train = cfg.train
    eval_only = bool(getattr(args, "eval_only", False))
    if hasattr(args, "resume"):
        train.resume = bool(args.resume)
    if getattr(args, "overwrite_output_dir", False):
        train.overwrite_output_dir = True
    fast_dev_run = _apply_fast_dev_run(cfg) if getattr(args, "fast_dev_run", False) else None
    check_same_config_on_every_rank(cfg)
    output_dir = train.output_dir
    deleted = prepare_output_dir(output_dir, resume=train.resume, overwrite=train.overwrite_output_dir,
                                 training=not eval_only)
    rank = dist.get_rank()
    logger = setup_logger(output_dir, distributed_rank=rank)
    logger.info(f"Rank of current process: {rank}. World size: {dist.get_world_size()}")
    logger.info("Command line arguments: " + str(args))
    if fast_dev_run:
        logger.info(fast_dev_run)
    if deleted:
        logger.warning(f"--overwrite-output-dir: deleted the previous run in {output_dir}: "
                       f"{describe(deleted, limit=1000)}")
    config_file = getattr(args, "config_file", "")
    if config_file:
        with open(config_file, "r") as f:
            logger.info(f"Contents of args.config_file={config_file}:\n{f.read()}")

    infer_pipeline_num_layers(cfg)
    dist.setup_dist_util(cfg.train.dist)
    layer_device = cfg.train.dist.get("device_type") or cfg.train.input_placement_device
    if layer_device == "cuda" and not flow.cuda.is_available():
        raise RuntimeError("train.dist.device_type='cuda' but CUDA is not available here; use cpu")
    dist.set_device_type(layer_device)
    sizes = resolve_batch_sizes(cfg.train, dist.get_data_parallel_size())
    logger.info(f"Batch sizes: {dict(sizes._asdict())} (data_parallel_size={dist.get_data_parallel_size()})")
    # NLP recipes: default corpus for unset data paths, model vocab = the tokenizer's padded size
    DefaultTrainer.build_tokenizer(cfg)

    seed = _resolve_seed(cfg, logger)
    if not eval_only and not train.resume:  # a resume saves it once it has found its checkpoint
        save_config(cfg)

    seed_for_rank = seed + rank
    flow.manual_seed(seed)
    np.random.seed(seed_for_rank % 2**32)
    random.seed(seed_for_rank)
    logger.info(f"Seeded engine with {seed} (train.seed), numpy and random with {seed_for_rank} "
                "(train.seed + rank)")


def _resolve_seed(cfg, logger):
    """train.seed, or for None / a negative one (LiBai's "no fixed seed") a seed drawn from the
    OS's entropy, the same on every rank, written back into cfg.train.seed: the data samplers
    need one, and the run's config.yaml then records it. A resume takes the run's recorded seed
    (its samplers' saved state must match it)."""
    seed = cfg.train.seed
    if seed is not None and seed >= 0:
        return int(seed)
    drawn = None
    if dist.is_main_process():
        if cfg.train.resume:
            drawn = _recorded_seed(os.path.join(cfg.train.output_dir, "config.yaml"))
        if drawn is None:
            drawn = int(np.random.SeedSequence().entropy % 2**31)
    drawn = int(dist.broadcast_object(drawn))
    cfg.train.seed = drawn
    logger.info(f"train.seed={seed}: no fixed seed, this run's is {drawn} (recorded in config.yaml; set "
                f"train.seed={drawn} to repeat the run)")
    return drawn


def _recorded_seed(config_yaml):
    """train.seed of a previous run's config.yaml, or None."""
    import yaml

    try:
        with open(config_yaml, encoding="utf-8") as f:
            seed = (yaml.safe_load(f) or {}).get("train", {}).get("seed")
    except (OSError, ValueError, AttributeError, yaml.YAMLError):
        return None
    return int(seed) if isinstance(seed, int) and seed >= 0 else None


def graph_mode(cfg):
    """Whether a resolved config asks for graph mode: `train.graph.enabled`, or LiBai's top-level
    `graph.enabled` (its configs' `graph` section)."""
    return bool(cfg.train.graph.enabled or try_get_key(cfg, "graph.enabled", default=False))


def check_graph_mode(cfg):
    """Graph mode with a feature it does not capture is refused at start, naming the key (and
    LiBai's auto-parallel, in any mode)."""
    if try_get_key(cfg, "graph.auto_parallel.enabled", default=False):
        raise NotImplementedError("graph.auto_parallel.enabled=True: LiBai's auto-parallel is not implemented; "
                                  "give the layouts in train.dist")
    if try_get_key(cfg, "graph.global_mode.enabled", default=False):
        raise NotImplementedError("graph.global_mode.enabled=True: LiBai's global mode is not implemented; models "
                                  "here use global tensors whenever train.dist asks for a layout")
    for key in ("train_graph", "eval_graph"):  # LiBai's LazyCall(GraphBase)(is_train=...): built from train.*
        lazy = try_get_key(cfg, f"graph.{key}", default=None)
        extra = sorted(k for k in (lazy or {}) if k not in ("_target_", "is_train"))
        if extra:
            raise NotImplementedError(f"graph.{key} sets {extra}: the graph is built from the train.* keys here "
                                      "(train.amp, train.activation_checkpoint, train.num_accumulation_steps, ...); "
                                      f"remove them from graph.{key}")
        target = (lazy or {}).get("_target_")
        if graph_mode(cfg) and target is not None:
            from libai.models.utils import GraphBase

            if (locate(target) if isinstance(target, str) else target) is not GraphBase:
                raise NotImplementedError(f"graph.{key}._target_={target!r}: the trainer builds LiBai's GraphBase "
                                          "(libai.models.utils.GraphBase) from the train.* keys, not another graph "
                                          f"class; set graph.{key}._target_ to it, or write a trainer that builds "
                                          "yours")



def _refuse(refused, mode, advice):
    if refused:
        raise NotImplementedError(f"{mode} with {', '.join(refused)} is not implemented; {advice}")


def check_cuda_graph_mode(cfg):
    """train.cuda_graph.enabled=True (CUDAGraphTrainer): refuse, at the start, what a captured
    forward + backward does not hold yet."""
    train = cfg.train
    if not train.cuda_graph.enabled:
        return
    refused = []
    if graph_mode(cfg):
        refused.append("graph mode (train.graph.enabled=True)")
    if str(train.input_placement_device) != "cuda":
        refused.append(f"train.input_placement_device={train.input_placement_device} (a CUDA graph needs 'cuda')")
    if (train.dist.get("pipeline_parallel_size") or 1) > 1:
        refused.append("pipeline_parallel_size > 1 (a stage's handoffs are scheduled by the host)")
    if train.zero_optimization.enabled:
        refused.append("train.zero_optimization.enabled=True")
    _refuse(refused, "train.cuda_graph.enabled=True", "run that configuration without it")


def save_config(cfg):
    """Rank 0 writes the full config to train.output_dir/config.yaml."""
    if dist.is_main_process():
        path = os.path.join(cfg.train.output_dir, "config.yaml")
        LazyConfig.save(cfg, path)
        logging.getLogger("libai").info(f"Full config saved to {path}")


def _unpack_loaders(result):
    if isinstance(result, (list, tuple)):
        result = list(result) + [None] * (3 - len(result))
        return result[0], result[1], result[2]
    return result, None, None


# where a model config says how many layers it has (LiBai's recipes set pipeline_num_layers to it)
_LAYER_COUNT_KEYS = ("model.cfg.hidden_layers", "model.cfg.num_layers", "model.depth", "model.depths")


def _check_pipeline_num_layers(cfg, given):
    """ValueError when train.dist.pipeline_num_layers is larger than the model's layer count: the
    stages split layer indices 0 .. pipeline_num_layers - 1, so the layers all went to the first
    stages and the last ones held none (a count too small is refused where the stages are built)."""
    found = _model_layer_count(cfg)
    if found is not None and given > found[1]:
        key, layers = found
        raise ValueError(f"train.dist.pipeline_num_layers={given} is larger than the model's {layers} layers "
                         f"({key}): the stages would split {given} layer indices and leave the last ones "
                         f"without layers; set it to {layers} (or leave it unset: it is inferred), or place "
                         "layers with train.dist.custom_pipeline_stage_id")


def _model_layer_count(cfg):
    """(the first of _LAYER_COUNT_KEYS the model config has, its layer count), or None."""
    for key in _LAYER_COUNT_KEYS:
        value = try_get_key(cfg, key, default=None)
        if value is not None:
            return key, int(sum(value)) if not isinstance(value, int) else int(value)
    return None


def infer_pipeline_num_layers(cfg):
    """With pipeline_parallel_size > 1 and train.dist.pipeline_num_layers unset, set it to the
    model's layer count (model.cfg.hidden_layers, model.depth, sum(model.depths): one pipeline
    layer per transformer layer or Swin block), as LiBai's recipes do by hand. A model config
    without any of those keys is an error asking for the key."""
    d = cfg.train.dist
    if d.pipeline_parallel_size == 1:
        return
    if d.pipeline_num_layers is not None:
        _check_pipeline_num_layers(cfg, int(d.pipeline_num_layers))
        return
    found = _model_layer_count(cfg)
    if found is not None:
        key, d.pipeline_num_layers = found
        logging.getLogger(__name__).info(f"train.dist.pipeline_num_layers = {d.pipeline_num_layers} (from {key})")
        return
    raise ValueError("train.dist.pipeline_parallel_size > 1 needs train.dist.pipeline_num_layers (the number of layers "
                     f"to split over the stages): none of {_LAYER_COUNT_KEYS} is in the config to infer it from")


class DefaultTrainer(TrainerBase):
    """The standard training workflow, built from a LazyConfig:

    1. train / test loaders from cfg.dataloader.train / cfg.dataloader.test (a list)
    2. model = instantiate(cfg.model), optimizer = build_optimizer(cfg.optim, model), scheduler
       from cfg.train.scheduler (max_iter = train.train_iter, warmup_iter =
       int(train.warmup_ratio * train.train_iter))
    3. resume (train.resume: every state from the newest valid checkpoint in output_dir) or
       load train.load_weight (model weights only)
    4. hooks: IterationTimer, LRScheduler, EvalHook + BestCheckpointer (when evaluation is
       enabled), PeriodicWriter (CommonMetricPrinter, JSONWriter, TensorboardXWriter),
       PeriodicCheckpointer

    train.output_dir is claimed first (libai.utils.output_dir.prepare_output_dir: its lock,
    and no fresh run on top of a previous one); default_setup already did it, claiming again
    in the same process changes nothing.

    One iteration is one optimizer step over train.num_accumulation_steps micro-batches, i.e.
    train.global_batch_size samples over all data-parallel ranks.

    cfg.train is resolved first (libai.config.resolve_train_config; default_setup already did
    it, resolving again changes nothing). The trainer's state_dict() (iteration, hook states)
    is saved with every checkpoint (the checkpointer's trainer_state file) and restored on
    resume.
    """

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        logger = logging.getLogger("libai")
        if not logger.isEnabledFor(logging.INFO) or not logger.handlers:
            setup_logger(distributed_rank=dist.get_rank())
        self._logger = logging.getLogger(__name__)

        resolve_train_config(cfg)
        check_graph_mode(cfg)
        check_cuda_graph_mode(cfg)
        prepare_output_dir(cfg.train.output_dir, resume=cfg.train.resume, overwrite=cfg.train.overwrite_output_dir)
        resolve_batch_sizes(cfg.train, dist.get_data_parallel_size())
        self.tokenizer = self.build_tokenizer(cfg)
        self.train_loader, valid_loader, test_loader = self.build_train_loader(cfg, self.tokenizer)
        self.test_loader = [ld for ld in (valid_loader, test_loader) if ld is not None]
        self.test_loader.extend(self.build_test_loader(cfg, self.tokenizer))

        self.auto_scale_hyperparams(cfg, self.train_loader)

        self.model = self.build_model(cfg)
        self.optimizer = self.build_optimizer(cfg, self.model)
        self.lr_scheduler = self.build_lr_scheduler(cfg, self.optimizer, warmup_iter=self.warmup_iter)

        self.input_device(cfg)  # a "cuda" input device on a machine without CUDA is an error now
        self.pipeline = self.build_pipeline(cfg, self.model)
        self.zero = self.build_zero(cfg, self.optimizer)
        self.grad_scaler = self.build_grad_scaler(cfg)
        # run_step passes get_batch and the input device, as LiBai's DefaultTrainer
        if graph_mode(cfg):
            if self.pipeline is not None:  # this stage's whole schedule is one graph
                from .pipeline import PipelineGraph

                graph = PipelineGraph(self.pipeline)
            else:
                graph = self.build_graph(cfg, self.model, is_train=True, grad_scaler=self.grad_scaler)
            debug = cfg.train.graph.debug if cfg.train.graph.debug >= 0 else \
                try_get_key(cfg, "graph.debug", default=-1)  # LiBai's key
            if debug >= 0:
                graph.debug(debug)
            self._trainer = GraphTrainer(graph, self.train_loader, cfg.train.num_accumulation_steps,
                                         optimizer=self.optimizer, grad_scaler=self.grad_scaler, zero=self.zero,
                                         pipeline=self.pipeline, autocast=self.autocast_of(cfg))
        elif cfg.train.cuda_graph.enabled:
            self._trainer = CUDAGraphTrainer(self.model, self.train_loader, self.optimizer,
                                             autocast=self.autocast_of(cfg), grad_scaler=self.grad_scaler,
                                             warmup_iters=cfg.train.cuda_graph.warmup_iters,
                                             grad_acc_steps=cfg.train.num_accumulation_steps or 1)
        else:
            self._trainer = EagerTrainer(self.model, self.train_loader, self.optimizer,
                                         cfg.train.num_accumulation_steps, pipeline=self.pipeline,
                                         zero=self.zero, autocast=self.autocast_of(cfg),
                                         grad_scaler=self.grad_scaler)

        checkpointables = dict(optimizer=self.optimizer, lr_scheduler=self.lr_scheduler)
        if self.grad_scaler is not None:
            checkpointables["grad_scaler"] = self.grad_scaler
        if hasattr(self.train_loader, "state_dict") and hasattr(self.train_loader, "load_state_dict"):
            checkpointables["train_loader"] = self.train_loader
        else:
            self._logger.warning("the train loader has no state_dict(): a resumed run restarts its data order")
        # train.checkpointer.period <= 0 disables every checkpoint (model_best included)
        self.checkpointer = Checkpointer(self.model, cfg.train.output_dir, trainer=weakref.proxy(self),
                                         enabled=cfg.train.checkpointer.period > 0, **checkpointables)

        self.global_batch_size = cfg.train.global_batch_size
        self.max_iter = cfg.train.train_iter
        self._last_eval_results = None
        # hooks first: resuming restores their state
        self.register_hooks(self.build_hooks())
        self.start_iter = 0
        self.resume_or_load(cfg.train.resume)

    # ------------------------------------------------------------------ resume / load
    def resume_or_load(self, resume=True):
        """With `resume`, restore model, optimizer, scheduler, data position, RNG states and the
        trainer's state (iteration, hook states) from the newest valid checkpoint in
        train.output_dir (Checkpointer.resume: `last_checkpoint`'s, else the newest one that
        verifies) and continue after its iteration. A resume that finds no valid checkpoint
        in a directory holding a previous run is an error (OutputDirError) unless
        train.overwrite_output_dir, which deletes that run; in an empty directory it starts
        from scratch. Without `resume` (or starting from scratch): load train.load_weight
        (model weights only; missing/unexpected keys are logged, mismatched shapes are errors)
        and start from iteration 0."""
        train = self.cfg.train
        self.start_iter = 0
        if resume:
            path, extra = self.checkpointer.resume()  # sets self.iter
            if path is not None:
                self.start_iter = self.iter + 1 if "iteration" in extra else 0
                self._logger.info(f"Resumed from {path}: continuing at iteration {self.start_iter}")
                changed = config_changes(self.cfg, path) if dist.is_main_process() else None
                if changed:  # e.g. an optim.lr override: the checkpoint's scheduler state decides the lr
                    self._logger.warning(f"--resume: {os.path.basename(path)} was saved with another config "
                                         f"({changed}); the run continues from the checkpoint's state (weights, "
                                         "optimizer, learning-rate schedule, data position) under this config")
                save_config(self.cfg)
                return
            self._start_fresh_after_failed_resume(train.output_dir, train.overwrite_output_dir)
            save_config(self.cfg)
        if train.load_weight:
            try:
                self.checkpointer.load(train.load_weight, checkpointables=[])
            except CheckpointError as e:
                hint = model_settings_hint(self.cfg, train.load_weight)
                if not hint:
                    raise
                raise CheckpointError(f"train.load_weight: {e}{hint}") from e

    def _start_fresh_after_failed_resume(self, output_dir, overwrite):
        notes = self.checkpointer.resume_notes
        found = "; ".join(notes) or "no checkpoint directory"
        if dist.max_over_ranks(self.checkpointer.resume_partial):  # some ranks now hold a checkpoint's state
            raise OutputDirError(f"--resume: the checkpoints in {output_dir} load on some ranks only ({found})")
        leftovers = dist.broadcast_object(previous_run_artifacts(output_dir) if dist.is_main_process() else None)
        if not leftovers:
            self._logger.info(f"--resume: {output_dir} holds no previous run; starting from scratch")
            return
        if not overwrite:
            checkpoints = self.checkpointer.get_all_checkpoint_files()
            hint = config_change_hint(self.cfg, checkpoints[-1]) if checkpoints and dist.is_main_process() else ""
            raise OutputDirError(
                f"--resume: train.output_dir={output_dir!r} holds a previous run ({describe(leftovers)}) but no "
                f"checkpoint this run can resume from ({found}). {hint}If a checkpoint is damaged, restore it; to "
                f"delete the previous run and start over, add --overwrite-output-dir")
        if dist.is_main_process():
            check_previous_run(output_dir, resume=False, overwrite=True)
        dist.synchronize()
        self._logger.warning(f"--resume --overwrite-output-dir: no valid checkpoint in {output_dir} ({found}); "
                             f"deleted {describe(leftovers)} and starting from scratch")

    # ------------------------------------------------------------------ hooks and writers
    def build_hooks(self):
        cfg = self.cfg
        train, ev = cfg.train, cfg.train.evaluation
        ret = [hooks.IterationTimer(), hooks.LRScheduler()]
        if ev.enabled and not self.test_loader:
            self._logger.warning("train.evaluation.enabled=True, but there is nothing to evaluate (no "
                                 "dataloader.test, and the train splits give no valid or test data): no evaluation "
                                 f"runs and no model_best is saved for {ev.eval_metric!r}")
        if ev.enabled and self.test_loader:
            def test_and_save_results():
                self._last_eval_results = self.test(self.cfg, self.test_loader, self.model,
                                                    should_stop=self.stop_requested)
                return self._last_eval_results

            ret.append(hooks.EvalHook(ev.eval_period, test_and_save_results))
            ret.append(hooks.BestCheckpointer(ev.eval_period, self.checkpointer, val_metric=ev.eval_metric,
                                              mode=ev.eval_mode))
        # writers after evaluation, so that an iteration's evaluation results are written with it
        # (on every rank, so that every rank restores the same hook states; writers on rank 0)
        ret.append(hooks.PeriodicWriter(self.build_writers() if dist.is_main_process() else [], train.log_period))
        # the checkpointer last: a checkpoint of iteration k follows everything iteration k did
        ret.append(hooks.PeriodicCheckpointer(self.checkpointer, train.checkpointer.period,
                                              max_to_keep=train.checkpointer.max_to_keep))
        return ret

    def build_writers(self):
        out = self.cfg.train.output_dir
        return [
            CommonMetricPrinter(self.global_batch_size, self.max_iter),
            JSONWriter(os.path.join(out, "metrics.json")),
            TensorboardXWriter(out),
        ]

    # ------------------------------------------------------------------ training
    def train(self, stop_iter=None):
        """Train from start_iter to train.train_iter (or stop after `stop_iter` iterations in
        total). Returns the last evaluation results (or None)."""
        if self.start_iter >= self.max_iter:
            self._logger.info(f"Training already finished (start_iter {self.start_iter} >= train_iter {self.max_iter})")
            return self._last_eval_results
        if stop_iter is not None and stop_iter <= self.start_iter:
            # nothing to run: no iteration, no record, and no checkpoint of an iteration that never ran
            self._logger.warning(f"--stop-iter {stop_iter}: this run starts at iteration {self.start_iter}, which is "
                                 f"not before {stop_iter}; nothing to train, nothing written")
            return self._last_eval_results
        super().train(self.start_iter, self.max_iter, stop_iter)
        if self.interrupted or self.iter < self.max_iter:
            why = (f"Interrupted by {signal.Signals(self.interrupted).name}" if self.interrupted else
                   f"--stop-iter {stop_iter}: stopped")
            saved = self.checkpointer.enabled and self.checkpointer.save_dir
            self._logger.warning(
                f"{why} after iteration {self.iter - 1} of {self.max_iter} (iterations count from 0): "
                + (f"checkpoint {self.checkpointer.get_checkpoint_file()} written, continue with --resume"
                   if saved else "no checkpoint written (train.checkpointer.period <= 0)"))
        dist.synchronize()  # every rank has finished its hooks (and writes) before any exits
        return self._last_eval_results

    def run_step(self):
        """`self._trainer.run_step(self.get_batch, train.input_placement_device)`, as LiBai (a
        replaced `_trainer` is called the same way)."""
        self._trainer.iter = self.iter
        self._trainer.run_step(self.get_batch, self.cfg.train.input_placement_device)

    # ------------------------------------------------------------------ builders
    @staticmethod
    def input_device(cfg):
        """train.input_placement_device; "cuda" on a machine without CUDA is an error (a job
        never silently runs elsewhere than asked)."""
        device = cfg.train.input_placement_device
        if device == "cuda" and not flow.cuda.is_available():
            raise RuntimeError("train.input_placement_device='cuda' but CUDA is not available here; "
                               "use train.input_placement_device=cpu")
        return device

    @classmethod
    def get_batch(cls, data, input_placement_device="cpu", mixup_func=None, placement=None):
        """Turn a loader batch into the model's keyword arguments (tensors moved to the input
        device). Override for e.g. mixup or global tensors. LiBai's signature: `mixup_func`
        (the loader's, if it has one) is applied to the batch's "images" and "labels" first
        (this project's image loaders mix in their collate function instead).

        A batch with a `to_model_inputs(device_type)` method (a `libai.data.structures.Instance`
        of DistTensorData, as the GPT-2 loaders yield) is converted by it: each field becomes a
        global tensor on its layer's placement with sbp [S(0), B] over the (dp, tp) mesh, or
        on `placement` (a pipeline stage: the fields its steps read)."""
        if mixup_func is not None:
            data = _mix(data, mixup_func, input_placement_device)
        if hasattr(data, "to_model_inputs"):
            return data.to_model_inputs(input_placement_device, placement=placement)
        if input_placement_device == "cuda":
            return {k: (v.to("cuda") if isinstance(v, flow.Tensor) else v) for k, v in data.items()}
        return dict(data)

    @classmethod
    def build_model(cls, cfg):
        if try_get_key(cfg, "model") is None:
            raise KeyError("cfg must contain a `model` namespace")
        model = instantiate(cfg.model)
        logging.getLogger(__name__).info(f"Model:\n{model}")
        if cfg.train.activation_checkpoint.enabled:
            from libai.layers.utils import set_activation_checkpointing

            n = set_activation_checkpointing(model)
            if n == 0:
                raise ValueError(f"train.activation_checkpoint.enabled=True but {type(model).__name__} has no layer "
                                 "that recomputes its activations (TransformerLayer, SwinBlock)")
            logging.getLogger(__name__).info(f"Activation checkpointing: {n} layers recompute their forward in "
                                             "backward")
        if cls.input_device(cfg) == "cuda":
            model = model.to("cuda")
        return model

    @classmethod
    def build_pipeline(cls, cfg, model):
        """The pipeline schedule runner when train.dist.pipeline_parallel_size > 1 (None
        otherwise): train.dist.pipeline_schedule ("1F1B" or "GPipe") over
        train.num_accumulation_steps micro-batches (libai.engine.pipeline)."""
        if dist.get_pipeline_parallel_size() == 1:
            return None
        from .pipeline import PipelineRunner

        device = cls.input_device(cfg)
        return PipelineRunner(model, lambda data, placement: cls.get_batch(data, device, placement=placement),
                              kind=cfg.train.dist.pipeline_schedule, device_type=device)

    @classmethod
    def build_graph(cls, cfg, model, optimizer=None, lr_scheduler=None, is_train=True, grad_scaler=None):
        """The nn.Graph of graph mode (libai.models.utils.GraphBase). Training: each call is one
        micro-batch's forward and backward under the config's autocast (float16: its backward
        scaled by `grad_scaler`, the trainer's); the trainer runs the eager update around it (so
        the optimizer and scheduler are not given to the graph). Evaluation (`is_train=False`):
        the model's forward without gradients."""
        from libai.models.utils import GraphBase

        fp16 = is_train and cls.float16_training(cfg)
        return GraphBase(model, optimizer, lr_scheduler, is_train=is_train, fp16=fp16,
                         grad_acc_steps=cfg.train.num_accumulation_steps if is_train else 1,
                         autocast=cls.autocast_of(cfg), grad_scaler=grad_scaler if fp16 else None)

    @classmethod
    def autocast_of(cls, cfg):
        """A factory of the autocast context of train.amp (None when amp is off): PyTorch's
        per-op policy in train.amp.dtype ("bfloat16", "float16"; None: bfloat16 on the CPU,
        float16 on CUDA) around every forward, in training and evaluation (engine.amp)."""
        if not cfg.train.amp.enabled:
            return None
        device, dtype = cls.input_device(cfg), cfg.train.amp.dtype
        return lambda: flow.autocast(device, dtype=dtype)

    @classmethod
    def build_grad_scaler(cls, cfg):
        """engine.amp.GradScaler (PyTorch's defaults) when training in float16, where small
        gradients would underflow without loss scaling; None otherwise (bfloat16 has float32's
        range and needs none)."""
        if not cls.float16_training(cfg):
            return None
        return flow.amp.GradScaler(cls.input_device(cfg))

    @classmethod
    def float16_training(cls, cfg):
        """Whether train.amp computes in float16 (its dtype, or the device's default)."""
        return bool(cfg.train.amp.enabled) and cls.autocast_of(cfg)().fast_dtype == flow.float16

    @classmethod
    def build_zero(cls, cfg, optimizer):
        """ZeRO over the data-parallel mesh axis when train.zero_optimization.enabled (None
        otherwise, or with data_parallel_size 1, where there is nothing to shard): stage 1
        shards the optimizer state, 2 also the gradients, 3 also the parameters
        (engine.distributed.zero). Applied to the optimizer in place, before any state exists."""
        z = cfg.train.zero_optimization
        if not z.enabled:
            return None
        logger = logging.getLogger(__name__)
        if dist.get_data_parallel_size() == 1:
            logger.warning("train.zero_optimization.enabled with data_parallel_size 1: nothing to shard, ZeRO is off")
            return None
        from engine.distributed.zero import ZeroRedundancy

        zero = ZeroRedundancy(optimizer, z.stage, axis=0)  # dp is the first mesh axis of every stage
        n = len(zero.pairs) + len(zero.sharded)
        total = len({id(p) for g in optimizer.param_groups for p in g["params"]})
        logger.info(f"ZeRO stage {z.stage}: {n} of {total} parameters sharded over {dist.get_data_parallel_size()} "
                    "data-parallel ranks (the others do not divide)")
        return zero

    @classmethod
    def build_optimizer(cls, cfg, model):
        from libai.optim import build_optimizer

        if try_get_key(cfg, "optim") is None:
            raise KeyError("cfg must contain an `optim` namespace")
        return build_optimizer(cfg.optim, model)

    @classmethod
    def build_lr_scheduler(cls, cfg, optimizer, warmup_iter=None):
        from libai.scheduler import build_lr_scheduler

        if cfg.train.scheduler is None:
            raise KeyError("cfg.train.scheduler is None: set the lr scheduler to build")
        if warmup_iter is None:
            warmup_iter = int(cfg.train.warmup_ratio * cfg.train.train_iter)
        return build_lr_scheduler(cfg.train.scheduler, optimizer, max_iter=int(cfg.train.train_iter),
                                  warmup_iter=int(warmup_iter))

    @classmethod
    def build_tokenizer(cls, cfg):
        """The tokenizer of cfg.tokenization (None without that section), as LiBai: unset GPT-2
        data paths are first filled with the default corpus (libai.data.corpus.apply_default_corpus),
        then model.cfg.vocab_size (when the model has that key) becomes
        `tokenizer.padded_vocab_size(tokenization.make_vocab_size_divisible_by,
        train.dist.tensor_parallel_size)`, so the vocabulary splits evenly over tp ranks."""
        if try_get_key(cfg, "tokenization.tokenizer") is None:
            return None
        from libai.data.corpus import apply_default_corpus

        divisible = try_get_key(cfg, "tokenization.make_vocab_size_divisible_by", default=1)
        if divisible is not None and (isinstance(divisible, bool) or not isinstance(divisible, int) or divisible < 1):
            raise ValueError(f"tokenization.make_vocab_size_divisible_by must be a positive integer (1: no padding), "
                             f"got {divisible!r}")
        divisible = int(divisible or 1)
        apply_default_corpus(cfg)
        tokenizer = instantiate(cfg.tokenization.tokenizer)
        tp = cfg.train.dist.tensor_parallel_size
        padded = tokenizer.padded_vocab_size(divisible, tp)
        tokenizer.padded_vocab = padded
        from libai.tokenizer import set_tokenizer

        set_tokenizer(tokenizer)  # for datasets configured without one (libai.tokenizer.get_tokenizer)
        if try_get_key(cfg, "model.cfg.vocab_size", default=None) is not None:
            if cfg.model.cfg.vocab_size != padded:
                logging.getLogger(__name__).info(
                    f"model.cfg.vocab_size = {padded} (tokenizer: {len(tokenizer)} tokens padded to a multiple "
                    f"of {divisible} * tensor_parallel_size {tp})")
            cfg.model.cfg.vocab_size = padded
        return tokenizer

    @classmethod
    def build_train_loader(cls, cfg, tokenizer=None):
        """instantiate(cfg.dataloader.train, _recursive_=False) (as LiBai: the builder receives
        its datasets unbuilt) with train_batch_size = train.train_micro_batch_size,
        test_batch_size = train.test_micro_batch_size and seed = train.seed. Returns
        (train, valid, test) loaders (valid/test may be None). A `tokenizer` is given to each
        dataset (its `tokenizer` argument), as LiBai; the config itself is left unchanged.

        A loader with a `train_val_test_num_samples` key left at None (the NLP builders) gets
        [train_iter * global_batch_size, 0, 0]: the training samples, and one epoch (0) of the
        valid and test splits. LiBai (Megatron) asks those for eval_iter batches per evaluation
        times the number of evaluations, which repeats and reshuffles a small split, so that the
        samples an evaluation reads (at most eval_iter batches from the split's start, every
        time) depended on train_iter; with one epoch they do not, and `--eval-only` on a
        checkpoint gives the perplexity the training run recorded for it."""
        if try_get_key(cfg, "dataloader.train") is None:
            raise KeyError("cfg must contain a `dataloader.train` namespace")
        node = cfg.dataloader.train
        if hasattr(node, "keys") and "train_val_test_num_samples" in node and node.train_val_test_num_samples is None:
            nums = [int(cfg.train.train_iter) * int(cfg.train.global_batch_size), 0, 0]
            node.train_val_test_num_samples = nums
            logging.getLogger(__name__).info(f"dataloader.train.train_val_test_num_samples = {nums}")
        with _datasets_given(node, tokenizer):
            result = instantiate(node, _recursive_=False, train_batch_size=cfg.train.train_micro_batch_size,
                                 test_batch_size=cfg.train.test_micro_batch_size, seed=cfg.train.seed)
        return _unpack_loaders(result)

    @classmethod
    def build_eval_only_loaders(cls, cfg, tokenizer=None):
        """The loaders `--eval-only` evaluates, in the trainer's order, so that its results carry
        the names of the training run's evaluations (`test`): the valid and test splits of
        dataloader.train, when its builder makes them (a loader with a `train_val_test_num_samples`
        key, as the NLP recipes; or any dataloader.train when there is no dataloader.test), then
        one loader per dataloader.test entry.

        A `train_val_test_num_samples` left at None becomes [0, 0, 0]: one epoch of each split,
        so that what is evaluated does not depend on train.train_iter or the evaluation period
        (each evaluation runs at most train.evaluation.eval_iter batches of it)."""
        tests = cls.build_test_loader(cfg, tokenizer)
        node = try_get_key(cfg, "dataloader.train", default=None)
        has_splits = hasattr(node, "keys") and "train_val_test_num_samples" in node
        if node is None or (tests and not has_splits):
            return tests
        if has_splits and node.train_val_test_num_samples is None:
            node.train_val_test_num_samples = [0, 0, 0]
            logging.getLogger(__name__).info(
                "--eval-only: dataloader.train.train_val_test_num_samples = [0, 0, 0] (one epoch of each split, "
                "whatever train.train_iter is)")
        _, valid, test = cls.build_train_loader(cfg, tokenizer)
        return [ld for ld in (valid, test) if ld is not None] + tests

    @classmethod
    def build_test_loader(cls, cfg, tokenizer=None):
        """One loader per entry of the cfg.dataloader.test list (instantiated with
        `_recursive_=False`, test_batch_size = train.test_micro_batch_size, seed = train.seed;
        a `tokenizer` is given to each dataset); [] when there is none."""
        tests = try_get_key(cfg, "dataloader.test", default=None)
        if not tests:
            return []
        loaders = []
        for t in tests:
            with _datasets_given(t, tokenizer):
                loaders.append(instantiate(t, _recursive_=False, test_batch_size=cfg.train.test_micro_batch_size,
                                           seed=cfg.train.seed))
        return loaders

    @classmethod
    def build_evaluator(cls, cfg):
        return instantiate(cfg.train.evaluation.evaluator)

    def auto_scale_hyperparams(self, cfg, data_loader):
        """train_iter = max(train_iter, ceil(len(dataset) * train_epoch / global_batch_size));
        warmup_iter = int(warmup_ratio * train_iter)."""
        train_iter, train_epoch, warmup_ratio = cfg.train.train_iter, cfg.train.train_epoch, cfg.train.warmup_ratio
        if not 0 <= warmup_ratio < 1:
            raise ValueError("train.warmup_ratio must be in [0, 1): the fraction of iterations used for warmup")
        dataset = getattr(data_loader, "dataset", None)
        if train_epoch and dataset is not None:
            train_iter = max(math.ceil(len(dataset) * train_epoch / cfg.train.global_batch_size), train_iter)
        cfg.train.train_iter = train_iter
        self.warmup_iter = int(warmup_ratio * train_iter)
        self._logger.info(f"train.train_iter={train_iter}, warmup_iter={self.warmup_iter}")
        self._scale_epoch_periods(cfg, dataset)

    def _scale_epoch_periods(self, cfg, dataset):
        """LiBai's evaluation.eval_after_n_epoch / checkpointer.save_model_after_n_epoch: when set,
        eval_period / checkpointer.period become n * iterations per epoch (len(dataset) //
        global_batch_size)."""
        keys = (("evaluation", "eval_after_n_epoch", "eval_period"),
                ("checkpointer", "save_model_after_n_epoch", "period"))
        for section, epochs_key, period_key in keys:
            node = cfg.train[section]
            epochs = node.get(epochs_key)
            if not epochs:
                continue
            if dataset is None or not hasattr(dataset, "__len__"):
                raise ValueError(f"train.{section}.{epochs_key}={epochs} needs a training dataset with a length "
                                 "to count the iterations of an epoch")
            iter_per_epoch = len(dataset) // cfg.train.global_batch_size
            if iter_per_epoch < 1:
                raise ValueError(f"train.{section}.{epochs_key}={epochs}: an epoch of {len(dataset)} samples is "
                                 f"less than one iteration of {cfg.train.global_batch_size}")
            node[period_key] = int(iter_per_epoch * epochs)
            self._logger.info(f"train.{section}.{epochs_key}={epochs}: train.{section}.{period_key}="
                              f"{node[period_key]} ({iter_per_epoch} iterations per epoch)")

    @classmethod
    def test(cls, cfg, test_loaders=None, model=None, evaluator=None, should_stop=None, names=None):
        """Evaluate `model` on each test loader (at most train.evaluation.eval_iter batches each)
        with `evaluator` (default: instantiate(train.evaluation.evaluator)). `test(cfg, model)`
        builds the test loaders from the config. `should_stop` (the trainer's stop_requested) may
        end it early with EvaluationInterrupted (inference_on_dataset).

        Results are named by the loader's place (`eval_result_prefixes`): the first loader is
        the validation set and its metrics keep their plain names (`PPL`, `Acc@1`: what
        train.evaluation.eval_metric names); the second is the test set, its metrics under
        `test` (flattened `test/PPL`), a third under `test_2`, ... The trainer's loaders come in
        the order valid split, test split (of dataloader.train), then dataloader.test. One
        loader: its results dict; several: {validation metrics..., "test": {...}, ...}. `names`
        (one prefix per loader, "" for plain names) replaces the default prefixes."""
        if isinstance(test_loaders, flow.nn.Module):
            test_loaders, model, evaluator = None, test_loaders, model
        if test_loaders is None:
            test_loaders = cls.build_test_loader(cfg)
        test_loaders = list(test_loaders)
        names = eval_result_prefixes(len(test_loaders)) if names is None else list(names)
        if len(names) != len(test_loaders) or len(set(names)) != len(names):
            raise ValueError(f"DefaultTrainer.test: names {names} must give one distinct prefix to each of the "
                             f"{len(test_loaders)} loaders")
        logger = logging.getLogger(__name__)
        device = cls.input_device(cfg)
        pipeline = cls.build_pipeline(cfg, model)
        autocast = cls.autocast_of(cfg)
        if pipeline is not None and autocast is not None:
            pipeline.autocast = autocast
        results = OrderedDict()
        for loader, prefix in zip(test_loaders, names):
            ev = evaluator if evaluator is not None else cls.build_evaluator(cfg)
            res = inference_on_dataset(model, loader, ev, cfg.train.evaluation.eval_iter,
                                       get_batch=lambda data: cls.get_batch(data, device), should_stop=should_stop,
                                       forward=pipeline.forward_only if pipeline is not None else None,
                                       autocast=autocast)
            clash = sorted(set(results) & ({prefix} if prefix else set(res)))
            if clash:
                raise ValueError(f"DefaultTrainer.test: the results of {_describe_loader(loader)} would replace "
                                 f"{clash} of another loader")
            if prefix:
                results[prefix] = res
            else:
                results.update(res)
            if dist.is_main_process():
                role = ("the validation set (metrics named as the evaluator names them)" if not prefix else
                        f"the {'test set' if prefix.startswith('test') else f'set {prefix!r}'} (metrics named "
                        f"{prefix}/...)")
                logger.info(f"Evaluation results for {role}, {_describe_loader(loader)}, in csv format:")
                print_csv_format(res)
        return results


def eval_result_prefixes(n):
    """The names DefaultTrainer.test gives the results of `n` loaders: "" (plain metric names)
    for the first, the validation set; "test" for the second; "test_2", "test_3", ... after."""
    return ["" if i == 0 else "test" if i == 1 else f"test_{i}" for i in range(n)]


def _describe_loader(loader):
    dataset = getattr(loader, "dataset", loader)
    name = getattr(dataset, "name", None)
    return type(dataset).__name__ + (f" {name!r}" if isinstance(name, str) else "")


def write_eval_results(cfg, results, iteration=0):
    """Append evaluation results (flattened) as one record to output_dir/metrics.json and to the
    TensorBoard event file (used by --eval-only). In a training run's directory, whose
    metrics.json already has records of that iteration or later, the record goes to
    eval_only.json instead: metrics.json never holds an iteration twice, nor goes back."""
    out = cfg.train.output_dir
    if not out or not dist.is_main_process() or not results:
        return
    json_file = os.path.join(out, "metrics.json")
    if _last_recorded_iteration(json_file) >= iteration:
        json_file = os.path.join(out, "eval_only.json")
        logging.getLogger(__name__).info(f"{out}/metrics.json holds a training run's records up to this iteration "
                                         f"({iteration}): the results are appended to {json_file}")
    with EventStorage(iteration) as storage:
        storage.put_scalars(**flatten_results_dict(results), smoothing_hint=False)
        for w in (JSONWriter(json_file), TensorboardXWriter(out)):
            w.write()
            w.close()


def _last_recorded_iteration(json_file):
    """The largest iteration of a metrics.json's records (-1 for none or no file)."""
    last = -1
    try:
        with open(json_file, encoding="utf-8") as f:
            for line in f:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if isinstance(record, dict) and isinstance(record.get("iteration"), int):
                    last = max(last, record["iteration"])
    except OSError:
        pass
    return last


@contextlib.contextmanager
def _datasets_given(loader_node, tokenizer):
    """While open, each dataset LazyCall of `loader_node` (its `dataset`: one or a list) has
    `tokenizer=tokenizer` (LiBai's build_*_loader do so); afterwards the nodes are as before. Does
    nothing for tokenizer None or a loader node without datasets."""
    from libai.config.instantiate import is_lazy_node

    datasets = loader_node.get("dataset") if tokenizer is not None and hasattr(loader_node, "get") else None
    if datasets is None:
        yield
        return
    nodes = [d for d in (datasets if OmegaConf.is_list(datasets) or isinstance(datasets, list) else [datasets])
             if is_lazy_node(d)]
    saved = [(d, "tokenizer" in d, d.get("tokenizer")) for d in nodes]
    for d in nodes:
        d.tokenizer = tokenizer
    try:
        yield
    finally:
        for d, had, value in saved:
            if had:
                d.tokenizer = value
            else:
                d.pop("tokenizer")


def _mix(data, mixup_func, device):
    """LiBai's get_batch mixup: mixup_func(images, labels) on the batch's "images" and "labels"."""
    if hasattr(data, "get_fields"):  # an Instance of DistTensorData
        images, labels = mixup_func(data.get("images").tensor.to(device), data.get("labels").tensor.to(device))
        data.get("images").tensor, data.get("labels").tensor = images, labels
        return data
    data = dict(data)
    data["images"], data["labels"] = mixup_func(data["images"].to(device), data["labels"].to(device))
    return data

