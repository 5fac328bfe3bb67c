"""Recurrent layers: `RNN` (tanh/relu), `LSTM` (with optional projection), `GRU` and their one-step
`RNNCell`, `LSTMCell`, `GRUCell`, with torch.nn's arguments, parameter names/order, init and checks.

Everything is composed of engine ops (linear, sigmoid, tanh, split, stack, ...), so autograd gives
the backward. The input-to-hidden product does not depend on the recurrence: it is one GEMM over all
time steps per layer and direction (with both biases folded in where the gate math allows), and
only the hidden-to-hidden product runs step by step. A sequence layer and its cell share the same
per-step functions (`_STEPS`), so the two cannot drift apart.

A PackedSequence input (engine.nn.utils.rnn) runs on its packed rows: the input projection is
one GEMM over all of them, and step t updates only the batch_sizes[t] sequences still running
(the state shrinks as sequences end in the forward direction, and grows as they start in the
reverse one), so each sequence's final state is the state after its own last step.

Gate layouts are torch's (cuDNN's): LSTM rows are [i, f, g, o], GRU rows [r, z, n].
"""
import math
import numbers
import warnings
from collections import namedtuple

from ...amp import is_autocast_enabled
from ...ops.creation import empty, zeros
from ...ops.dropout import dropout as _dropout
from ...ops.indexing import index_select
from ...ops.linalg import linear
from ...ops.shape import cat, chunk, split, stack, transpose, unbind
from ...ops.unary import relu, sigmoid, tanh
from ...tensor import Parameter, Tensor
from .. import init
from ..module import Module
from ..utils.rnn import PackedSequence

__all__ = ["RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell", "GRUCell"]

# The weights of one layer and direction; absent ones (no bias, no projection) are None.
_Weights = namedtuple("_Weights", ["w_ih", "w_hh", "b_ih", "b_hh", "w_hr"])


# ------------------------------------------------------------------ one time step
# Each step takes the input projection `xg` of this step (x W_ih^T + b_ih, and + b_hh where the
# step says so), the state (h, c) and the weights; it returns the new (h, c), c None if stateless.
def _tanh_step(xg, h, c, w):
    return tanh(xg + linear(h, w.w_hh)), None


def _relu_step(xg, h, c, w):
    return relu(xg + linear(h, w.w_hh)), None


def _lstm_step(xg, h, c, w):
    i, f, g, o = chunk(xg + linear(h, w.w_hh), 4, 1)
    c = sigmoid(f) * c + sigmoid(i) * tanh(g)
    h = sigmoid(o) * tanh(c)
    if w.w_hr is not None:
        h = linear(h, w.w_hr)
    return h, c


def _gru_step(xg, h, c, w):
    # b_hn sits inside r * (W_hn h + b_hn), so b_hh is not folded into xg for the GRU.
    hidden = w.w_hh.shape[1]
    hg = linear(h, w.w_hh, w.b_hh)
    x_rz, x_n = split(xg, [2 * hidden, hidden], 1)
    h_rz, h_n = split(hg, [2 * hidden, hidden], 1)
    r, z = chunk(sigmoid(x_rz + h_rz), 2, 1)
    n = tanh(x_n + r * h_n)
    return n + z * (h - n), None  # = (1 - z) * n + z * h


# mode -> (step, gate rows per hidden unit, whether b_hh is folded into the input projection)
_STEPS = {
    "RNN_TANH": (_tanh_step, 1, True),
    "RNN_RELU": (_relu_step, 1, True),
    "LSTM": (_lstm_step, 4, True),
    "GRU": (_gru_step, 3, False),
}


def _input_projection(x, w, fold_b_hh):
    """x W_ih^T + b_ih (+ b_hh) for every leading index of x in one GEMM."""
    bias = w.b_ih
    if fold_b_hh and bias is not None:
        bias = bias + w.b_hh
    return linear(x, w.w_ih, bias)


def _is_packed_sequence(x):
    return not isinstance(x, Tensor) and hasattr(x, "batch_sizes") and hasattr(x, "data")


def _as_packed(input, cls_name):
    """An engine PackedSequence (or a namedtuple-like one holding engine tensors) for a packed
    input, None for anything else; a packed sequence of another library is refused."""
    if isinstance(input, PackedSequence):
        return input
    if not _is_packed_sequence(input):
        return None
    if not isinstance(input.data, Tensor):
        raise TypeError(f"{cls_name}: the PackedSequence holds {type(input.data).__name__} data, not engine "
                        "Tensors; pack it with engine.nn.utils.rnn")
    return PackedSequence(input.data, input.batch_sizes, getattr(input, "sorted_indices", None),
                          getattr(input, "unsorted_indices", None))


def _check_tensor_input(input, cls_name):
    if _is_packed_sequence(input):
        raise NotImplementedError(f"{cls_name}: PackedSequence input is not supported by the cells (one time "
                                  "step); pass a Tensor")
    if not isinstance(input, Tensor):
        raise TypeError(f"{cls_name}: input must be a Tensor, got {type(input).__name__}")


def _uniform_init(module):
    """torch's RNN init: every parameter ~ U(-1/sqrt(hidden_size), 1/sqrt(hidden_size))."""
    stdv = 1.0 / math.sqrt(module.hidden_size) if module.hidden_size > 0 else 0
    for weight in module.parameters():
        init.uniform_(weight, -stdv, stdv)


# ------------------------------------------------------------------ sequence layers
class RNNBase(Module):
    """The multi-layer, optionally bidirectional recurrence shared by RNN, LSTM and GRU.

    Parameters are registered per layer and direction in torch's order (weight_ih_l{k},
    weight_hh_l{k}, bias_ih_l{k}, bias_hh_l{k}, weight_hr_l{k}, then the `_reverse` ones), so
    state dicts are interchangeable with torch's."""

    def __init__(self, mode, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, proj_size=0, device=None, dtype=None):
        super().__init__()
        if not isinstance(dropout, numbers.Number) or not 0 <= dropout <= 1 or isinstance(dropout, bool):
            raise ValueError("dropout should be a number in range [0, 1] representing the probability of an "
                             "element being zeroed")
        if dropout > 0 and num_layers == 1:
            warnings.warn("dropout option adds dropout after all but last recurrent layer, so non-zero dropout "
                          f"expects num_layers greater than 1, but got dropout={dropout} and "
                          f"num_layers={num_layers}", stacklevel=3)
        if not isinstance(bias, bool):
            raise TypeError(f"bias should be of type bool, got: {type(bias).__name__}")
        if not isinstance(batch_first, bool):
            raise TypeError(f"batch_first should be of type bool, got: {type(batch_first).__name__}")
        if not isinstance(input_size, int):
            raise TypeError(f"input_size should be of type int, got: {type(input_size).__name__}")
        if input_size <= 0:
            raise ValueError("input_size must be greater than zero")
        if not isinstance(hidden_size, int):
            raise TypeError(f"hidden_size should be of type int, got: {type(hidden_size).__name__}")
        if hidden_size <= 0:
            raise ValueError("hidden_size must be greater than zero")
        if num_layers <= 0:
            raise ValueError("num_layers must be greater than zero")
        if proj_size < 0:
            raise ValueError("proj_size should be a positive integer or zero to disable projections")
        if proj_size >= hidden_size:
            raise ValueError("proj_size has to be smaller than hidden_size")
        if mode not in _STEPS:
            raise ValueError("Unrecognized RNN mode: " + mode)

        self.mode = mode
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bias = bias
        self.batch_first = batch_first
        self.dropout = float(dropout)
        self.bidirectional = bidirectional
        self.proj_size = proj_size

        gate_size = _STEPS[mode][1] * hidden_size
        real_hidden_size = proj_size if proj_size > 0 else hidden_size
        num_directions = 2 if bidirectional else 1
        factory = {"device": device, "dtype": dtype}
        self._flat_weights_names = []
        self._all_weights = []
        for layer in range(num_layers):
            for direction in range(num_directions):
                layer_input_size = input_size if layer == 0 else real_hidden_size * num_directions
                shapes = [("weight_ih", (gate_size, layer_input_size)), ("weight_hh", (gate_size, real_hidden_size))]
                if bias:
                    shapes += [("bias_ih", (gate_size,)), ("bias_hh", (gate_size,))]
                if proj_size > 0:
                    shapes += [("weight_hr", (proj_size, hidden_size))]
                suffix = "_reverse" if direction == 1 else ""
                names = []
                for base, shape in shapes:
                    name = f"{base}_l{layer}{suffix}"
                    setattr(self, name, Parameter(empty(*shape, **factory)))
                    names.append(name)
                self._flat_weights_names.extend(names)
                self._all_weights.append(names)
        self.reset_parameters()

    def reset_parameters(self):
        _uniform_init(self)

    def flatten_parameters(self):
        """torch compacts the weights into one cuDNN buffer here; without cuDNN (as on torch's CPU)
        there is nothing to do. Kept so code written for torch runs unchanged."""

    @property
    def _flat_weights(self):
        return [getattr(self, name, None) for name in self._flat_weights_names]

    @property
    def all_weights(self):
        return [[getattr(self, name) for name in names] for names in self._all_weights]

    def _weights(self, layer, direction):
        suffix = f"_l{layer}" + ("_reverse" if direction == 1 else "")
        p = self._parameters
        return _Weights(p["weight_ih" + suffix], p["weight_hh" + suffix], p.get("bias_ih" + suffix),
                        p.get("bias_hh" + suffix), p.get("weight_hr" + suffix))

    # -------------------------------------------------------------- argument checks (torch's)
    def _check_input(self, input, packed=False):
        weight = self._flat_weights[0]
        if input.dtype != weight.dtype and not is_autocast_enabled():
            raise ValueError(f"RNN input dtype ({input.dtype}) does not match weight dtype ({weight.dtype}). "
                             f"Convert input: input.to({weight.dtype}), or convert model: model.to({input.dtype})")
        expected_dim = 2 if packed else 3
        if input.dim() != expected_dim:
            raise RuntimeError(f"input must have {expected_dim} dimensions, got {input.dim()}")
        if self.input_size != input.shape[-1]:
            raise RuntimeError(f"input.size(-1) must be equal to input_size. Expected {self.input_size}, "
                               f"got {input.shape[-1]}")
        if not packed and input.shape[1 if self.batch_first else 0] == 0:
            raise RuntimeError("Expected sequence length to be larger than 0 in RNN")

    def _expected_hidden_size(self, input, size):
        mini_batch = input.shape[0 if self.batch_first else 1]
        return (self.num_layers * (2 if self.bidirectional else 1), mini_batch, size)

    @staticmethod
    def _check_hidden_size(hx, expected, msg="Expected hidden size {}, got {}"):
        if tuple(hx.shape) != expected:
            raise RuntimeError(msg.format(expected, list(hx.shape)))

    def _check_state_dims(self, states, is_batched):
        """hx (and cx) must have the input's batchedness: 3-D for 3-D input, 2-D for 2-D input."""
        want = 3 if is_batched else 2
        if any(s.dim() != want for s in states):
            kind = "batched 3-D" if is_batched else "unbatched 2-D"
            dims = ", ".join(f"{s.dim()}-D" for s in states)
            if len(states) == 1:
                raise RuntimeError(f"For {kind} input, hx should also be {want}-D but got {dims} tensor")
            raise RuntimeError(f"For {kind} input, hx and cx should also be {want}-D but got ({dims}) tensors")

    # -------------------------------------------------------------- the recurrence
    def _initial_state(self, h0, c0, k, batch, real_hidden_size, like):
        """(h, c) of layer-direction k: the given states, else zeros (c is None unless LSTM)."""
        h = h0[k] if h0 is not None else zeros(batch, real_hidden_size, dtype=like.dtype, device=like.device)
        if self.mode != "LSTM":
            return h, None
        return h, (c0[k] if c0 is not None else zeros(batch, self.hidden_size, dtype=like.dtype, device=like.device))

    def _layers(self, layer_input, hx, cx, batch, run_direction, feature_dim):
        """The layers and directions of `_run` and `_run_packed`: per layer and direction, the
        initial state, the input projection of all steps at once, then
        `run_direction(projected, h, c, w, step, direction) -> (output, h_last, c_last)`; the
        directions' outputs joined on `feature_dim`, dropout between layers. Returns the last
        layer's output, h_n and c_n (None for stateless modes)."""
        step, _, fold_b_hh = _STEPS[self.mode]
        num_directions = 2 if self.bidirectional else 1
        real_hidden_size = self.proj_size if self.proj_size > 0 else self.hidden_size
        h0 = unbind(hx, 0) if hx is not None else None
        c0 = unbind(cx, 0) if cx is not None else None
        h_n, c_n = [], []
        for layer in range(self.num_layers):
            outputs = []
            for direction in range(num_directions):
                h, c = self._initial_state(h0, c0, layer * num_directions + direction, batch, real_hidden_size,
                                           layer_input)
                w = self._weights(layer, direction)
                out, h, c = run_direction(_input_projection(layer_input, w, fold_b_hh), h, c, w, step, direction)
                outputs.append(out)
                h_n.append(h)
                c_n.append(c)
            layer_input = outputs[0] if num_directions == 1 else cat(outputs, feature_dim)
            if self.training and self.dropout > 0 and layer < self.num_layers - 1:
                layer_input = _dropout(layer_input, self.dropout, True)
        return layer_input, stack(h_n, 0), (stack(c_n, 0) if self.mode == "LSTM" else None)

    def _run(self, x, hx, cx):
        """x: (seq, batch, features) time-major; hx/cx: (layers*directions, batch, size) or None
        for zeros. Returns output (seq, batch, directions*real_hidden), h_n and c_n (None for
        stateless modes)."""
        def run_direction(projected, h, c, w, step, direction):
            steps = unbind(projected, 0)
            if direction == 1:
                steps = steps[::-1]
            hs = []
            for xg in steps:
                h, c = step(xg, h, c, w)
                hs.append(h)
            if direction == 1:
                hs.reverse()
            return stack(hs, 0), h, c

        return self._layers(x, hx, cx, x.shape[1], run_direction, 2)

    def _forward(self, input, hx, cx, is_batched):
        """Run on a checked 3-D input, converting batch_first and unbatched layouts on both ends."""
        x = transpose(input, 0, 1) if self.batch_first else input
        output, h_n, c_n = self._run(x, hx, cx)
        if self.batch_first:
            output = transpose(output, 0, 1)
        if not is_batched:
            output = output.squeeze(0 if self.batch_first else 1)
            h_n = h_n.squeeze(1)
            c_n = c_n.squeeze(1) if c_n is not None else None
        return output, h_n, c_n

    def _run_packed(self, data, batch_sizes, hx, cx):
        """data: (sum of lengths, features), the rows of time step t at offsets[t] ... + batch_sizes[t],
        sequences sorted by decreasing length; hx/cx as in `_run`, in the sorted order. Returns
        the output rows (same layout), h_n and c_n (each sequence's state after its last step)."""
        sizes = [int(n) for n in (batch_sizes.tolist() if isinstance(batch_sizes, Tensor) else batch_sizes)]
        lstm = self.mode == "LSTM"

        def run_direction(projected, h, c, w, step, direction):
            steps = split(projected, sizes, 0)
            hs = []
            if direction == 0:
                ended = []  # (h, c) of the sequences that ended, the shortest (last rows) first
                for n, xg in zip(sizes, steps):
                    if n < h.shape[0]:
                        ended.append((h[n:], c[n:] if lstm else None))
                        h, c = h[:n], (c[:n] if lstm else None)
                    h, c = step(xg, h, c, w)
                    hs.append(h)
                ended.append((h, c))
                h_last = cat([e[0] for e in reversed(ended)], 0) if len(ended) > 1 else h
                c_last = None
                if lstm:
                    c_last = cat([e[1] for e in reversed(ended)], 0) if len(ended) > 1 else c
            else:
                h_init, c_init = h, c
                h, c = h_init[:sizes[-1]], (c_init[:sizes[-1]] if lstm else None)
                for n, xg in zip(reversed(sizes), reversed(steps)):
                    if n > h.shape[0]:  # sequences that start (from their end) at this step
                        h = cat([h, h_init[h.shape[0]:n]], 0)
                        c = cat([c, c_init[c.shape[0]:n]], 0) if lstm else None
                    h, c = step(xg, h, c, w)
                    hs.append(h)
                hs.reverse()
                h_last, c_last = h, c
            return (cat(hs, 0) if len(hs) > 1 else hs[0]), h_last, c_last

        return self._layers(data, hx, cx, sizes[0], run_direction, 1)

    def _forward_packed(self, packed, hx, cx):
        """torch's packed path: the states given in the batch's order are permuted to the sorted
        order, and h_n/c_n permuted back; the output is a PackedSequence with the input's sizes
        and indices (batch_first does not apply)."""
        data, batch_sizes, sorted_indices, unsorted_indices = packed
        self._check_input(data, packed=True)
        if not isinstance(data, Tensor):
            raise TypeError(f"{type(self).__name__}: PackedSequence.data must be a Tensor, got {type(data).__name__}")
        mini_batch = int(batch_sizes[0])
        num_directions = 2 if self.bidirectional else 1
        real_hidden_size = self.proj_size if self.proj_size > 0 else self.hidden_size
        if hx is not None:
            self._check_hidden_size(hx, (self.num_layers * num_directions, mini_batch, real_hidden_size),
                                    "Expected hidden size {}, got {}" if cx is None else
                                    "Expected hidden[0] size {}, got {}")
            if cx is not None:
                self._check_hidden_size(cx, (self.num_layers * num_directions, mini_batch, self.hidden_size),
                                        "Expected hidden[1] size {}, got {}")
            if sorted_indices is not None:
                hx = index_select(hx, 1, sorted_indices)
                cx = index_select(cx, 1, sorted_indices) if cx is not None else None
        output, h_n, c_n = self._run_packed(data, batch_sizes, hx, cx)
        if unsorted_indices is not None:
            h_n = index_select(h_n, 1, unsorted_indices)
            c_n = index_select(c_n, 1, unsorted_indices) if c_n is not None else None
        return PackedSequence(output, batch_sizes, sorted_indices, unsorted_indices), h_n, c_n

    def _prepare(self, input, name):
        """Checks common to all modes; returns (3-D input, is_batched)."""
        _check_tensor_input(input, name)
        if input.dim() not in (2, 3):
            tail = " tensor instead" if name == "RNN" else " instead"
            raise ValueError(f"{name}: Expected input to be 2D or 3D, got {input.dim()}D{tail}")
        is_batched = input.dim() == 3
        if not is_batched:
            input = input.unsqueeze(0 if self.batch_first else 1)
        return input, is_batched

    def _forward_single_state(self, input, hx, name):
        """RNN and GRU: one state tensor, returns (output, h_n)."""
        packed = _as_packed(input, name)
        if packed is not None:
            output, h_n, _ = self._forward_packed(packed, hx, None)
            return output, h_n
        input, is_batched = self._prepare(input, name)
        if hx is not None:
            self._check_state_dims([hx], is_batched)
            if not is_batched:
                hx = hx.unsqueeze(1)
        self._check_input(input)
        if hx is not None:
            self._check_hidden_size(hx, self._expected_hidden_size(input, self.hidden_size))
        output, h_n, _ = self._forward(input, hx, None, is_batched)
        return output, h_n

    def extra_repr(self):
        s = "{input_size}, {hidden_size}"
        if self.proj_size != 0:
            s += ", proj_size={proj_size}"
        if self.num_layers != 1:
            s += ", num_layers={num_layers}"
        if self.bias is not True:
            s += ", bias={bias}"
        if self.batch_first is not False:
            s += ", batch_first={batch_first}"
        if self.dropout != 0:
            s += ", dropout={dropout}"
        if self.bidirectional is not False:
            s += ", bidirectional={bidirectional}"
        return s.format(**self.__dict__)


class RNN(RNNBase):
    """Elman RNN: h_t = act(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh), act tanh or relu.

    RNN(input_size, hidden_size, num_layers=1, nonlinearity='tanh', bias=True, batch_first=False,
    dropout=0.0, bidirectional=False, device=None, dtype=None); forward(input, hx=None) returns
    (output, h_n)."""

    def __init__(self, *args, **kwargs):
        if "proj_size" in kwargs:
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        if len(args) > 3:
            self.nonlinearity = args[3]
            args = args[:3] + args[4:]
        else:
            self.nonlinearity = kwargs.pop("nonlinearity", "tanh")
        if self.nonlinearity == "tanh":
            mode = "RNN_TANH"
        elif self.nonlinearity == "relu":
            mode = "RNN_RELU"
        else:
            raise ValueError(f"Unknown nonlinearity '{self.nonlinearity}'. Select from 'tanh' or 'relu'.")
        super().__init__(mode, *args, **kwargs)

    def forward(self, input, hx=None):
        return self._forward_single_state(input, hx, "RNN")


class LSTM(RNNBase):
    """Long short-term memory; with proj_size > 0 the hidden state is projected by weight_hr
    (h_t = W_hr (o_t * tanh(c_t))), as torch's LSTM with projections.

    forward(input, (h_0, c_0)=None) returns (output, (h_n, c_n))."""

    def __init__(self, *args, **kwargs):
        super().__init__("LSTM", *args, **kwargs)

    @staticmethod
    def _split_state(hx):
        if isinstance(hx, Tensor) or not isinstance(hx, (tuple, list)) or len(hx) != 2:
            raise TypeError(f"LSTM: hx must be a tuple (h_0, c_0) of two Tensors, got {type(hx).__name__}"
                            + (f" of length {len(hx)}" if isinstance(hx, (tuple, list)) else ""))
        return hx

    def forward(self, input, hx=None):
        packed = _as_packed(input, "LSTM")
        if packed is not None:
            hx, cx = self._split_state(hx) if hx is not None else (None, None)
            output, h_n, c_n = self._forward_packed(packed, hx, cx)
            return output, (h_n, c_n)
        input, is_batched = self._prepare(input, "LSTM")
        cx = None
        if hx is not None:
            hx, cx = self._split_state(hx)
            self._check_state_dims([hx, cx], is_batched)
            if not is_batched:
                hx, cx = hx.unsqueeze(1), cx.unsqueeze(1)
        self._check_input(input)
        if hx is not None:
            real_hidden_size = self.proj_size if self.proj_size > 0 else self.hidden_size
            self._check_hidden_size(hx, self._expected_hidden_size(input, real_hidden_size),
                                    "Expected hidden[0] size {}, got {}")
            self._check_hidden_size(cx, self._expected_hidden_size(input, self.hidden_size),
                                    "Expected hidden[1] size {}, got {}")
        output, h_n, c_n = self._forward(input, hx, cx, is_batched)
        return output, (h_n, c_n)


class GRU(RNNBase):
    """Gated recurrent unit: r, z = sigmoid(...), n = tanh(W_in x + b_in + r * (W_hn h + b_hn)),
    h' = (1 - z) * n + z * h. forward(input, hx=None) returns (output, h_n)."""

    def __init__(self, *args, **kwargs):
        if "proj_size" in kwargs:
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        super().__init__("GRU", *args, **kwargs)

    def forward(self, input, hx=None):
        return self._forward_single_state(input, hx, "GRU")


# ------------------------------------------------------------------ cells
class RNNCellBase(Module):
    """One time step: parameters weight_ih (chunks*hidden, input), weight_hh (chunks*hidden,
    hidden), bias_ih, bias_hh, initialised like the sequence layers."""

    def __init__(self, input_size, hidden_size, bias, num_chunks, device=None, dtype=None):
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.bias = bias
        factory = {"device": device, "dtype": dtype}
        self.weight_ih = Parameter(empty(num_chunks * hidden_size, input_size, **factory))
        self.weight_hh = Parameter(empty(num_chunks * hidden_size, hidden_size, **factory))
        if bias:
            self.bias_ih = Parameter(empty(num_chunks * hidden_size, **factory))
            self.bias_hh = Parameter(empty(num_chunks * hidden_size, **factory))
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()

    def reset_parameters(self):
        _uniform_init(self)

    def extra_repr(self):
        s = "{input_size}, {hidden_size}"
        if "bias" in self.__dict__ and self.bias is not True:
            s += ", bias={bias}"
        if "nonlinearity" in self.__dict__ and self.nonlinearity != "tanh":
            s += ", nonlinearity={nonlinearity}"
        return s.format(**self.__dict__)

    def _check_dims(self, input, states, labels):
        name = type(self).__name__
        _check_tensor_input(input, name)
        if input.dim() not in (1, 2):
            raise ValueError(f"{name}: Expected input to be 1D or 2D, got {input.dim()}D instead")
        for state, label in zip(states, labels):
            if state is not None and state.dim() not in (1, 2):
                raise ValueError(f"{name}: Expected {label} to be 1D or 2D, got {state.dim()}D instead")

    def _step(self, mode, input, states):
        """Check the (2-D) input and states as torch's cell kernels do, then run one step of
        `mode` (a key of _STEPS); missing states are zeros."""
        if input.shape[1] != self.input_size:
            raise RuntimeError(f"input has inconsistent input_size: got {input.shape[1]} expected {self.input_size}")
        for k, state in enumerate(states):
            if state is None:
                continue
            if input.shape[0] != state.shape[0]:
                raise RuntimeError(f"Input batch size {input.shape[0]} doesn't match hidden{k} batch size "
                                   f"{state.shape[0]}")
            if state.shape[1] != self.hidden_size:
                raise RuntimeError(f"hidden{k} has inconsistent hidden_size: got {state.shape[1]}, expected "
                                   f"{self.hidden_size}")
        step, _, fold_b_hh = _STEPS[mode]
        w = _Weights(self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh, None)
        zero = None
        if any(s is None for s in states):
            zero = zeros(input.shape[0], self.hidden_size, dtype=input.dtype, device=input.device)
        h = states[0] if states[0] is not None else zero
        c = None
        if len(states) == 2:
            c = states[1] if states[1] is not None else zero
        return step(_input_projection(input, w, fold_b_hh), h, c, w)


class RNNCell(RNNCellBase):
    """h' = act(x W_ih^T + b_ih + h W_hh^T + b_hh), act tanh or relu; forward(input, hx=None) -> h'."""

    def __init__(self, input_size, hidden_size, bias=True, nonlinearity="tanh", device=None, dtype=None):
        super().__init__(input_size, hidden_size, bias, num_chunks=1, device=device, dtype=dtype)
        self.nonlinearity = nonlinearity

    def forward(self, input, hx=None):
        self._check_dims(input, [hx], ["hidden"])
        if self.nonlinearity not in ("tanh", "relu"):
            raise RuntimeError(f"Unknown nonlinearity: {self.nonlinearity}")
        is_batched = input.dim() == 2
        if not is_batched:
            input = input.unsqueeze(0)
            hx = hx.unsqueeze(0) if hx is not None else None
        h, _ = self._step("RNN_TANH" if self.nonlinearity == "tanh" else "RNN_RELU", input, [hx])
        return h if is_batched else h.squeeze(0)


class LSTMCell(RNNCellBase):
    """One LSTM step; forward(input, (h, c)=None) -> (h', c')."""

    def __init__(self, input_size, hidden_size, bias=True, device=None, dtype=None):
        super().__init__(input_size, hidden_size, bias, num_chunks=4, device=device, dtype=dtype)

    def forward(self, input, hx=None):
        if hx is not None:
            if isinstance(hx, Tensor) or not isinstance(hx, (tuple, list)) or len(hx) != 2:
                raise TypeError(f"LSTMCell: hx must be a tuple (h, c) of two Tensors, got {type(hx).__name__}")
            states = list(hx)
        else:
            states = [None, None]
        self._check_dims(input, states, ["hx[0]", "hx[1]"])
        is_batched = input.dim() == 2
        if not is_batched:
            input = input.unsqueeze(0)
            states = [s.unsqueeze(0) if s is not None else None for s in states]
        h, c = self._step("LSTM", input, states)
        return (h, c) if is_batched else (h.squeeze(0), c.squeeze(0))


class GRUCell(RNNCellBase):
    """One GRU step; forward(input, hx=None) -> h'."""

    def __init__(self, input_size, hidden_size, bias=True, device=None, dtype=None):
        super().__init__(input_size, hidden_size, bias, num_chunks=3, device=device, dtype=dtype)

    def forward(self, input, hx=None):
        self._check_dims(input, [hx], ["hidden"])
        is_batched = input.dim() == 2
        if not is_batched:
            input = input.unsqueeze(0)
            hx = hx.unsqueeze(0) if hx is not None else None
        h, _ = self._step("GRU", input, [hx])
        return h if is_batched else h.squeeze(0)
