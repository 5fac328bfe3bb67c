"""Functional forms of the ops (`engine.nn.functional`, imported as F).

The ops live in engine/ops; this namespace re-exports them, as torch.nn.functional does for
torch's ops (`F.relu`, `F.softmax`, `F.cross_entropy`, `F.conv2d`, ...).
"""
from ..ops.unary import *  # noqa: F401,F403
from ..ops.comparison import *  # noqa: F401,F403
from ..ops.logical import *  # noqa: F401,F403
from ..ops.elementwise import lerp, pow  # noqa: F401
from ..ops.reduction import *  # noqa: F401,F403
from ..ops.shape import *  # noqa: F401,F403
from ..ops.indexing import *  # noqa: F401,F403
from ..ops.linalg import *  # noqa: F401,F403
from ..ops.softmax import *  # noqa: F401,F403
from ..ops.attention import *  # noqa: F401,F403
from ..ops.normalization import *  # noqa: F401,F403
from ..ops.dropout import *  # noqa: F401,F403
from ..ops.loss import *  # noqa: F401,F403
from ..ops.conv import *  # noqa: F401,F403
from ..ops.random_ops import *  # noqa: F401,F403
from ..ops.activation import *  # noqa: F401,F403
from ..ops.vision import *  # noqa: F401,F403
