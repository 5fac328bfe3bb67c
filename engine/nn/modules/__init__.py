"""The layer classes of engine.nn (re-exported as `engine.nn.Linear`, ...)."""
from .activation import GELU, LogSoftmax, ReLU, Sigmoid, SiLU, Softmax, Tanh
from .container import ModuleDict, ModuleList, ParameterDict, ParameterList, Sequential
from .conv import Conv2d
from .dropout import Dropout
from .flatten import Flatten, Unflatten
from .linear import Identity, Linear
from .loss import BCEWithLogitsLoss, CrossEntropyLoss, L1Loss, MSELoss, NLLLoss
from .normalization import LayerNorm
from .pooling import AdaptiveAvgPool2d, AvgPool2d
from .sparse import Embedding

__all__ = ["GELU", "LogSoftmax", "ReLU", "Sigmoid", "SiLU", "Softmax", "Tanh", "ModuleDict", "ModuleList",
           "ParameterDict", "ParameterList", "Sequential", "Conv2d", "Dropout", "Flatten", "Unflatten",
           "Identity", "Linear", "BCEWithLogitsLoss", "CrossEntropyLoss", "L1Loss", "MSELoss", "NLLLoss",
           "LayerNorm", "AdaptiveAvgPool2d", "AvgPool2d", "Embedding"]
