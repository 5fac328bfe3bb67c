"""engine.save / engine.load: safetensors files, bit-exact round trips, no pickle, clear corruption errors."""
import io
import json
import os
import pathlib
import struct
from collections import OrderedDict

import numpy as np
import pytest
import torch

import engine as flow
from engine.serialization import CheckpointError


def _bits(t):
    return t.detach().numpy().tobytes()  # raw bytes: NaN payloads and -0.0 included


def _assert_same(a, b):
    """Equal structure, types, key order and bit-identical tensors."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, flow.Tensor):
        assert a.dtype is b.dtype and tuple(a.shape) == tuple(b.shape)
        assert a.requires_grad == b.requires_grad
        assert _bits(a) == _bits(b)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    elif isinstance(a, float) and np.isnan(a):
        assert np.isnan(b)
    else:
        assert a == b


def _special_floats(dtype):
    vals = np.array([0.0, -0.0, 1.5, -3.25, np.inf, -np.inf, np.nan, 1e-3, 65504.0], np.float32)
    return flow.tensor(vals).to(dtype)


@pytest.fixture
def nested():
    rng = np.random.default_rng(0)
    return {
        "model": OrderedDict([
            ("fc.weight", flow.tensor(rng.standard_normal((3, 4)).astype(np.float32))),
            ("fc.bias", flow.tensor(rng.standard_normal(3).astype(np.float32))),
        ]),
        "dtypes": {
            "bf16": _special_floats(flow.bfloat16), "f16": _special_floats(flow.float16),
            "f32": _special_floats(flow.float32), "f64": flow.tensor(rng.standard_normal(5)),
            "i64": flow.tensor([-(2**62), 0, 2**62 + 7]), "i32": flow.tensor([1, -2], dtype=flow.int32),
            "bool": flow.tensor([True, False, True]), "scalar": flow.tensor(3.5), "empty": flow.zeros(0, 4),
        },
        "optimizer": {"state": {0: {"step": 10, "exp_avg": flow.ones(2)}, 1: {}},
                      "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": [0, 1], "amsgrad": False,
                                        "name": None}]},
        "tuple": (1, 2.5, "three", [None, True]),
        "floats": [float("inf"), float("-inf"), float("nan"), -0.0, 2**70],
        "keys": {1.5: "float key", None: "none key", True: "bool key", (1, "a"): "tuple key", "": "empty"},
        "numpy": np.arange(6, dtype=np.uint64).reshape(2, 3),
        "param": flow.nn.Parameter(flow.ones(2)),
        "grad_tensor": flow.ones(3, requires_grad=True),
        "unicode ключ": "värde",
    }


def test_round_trip_is_bit_exact(tmp_path, nested):
    p = tmp_path / "ckpt.safetensors"
    flow.save(nested, p)
    out = flow.load(p)
    _assert_same(nested, out)
    assert isinstance(out["param"], flow.nn.Parameter) and out["param"].requires_grad
    assert out["dtypes"]["bf16"].device == flow.device("cpu")


def test_round_trip_non_contiguous_and_shared(tmp_path):
    base = flow.tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    view = flow.Tensor._make(base._data.T, base.device)  # a transposed (non-contiguous) view
    shared = flow.ones(3)
    flow.save({"v": view, "a": shared, "b": [shared]}, tmp_path / "x")
    out = flow.load(tmp_path / "x")
    np.testing.assert_array_equal(out["v"].numpy(), base.numpy().T)
    assert out["a"] is out["b"][0]  # one tensor saved once comes back as one tensor


def test_model_state_dict_round_trip_restores_outputs(tmp_path):
    torch.manual_seed(0)
    m = flow.nn.Sequential(flow.nn.Linear(4, 8), flow.nn.GELU(), flow.nn.LayerNorm(8), flow.nn.Linear(8, 2))
    flow.save({"model": m.state_dict(), "epoch": 3}, str(tmp_path / "m.safetensors"))
    m2 = flow.nn.Sequential(flow.nn.Linear(4, 8), flow.nn.GELU(), flow.nn.LayerNorm(8), flow.nn.Linear(8, 2))
    ck = flow.load(str(tmp_path / "m.safetensors"))
    assert ck["epoch"] == 3
    m2.load_state_dict(ck["model"])
    x = flow.tensor(np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32))
    np.testing.assert_array_equal(m(x).detach().numpy(), m2(x).detach().numpy())


def test_file_is_standard_safetensors(tmp_path):
    from safetensors.torch import load_file, save_file

    sd = OrderedDict([("w", flow.tensor([[1.0, 2.0]])), ("b", flow.tensor([1.5]).to(flow.bfloat16)),
                      ("n", flow.tensor([1, 2]))])
    flow.save(sd, tmp_path / "a")
    t = load_file(str(tmp_path / "a"))
    assert set(t) == {"w", "b", "n"}
    assert t["b"].dtype == torch.bfloat16 and t["b"].item() == 1.5 and t["n"].dtype == torch.int64
    # a file written by the safetensors library loads as an OrderedDict of tensors
    save_file({"x": torch.arange(6, dtype=torch.float32).reshape(2, 3), "h": torch.ones(2, dtype=torch.bfloat16)},
              str(tmp_path / "b"))
    out = flow.load(tmp_path / "b")
    assert list(out) == ["h", "x"] or list(out) == ["x", "h"]
    np.testing.assert_array_equal(out["x"].numpy(), np.arange(6, dtype=np.float32).reshape(2, 3))
    assert out["h"].dtype is flow.bfloat16


def test_header_layout(tmp_path):
    flow.save({"w": flow.tensor([1.0]).to(flow.bfloat16)}, tmp_path / "a")
    raw = (tmp_path / "a").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0
    header = json.loads(raw[8:8 + n])
    assert header["w"] == {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]}
    meta = header["__metadata__"]
    assert meta["format"].startswith("engine")
    assert json.loads(meta["tensors"]) == [["w", "bfloat16"]]


def test_path_like_and_file_objects(tmp_path):
    p = pathlib.Path(tmp_path) / "p.st"
    flow.save([1, flow.ones(1)], p)
    assert flow.load(p)[0] == 1
    buf = io.BytesIO()
    flow.save({"a": flow.ones(2)}, buf)
    buf.seek(0)
    np.testing.assert_array_equal(flow.load(buf)["a"].numpy(), np.ones(2, np.float32))


def test_map_location(tmp_path):
    flow.save({"a": flow.ones(2)}, tmp_path / "a")
    assert flow.load(tmp_path / "a", map_location="cpu")["a"].device == flow.device("cpu")
    if flow.cuda.is_available():
        assert flow.load(tmp_path / "a", map_location="cuda")["a"].device.type == "cuda"


def test_save_is_atomic_and_leaves_no_temp_files(tmp_path):
    p = tmp_path / "ck"
    flow.save({"v": 1}, p)
    flow.save({"v": 2}, p)
    assert flow.load(p) == {"v": 2}
    with pytest.raises(TypeError, match="cannot save"):
        flow.save({"v": 3, "bad": object()}, p)
    assert flow.load(p) == {"v": 2}  # a failed save leaves the previous checkpoint intact
    assert sorted(os.listdir(tmp_path)) == ["ck"]


def test_unsupported_objects_are_rejected_not_pickled(tmp_path):
    with pytest.raises(TypeError, match="object"):
        flow.save({"s": {1, object()}}, tmp_path / "x")
    with pytest.raises(TypeError, match="Linear"):
        flow.save(flow.nn.Linear(2, 2), tmp_path / "x")
    import engine.serialization as ser
    src = pathlib.Path(ser.__file__).read_text()
    assert "import pickle" not in src and "pickle.load" not in src


# ---------------------------------------------------------------- corruption
@pytest.fixture
def saved(tmp_path):
    p = tmp_path / "good.safetensors"
    flow.save({"model": OrderedDict(w=flow.tensor(np.arange(64, dtype=np.float32))), "step": 1}, p)
    return p


@pytest.mark.parametrize("keep", [0, 5, 8, 20, "half_header", "mid_data", -1])
def test_truncated_file_raises_clear_error(saved, keep):
    raw = saved.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    cut = {"half_header": 8 + n // 2, "mid_data": 8 + n + 100, -1: len(raw) - 1}.get(keep, keep)
    saved.write_bytes(raw[:cut])
    with pytest.raises(CheckpointError, match=str(saved.name)):
        flow.load(saved)


@pytest.mark.parametrize("mask", [0xFF, 0x01, 0x02])
def test_flipped_header_bytes_raise(saved, mask):
    """Every single flipped header byte is caught: invalid UTF-8/JSON, failed validation, or the
    header checksum (e.g. "step":1 -> "step":0 still parses)."""
    raw = bytearray(saved.read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    for pos in range(8, 8 + n):
        bad = bytearray(raw)
        bad[pos] ^= mask
        saved.write_bytes(bytes(bad))
        with pytest.raises(CheckpointError, match="good.safetensors"):
            flow.load(saved)


def test_flipped_length_and_data_bytes_raise(saved):
    raw = bytearray(saved.read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    for pos in (0, 3, 7, 8 + n, len(raw) - 1):
        bad = bytearray(raw)
        bad[pos] ^= 0x01
        saved.write_bytes(bytes(bad))
        with pytest.raises(CheckpointError, match="good.safetensors"):
            flow.load(saved)


def test_header_edited_consistently_still_checked(saved):
    """Valid JSON that lies about shapes or references is rejected, not half-loaded."""
    raw = saved.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    for mutate in (lambda h: h["model.w"].update(shape=[65]),
                   lambda h: h["model.w"].update(dtype="F64"),
                   lambda h: h["model.w"].update(data_offsets=[0, 128]),
                   lambda h: h["__metadata__"].update(structure='{"D":[["x",{"T":5}]]}'),
                   lambda h: h["__metadata__"].update(structure='{"Z":1}'),
                   lambda h: h["__metadata__"].update(tensors='[["model.w","nonsense"]]')):
        h = json.loads(json.dumps(header))
        mutate(h)
        hb = json.dumps(h).encode()
        saved.write_bytes(struct.pack("<Q", len(hb)) + hb + raw[8 + n:])
        with pytest.raises(CheckpointError, match="good.safetensors"):
            flow.load(saved)


def test_empty_and_garbage_files(tmp_path):
    p = tmp_path / "junk.bin"
    for content in (b"", b"\x00" * 3, b"hello world, not a checkpoint", struct.pack("<Q", 2) + b"[]"):
        p.write_bytes(content)
        with pytest.raises(CheckpointError, match="junk.bin"):
            flow.load(p)


def test_saved_files_get_the_usual_permissions_not_the_temp_files_private_ones(tmp_path):
    """An atomic write goes through a mkstemp file (mode 0600); the file it becomes must have the
    mode open() gives (0666 less the umask), so a checkpoint or an exported HF folder can be shared."""
    import stat

    from engine.serialization import atomic_write, current_umask

    old = os.umask(0o022)
    try:
        flow.save({"w": flow.ones(2)}, str(tmp_path / "a.safetensors"))
        atomic_write(str(tmp_path / "b.json"), [b"{}"])
        for name in ("a.safetensors", "b.json"):
            assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == 0o644
        os.umask(0o077)
        assert current_umask() == 0o077
        atomic_write(str(tmp_path / "c.json"), [b"{}"])
        assert stat.S_IMODE(os.stat(tmp_path / "c.json").st_mode) == 0o600
    finally:
        os.umask(old)
