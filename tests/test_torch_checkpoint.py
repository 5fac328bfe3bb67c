"""engine.load on files written by torch.save: zip and legacy formats, identical values, shared
storages, and no code from the file ever run (malicious pickles are refused, their side effect
never happens)."""
import io
import os
import pickle
import zipfile
from collections import OrderedDict

import numpy as np
import pytest
import torch

import engine as flow
from engine import _torch_checkpoint as tc
from engine.serialization import CheckpointError

FORMATS = [True, False]  # torch.save's _use_new_zipfile_serialization: zip, legacy
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int16, torch.int32,
           torch.int64, torch.uint8, torch.bool]


def _save(obj, path, zip_format=True):
    torch.save(obj, path, _use_new_zipfile_serialization=zip_format)
    return path


def _torch_load(path, **kw):
    """The oracle (our own files: torch's weights_only allowlist would refuse e.g. b"")."""
    return torch.load(path, weights_only=False, **kw)


def _bytes_of(t):
    """Raw bytes of a torch tensor's values in row-major order (bf16 included)."""
    t = t.detach().contiguous().reshape(-1)
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def _assert_same(e, t, where="object"):
    """The engine object `e` is what torch loads as `t`: same structure, types, key order, dtypes
    and bit-identical tensor values."""
    if isinstance(t, torch.Tensor):
        assert isinstance(e, flow.Tensor), where
        assert isinstance(e, flow.nn.Parameter) == isinstance(t, torch.nn.Parameter), where
        assert e.dtype.name == str(t.dtype).replace("torch.", ""), (where, e.dtype, t.dtype)
        assert tuple(e.shape) == tuple(t.shape), where
        assert e.requires_grad == t.requires_grad, where
        assert np.ascontiguousarray(e.detach().numpy()).tobytes() == _bytes_of(t), where
    elif isinstance(t, torch.dtype):
        assert e is getattr(flow, str(t).replace("torch.", "")), where
    elif isinstance(t, torch.device):
        assert isinstance(e, flow.device) and str(e) == str(t), where
    elif isinstance(t, torch.Size):
        assert isinstance(e, flow.Size) and tuple(e) == tuple(t), where
    elif isinstance(t, dict):
        assert type(e) is type(t) and list(e) == list(t), where
        for k in t:
            _assert_same(e[k], t[k], f"{where}/{k}")
    elif isinstance(t, (list, tuple)):
        assert type(e) is type(t) and len(e) == len(t), where
        for i, (a, b) in enumerate(zip(e, t)):
            _assert_same(a, b, f"{where}/{i}")
    else:
        assert type(e) is type(t) and (e == t or (isinstance(t, float) and np.isnan(t) and np.isnan(e))), where


def _random(shape, dtype, gen):
    if dtype is torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=gen, dtype=torch.float64) * 100).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, shape, generator=gen, dtype=torch.int64).to(dtype)


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(0)


@pytest.mark.parametrize("zip_format", FORMATS)
def test_state_dict_of_every_dtype_loads_identically(tmp_path, gen, zip_format):
    sd = OrderedDict()
    for dt in _DTYPES:
        name = str(dt).replace("torch.", "")
        sd[f"{name}.w"] = _random((3, 5), dt, gen)
        sd[f"{name}.scalar"] = _random((), dt, gen)
        sd[f"{name}.empty"] = _random((0, 4), dt, gen)
        sd[f"{name}.odd"] = _random((7, 1, 3), dt, gen)
    sd["special"] = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-45, 65504.0])
    path = _save(sd, tmp_path / "sd.pt", zip_format)
    _assert_same(flow.load(path), _torch_load(path))


@pytest.mark.parametrize("zip_format", FORMATS)
def test_views_and_shared_storages(tmp_path, gen, zip_format):
    base = torch.randn(6, 8, generator=gen)
    col = torch.randn(4, 1, generator=gen)
    sd = {
        "base": base, "t": base.t(), "slice": base[1:5, 2:7], "step": base[::2, 1::3], "row": base[3],
        "expanded": col.expand(4, 5), "flat_tail": base.reshape(-1)[40:], "tied": base,
        "narrow_bf16": base.to(torch.bfloat16)[:, 3],
    }
    path = _save(sd, tmp_path / "views.pt", zip_format)
    e, t = flow.load(path), _torch_load(path)
    _assert_same(e, t)
    for k in ("t", "slice", "step", "row", "flat_tail"):  # views of one storage share memory, as in torch
        assert np.shares_memory(e[k]._data, e["base"]._data), k
    assert e["tied"] is e["base"] and t["tied"] is t["base"]
    assert not e["expanded"]._data.flags.writeable or not np.shares_memory(e["expanded"]._data, e["base"]._data)
    e["base"].detach()._data[1, 2] = 123.0  # writing through one view shows in the others (torch does the same)
    assert e["slice"].detach().numpy()[0, 0] == 123.0 and e["t"].detach().numpy()[2, 1] == 123.0


@pytest.mark.parametrize("zip_format", FORMATS)
def test_nested_containers_and_python_values(tmp_path, gen, zip_format):
    obj = {
        "ints": [1, -2, 2**70, 0], "floats": (1.5, float("nan"), -0.0), "strs": {"a": "b", "ü": "ß"},
        "none": None, "flags": [True, False], "bytes": b"\x00\xffabc", "empty_bytes": b"", "set": {1, 2, 3},
        "frozen": frozenset({"x"}), "complex": 1 + 2j, "bytearray": bytearray(b"xy"),
        "nested": OrderedDict([("deeper", {3: [torch.arange(5), {"x": torch.ones(2, 2)}]}), ("k", 7)]),
        "dtype": torch.bfloat16, "size": torch.Size([2, 3]), "device": torch.device("cpu"),
        "cuda_device": torch.device("cuda", 1), "int_keys": {0: "a", 1.5: "b", (1, 2): "c"},
    }
    path = _save(obj, tmp_path / "nested.pt", zip_format)
    e, t = flow.load(path), _torch_load(path)
    _assert_same(e, t)


def _tiny_gpt(gen_seed=0):
    torch.manual_seed(gen_seed)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = torch.nn.LayerNorm(8)
            self.attn = torch.nn.Linear(8, 24)
            self.register_buffer("bias", torch.tril(torch.ones(5, 5)).view(1, 1, 5, 5))

    class GPT(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = torch.nn.Embedding(11, 8)
            self.h = torch.nn.ModuleList([Block(), Block()])
            self.lm_head = torch.nn.Linear(8, 11, bias=False)
            self.lm_head.weight = self.wte.weight  # weight tying, as nanoGPT and GPT-2 do

    return GPT()


def _nanogpt_checkpoint():
    model = _tiny_gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)
    loss = model.lm_head(model.h[0].ln(model.wte(torch.tensor([[1, 2, 3]])))).square().mean()
    loss.backward()
    opt.step()
    model_args = dict(n_layer=2, n_head=2, n_embd=8, block_size=5, bias=True, vocab_size=11, dropout=0.0)
    config = {"out_dir": "out", "eval_interval": 2000, "learning_rate": 6e-4, "decay_lr": True,
              "dataset": "openwebtext", "dtype": "bfloat16", "compile": False}
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "model_args": model_args,
            "iter_num": 5, "best_val_loss": torch.tensor(3.25), "config": config}


@pytest.mark.parametrize("zip_format", FORMATS)
def test_nanogpt_checkpoint(tmp_path, zip_format):
    path = _save(_nanogpt_checkpoint(), tmp_path / "ckpt.pt", zip_format)
    e, t = flow.load(path, map_location="cpu"), _torch_load(path, map_location="cpu")
    _assert_same(e, t)
    sd = e["model"]
    assert np.shares_memory(sd["wte.weight"]._data, sd["lm_head.weight"]._data)  # tied weights stay tied
    assert e["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.95)
    assert set(e["optimizer"]["state"]) == set(t["optimizer"]["state"])  # int keys
    assert sd._metadata == t["model"]._metadata  # the state_dict's module versions, as torch keeps them


def test_parameters_and_requires_grad(tmp_path, gen):
    obj = {"p": torch.nn.Parameter(torch.randn(3, generator=gen)),
           "frozen": torch.nn.Parameter(torch.randn(2, generator=gen), requires_grad=False),
           "leaf": torch.randn(2, generator=gen).requires_grad_(), "plain": torch.zeros(1)}
    path = _save(obj, tmp_path / "params.pt")
    e = flow.load(path)
    _assert_same(e, _torch_load(path))
    assert isinstance(e["p"], flow.nn.Parameter) and e["p"].requires_grad
    assert isinstance(e["frozen"], flow.nn.Parameter) and not e["frozen"].requires_grad


def test_module_state_dict_loads_into_engine_module(tmp_path):
    tm = torch.nn.Linear(5, 3)
    path = _save(tm.state_dict(), tmp_path / "pytorch_model.bin")
    em = flow.nn.Linear(5, 3)
    em.load_state_dict(flow.load(path))
    x = np.random.default_rng(0).standard_normal((2, 5)).astype(np.float32)
    np.testing.assert_allclose(em(flow.tensor(x)).detach().numpy(), tm(torch.tensor(x)).detach().numpy(),
                               rtol=1e-6, atol=1e-6)


def test_file_objects_mmap_and_map_location(tmp_path, gen):
    sd = {"w": torch.randn(4, 3, generator=gen), "i": torch.arange(6, dtype=torch.int32).view(2, 3).t()}
    path = _save(sd, tmp_path / "m.pt")
    t = _torch_load(path)
    _assert_same(flow.load(io.BytesIO(path.read_bytes())), t)
    with open(path, "rb") as f:
        _assert_same(flow.load(f), t)
    for loc in ("cpu", flow.device("cpu"), None):
        _assert_same(flow.load(str(path), map_location=loc), t)
    mapped = flow.load(path, mmap=True)
    _assert_same(mapped, t)
    mapped["w"].detach()._data[0, 0] = 7.0  # copy-on-write: the file is not changed
    _assert_same(flow.load(path), t)
    with pytest.raises(ValueError, match="mmap=True needs the path"):
        flow.load(io.BytesIO(path.read_bytes()), mmap=True)
    legacy = _save(sd, tmp_path / "legacy.pt", zip_format=False)
    with pytest.raises(ValueError, match="legacy"):
        flow.load(legacy, mmap=True)
    with pytest.raises(NotImplementedError, match="never executes code"):
        flow.load(path, weights_only=False)
    _assert_same(flow.load(path, map_location={"cuda:0": "cpu"}), t)
    _assert_same(flow.load(path, map_location=lambda storage, loc: storage), t)
    with pytest.raises(TypeError, match="map_location of type int"):
        flow.load(path, map_location=0)
    if not flow.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            flow.load(path, map_location="cuda:0")


def test_big_endian_byteorder_record(tmp_path, gen):
    """A zip written on a big-endian machine says so in `byteorder`: values are swapped on load."""
    sd = {dt: _random((3, 4), dt, gen) for dt in (torch.float32, torch.float64, torch.bfloat16, torch.int16,
                                                   torch.int64, torch.bool)}
    sd = {str(k): v for k, v in sd.items()}
    src = _save(sd, tmp_path / "le.pt")
    dst = tmp_path / "be.pt"
    # torch numbers storages in pickling order (the dict's order): record key -> element size
    sizes = {str(i): t.element_size() for i, t in enumerate(sd.values())}
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info)
            prefix, _, rest = info.filename.partition("/")
            if rest == "byteorder":
                data = b"big"
            elif rest.startswith("data/") and rest[5:] in sizes:
                size = sizes[rest[5:]]
                data = np.frombuffer(data, dtype=f"<u{size}").astype(f">u{size}").tobytes() if size > 1 else data
            zout.writestr(info.filename, data)
    _assert_same(flow.load(dst), _torch_load(src))


# ------------------------------------------------------------------ refusing code
class _System:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


class _Eval:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return eval, (f"open({str(self.marker)!r}, 'w').close()",)


class _Custom:  # an ordinary class: its global is refused like any other
    def __init__(self):
        self.x = 1


@pytest.mark.parametrize("zip_format", FORMATS)
@pytest.mark.parametrize("evil, refused", [(_System, ("posix.system", "os.system")), (_Eval, ("builtins.eval",))])
def test_malicious_pickles_are_refused_and_not_executed(tmp_path, zip_format, evil, refused):
    marker = tmp_path / "pwned"
    path = _save({"w": torch.ones(2), "payload": evil(marker)}, tmp_path / "evil.pt", zip_format)
    with pytest.raises(CheckpointError) as info:
        flow.load(path)
    assert any(r in str(info.value) for r in refused), str(info.value)
    assert "refuses" in str(info.value)
    assert not marker.exists()


def test_other_globals_are_refused_by_name(tmp_path):
    path = _save({"obj": _Custom()}, tmp_path / "custom.pt")
    with pytest.raises(CheckpointError, match=r"test_torch_checkpoint\._Custom"):
        flow.load(path)
    path = _save({"np": np.float64(1.5)}, tmp_path / "numpy.pt")
    with pytest.raises(CheckpointError, match="numpy"):
        flow.load(path)
    path = _save({"z": torch.zeros(2, dtype=torch.complex64)}, tmp_path / "complex.pt")
    with pytest.raises(CheckpointError, match="ComplexFloatStorage"):
        flow.load(path)


class _TensorWithState:
    """Pickles as a real tensor rebuild followed by a BUILD opcode that sets attributes on it."""

    def __init__(self, t):
        self.t = t

    def __reduce__(self):
        return (torch._utils._rebuild_tensor_v2,
                (self.t._typed_storage(), 0, (2,), (1,), False, OrderedDict()), {"evil": 1})


def test_state_injected_into_a_tensor_is_refused(tmp_path):
    path = _save({"t": _TensorWithState(torch.ones(2))}, tmp_path / "state.pt")
    with pytest.raises(CheckpointError, match="extra state"):
        flow.load(path)


def _craft_zip(path, pkl, records=()):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/byteorder", "little")
        for name, data in records:
            z.writestr(f"archive/data/{name}", data)
    return path


def test_hand_made_pickles_are_checked(tmp_path):
    """data.pkl written by hand: views past their storage, short or missing records, other globals."""

    def pid_pickle(size, stride, offset, storage_bytes):
        st = object()

        class P(pickle.Pickler):
            def persistent_id(self, obj):
                return ("storage", torch.FloatStorage, "0", "cpu", len(storage_bytes) // 4) if obj is st else None

        f = io.BytesIO()

        class R:
            def __reduce__(self):
                return torch._utils._rebuild_tensor_v2, (st, offset, size, stride, False, OrderedDict())

        P(f, protocol=2).dump({"x": R()})
        return f.getvalue()

    data = np.arange(6, dtype="<f4").tobytes()
    ok = _craft_zip(tmp_path / "ok.pt", pid_pickle((2, 3), (3, 1), 0, data), [("0", data)])
    np.testing.assert_array_equal(flow.load(ok)["x"].numpy(), np.arange(6, dtype=np.float32).reshape(2, 3))
    far = _craft_zip(tmp_path / "far.pt", pid_pickle((2, 3), (3, 1), 1, data), [("0", data)])
    with pytest.raises(CheckpointError, match="reaches element 6"):
        flow.load(far)
    short = _craft_zip(tmp_path / "short.pt", pid_pickle((2, 3), (3, 1), 0, data), [("0", data[:-4])])
    with pytest.raises(CheckpointError, match="has 20 bytes"):
        flow.load(short)
    missing = _craft_zip(tmp_path / "missing.pt", pid_pickle((2, 3), (3, 1), 0, data))
    with pytest.raises(CheckpointError, match="missing"):
        flow.load(missing)
    getattr_pkl = b"\x80\x02c__builtin__\ngetattr\nq\x00."
    with pytest.raises(CheckpointError, match="builtins.getattr"):
        flow.load(_craft_zip(tmp_path / "getattr.pt", getattr_pkl))


# ------------------------------------------------------------------ broken files
@pytest.mark.parametrize("zip_format", FORMATS)
def test_truncated_files_raise_a_clear_error(tmp_path, gen, zip_format):
    path = _save({"w": torch.randn(64, 64, generator=gen)}, tmp_path / "t.pt", zip_format)
    data = path.read_bytes()
    for cut in (len(data) // 2, len(data) - 30, 40):
        bad = tmp_path / f"cut{cut}.pt"
        bad.write_bytes(data[:cut])
        with pytest.raises(CheckpointError, match="truncated or corrupted"):
            flow.load(bad)


def test_corrupted_record_fails_its_crc(tmp_path, gen):
    path = _save({"w": torch.randn(16, generator=gen)}, tmp_path / "c.pt")
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as z:
        info = z.getinfo(next(n for n in z.namelist() if n.endswith("data/0")))
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    data[start + 5] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="CRC32"):
        flow.load(path)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit, used only to make an archive
def test_other_formats_get_clear_errors(tmp_path):
    plain = tmp_path / "plain.pkl"
    plain.write_bytes(pickle.dumps({"a": 1}, protocol=4))
    with pytest.raises(CheckpointError, match="plain pickle"):
        flow.load(plain)
    script = tmp_path / "script.pt"
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), str(script))
    with pytest.raises(CheckpointError, match="TorchScript"):
        flow.load(script)
    other_zip = tmp_path / "other.zip"
    with zipfile.ZipFile(other_zip, "w") as z:
        z.writestr("readme.txt", "hello")
    with pytest.raises(CheckpointError, match="not a torch.save checkpoint"):
        flow.load(other_zip)


def test_engine_files_still_load_and_report_corruption(tmp_path):
    path = tmp_path / "e.safetensors"
    flow.save({"w": flow.ones(3)}, path)
    np.testing.assert_array_equal(flow.load(path)["w"].numpy(), np.ones(3, np.float32))
    data = path.read_bytes()
    (tmp_path / "cut").write_bytes(data[:-3])
    with pytest.raises(CheckpointError, match="truncated or corrupted"):
        flow.load(tmp_path / "cut")
    assert tc.detect(path)[0] is None and tc.detect(io.BytesIO(data))[0] is None


def test_detection_of_file_objects_keeps_their_position(tmp_path, gen):
    path = _save({"w": torch.randn(3, generator=gen)}, tmp_path / "p.pt")
    f = io.BytesIO(b"junk" + path.read_bytes())
    f.seek(4)
    kind, same = tc.detect(f)
    assert kind == "zip" and same is f and f.tell() == 4
