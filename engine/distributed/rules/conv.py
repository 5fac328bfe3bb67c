"""SBP rules of engine/ops/conv.py: convolution and pooling work per sample (pooling and resampling
also per channel), so the batch (and channel) axis may be split; resampling mixes only the last
two axes, linearly."""
from ...ops import conv
from .base import sbp_rule
from .patterns import AlongAxes, PerSample, last_two_axes

sbp_rule(conv.Conv2d)(PerSample())
sbp_rule(conv.AvgPool2d)(PerSample(channels=True))  # pooling wrappers always pass 4-D inputs
sbp_rule(conv.MaxPool2d)(PerSample(n_out=2, channels=True))
sbp_rule(conv.Resample2d)(AlongAxes(axes=last_two_axes, linear=True, same_shape=False))
