"""Optimizers (`engine.optim.SGD`, `Adam`, `AdamW`, `LAMB`) and `engine.optim.lr_scheduler`.

Steps update each parameter's backend array in place (see optimizer.py for why); the math and the
state-dict layout follow torch.optim.
"""
from .optimizer import Optimizer
from .sgd import SGD
from .adam import Adam, AdamW
from .lamb import LAMB
from . import lr_scheduler

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "LAMB", "lr_scheduler"]
