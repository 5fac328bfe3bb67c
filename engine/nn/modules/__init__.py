"""The layer classes of engine.nn (re-exported as `engine.nn.Linear`, ...)."""
from .activation import GELU, LogSoftmax, ReLU, Sigmoid, SiLU, Softmax, Tanh
from .attention import MultiheadAttention
from .activation import (CELU, ELU, GLU, SELU, Hardsigmoid, Hardswish, Hardtanh, LeakyReLU, LogSigmoid, Mish, PReLU,
                         ReLU6, Softplus, Softsign, Tanhshrink)
from .batchnorm import BatchNorm1d, BatchNorm2d, InstanceNorm1d, InstanceNorm2d
from .container import ModuleDict, ModuleList, ParameterDict, ParameterList, Sequential
from .conv import Conv1d, Conv2d, ConvTranspose1d, ConvTranspose2d
from .dropout import AlphaDropout, Dropout, Dropout1d, Dropout2d, Dropout3d, FeatureAlphaDropout
from .fold import Fold, Unfold
from .flatten import Flatten, Unflatten
from .linear import Identity, Linear
from .loss import BCEWithLogitsLoss, CrossEntropyLoss, L1Loss, MSELoss, NLLLoss
from .loss import BCELoss, CosineEmbeddingLoss, HuberLoss, KLDivLoss, MarginRankingLoss, SmoothL1Loss
from .normalization import GroupNorm, LayerNorm, RMSNorm
from .padding import *  # noqa: F401,F403
from .padding import __all__ as _padding_all
from .pooling import (AdaptiveAvgPool1d, AdaptiveAvgPool2d, AdaptiveMaxPool1d, AdaptiveMaxPool2d, AvgPool1d, AvgPool2d,
                      MaxPool1d, MaxPool2d)
from .rnn import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNBase, RNNCell, RNNCellBase
from .sparse import Embedding
from .upsampling import PixelShuffle, PixelUnshuffle, Upsample, UpsamplingBilinear2d, UpsamplingNearest2d
from .transformer import (Transformer, TransformerDecoder, TransformerDecoderLayer, TransformerEncoder,
                          TransformerEncoderLayer)

__all__ = ["GELU", "LogSoftmax", "ReLU", "Sigmoid", "SiLU", "Softmax", "Tanh", "ModuleDict", "ModuleList",
           "ParameterDict", "ParameterList", "Sequential", "Conv2d", "Dropout", "Flatten", "Unflatten",
           "Identity", "Linear", "BCEWithLogitsLoss", "CrossEntropyLoss", "L1Loss", "MSELoss", "NLLLoss",
           "LayerNorm", "AdaptiveAvgPool2d", "AvgPool2d", "Embedding",
           "RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell", "GRUCell"]
__all__ += ["Hardtanh", "ReLU6", "LeakyReLU", "Hardswish", "Hardsigmoid", "ELU", "SELU", "CELU", "Softplus", "Mish",
            "GLU", "PReLU", "LogSigmoid", "Softsign", "Tanhshrink"]
__all__ += ["BCELoss", "SmoothL1Loss", "HuberLoss", "KLDivLoss", "MarginRankingLoss", "CosineEmbeddingLoss"]
__all__ += ["Conv1d", "ConvTranspose1d", "ConvTranspose2d", "MaxPool1d", "MaxPool2d", "AvgPool1d", "AdaptiveAvgPool1d",
            "BatchNorm1d", "BatchNorm2d", "InstanceNorm1d", "InstanceNorm2d", "GroupNorm", "RMSNorm"]
__all__ += ["MultiheadAttention", "Transformer", "TransformerEncoder", "TransformerDecoder", "TransformerEncoderLayer",
            "TransformerDecoderLayer"]
__all__ += ["Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout", "Fold", "Unfold",
            "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "Upsample", "UpsamplingNearest2d", "UpsamplingBilinear2d",
            "PixelShuffle", "PixelUnshuffle"] + list(_padding_all)
