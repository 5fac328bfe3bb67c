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

    Not implemented in graph mode (refused): float16 (`fp16=True`: loss scaling reads the scale
    on the host), activation checkpointing (its recomputation restores RNG states on the host),
    ZeRO, LiBai's auto-parallel."""

    def __init__(self, model, optimizer=None, lr_scheduler=None, fp16=False, activation_checkpoint=False,
                 grad_acc_steps=1, zero_optim=False, zero_stage=0, is_train=True, auto_parallel_conf=None,
                 autocast=None):
        super().__init__()
        for flag, what in ((fp16, "fp16=True (float16 loss scaling)"),
                           (activation_checkpoint, "activation_checkpoint=True"),
                           (zero_optim, "zero_optim=True (ZeRO)"),
                           (auto_parallel_conf is not None and auto_parallel_conf.get("enabled", False),
                            "auto_parallel.enabled=True")):
            if flag:
                raise NotImplementedError(f"GraphBase: {what} is not implemented in graph mode; train eagerly "
                                          "(graph.enabled=False) to use it")
        self.model = model
        self.is_train = is_train
        self.autocast = autocast or contextlib.nullcontext
        self.grad_acc_steps = int(grad_acc_steps or 1)
        self.loss_divisor = self.grad_acc_steps
        if is_train and optimizer is not None:
            self.add_optimizer(optimizer, lr_sch=lr_scheduler)
            if self.grad_acc_steps > 1:
                self.config.set_gradient_accumulation_steps(self.grad_acc_steps)
                self.loss_divisor = 1  # the graph scales each micro-batch's backward by 1/n

    def build(self, **kwargs):
        if not self.is_train:
            with flow.no_grad(), self.autocast():
                return self.model(**kwargs)
        from libai.engine.trainer import micro_batch_step

        loss_dict = micro_batch_step(self.model, kwargs, self.loss_divisor, self.autocast, None)
        return {k: v.detach() for k, v in loss_dict.items()}
