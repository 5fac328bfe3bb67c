"""engine.nn RNN / LSTM / GRU and their cells against torch.nn.

Each module is built in both libraries with the same arguments, the torch module's parameters are
loaded into the engine one (after checking the state_dict keys, order and shapes are torch's), and
the outputs, final states and the gradients of the input, the initial states and every parameter
are compared for the same inputs and upstream gradients (one random upstream gradient per output,
so every output contributes to the backward)."""
import math
import os
import warnings
from collections import OrderedDict

import numpy as np
import pytest
import torch

import engine as flow

DEVICE = os.environ.get("ENGINE_TEST_DEVICE", "cpu")  # "cuda": the parity checks (_check*) run ours on CuPy
TOL = {"float64": dict(rtol=1e-10, atol=1e-12), "float32": dict(rtol=1e-5, atol=1e-6)}
T_DTYPES = {"float64": torch.float64, "float32": torch.float32}
SEQ, BATCH, IN, HID = 4, 3, 3, 5  # odd sizes on purpose


def _to_engine(tm, em):
    """Check state_dict keys/order/shapes are torch's, then copy torch's values into `em`."""
    tsd, esd = tm.state_dict(), em.state_dict()
    assert list(esd) == list(tsd)
    assert [tuple(v.shape) for v in esd.values()] == [tuple(v.shape) for v in tsd.values()]
    assert [n for n, _ in em.named_parameters()] == [n for n, _ in tm.named_parameters()]
    em.load_state_dict(OrderedDict((k, flow.tensor(v.detach().cpu().numpy())) for k, v in tsd.items()))
    em.to(DEVICE)


def _pair(a):
    return torch.tensor(a, requires_grad=True), flow.tensor(a, requires_grad=True, device=DEVICE)


def _flatten_out(out):
    """(output, h) / (output, (h, c)) / h / (h, c) -> flat list of tensors."""
    flat = []
    for o in (out if isinstance(out, tuple) else (out,)):
        flat += _flatten_out(o) if isinstance(o, tuple) else [o]
    return flat


def _check(make, x, states=(), *, dtype="float64", train=False, seed=0):
    """make(nn, dtype) -> module; x: numpy input; states: numpy arrays (hx, or (h0, c0)) or None."""
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    tm, em = make(torch.nn, T_DTYPES[dtype]), make(flow.nn, getattr(flow, dtype))
    _to_engine(tm, em)
    tm.train(train), em.train(train)
    tx, ex = _pair(x)
    tstates, estates = zip(*[_pair(s) for s in states]) if states else ((), ())
    if len(states) == 1:
        targs, eargs = (tx, tstates[0]), (ex, estates[0])
    elif len(states) == 2:
        targs, eargs = (tx, tuple(tstates)), (ex, tuple(estates))
    else:
        targs, eargs = (tx,), (ex,)
    touts, eouts = _flatten_out(tm(*targs)), _flatten_out(em(*eargs))
    assert len(touts) == len(eouts)
    tol = TOL[dtype]
    tloss, eloss = 0, 0
    for t, e in zip(touts, eouts):
        assert tuple(e.shape) == tuple(t.shape)
        assert e.dtype.name == dtype
        np.testing.assert_allclose(e.detach().cpu().numpy(), t.detach().cpu().numpy(), **tol)
        g = rng.standard_normal(tuple(t.shape)).astype(dtype)
        tloss = tloss + (t * torch.from_numpy(g)).sum()
        eloss = eloss + (e * flow.tensor(g, device=DEVICE)).sum()
    tloss.backward()
    eloss.backward()
    for t, e in zip((tx,) + tuple(tstates), (ex,) + tuple(estates)):
        np.testing.assert_allclose(e.grad.cpu().numpy(), t.grad.cpu().numpy(), **tol)
    tparams = dict(tm.named_parameters())
    for name, p in em.named_parameters():
        np.testing.assert_allclose(p.grad.cpu().numpy(), tparams[name].grad.cpu().numpy(), err_msg=name, **tol)
    return tm, em


def _randn(*shape, dtype="float64", seed=1):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# ---------------------------------------------------------------- sequence layers
# (class, kwargs, unbatched, with initial state, train mode (dropout 0))
CONFIGS = [
    ("RNN", dict(), False, False, False),
    ("RNN", dict(nonlinearity="relu", num_layers=2), False, True, True),
    ("RNN", dict(num_layers=2, bidirectional=True, batch_first=True, bias=False), False, True, False),
    ("RNN", dict(nonlinearity="relu", bidirectional=True), True, True, False),
    ("LSTM", dict(), False, True, False),
    ("LSTM", dict(num_layers=2, bidirectional=True, batch_first=True), False, True, True),
    ("LSTM", dict(num_layers=2, bias=False), True, False, False),
    ("LSTM", dict(proj_size=2, num_layers=2, bidirectional=True), False, True, False),
    ("LSTM", dict(proj_size=3, batch_first=True), True, True, True),
    ("GRU", dict(), False, False, True),
    ("GRU", dict(num_layers=2, bidirectional=True), False, True, False),
    ("GRU", dict(batch_first=True, bias=False, num_layers=2), False, True, False),
    ("GRU", dict(bidirectional=True, batch_first=True), True, True, False),
]


def _states(cls, kw, unbatched, dtype):
    d = 2 if kw.get("bidirectional") else 1
    lead = (kw.get("num_layers", 1) * d,)
    batch = () if unbatched else (BATCH,)
    h_size = kw.get("proj_size", 0) or HID
    h = _randn(*lead, *batch, h_size, dtype=dtype, seed=2)
    if cls == "LSTM":
        return (h, _randn(*lead, *batch, HID, dtype=dtype, seed=3))
    return (h,)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("cls,kw,unbatched,with_state,train", CONFIGS)
def test_sequence_layer_parity(cls, kw, unbatched, with_state, train, dtype):
    if unbatched:
        x = _randn(SEQ, IN, dtype=dtype)
    elif kw.get("batch_first"):
        x = _randn(BATCH, SEQ, IN, dtype=dtype)
    else:
        x = _randn(SEQ, BATCH, IN, dtype=dtype)
    states = _states(cls, kw, unbatched, dtype) if with_state else ()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: "LSTM with projections is not supported with oneDNN"
        _check(lambda nn, dt: getattr(nn, cls)(IN, HID, dtype=dt, **kw), x, states, dtype=dtype, train=train)


@pytest.mark.parametrize("cls", ["RNN", "LSTM", "GRU"])
def test_single_step_and_empty_batch(cls):
    _check(lambda nn, dt: getattr(nn, cls)(IN, HID, dtype=dt), _randn(1, BATCH, IN))
    # a batch of 0 sequences is accepted by torch: empty outputs of the right shapes
    torch.manual_seed(0)
    tm, em = getattr(torch.nn, cls)(IN, HID, num_layers=2), getattr(flow.nn, cls)(IN, HID, num_layers=2)
    _to_engine(tm, em)
    x = _randn(SEQ, 0, IN, dtype="float32")
    tout, eout = _flatten_out(tm(torch.tensor(x))), _flatten_out(em(flow.tensor(x, device=DEVICE)))
    assert [tuple(e.shape) for e in eout] == [tuple(t.shape) for t in tout]


def test_state_dict_keys_and_all_weights_match_torch():
    for kw in (dict(num_layers=3, bidirectional=True, proj_size=2), dict(bias=False, num_layers=2)):
        tm, em = torch.nn.LSTM(IN, HID, **kw), flow.nn.LSTM(IN, HID, **kw)
        assert list(em.state_dict()) == list(tm.state_dict())
        assert [[tuple(p.shape) for p in ws] for ws in em.all_weights] == \
            [[tuple(p.shape) for p in ws] for ws in tm.all_weights]
        assert repr(em) == repr(tm)
    for cls in ("RNNCell", "LSTMCell", "GRUCell"):
        for bias in (True, False):
            tm, em = getattr(torch.nn, cls)(IN, HID, bias=bias), getattr(flow.nn, cls)(IN, HID, bias=bias)
            assert list(em.state_dict()) == list(tm.state_dict())
            assert repr(em) == repr(tm)
    assert repr(flow.nn.RNNCell(2, 3, nonlinearity="relu")) == repr(torch.nn.RNNCell(2, 3, nonlinearity="relu"))


@pytest.mark.parametrize("cls", ["GRU", "LSTMCell"])
def test_init_is_uniform_within_one_over_sqrt_hidden(cls):
    hidden = 64
    m = getattr(flow.nn, cls)(32, hidden)
    bound = 1 / math.sqrt(hidden)
    values = np.concatenate([p.detach().cpu().numpy().ravel() for p in m.parameters()])
    assert np.abs(values).max() <= bound
    assert np.abs(values).max() > 0.99 * bound
    # U(-b, b) has mean 0 and std b/sqrt(3); with ~20k samples both are within a few percent
    assert abs(values.mean()) < 0.02 * bound
    assert abs(values.std() / (bound / math.sqrt(3)) - 1) < 0.02
    first = [p.detach().cpu().numpy().ravel()[:8] for p in m.parameters()]
    assert not any(np.array_equal(first[0], f) for f in first[1:])  # each parameter drawn separately


# ---------------------------------------------------------------- dropout between layers
def test_dropout_one_zeroes_exactly_the_inputs_of_upper_layers():
    """With p=1 torch's dropout is deterministic (all zeros), so the train-mode output, both
    final states and all gradients can be compared: layer 0's h_n is untouched, layer 1 sees zeros."""
    x = _randn(SEQ, BATCH, IN)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for cls in ("RNN", "LSTM", "GRU"):
            _check(lambda nn, dt: getattr(nn, cls)(IN, HID, num_layers=2, dropout=1.0, dtype=dt), x, train=True)
            _check(lambda nn, dt: getattr(nn, cls)(IN, HID, num_layers=3, dropout=1.0, bidirectional=True,
                                                  dtype=dt), x, train=True)


@pytest.mark.parametrize("cls", ["RNN", "LSTM", "GRU"])
def test_dropout_applies_in_train_mode_only(cls):
    x = _randn(SEQ, BATCH, IN)
    # eval mode: dropout is off and the module matches torch exactly
    _check(lambda nn, dt: getattr(nn, cls)(IN, HID, num_layers=2, dropout=0.5, dtype=dt), x, train=False)
    m = getattr(flow.nn, cls)(IN, HID, num_layers=2, dropout=0.5, dtype=flow.float64)
    m.eval()
    ref = _flatten_out(m(flow.tensor(x)))
    m.train()
    flow.manual_seed(3)
    out1 = _flatten_out(m(flow.tensor(x)))
    flow.manual_seed(3)
    out2 = _flatten_out(m(flow.tensor(x)))
    flow.manual_seed(4)
    out3 = _flatten_out(m(flow.tensor(x)))
    for a, b in zip(out1, out2):  # the same seed gives the same masks
        np.testing.assert_array_equal(a.detach().cpu().numpy(), b.detach().cpu().numpy())
    assert not np.allclose(out1[0].detach().cpu().numpy(), ref[0].detach().cpu().numpy())  # layer 1 saw dropped inputs
    assert not np.allclose(out1[0].detach().cpu().numpy(), out3[0].detach().cpu().numpy())  # new seed, new masks
    # layer 0's final state never goes through dropout
    np.testing.assert_allclose(out1[1].detach().cpu().numpy()[0], ref[1].detach().cpu().numpy()[0], rtol=1e-12, atol=1e-14)


def test_dropout_with_one_layer_warns_like_torch():
    with pytest.warns(UserWarning, match="num_layers greater than 1"):
        torch.nn.GRU(IN, HID, dropout=0.2)
    with pytest.warns(UserWarning, match="num_layers greater than 1"):
        flow.nn.GRU(IN, HID, dropout=0.2)


# ---------------------------------------------------------------- cells
CELL_CONFIGS = [
    ("RNNCell", dict()),
    ("RNNCell", dict(nonlinearity="relu", bias=False)),
    ("LSTMCell", dict()),
    ("LSTMCell", dict(bias=False)),
    ("GRUCell", dict()),
    ("GRUCell", dict(bias=False)),
]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("cls,kw", CELL_CONFIGS)
@pytest.mark.parametrize("unbatched", [False, True])
def test_cell_parity(cls, kw, unbatched, dtype):
    batch = () if unbatched else (BATCH,)
    x = _randn(*batch, IN, dtype=dtype)
    make = lambda nn, dt: getattr(nn, cls)(IN, HID, dtype=dt, **kw)  # noqa: E731
    _check(make, x, dtype=dtype)
    n_states = 2 if cls == "LSTMCell" else 1
    states = tuple(_randn(*batch, HID, dtype=dtype, seed=2 + k) for k in range(n_states))
    _check(make, x, states, dtype=dtype)


@pytest.mark.parametrize("cls", ["RNNCell", "LSTMCell", "GRUCell"])
def test_cell_unrolled_over_time_and_empty_batch(cls):
    """A cell applied step by step keeps gradients flowing through time (and through the state)."""
    torch.manual_seed(0)
    tm, em = getattr(torch.nn, cls)(IN, HID, dtype=torch.float64), getattr(flow.nn, cls)(IN, HID, dtype=flow.float64)
    _to_engine(tm, em)
    x = _randn(SEQ, BATCH, IN)
    tx, ex = _pair(x)
    ts, es = None, None
    touts, eouts = [], []
    for t in range(SEQ):
        ts, es = tm(tx[t], ts), em(ex[t], es)
        touts.append(ts[0] if isinstance(ts, tuple) else ts)
        eouts.append(es[0] if isinstance(es, tuple) else es)
    torch.stack(touts).square().sum().backward()
    flow.stack(eouts).square().sum().backward()
    np.testing.assert_allclose(ex.grad.cpu().numpy(), tx.grad.cpu().numpy(), **TOL["float64"])
    tparams = dict(tm.named_parameters())
    for name, p in em.named_parameters():
        np.testing.assert_allclose(p.grad.cpu().numpy(), tparams[name].grad.cpu().numpy(), err_msg=name, **TOL["float64"])
    out = em(flow.zeros(0, IN, dtype=flow.float64, device=DEVICE))
    assert [tuple(o.shape) for o in _flatten_out(out)] == [(0, HID)] * len(_flatten_out(out))


# ---------------------------------------------------------------- bad arguments: torch's exception types
def _same_error(run):
    """run(nn, lib) raises in torch; the engine raises the same exception type."""
    with pytest.raises(Exception) as texc:
        run(torch.nn, torch)
    with pytest.raises(type(texc.value)) as eexc:
        run(flow.nn, flow)
    assert type(eexc.value) is type(texc.value), (texc.value, eexc.value)
    assert str(eexc.value)


def _zeros(lib, *shape, dtype="float32"):
    return lib.zeros(*shape, dtype=getattr(lib, dtype))


SEQ_ERRORS = {
    "input_1d": lambda nn, lib, cls: getattr(nn, cls)(IN, HID)(_zeros(lib, IN)),
    "input_4d": lambda nn, lib, cls: getattr(nn, cls)(IN, HID)(_zeros(lib, 1, SEQ, BATCH, IN)),
    "input_size": lambda nn, lib, cls: getattr(nn, cls)(IN, HID)(_zeros(lib, SEQ, BATCH, IN + 1)),
    "dtype": lambda nn, lib, cls: getattr(nn, cls)(IN, HID)(_zeros(lib, SEQ, BATCH, IN, dtype="float64")),
    "empty_sequence": lambda nn, lib, cls: getattr(nn, cls)(IN, HID)(_zeros(lib, 0, BATCH, IN)),
    "empty_sequence_batch_first": lambda nn, lib, cls: getattr(nn, cls)(IN, HID, batch_first=True)(
        _zeros(lib, BATCH, 0, IN)),
}


def _hx(lib, cls, h_shape, c_shape=None):
    h = _zeros(lib, *h_shape)
    return (h, _zeros(lib, *(c_shape or h_shape))) if cls == "LSTM" else h


SEQ_STATE_ERRORS = {
    "hx_batch": lambda nn, lib, cls: getattr(nn, cls)(IN, HID)(_zeros(lib, SEQ, BATCH, IN),
                                                               _hx(lib, cls, (1, BATCH + 1, HID))),
    "hx_layers": lambda nn, lib, cls: getattr(nn, cls)(IN, HID, bidirectional=True)(
        _zeros(lib, SEQ, BATCH, IN), _hx(lib, cls, (1, BATCH, HID))),
    "hx_size": lambda nn, lib, cls: getattr(nn, cls)(IN, HID)(_zeros(lib, SEQ, BATCH, IN),
                                                              _hx(lib, cls, (1, BATCH, HID + 1))),
    "hx_2d_for_batched": lambda nn, lib, cls: getattr(nn, cls)(IN, HID)(_zeros(lib, SEQ, BATCH, IN),
                                                                        _hx(lib, cls, (BATCH, HID))),
    "hx_3d_for_unbatched": lambda nn, lib, cls: getattr(nn, cls)(IN, HID)(_zeros(lib, SEQ, IN),
                                                                          _hx(lib, cls, (1, 1, HID))),
    "hx_batch_first": lambda nn, lib, cls: getattr(nn, cls)(IN, HID, batch_first=True)(
        _zeros(lib, BATCH, SEQ, IN), _hx(lib, cls, (1, SEQ, HID))),
}


@pytest.mark.parametrize("cls", ["RNN", "LSTM", "GRU"])
@pytest.mark.parametrize("case", sorted(SEQ_ERRORS) + sorted(SEQ_STATE_ERRORS))
def test_sequence_layer_bad_input_raises_like_torch(cls, case):
    run = SEQ_ERRORS.get(case) or SEQ_STATE_ERRORS[case]
    _same_error(lambda nn, lib: run(nn, lib, cls))


@pytest.mark.parametrize("case", [
    lambda nn, lib: nn.LSTM(IN, HID)(_zeros(lib, SEQ, BATCH, IN), (_zeros(lib, 1, BATCH, HID),
                                                                   _zeros(lib, 1, BATCH, HID + 1))),
    lambda nn, lib: nn.LSTM(IN, HID, proj_size=2)(_zeros(lib, SEQ, BATCH, IN), (_zeros(lib, 1, BATCH, HID),
                                                                                _zeros(lib, 1, BATCH, HID))),
    lambda nn, lib: nn.LSTM(IN, HID)(_zeros(lib, SEQ, IN), (_zeros(lib, 1, HID), _zeros(lib, 1, 1, HID))),
])
def test_lstm_bad_cell_state_raises_like_torch(case):
    _same_error(case)


@pytest.mark.parametrize("case", [
    lambda nn, lib: nn.RNN(IN, HID, nonlinearity="sigmoid"),
    lambda nn, lib: nn.RNN(IN, 5.0),
    lambda nn, lib: nn.RNN(2.0, HID),
    lambda nn, lib: nn.RNN(0, HID),
    lambda nn, lib: nn.GRU(IN, 0),
    lambda nn, lib: nn.LSTM(IN, HID, num_layers=0),
    lambda nn, lib: nn.LSTM(IN, HID, num_layers=1.5),
    lambda nn, lib: nn.GRU(IN, HID, dropout=1.5),
    lambda nn, lib: nn.GRU(IN, HID, dropout=True),
    lambda nn, lib: nn.LSTM(IN, HID, bias="yes"),
    lambda nn, lib: nn.LSTM(IN, HID, batch_first=1),
    lambda nn, lib: nn.LSTM(IN, HID, proj_size=HID),
    lambda nn, lib: nn.LSTM(IN, HID, proj_size=-1),
    lambda nn, lib: nn.GRU(IN, HID, proj_size=2),
    lambda nn, lib: nn.RNN(IN, HID, proj_size=2),
])
def test_bad_constructor_arguments_raise_like_torch(case):
    _same_error(case)


@pytest.mark.parametrize("cls", ["RNNCell", "LSTMCell", "GRUCell"])
@pytest.mark.parametrize("case", ["input_3d", "input_size", "state_3d", "state_batch", "state_size",
                                  "unbatched_input_batched_state"])
def test_cell_bad_input_raises_like_torch(cls, case):
    def state(lib, *shape):
        s = _zeros(lib, *shape)
        return (s, s) if cls == "LSTMCell" else s

    runs = {
        "input_3d": lambda m, lib: m(_zeros(lib, 1, BATCH, IN)),
        "input_size": lambda m, lib: m(_zeros(lib, BATCH, IN + 1)),
        "state_3d": lambda m, lib: m(_zeros(lib, BATCH, IN), state(lib, 1, BATCH, HID)),
        "state_batch": lambda m, lib: m(_zeros(lib, BATCH, IN), state(lib, BATCH + 1, HID)),
        "state_size": lambda m, lib: m(_zeros(lib, BATCH, IN), state(lib, BATCH, HID + 1)),
        "unbatched_input_batched_state": lambda m, lib: m(_zeros(lib, IN), state(lib, BATCH, HID)),
    }
    _same_error(lambda nn, lib: runs[case](getattr(nn, cls)(IN, HID), lib))


def test_lstm_cell_second_state_is_checked_like_torch():
    _same_error(lambda nn, lib: nn.LSTMCell(IN, HID)(_zeros(lib, BATCH, IN),
                                                     (_zeros(lib, BATCH, HID), _zeros(lib, BATCH, HID + 1))))
    _same_error(lambda nn, lib: nn.LSTMCell(IN, HID)(_zeros(lib, BATCH, IN),
                                                     (_zeros(lib, BATCH, HID), _zeros(lib, BATCH + 1, HID))))


def test_rnn_cell_unknown_nonlinearity_raises_at_forward_like_torch():
    _same_error(lambda nn, lib: nn.RNNCell(IN, HID, nonlinearity="gelu")(_zeros(lib, BATCH, IN)))


def test_lstm_hx_must_be_a_pair():
    m = flow.nn.LSTM(IN, HID)
    with pytest.raises(TypeError, match=r"tuple \(h_0, c_0\)"):
        m(flow.zeros(SEQ, BATCH, IN), flow.zeros(1, BATCH, HID))


# ---------------------------------------------------------------- engine.nn.utils.rnn: packed sequences
from torch.nn.utils import rnn as trnn  # noqa: E402

from engine.nn.utils import rnn as ernn  # noqa: E402

UNSORTED = [3, 5, 1, 3]  # a tie, and the longest not first
SORTED = [5, 3, 3, 1]


def _padded_input(lengths, batch_first, dtype="float64", feat=IN, seed=1):
    shape = (len(lengths), max(lengths), feat) if batch_first else (max(lengths), len(lengths), feat)
    return _randn(*shape, dtype=dtype, seed=seed)


def _same_packed(tp, ep, dtype="float64"):
    assert isinstance(ep, ernn.PackedSequence)
    np.testing.assert_allclose(ep.data.detach().cpu().numpy(), tp.data.detach().cpu().numpy(), **TOL[dtype])
    assert ep.batch_sizes.tolist() == tp.batch_sizes.tolist()
    assert ep.batch_sizes.dtype == flow.int64 and ep.batch_sizes.device.type == "cpu"
    for t, e in ((tp.sorted_indices, ep.sorted_indices), (tp.unsorted_indices, ep.unsorted_indices)):
        assert (t is None) == (e is None)
        if t is not None:
            assert e.tolist() == t.tolist() and e.dtype == flow.int64


def _backward_both(touts, eouts, dtype, seed=5):
    """One random upstream gradient per output, the same in both libraries."""
    rng = np.random.default_rng(seed)
    tloss, eloss = 0, 0
    for t, e in zip(touts, eouts):
        assert tuple(e.shape) == tuple(t.shape)
        np.testing.assert_allclose(e.detach().cpu().numpy(), t.detach().cpu().numpy(), **TOL[dtype])
        g = rng.standard_normal(tuple(t.shape)).astype(dtype)
        tloss = tloss + (t * torch.from_numpy(g)).sum()
        eloss = eloss + (e * flow.tensor(g, device=DEVICE)).sum()
    tloss.backward()
    eloss.backward()


def _check_packed(make, lengths, *, batch_first=False, enforce_sorted=False, with_state=True, dtype="float64",
                  train=False, state_shapes=None):
    torch.manual_seed(0)
    tm, em = make(torch.nn, T_DTYPES[dtype]), make(flow.nn, getattr(flow, dtype))
    _to_engine(tm, em)
    tm.train(train), em.train(train)
    tx, ex = _pair(_padded_input(lengths, batch_first, dtype))
    tp = trnn.pack_padded_sequence(tx, lengths, batch_first=batch_first, enforce_sorted=enforce_sorted)
    ep = ernn.pack_padded_sequence(ex, lengths, batch_first=batch_first, enforce_sorted=enforce_sorted)
    _same_packed(tp, ep, dtype)
    states = [_randn(*s, dtype=dtype, seed=2 + k) for k, s in enumerate(state_shapes or [])] if with_state else []
    tstates, estates = zip(*[_pair(s) for s in states]) if states else ((), ())
    targs, eargs = (tp,), (ep,)
    if len(states) == 1:
        targs, eargs = (tp, tstates[0]), (ep, estates[0])
    elif len(states) == 2:
        targs, eargs = (tp, tuple(tstates)), (ep, tuple(estates))
    tout, eout = tm(*targs), em(*eargs)
    _same_packed(tout[0], eout[0], dtype)
    tpad, tlen = trnn.pad_packed_sequence(tout[0], batch_first=batch_first)
    epad, elen = ernn.pad_packed_sequence(eout[0], batch_first=batch_first)
    assert elen.tolist() == tlen.tolist() == list(lengths)
    _backward_both([tpad] + _flatten_out(tout[1]), [epad] + _flatten_out(eout[1]), dtype)
    for t, e in zip((tx,) + tuple(tstates), (ex,) + tuple(estates)):
        np.testing.assert_allclose(e.grad.cpu().numpy(), t.grad.cpu().numpy(), **TOL[dtype])
    tparams = dict(tm.named_parameters())
    for name, p in em.named_parameters():
        np.testing.assert_allclose(p.grad.cpu().numpy(), tparams[name].grad.cpu().numpy(), err_msg=name, **TOL[dtype])


def _packed_state_shapes(cls, kw, batch):
    lead = kw.get("num_layers", 1) * (2 if kw.get("bidirectional") else 1)
    h = (lead, batch, kw.get("proj_size", 0) or HID)
    return [h, (lead, batch, HID)] if cls == "LSTM" else [h]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("cls", ["RNN", "LSTM", "GRU"])
def test_packed_sequence_layer_parity(cls, bidirectional, num_layers, batch_first, dtype):
    """Unsorted lengths (enforce_sorted=False) with initial states in the batch's order: outputs,
    h_n/c_n (each sequence's own last step, in the batch's order) and every gradient as torch."""
    kw = dict(bidirectional=bidirectional, num_layers=num_layers, batch_first=batch_first)
    make = lambda nn, dt: getattr(nn, cls)(IN, HID, dtype=dt, **kw)  # noqa: E731
    _check_packed(make, UNSORTED, batch_first=batch_first, state_shapes=_packed_state_shapes(cls, kw, 4),
                  dtype=dtype)
    _check_packed(make, SORTED, batch_first=batch_first, enforce_sorted=True, with_state=False, dtype=dtype)


@pytest.mark.parametrize("cls,kw", [
    ("RNN", dict(nonlinearity="relu", num_layers=2, bidirectional=True, bias=False)),
    ("LSTM", dict(proj_size=2, num_layers=2, bidirectional=True)),
    ("LSTM", dict(proj_size=3, bias=False)),
    ("GRU", dict(num_layers=2, bidirectional=True, bias=False)),
])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_packed_sequence_more_configs(cls, kw, dtype):
    make = lambda nn, dt: getattr(nn, cls)(IN, HID, dtype=dt, **kw)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: "LSTM with projections is not supported with oneDNN"
        _check_packed(make, [2, 6, 6, 1, 4], dtype=dtype, state_shapes=_packed_state_shapes(cls, kw, 5))
        _check_packed(make, [4, 4, 4], enforce_sorted=True, dtype=dtype, with_state=False)  # all the same length
        _check_packed(make, [3], dtype=dtype, state_shapes=_packed_state_shapes(cls, kw, 1))  # one sequence


@pytest.mark.parametrize("cls", ["RNN", "LSTM", "GRU"])
def test_packed_sequence_dropout_one_between_layers(cls):
    make = lambda nn, dt: getattr(nn, cls)(IN, HID, num_layers=2, dropout=1.0, bidirectional=True,  # noqa: E731
                                           dtype=dt)
    _check_packed(make, UNSORTED, train=True, state_shapes=_packed_state_shapes(cls, dict(num_layers=2,
                                                                                          bidirectional=True), 4))


def test_packed_sequence_final_state_is_each_sequences_own_last_step():
    """Without torch: h_n of a packed batch equals running each sequence alone."""
    m = flow.nn.GRU(IN, HID, num_layers=2, bidirectional=True, dtype=flow.float64)
    x = _padded_input(UNSORTED, False)
    _, h_n = m(ernn.pack_padded_sequence(flow.tensor(x), UNSORTED, enforce_sorted=False))
    for b, n in enumerate(UNSORTED):
        out, h = m(flow.tensor(x[:n, b:b + 1]))
        np.testing.assert_allclose(h_n.detach().cpu().numpy()[:, b], h.detach().cpu().numpy()[:, 0], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("lengths,enforce_sorted", [(SORTED, True), (UNSORTED, False), ([4, 4], True)])
def test_pack_pad_round_trip_and_gradients(lengths, enforce_sorted, batch_first, dtype):
    x = _padded_input(lengths, batch_first, dtype, feat=2)[..., None].repeat(3, -1)  # (.., 2, 3) trailing
    tx, ex = _pair(x)
    for tl in (None, max(lengths) + 2):
        tx.grad, ex.grad = None, None
        tp = trnn.pack_padded_sequence(tx, torch.tensor(lengths), batch_first=batch_first,
                                       enforce_sorted=enforce_sorted)
        ep = ernn.pack_padded_sequence(ex, flow.tensor(lengths), batch_first=batch_first,
                                       enforce_sorted=enforce_sorted)
        _same_packed(tp, ep, dtype)
        tpad, tlen = trnn.pad_packed_sequence(tp, batch_first=batch_first, padding_value=-7.0, total_length=tl)
        epad, elen = ernn.pad_packed_sequence(ep, batch_first=batch_first, padding_value=-7.0, total_length=tl)
        assert elen.tolist() == tlen.tolist() and elen.dtype == flow.int64
        # the packed data and the padded result both carry gradients back to the input
        _backward_both([tpad, tp.data], [epad, ep.data], dtype)
        np.testing.assert_allclose(ex.grad.cpu().numpy(), tx.grad.cpu().numpy(), **TOL[dtype])


def test_pack_padded_sequence_of_integer_targets():
    y = np.arange(20).reshape(5, 4)
    tp = trnn.pack_padded_sequence(torch.tensor(y), UNSORTED[::-1], enforce_sorted=False)
    ep = ernn.pack_padded_sequence(flow.tensor(y), UNSORTED[::-1], enforce_sorted=False)
    _same_packed(tp, ep)
    assert ep.data.dtype == flow.int64
    tpad, _ = trnn.pad_packed_sequence(tp, padding_value=-1)
    epad, _ = ernn.pad_packed_sequence(ep, padding_value=-1)
    np.testing.assert_array_equal(epad.cpu().numpy(), tpad.cpu().numpy())


@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("batch_first", [False, True])
def test_pad_sequence_and_unpad_sequence(batch_first, padding_side):
    arrays = [_randn(n, 2, 3, seed=n) for n in (2, 4, 0, 3)]
    tseqs, eseqs = zip(*[_pair(a) for a in arrays])
    tout = trnn.pad_sequence(tseqs, batch_first=batch_first, padding_value=2.5, padding_side=padding_side)
    eout = ernn.pad_sequence(eseqs, batch_first=batch_first, padding_value=2.5, padding_side=padding_side)
    _backward_both([tout], [eout], "float64")
    for t, e in zip(tseqs, eseqs):
        np.testing.assert_allclose(e.grad.cpu().numpy(), t.grad.cpu().numpy(), **TOL["float64"])
    if padding_side == "right":
        lengths = [len(a) for a in arrays]
        tback = trnn.unpad_sequence(tout.detach().clone(), torch.tensor(lengths), batch_first=batch_first)
        eback = ernn.unpad_sequence(eout.detach(), flow.tensor(lengths), batch_first=batch_first)
        assert tuple(eout.shape) == tuple(tout.shape)  # the argument is not transposed in place
        for a, t, e in zip(arrays, tback, eback):
            np.testing.assert_array_equal(e.cpu().numpy(), t.cpu().numpy())
            np.testing.assert_array_equal(e.cpu().numpy(), a)


def test_pad_sequence_shapes_dtypes_and_tensor_argument():
    # 1-D sequences, one-element trailing broadcast (as torch's copy into the padded slot)
    tseqs = [torch.arange(3.0), torch.arange(1.0)]
    eseqs = [flow.arange(3.0), flow.arange(1.0)]
    np.testing.assert_array_equal(ernn.pad_sequence(eseqs).cpu().numpy(), trnn.pad_sequence(tseqs).cpu().numpy())
    t = trnn.pad_sequence([torch.ones(2, 3), torch.ones(3, 1)], batch_first=True)
    e = ernn.pad_sequence([flow.ones(2, 3), flow.ones(3, 1)], batch_first=True)
    np.testing.assert_array_equal(e.cpu().numpy(), t.cpu().numpy())
    # a Tensor is an iterable of its rows; the dtype is the first sequence's
    x = _randn(3, 4)
    np.testing.assert_array_equal(ernn.pad_sequence(flow.tensor(x)).cpu().numpy(), trnn.pad_sequence(torch.tensor(x)).cpu().numpy())
    e = ernn.pad_sequence([flow.ones(2, dtype=flow.float32), flow.ones(3, dtype=flow.float64)])
    assert trnn.pad_sequence([torch.ones(2), torch.ones(3, dtype=torch.float64)]).dtype == torch.float32
    assert e.dtype == flow.float32
    assert tuple(ernn.pad_sequence([flow.zeros(0, 3), flow.zeros(0, 3)]).shape) == (0, 2, 3)


@pytest.mark.parametrize("enforce_sorted,arrays", [(True, (5, 3, 3, 1)), (False, (3, 5, 1, 3))])
def test_pack_sequence_and_unpack_sequence(enforce_sorted, arrays):
    arrays = [_randn(n, IN, seed=n) for n in arrays]
    tseqs, eseqs = zip(*[_pair(a) for a in arrays])
    tp = trnn.pack_sequence(list(tseqs), enforce_sorted=enforce_sorted)
    ep = ernn.pack_sequence(list(eseqs), enforce_sorted=enforce_sorted)
    _same_packed(tp, ep)
    tback, eback = trnn.unpack_sequence(tp), ernn.unpack_sequence(ep)
    assert len(eback) == len(arrays)
    for a, e in zip(arrays, eback):
        np.testing.assert_array_equal(e.detach().cpu().numpy(), a)
    _backward_both(list(tback), list(eback), "float64")
    for t, e in zip(tseqs, eseqs):
        np.testing.assert_allclose(e.grad.cpu().numpy(), t.grad.cpu().numpy(), **TOL["float64"])


def test_packed_sequence_object():
    ep = ernn.pack_padded_sequence(flow.tensor(_padded_input(UNSORTED, False, "float32")), UNSORTED,
                                   enforce_sorted=False)
    data, batch_sizes, sorted_indices, unsorted_indices = ep  # a namedtuple, as torch's
    assert ep._fields == trnn.PackedSequence._fields
    assert repr(ep).startswith("PackedSequence(data=")
    assert not ep.is_cuda and ep.device.type == "cpu" and not ep.is_pinned() and ep.pin_memory() is ep
    assert ep.to(flow.float32) is ep and ep.to("cpu") is ep and ep.cpu() is ep
    d = ep.to(flow.float64)
    assert isinstance(d, ernn.PackedSequence) and d.data.dtype == flow.float64
    assert ep.double().data.dtype == flow.float64
    assert d.batch_sizes is batch_sizes and d.sorted_indices.tolist() == sorted_indices.tolist()
    assert ep.long().data.dtype == flow.int64 and ep.half().data.dtype == flow.float16
    # unsorted_indices default to the inverse permutation; ((data, batch_sizes)) is accepted
    again = ernn.PackedSequence(data, batch_sizes, sorted_indices)
    assert again.unsorted_indices.tolist() == unsorted_indices.tolist() == [1, 0, 3, 2]
    assert ernn.PackedSequence((data, batch_sizes)).sorted_indices is None
    perm = torch.tensor([2, 0, 3, 1])
    assert ernn.invert_permutation(flow.tensor([2, 0, 3, 1])).tolist() == trnn.invert_permutation(perm).tolist()
    assert ernn.invert_permutation(None) is None
    assert flow.nn.utils.rnn.pad_sequence is ernn.pad_sequence


def _same_error_and_message(run, same_message=True):
    """run(rnn_utils, lib) raises in torch; the engine raises the same type with the same message
    (the library's name aside)."""
    with pytest.raises(Exception) as texc:
        run(trnn, torch)
    with pytest.raises(type(texc.value)) as eexc:
        run(ernn, flow)
    assert type(eexc.value) is type(texc.value)
    if same_message:
        assert str(eexc.value).replace("engine.", "torch.") == str(texc.value)


RNN_UTILS_ERRORS = {
    "unsorted_with_enforce_sorted": lambda u, lib: u.pack_padded_sequence(lib.zeros(5, 4, 2), UNSORTED),
    "zero_length": lambda u, lib: u.pack_padded_sequence(lib.zeros(5, 4, 2), [5, 3, 1, 0]),
    "zero_length_unsorted": lambda u, lib: u.pack_padded_sequence(lib.zeros(5, 4, 2), [0, 3, 1, 5],
                                                                  enforce_sorted=False),
    "negative_length": lambda u, lib: u.pack_padded_sequence(lib.zeros(5, 4, 2), [-1, 3, 1, 5],
                                                             enforce_sorted=False),
    "zero_inside_unsorted_enforced": lambda u, lib: u.pack_padded_sequence(lib.zeros(5, 3, 2), [3, 0, 1]),
    "lengths_count": lambda u, lib: u.pack_padded_sequence(lib.zeros(5, 4, 2), [5, 3, 1]),
    "lengths_count_batch_first": lambda u, lib: u.pack_padded_sequence(lib.zeros(4, 5, 2), [4, 3, 1, 1, 1],
                                                                       batch_first=True),
    "lengths_2d": lambda u, lib: u.pack_padded_sequence(lib.zeros(5, 2, 2), lib.tensor([[5, 3]])),
    "empty_input": lambda u, lib: u.pack_padded_sequence(lib.zeros(0, 2, 2), [2, 1]),
    "input_1d": lambda u, lib: u.pack_padded_sequence(lib.zeros(4), [4]),
    "total_length": lambda u, lib: u.pad_packed_sequence(u.pack_padded_sequence(lib.zeros(5, 4, 2), SORTED),
                                                         total_length=4),
    "pack_sequence_unsorted": lambda u, lib: u.pack_sequence([lib.zeros(2), lib.zeros(3)]),
    "pack_sequence_empty_sequence": lambda u, lib: u.pack_sequence([lib.zeros(2), lib.zeros(0)],
                                                                   enforce_sorted=False),
    "pad_sequence_empty": lambda u, lib: u.pad_sequence([]),
    "pad_sequence_side": lambda u, lib: u.pad_sequence([lib.zeros(2)], padding_side="middle"),
    "pad_sequence_not_iterable": lambda u, lib: u.pad_sequence(5),
    "pad_sequence_trailing": lambda u, lib: u.pad_sequence([lib.zeros(2, 3), lib.zeros(3, 4)]),
    "unpad_lengths_count": lambda u, lib: u.unpad_sequence(lib.zeros(2, 3, 1), lib.tensor([2, 3, 1]),
                                                           batch_first=True),
}


@pytest.mark.parametrize("case", sorted(RNN_UTILS_ERRORS))
def test_rnn_utils_bad_input_raises_like_torch(case):
    _same_error_and_message(RNN_UTILS_ERRORS[case])


def test_rnn_utils_errors_beyond_torch():
    # torch packs a truncated data tensor whose batch_sizes claim more rows; the engine refuses
    with pytest.raises(RuntimeError, match="longer than the 4 time steps"):
        ernn.pack_padded_sequence(flow.zeros(4, 2, 1), [5, 1])
    with pytest.raises(RuntimeError, match="0-d"):
        ernn.pad_sequence([flow.tensor(1.0), flow.tensor(2.0)])
    with pytest.raises(TypeError, match="Tensors"):
        ernn.pad_sequence([[1.0, 2.0]])


def _packed_zeros(u, lib, lengths=UNSORTED, feat=IN, dtype="float32"):
    return u.pack_padded_sequence(_zeros(lib, max(lengths), len(lengths), feat, dtype=dtype), lengths,
                                  enforce_sorted=False)


@pytest.mark.parametrize("cls", ["RNN", "LSTM", "GRU"])
@pytest.mark.parametrize("case", ["input_size", "input_3d", "dtype", "hx_layers", "hx_size"])
def test_packed_sequence_layer_bad_input_raises_like_torch(cls, case):
    """torch's LSTM does not check a packed input or its states (its kernels fail instead, with
    RuntimeErrors of their own); RNN and GRU check them, and the engine checks all three alike."""
    def run(u, lib):
        m = getattr(lib.nn, cls)(IN, HID)
        if case == "input_size":
            return m(_packed_zeros(u, lib, feat=IN + 1))
        if case == "input_3d":
            p = _packed_zeros(u, lib)
            return m(u.PackedSequence(p.data[:, None], p.batch_sizes, p.sorted_indices, p.unsorted_indices))
        if case == "dtype":
            return m(_packed_zeros(u, lib, dtype="float64"))
        shape = {"hx_layers": (2, 4, HID), "hx_size": (1, 4, HID + 1)}[case]
        return m(_packed_zeros(u, lib), _hx(lib, cls, shape))

    if cls != "LSTM":
        _same_error_and_message(run)
        return
    with pytest.raises(RuntimeError):
        run(trnn, torch)
    with pytest.raises(ValueError if case == "dtype" else RuntimeError, match="dtype|input|hidden"):
        run(ernn, flow)


@pytest.mark.parametrize("cls", ["RNN", "LSTM", "GRU"])
def test_packed_sequence_hidden_batch_is_checked(cls):
    """The batch of hx must be batch_sizes[0]. torch's RNN/GRU permute hx first (a larger hx
    then passes with some rows dropped, a smaller one fails in index_select); the engine checks
    the size first, as torch's LSTM does."""
    for batch in (3, 5):
        with pytest.raises(RuntimeError, match="Expected hidden"):
            getattr(flow.nn, cls)(IN, HID)(_packed_zeros(ernn, flow), _hx(flow, cls, (1, batch, HID)))


def test_packed_sequence_of_another_library_or_into_a_cell():
    packed = torch.nn.utils.rnn.pack_padded_sequence(torch.zeros(SEQ, 2, IN), [SEQ, 2])
    for cls in ("RNN", "LSTM", "GRU"):
        with pytest.raises(TypeError, match="engine.nn.utils.rnn"):
            getattr(flow.nn, cls)(IN, HID)(packed)
    epacked = ernn.pack_padded_sequence(flow.zeros(SEQ, 2, IN), [SEQ, 2])
    for cls in ("RNNCell", "LSTMCell", "GRUCell"):
        with pytest.raises(NotImplementedError, match="PackedSequence"):
            getattr(flow.nn, cls)(IN, HID)(epacked)
