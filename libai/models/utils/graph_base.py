"""LiBai's GraphBase: the nn.Graph (engine.nn.Graph) that runs a model's training or evaluation
step in graph mode (`train.graph.enabled=True`, or LiBai's top-level `graph.enabled=True`)."""
import contextlib

import engine as flow

__all__ = ["GraphBase"]


class GraphBase(flow.nn.Graph):
    """LiBai's signature. Training (`is_train=True`): build runs the model on the batch's keyword
    inputs, backward of its loss (LiBai's rule: "total_loss", else the sum of the "...loss..."
    entries) and returns the loss dict. With an `optimizer` the graph also steps it (and
    `lr_scheduler`), splitting each call's batch into `grad_acc_steps` micro-batches (LiBai's
    GraphTrainer use); without one (this project's GraphTrainer, which runs the eager update:
    gradient sync, clipping, the optimizer step) each call is one of `grad_acc_steps`
    micro-batches and its loss is divided by that number, as EagerTrainer divides it.
    Evaluation (`is_train=False`): the model's outputs, without gradients.

    float16 (`fp16=True`, LiBai's flag): the step runs under a float16 autocast (`autocast`, or
    `graph.config.enable_amp` when none is given) with dynamic loss scaling by `grad_scaler`
    (default: LiBai's GradScaler(init_scale=2**30, growth_interval=2000)). With an optimizer the
    graph unscales, skips inf/nan steps and updates the scale itself (`set_grad_scaler`);
    without one the backward is scaled and `self.grad_scaler` is left to the caller's update.

    `activation_checkpoint=True` (LiBai's flag) turns on the recomputation of the model's
    Transformer/Swin layers; the graph records the random-state swaps around it. A model class
    with LiBai's `set_pipeline_stage_id(model)` has it called, as LiBai's GraphBase does; its
    `set_stage` calls must agree with where the layers are placed (nn.graph.GraphModule.set_stage).

    Not implemented (refused): `zero_optim=True`, ZeRO with the graph stepping its own optimizer
    (the trainer's ZeRO, train.zero_optimization, works: its eager update does the sharded
    step), and LiBai's auto-parallel."""

    def __init__(self, model, optimizer=None, lr_scheduler=None, fp16=False, activation_checkpoint=False,
                 grad_acc_steps=1, zero_optim=False, zero_stage=0, is_train=True, auto_parallel_conf=None,
                 autocast=None, grad_scaler=None):
        super().__init__()
        for flag, what, instead in (
                (zero_optim, "zero_optim=True (ZeRO)", "use the trainer's train.zero_optimization (its eager "
                 "update does the sharded step), or train eagerly (graph.enabled=False)"),
                (auto_parallel_conf is not None and auto_parallel_conf.get("enabled", False),
                 "auto_parallel.enabled=True", "train eagerly (graph.enabled=False)")):
            if flag:
                raise NotImplementedError(f"GraphBase: {what} is not implemented in graph mode; {instead}")
        if grad_scaler is not None and not fp16:
            raise ValueError("GraphBase: a grad_scaler is for float16 training; pass fp16=True with it")
        if activation_checkpoint and is_train:
            own = getattr(type(model), "set_activation_checkpoint", None)
            if own is not None:  # a LiBai model's own rule (it may use nn.graph.GraphModule)
                own(model)
            else:
                from libai.layers.utils import set_activation_checkpointing

                set_activation_checkpointing(model)  # its Transformer/Swin layers recompute in backward
        own_stages = getattr(type(model), "set_pipeline_stage_id", None)
        if own_stages is not None:
            # a LiBai model's rule: `module.to(nn.graph.GraphModule).set_stage(stage, placement)` per
            # block, checked against where its layers are placed (each rank captures its own stage)
            own_stages(model)
        self.model = model
        self.is_train = is_train
        self.autocast = autocast or contextlib.nullcontext
        if fp16 and autocast is None:
            self.config.enable_amp(True, dtype=flow.float16)
        self.grad_acc_steps = int(grad_acc_steps or 1)
        self.loss_divisor = self.grad_acc_steps
        self.grad_scaler = None
        if is_train and fp16:
            self.grad_scaler = grad_scaler or flow.amp.GradScaler(init_scale=2.0 ** 30, growth_factor=2.0,
                                                                  backoff_factor=0.5, growth_interval=2000)
        if is_train and optimizer is not None:
            self.add_optimizer(optimizer, lr_sch=lr_scheduler)
            if self.grad_scaler is not None:
                self.set_grad_scaler(self.grad_scaler)  # the graph scales, unscales, skips and updates
            if self.grad_acc_steps > 1:
                self.config.set_gradient_accumulation_steps(self.grad_acc_steps)
                self.loss_divisor = 1  # the graph scales each micro-batch's backward by 1/n

    def build(self, **kwargs):
        if not self.is_train:
            with flow.no_grad(), self.autocast():
                return self.model(**kwargs)
        from libai.engine.trainer import micro_batch_step

        # the caller's update unscales when the graph does not step the optimizer itself
        scaler = self.grad_scaler if not self.optimizers else None
        loss_dict = micro_batch_step(self.model, kwargs, self.loss_divisor, self.autocast, scaler)
        return {k: v.detach() for k, v in loss_dict.items()}
