"""Optimizers (`engine.optim.SGD`, `Adam`, `AdamW`, `LAMB`, `RMSprop`, `Adagrad`, `Adadelta`,
`Adamax`, `NAdam`, `RAdam`, `LBFGS`), `engine.optim.lr_scheduler` and `engine.optim.swa_utils`.

Steps update each parameter's backend array in place (see optimizer.py for why); the math and the
state-dict layout follow torch.optim.
"""
from .optimizer import Optimizer
from .sgd import SGD
from .adam import Adam, AdamW
from .lamb import LAMB
from .rmsprop import RMSprop
from .adagrad import Adagrad
from .adadelta import Adadelta
from .adamax import Adamax
from .nadam import NAdam
from .radam import RAdam
from .lbfgs import LBFGS
from . import lr_scheduler, swa_utils

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "LAMB", "RMSprop", "Adagrad", "Adadelta", "Adamax", "NAdam",
           "RAdam", "LBFGS", "lr_scheduler", "swa_utils"]
