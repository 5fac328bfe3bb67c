from omegaconf import DictConfig

from libai.config import LazyCall

# The one place where the defaults of the `train` keys are written: libai.config.resolve_train_config
# (called by default_setup and DefaultTrainer) fills a recipe's missing keys from here, refuses
# keys that are not here, and refuses a non-default value of the LiBai keys marked "not implemented"
# below (libai.config.train_config.NOT_IMPLEMENTED). See docs/config.md for a table of every key.
# The evaluator and the scheduler are given as dotted paths: they are imported only when the
# trainer instantiates them.

# fmt: off
train = dict(

    # Directory where output files (config.yaml, logs, checkpoints, metrics) are written
    output_dir="./output",

    # `train_micro_batch_size` is the number of samples per batch on each data-parallel rank.
    # global_batch_size = train_micro_batch_size * data_parallel_size * num_accumulation_steps;
    # set any two of the three (or only the micro batch size: one accumulation step) and the
    # trainer solves the third (libai.config.resolve_batch_sizes).
    train_micro_batch_size=32,
    global_batch_size=None,
    num_accumulation_steps=None,

    # The total training iterations
    train_iter=10000,
    # The total training epochs, scaled to iterations automatically; the actual number of
    # iterations is `max(train_iter, train_epoch * iter_per_epoch)`.
    train_epoch=0,
    # not implemented (only these defaults are accepted): the data position is restored from the
    # checkpoint on resume, and the training is sized by train_iter / train_epoch
    consumed_train_samples=0,
    consumed_valid_samples=0,
    train_samples=None,

    # Fraction of the total training iterations used for lr warmup (warmup_iter = ratio * iters)
    warmup_ratio=0,

    # The start iteration (not settable: --resume continues after the checkpoint's iteration)
    start_iter=0,

    # Resume from the newest valid checkpoint in output_dir (set by the --resume flag)
    resume=False,
    # Delete a previous run found in output_dir (checkpoints, last_checkpoint, metrics.json,
    # TensorBoard events) and start over (set by --overwrite-output-dir); without it, a run that
    # is not resumed refuses to start in a directory holding a previous run
    overwrite_output_dir=False,

    # Automatic mixed precision (engine.amp): PyTorch's autocast policy around every forward
    # (matmuls in `dtype`, losses in float32, float32 master weights); dtype "float16" (with
    # dynamic loss scaling), "bfloat16", or None: bfloat16 on the CPU, float16 on CUDA
    amp=dict(enabled=False, dtype=None),

    # Activation checkpointing: every TransformerLayer (and SwinBlock) recomputes its forward in
    # backward instead of keeping its activations (same losses and gradients, less memory, about
    # one more forward of compute; engine.utils.checkpoint)
    activation_checkpoint=dict(enabled=False),

    # Graph mode (engine.nn.Graph, OneFlow's static graph): each micro-batch's forward and backward
    # is traced at the first iteration and replayed after, without the per-op Python work; the
    # same numbers as eager. `debug` >= 0 prints the captured graph (0 a summary, 1 every kernel).
    # LiBai's top-level `graph.enabled` is read as well. Not with pipeline parallelism, float16,
    # activation checkpointing or ZeRO (refused at start). See docs/graph.md.
    graph=dict(enabled=False, debug=-1),

    # CUDA graphs (engine.cuda.graph): after `warmup_iters` eager iterations, each iteration's
    # forward and backward replay one captured CUDA graph (no per-op Python: a GPU step bound by
    # the host runs at the GPU's speed); the optimizer, clipping and the loss scaler stay eager.
    # One GPU only, input device 'cuda', dropout off, no accumulation, activation checkpointing or
    # ZeRO (refused at start). See docs/cuda.md.
    cuda_graph=dict(enabled=False, warmup_iters=3),

    # NCCL fusion threshold in megabytes / maximum number of fused ops (OneFlow options, not
    # implemented: only these defaults are accepted)
    nccl_fusion_threshold_mb=16,
    nccl_fusion_max_ops=24,

    # ZeRO over the data-parallel ranks (engine.distributed.zero): stage 1 shards the optimizer
    # states, 2 also the gradients (reduce-scattered), 3 also the parameters (all-gathered where used)
    zero_optimization=dict(
        enabled=False,
        stage=1,
    ),

    # Save a checkpoint every `period` iterations and keep at most `max_to_keep` of them;
    # save_model_after_n_epoch (LiBai's): when set, period = n * iterations per epoch
    checkpointer=dict(period=5000, max_to_keep=100, save_model_after_n_epoch=None),

    # Samples per batch on each data-parallel rank for evaluation
    test_micro_batch_size=32,

    # Evaluation during training, every `eval_period` iterations, for at most `eval_iter` batches
    evaluation=dict(
        enabled=True,
        # evaluator computing top-k accuracy
        evaluator=LazyCall("libai.evaluation.ClsEvaluator")(topk=(1, 5)),
        eval_period=5000,
        # LiBai's eval_after_n_epoch: when set, eval_period = n * iterations per epoch
        eval_after_n_epoch=None,
        eval_iter=int(1e5),  # maximum steps for validation/test
        # Metric used to pick the best model checkpoint, and whether higher ("max") is better
        eval_metric="Acc@1",
        eval_mode="max",
    ),

    # Path to a checkpoint to load into the model for training or evaluation
    load_weight="",

    # Log to console every this number of iterations
    log_period=20,

    # LR scheduler; the trainer sets `max_iter` and `warmup_iter` from this train config
    scheduler=LazyCall("libai.scheduler.WarmupCosineLR")(
        warmup_factor=0.001,
        alpha=0.01,
        warmup_method="linear",
    ),

    # Distributed arguments; dp x tp x pp must equal the number of processes
    dist=dict(
        data_parallel_size=1,
        tensor_parallel_size=1,
        # pipeline stages (ranks are stage-major: stage s holds ranks [s*dp*tp, (s+1)*dp*tp));
        # train.num_accumulation_steps is the number of micro-batches (libai/engine/pipeline.py)
        pipeline_parallel_size=1,
        # number of layers split into stages (the recipes set it to the model's layer count;
        # with pipeline_parallel_size 1: every layer on stage 0)
        pipeline_num_layers=None,
        # optional manual stage id of every layer, e.g. [0, 0, 0, 1] for 4 layers on 2 stages;
        # None: layers are split evenly
        custom_pipeline_stage_id=None,
        # micro-batch schedule of the pipeline: "1F1B" (Megatron's: warm-up, one forward one
        # backward, cool-down) or "GPipe" (all forwards, then all backwards); same gradients
        pipeline_schedule="1F1B",
        # device type of the layers' placements ("cpu" or "cuda"); None: train.input_placement_device.
        # Each rank computes on GPU LOCAL_RANK (modulo the GPUs it sees) of its node.
        device_type=None,
    ),

    # Device type of the model and its input tensors: "cpu" or "cuda" (LiBai's default is "cuda";
    # here it is "cpu", so a job never moves to a GPU just because one is visible; "cuda" without
    # a GPU is an error)
    input_placement_device="cpu",

    # OneFlow's RDMA between pipeline stages (LiBai's default is True): a transport choice with no
    # effect on results; the engine's collectives go over MPI or NCCL (which use RDMA where the
    # fabric has it), so True is accepted and noted in the log
    rdma_enabled=False,

    # Seed for all random generators; a fixed seed increases reproducibility
    seed=1234,
)
# fmt: on

train = DictConfig(train, flags={"allow_objects": True})
