"""Parameter initialisation (`engine.nn.init`), with torch.nn.init's formulas and distributions.

Every function fills a tensor in place without recording anything in the autograd graph and
returns it. Random values come from the engine's generator for the tensor's device
(`engine.manual_seed` makes them reproducible); they are drawn in float32 (float64 for float64
tensors) and written into the tensor's storage with one cast, so bfloat16/float16 parameters get
correctly rounded values.
"""
import math

import numpy as np

from ..backend import dtypes, xp_of
from ..backend.random import default_generator

__all__ = ["calculate_gain", "uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_",
           "eye_", "dirac_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_",
           "orthogonal_"]


# ------------------------------------------------------------------ helpers
def _work_dtype(t):
    if not t.is_floating_point():
        raise TypeError(f"init: expected a floating point tensor, got {t.dtype}")
    return np.float64 if t.dtype is dtypes.float64 else np.float32


def _rng(t, generator):
    return (generator or default_generator).rng(xp_of(t._data))


def _write(t, array):
    """Copy `array` into t's storage (cast to t's dtype) and bump its version."""
    xp_of(t._data).copyto(t._data, array, casting="unsafe")
    t._bump_version()
    return t


def _uniform(t, low, high, generator):
    w = _work_dtype(t)
    u = _rng(t, generator).random(tuple(t.shape), dtype=w)
    if high - low != 1.0:
        u *= w(high - low)
    if low != 0.0:
        u += w(low)
    return u


def _normal(t, mean, std, generator):
    w = _work_dtype(t)
    z = _rng(t, generator).standard_normal(tuple(t.shape), dtype=w)
    if std != 1.0:
        z *= w(std)
    if mean != 0.0:
        z += w(mean)
    return z


def _calculate_fan_in_and_fan_out(tensor):
    dimensions = tensor.dim()
    if dimensions < 2:
        raise ValueError("Fan in and fan out can not be computed for tensor with fewer than 2 dimensions")
    num_input_fmaps = tensor.shape[1]
    num_output_fmaps = tensor.shape[0]
    receptive_field_size = 1
    for s in tensor.shape[2:]:
        receptive_field_size *= s
    return num_input_fmaps * receptive_field_size, num_output_fmaps * receptive_field_size


def _calculate_correct_fan(tensor, mode):
    mode = mode.lower()
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"Mode {mode} not supported, please use one of fan_in, fan_out")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


def calculate_gain(nonlinearity, param=None):
    """The recommended gain for a nonlinearity (torch.nn.init.calculate_gain's table)."""
    linear_fns = ["linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                  "conv_transpose3d"]
    if nonlinearity in linear_fns or nonlinearity == "sigmoid":
        return 1
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            negative_slope = 0.01
        elif not isinstance(param, bool) and isinstance(param, (int, float)):
            negative_slope = param
        else:
            raise ValueError(f"negative_slope {param} not a valid number")
        return math.sqrt(2.0 / (1 + negative_slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"Unsupported nonlinearity {nonlinearity}")


# ------------------------------------------------------------------ fills
def uniform_(tensor, a=0.0, b=1.0, generator=None):
    """Fill with U(a, b)."""
    return _write(tensor, _uniform(tensor, float(a), float(b), generator))


def normal_(tensor, mean=0.0, std=1.0, generator=None):
    """Fill with N(mean, std^2)."""
    return _write(tensor, _normal(tensor, float(mean), float(std), generator))


def _ndtri(p):
    """Inverse of the standard normal CDF (Acklam's rational approximation, |rel err| < 1.2e-9)."""
    xp = xp_of(p)
    a = (-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
         1.383577518672690e+02, -3.066479806614716e+01, 2.506628277459239e+00)
    b = (-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
         6.680131188771972e+01, -1.328068155288572e+01)
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
         -2.549732539343734e+00, 4.374664141464968e+00, 2.938163982698783e+00)
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00, 3.754408661907416e+00)
    p = xp.clip(p, 1e-300, 1.0 - 1e-16)
    out = xp.empty_like(p)
    lo = p < 0.02425
    hi = p > 1 - 0.02425
    mid = ~(lo | hi)
    q = p[mid] - 0.5
    r = q * q
    out[mid] = ((((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
                (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1))
    for mask, sign, tail in ((lo, 1.0, p[lo]), (hi, -1.0, 1.0 - p[hi])):
        q = xp.sqrt(-2.0 * xp.log(tail))
        out[mask] = sign * ((((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
                            ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1))
    return out


def trunc_normal_(tensor, mean=0.0, std=1.0, a=-2.0, b=2.0, generator=None):
    """Fill with N(mean, std^2) truncated to [a, b] (a and b are absolute bounds, as in torch).

    Inverse-CDF sampling like torch: draw u uniformly between the CDF values of the bounds and
    map it back through the inverse normal CDF, so every value lies in [a, b] and no draw is
    rejected however far the bounds are in the tails."""
    if not a < b:
        raise ValueError(f"trunc_normal_: need a < b, got a={a}, b={b}")
    if std <= 0:
        raise ValueError(f"trunc_normal_: std must be positive, got {std}")

    def norm_cdf(x):
        return (1.0 + math.erf(x / math.sqrt(2.0))) / 2.0

    za, zb = (a - mean) / std, (b - mean) / std
    flip = za > 0  # sample a right-tail interval as its mirror image: CDF values near 1 lose precision
    if flip:
        za, zb = -zb, -za
    lo, hi = norm_cdf(za), norm_cdf(zb)
    xp = xp_of(tensor._data)
    u = _rng(tensor, generator).random(tuple(tensor.shape), dtype=np.float64)
    z = _ndtri(lo + (hi - lo) * u)
    x = (-std if flip else std) * z + mean
    xp.clip(x, a, b, out=x)
    return _write(tensor, x.astype(_work_dtype(tensor), copy=False))


def constant_(tensor, val):
    tensor._data.fill(val)
    tensor._bump_version()
    return tensor


def ones_(tensor):
    return constant_(tensor, 1)


def zeros_(tensor):
    return constant_(tensor, 0)


def eye_(tensor):
    """Fill a 2-D tensor with the identity matrix."""
    if tensor.dim() != 2:
        raise ValueError("Only tensors with 2 dimensions are supported")
    xp = xp_of(tensor._data)
    return _write(tensor, xp.eye(*tensor.shape, dtype=tensor._data.dtype))


def dirac_(tensor, groups=1):
    """Fill a {3,4,5}-D conv weight with the Dirac delta (identity convolution per group)."""
    dims = tensor.dim()
    if dims not in (3, 4, 5):
        raise ValueError("Only tensors with 3, 4, or 5 dimensions are supported")
    sizes = tensor.shape
    if sizes[0] % groups != 0:
        raise ValueError("dim 0 must be divisible by groups")
    out_chans_per_grp = sizes[0] // groups
    min_dim = min(out_chans_per_grp, sizes[1])
    w = np.zeros(tuple(sizes), dtype=np.float64)
    centre = tuple(s // 2 for s in sizes[2:])
    for g in range(groups):
        for d in range(min_dim):
            w[(g * out_chans_per_grp + d, d) + centre] = 1
    return _write(tensor, xp_of(tensor._data).asarray(w))


def _xavier_std(tensor, gain):
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return gain * math.sqrt(2.0 / float(fan_in + fan_out))


def xavier_uniform_(tensor, gain=1.0, generator=None):
    """U(-r, r) with r = gain * sqrt(6 / (fan_in + fan_out)) (Glorot & Bengio, 2010)."""
    bound = math.sqrt(3.0) * _xavier_std(tensor, gain)
    return uniform_(tensor, -bound, bound, generator)


def xavier_normal_(tensor, gain=1.0, generator=None):
    """N(0, std^2) with std = gain * sqrt(2 / (fan_in + fan_out))."""
    return normal_(tensor, 0.0, _xavier_std(tensor, gain), generator)


def _kaiming_std(tensor, a, mode, nonlinearity):
    fan = _calculate_correct_fan(tensor, mode)
    gain = calculate_gain(nonlinearity, a)
    return gain / math.sqrt(fan)


def kaiming_uniform_(tensor, a=0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    """U(-bound, bound) with bound = gain * sqrt(3 / fan) (He et al., 2015)."""
    if 0 in tuple(tensor.shape):
        return tensor
    bound = math.sqrt(3.0) * _kaiming_std(tensor, a, mode, nonlinearity)
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(tensor, a=0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    """N(0, std^2) with std = gain / sqrt(fan)."""
    if 0 in tuple(tensor.shape):
        return tensor
    return normal_(tensor, 0.0, _kaiming_std(tensor, a, mode, nonlinearity), generator)


def _reset_layer_(weight, bias, zero_fan_in_bound):
    """torch's default init of Linear and Conv layers: weight ~ kaiming_uniform(a=sqrt(5)), bias ~
    U(-1/sqrt(fan_in), 1/sqrt(fan_in)). With fan_in == 0 the bias is drawn from
    U(-zero_fan_in_bound, zero_fan_in_bound), or left as it is when that is None."""
    kaiming_uniform_(weight, a=math.sqrt(5))
    if bias is None:
        return
    fan_in, _ = _calculate_fan_in_and_fan_out(weight)
    if fan_in != 0:
        bound = 1 / math.sqrt(fan_in)
    elif zero_fan_in_bound is None:
        return
    else:
        bound = zero_fan_in_bound
    uniform_(bias, -bound, bound)


def orthogonal_(tensor, gain=1, generator=None):
    """A (semi-)orthogonal matrix from the QR decomposition of a normal matrix (Saxe et al., 2013)."""
    if tensor.dim() < 2:
        raise ValueError("Only tensors with 2 or more dimensions are supported")
    if tensor.numel() == 0:
        return tensor
    rows = tensor.shape[0]
    cols = tensor.numel() // rows
    flat = (generator or default_generator).rng(np).standard_normal((rows, cols))
    if rows < cols:
        flat = flat.T
    q, r = np.linalg.qr(flat)
    d = np.sign(np.diag(r))
    d[d == 0] = 1
    q *= d
    if rows < cols:
        q = q.T
    q = (q * gain).reshape(tuple(tensor.shape))
    return _write(tensor, xp_of(tensor._data).asarray(q))


# torch's deprecated non-underscore aliases are not provided: the underscore forms are the API.
