"""The custom-trainer pattern of LiBai's tutorial (docs/source/tutorials/basics/Training.md,
"Customize a DefaultTrainer"), written as a LiBai user writes it: a DefaultTrainer subclass whose
`_trainer` is an EagerTrainer subclass with its own run_step (LiBai's EagerTrainer body, keeping
the model's output) and whose build_hooks adds a hook. tests/libai_compat runs it unchanged."""
import logging
import time

import oneflow as flow  # noqa: F401  (LiBai scripts import it; here it is the engine shim)

from libai.config import LazyConfig, default_argument_parser
from libai.engine import DefaultTrainer, default_setup, hooks
from libai.engine.trainer import EagerTrainer, HookBase
from libai.utils import distributed as dist

logger = logging.getLogger("libai." + __name__)


class MyEagerTrainer(EagerTrainer):
    def __init__(self, model, data_loader, optimizer, grad_acc_steps=1):
        super().__init__(model, data_loader, optimizer, grad_acc_steps)
        self.previous_output = None

    def run_step(self, get_batch, input_placement_device="cuda"):
        assert self.model.training, "[MyEagerTrainer] model was changed to eval mode!"
        start = time.perf_counter()
        data = next(self._data_loader_iter)
        data = get_batch(data, input_placement_device, getattr(self.data_loader, "mixup_func", None))
        data_time = time.perf_counter() - start

        loss_dict = self.model(**data)
        self.previous_output = loss_dict
        losses = sum(v for k, v in loss_dict.items() if "loss" in k) / self.grad_acc_steps
        losses.backward()
        self.write_metrics(loss_dict, data_time)

        if (self.iter + 1) % self.grad_acc_steps == 0:
            self.optimizer.clip_grad()
            self.optimizer.step()
            self.optimizer.zero_grad()


class InfoHook(HookBase):
    def before_train(self):
        print(f"InfoHook: start training at {self.trainer.iter}", flush=True)

    def after_step(self):
        out = self.trainer._trainer.previous_output
        print(f"InfoHook: iteration {self.trainer.iter} output {sorted(out)}", flush=True)

    def after_train(self):
        print(f"InfoHook: end training at {self.trainer.iter}", flush=True)


class MyTrainer(DefaultTrainer):
    def __init__(self, cfg):
        super().__init__(cfg)
        # NOTE: run_step() is overwritten in your _trainer
        self._trainer = MyEagerTrainer(self.model, self.train_loader, self.optimizer,
                                       cfg.train.num_accumulation_steps)

    def build_hooks(self):
        ret = [
            hooks.IterationTimer(),
            hooks.LRScheduler(),
            hooks.PeriodicCheckpointer(self.checkpointer, self.cfg.train.checkpointer.period),
        ]
        ret.append(InfoHook())
        if dist.is_main_process():
            ret.append(hooks.PeriodicWriter(self.build_writers(), self.cfg.train.log_period))
        return ret


def main(args):
    cfg = LazyConfig.load(args.config_file)
    cfg = LazyConfig.apply_overrides(cfg, args.opts)
    default_setup(cfg, args)
    trainer = MyTrainer(cfg)
    return trainer.train()


if __name__ == "__main__":
    main(default_argument_parser().parse_args())
