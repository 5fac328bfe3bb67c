"""Stochastic weight averaging (torch.optim.swa_utils): `AveragedModel`, `SWALR`, `update_bn` and
the averaging functions `get_swa_avg_fn` / `get_ema_avg_fn` (one tensor at a time) and
`get_swa_multi_avg_fn` / `get_ema_multi_avg_fn` (lists, in place).

As torch 2.13: the first `update_parameters` copies the model; later ones average with the SWA
mean (a_{n+1} = a_n + (p - a_n) / (n + 1)) unless given `avg_fn` / `multi_avg_fn`; buffers are
averaged with `use_buffers=True`, copied otherwise. The in-place averages use torch's two-branch
lerp (`adam._lerp_into`) on the backend arrays, so they round as torch's `_foreach_lerp_` does.
"""
import itertools
import math
from copy import deepcopy

from ..autograd.grad_mode import no_grad
from ..backend import dtypes, xp_of
from ..nn.module import Module
from ..nn.modules.batchnorm import _BatchNorm
from ..ops.creation import tensor
from .adam import _lerp_into
from .lr_scheduler import LRScheduler, _per_group

__all__ = ["AveragedModel", "update_bn", "SWALR", "get_ema_multi_avg_fn", "get_swa_multi_avg_fn",
           "get_ema_avg_fn", "get_swa_avg_fn"]


def _lerp_(averaged, current, weight):
    """averaged[i] = lerp(averaged[i], current[i], weight), in place on the arrays."""
    for a, c in zip(averaged, current, strict=True):
        xp = xp_of(a._data)
        _lerp_into(xp, a._data, c._data, xp.subtract(c._data, a._data), weight)
        a._bump_version()


def _check_decay(decay):
    if decay < 0.0 or decay > 1.0:
        raise ValueError(f"Invalid decay value {decay} provided. Please provide a value in [0,1] range.")


def get_ema_multi_avg_fn(decay=0.999):
    """In-place exponential moving average of lists of tensors: ema = lerp(ema, p, 1 - decay)."""
    _check_decay(decay)

    def ema_update(ema_param_list, current_param_list, _):
        with no_grad():
            if ema_param_list[0].is_floating_point():
                _lerp_(ema_param_list, current_param_list, 1 - decay)
            else:
                for p_ema, p_model in zip(ema_param_list, current_param_list, strict=True):
                    p_ema.copy_(p_ema * decay + p_model * (1 - decay))

    return ema_update


def get_swa_multi_avg_fn():
    """In-place running mean of lists of tensors: a = lerp(a, p, 1 / (n + 1))."""

    def swa_update(averaged_param_list, current_param_list, num_averaged):
        with no_grad():
            if averaged_param_list[0].is_floating_point():
                _lerp_(averaged_param_list, current_param_list, float(1 / (num_averaged + 1)))
            else:
                for a, p in zip(averaged_param_list, current_param_list, strict=True):
                    a.add_((p - a) / (num_averaged + 1))

    return swa_update


def get_ema_avg_fn(decay=0.999):
    """decay * ema + (1 - decay) * p, for one tensor."""
    _check_decay(decay)

    def ema_update(ema_param, current_param, num_averaged):
        with no_grad():
            return decay * ema_param + (1 - decay) * current_param

    return ema_update


def get_swa_avg_fn():
    """a + (p - a) / (n + 1), for one tensor."""

    def swa_update(averaged_param, current_param, num_averaged):
        with no_grad():
            return averaged_param + (current_param - averaged_param) / (num_averaged + 1)

    return swa_update


class AveragedModel(Module):
    """A deep copy of `model` whose parameters (and, with `use_buffers`, buffers) are the average
    of the models given to `update_parameters`; `n_averaged` (an int64 buffer) counts them."""

    def __init__(self, model, device=None, avg_fn=None, multi_avg_fn=None, use_buffers=False):
        super().__init__()
        if avg_fn is not None and multi_avg_fn is not None:
            raise AssertionError("Only one of avg_fn and multi_avg_fn should be provided")
        self.module = deepcopy(model)
        if device is not None:
            self.module = self.module.to(device)
        self.register_buffer("n_averaged", tensor(0, dtype=dtypes.int64, device=device))
        self.avg_fn = avg_fn
        self.multi_avg_fn = multi_avg_fn
        self.use_buffers = use_buffers

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def update_parameters(self, model):
        """Fold `model`'s current parameters (and buffers) into the average."""
        if self.use_buffers:
            self_param = itertools.chain(self.module.parameters(), self.module.buffers())
            model_param = itertools.chain(model.parameters(), model.buffers())
        else:
            self_param, model_param = self.parameters(), model.parameters()
        averaged, current = [], []
        copy_param = int(self.n_averaged.item()) == 0
        with no_grad():
            for p_averaged, p_model in zip(self_param, model_param):
                p_model_ = p_model.detach().to(p_averaged.device)
                averaged.append(p_averaged.detach())
                current.append(p_model_)
                if copy_param:
                    p_averaged.detach().copy_(p_model_)
            if not copy_param:
                self._average(averaged, current)
            if not self.use_buffers:
                for b_swa, b_model in zip(self.module.buffers(), model.buffers(), strict=True):
                    b_swa.detach().copy_(b_model.detach().to(b_swa.device))
            self.n_averaged += 1

    def _average(self, averaged, current):
        if self.avg_fn is not None and self.multi_avg_fn is None:
            for p_averaged, p_model in zip(averaged, current, strict=True):
                n_averaged = self.n_averaged.to(p_averaged.device)
                p_averaged.copy_(self.avg_fn(p_averaged, p_model, n_averaged))
            return
        groups = {}  # torch groups the tensors by (device, dtype) for its multi-tensor functions
        for a, c in zip(averaged, current, strict=True):
            groups.setdefault((str(a.device), a.dtype), ([], []))
            groups[(str(a.device), a.dtype)][0].append(a)
            groups[(str(a.device), a.dtype)][1].append(c)
        for (device, _), (mine, theirs) in groups.items():
            n_averaged = self.n_averaged.to(mine[0].device)
            if self.multi_avg_fn is not None:
                self.multi_avg_fn(mine, theirs, n_averaged)
            elif mine[0].device.type == "cuda":  # torch's foreach devices: the in-place lerp
                get_swa_multi_avg_fn()(mine, theirs, n_averaged)
            else:
                avg_fn = get_swa_avg_fn()
                for p_averaged, p_model in zip(mine, theirs, strict=True):
                    p_averaged.copy_(avg_fn(p_averaged, p_model, n_averaged))


def update_bn(loader, model, device=None):
    """Recompute the running statistics of `model`'s batch-norm layers in one pass over `loader`
    (a cumulative average: momentum None while it runs), in train mode; the mode is restored."""
    with no_grad():
        momenta = {}
        for module in model.modules():
            if isinstance(module, _BatchNorm):
                module.reset_running_stats()
                momenta[module] = module.momentum
        if not momenta:
            return
        was_training = model.training
        model.train()
        for module in momenta:
            module.momentum = None
        for input in loader:
            if isinstance(input, (list, tuple)):
                input = input[0]
            if device is not None:
                input = input.to(device)
            model(input)
        for bn_module in momenta:
            bn_module.momentum = momenta[bn_module]
        model.train(was_training)


class SWALR(LRScheduler):
    """Anneals each group's lr to `swa_lr` over `anneal_epochs` steps ('cos' or 'linear'), then
    holds it."""

    def __init__(self, optimizer, swa_lr, anneal_epochs=10, anneal_strategy="cos", last_epoch=-1):
        swa_lrs = _per_group(optimizer, "swa_lr", swa_lr)
        for lr, group in zip(swa_lrs, optimizer.param_groups, strict=True):
            group["swa_lr"] = lr
        if anneal_strategy not in ["cos", "linear"]:
            raise ValueError(f"anneal_strategy must be one of 'cos' or 'linear', instead got {anneal_strategy}")
        self._set_anneal_func(anneal_strategy)
        if not isinstance(anneal_epochs, int) or anneal_epochs < 0:
            raise ValueError(f"anneal_epochs must be equal or greater than 0, got {anneal_epochs}")
        self.anneal_epochs = anneal_epochs
        super().__init__(optimizer, last_epoch)

    @staticmethod
    def _linear_anneal(t):
        return t

    @staticmethod
    def _cosine_anneal(t):
        return (1 - math.cos(math.pi * t)) / 2

    @staticmethod
    def _get_initial_lr(lr, swa_lr, alpha):
        if alpha == 1:
            return swa_lr
        return (lr - alpha * swa_lr) / (1 - alpha)

    def get_lr(self):
        step = self._step_count - 1
        if self.anneal_epochs == 0:
            step = max(1, step)
        prev_t = max(0, min(1, (step - 1) / max(1, self.anneal_epochs)))
        prev_alpha = self.anneal_func(prev_t)
        prev_lrs = [self._get_initial_lr(group["lr"], group["swa_lr"], prev_alpha)
                    for group in self.optimizer.param_groups]
        t = max(0, min(1, step / max(1, self.anneal_epochs)))
        alpha = self.anneal_func(t)
        return [group["swa_lr"] * alpha + lr * (1 - alpha)
                for group, lr in zip(self.optimizer.param_groups, prev_lrs, strict=True)]

    def _set_anneal_func(self, anneal_strategy):
        self._anneal_strategy = anneal_strategy
        self.anneal_func = self._cosine_anneal if anneal_strategy == "cos" else self._linear_anneal

    def state_dict(self):
        return {key: value for key, value in self.__dict__.items() if key not in ("optimizer", "anneal_func")}

    def load_state_dict(self, state_dict):
        self.__dict__.update(state_dict)
        self._set_anneal_func(self._anneal_strategy)
