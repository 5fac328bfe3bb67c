"""LazyConfig.load (relative imports by file path, YAML), save -> load round trips, to_py."""
import textwrap
import warnings

import pytest
from omegaconf import DictConfig, OmegaConf

from libai.config import LazyCall, LazyConfig, instantiate


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def config_tree(tmp_path):
    """tmp/base.py, tmp/configs/common/{models/net.py, train.py}, tmp/configs/exp/run.py."""
    _write(
        tmp_path / "base.py",
        """
        base = dict(seed=1, tags=["a", "b"])
        _private = dict(hidden=True)
        helper_number = 3
        """,
    )
    _write(
        tmp_path / "configs" / "common" / "models" / "net.py",
        """
        from libai.config import LazyCall
        from collections import OrderedDict
        model = LazyCall(OrderedDict)(hidden=8, layers=[1, 2])
        """,
    )
    _write(
        tmp_path / "configs" / "common" / "train.py",
        """
        train = dict(iters=10, dist=dict(dp=1))
        """,
    )
    _write(
        tmp_path / "configs" / "exp" / "run.py",
        """
        from ..common.models.net import model
        from ..common.train import train
        from ..common import train as train_module
        from ...base import base

        model.hidden = 16
        train.iters = 20
        extra = dict(module_train_iters=train_module.train.iters, base_seed=base.seed)
        """,
    )
    _write(
        tmp_path / "configs" / "top.py",
        """
        from .common.models.net import model
        from .common.train import train
        from ..base import base
        """,
    )
    return tmp_path


def test_load_relative_imports_one_level(config_tree):
    cfg = LazyConfig.load(str(config_tree / "configs" / "top.py"))
    assert isinstance(cfg, DictConfig)
    assert set(cfg.keys()) == {"model", "train", "base"}
    assert cfg.model.hidden == 8 and cfg.train.dist.dp == 1 and cfg.base.tags == ["a", "b"]
    assert instantiate(cfg.model)["hidden"] == 8


def test_load_relative_imports_two_levels_and_fresh_copies(config_tree):
    cfg = LazyConfig.load(config_tree / "configs" / "exp" / "run.py")
    assert set(cfg.keys()) == {"model", "train", "extra", "base"}
    assert cfg.model.hidden == 16 and cfg.train.iters == 20
    # every import executes the file again: the module imported separately is unmodified
    assert cfg.extra.module_train_iters == 10 and cfg.extra.base_seed == 1


def test_load_private_and_non_dict_names_are_dropped(config_tree):
    cfg = LazyConfig.load(config_tree / "base.py")
    assert list(cfg.keys()) == ["base"]


def test_load_keys(config_tree):
    path = config_tree / "configs" / "top.py"
    model = LazyConfig.load(path, keys="model")
    assert model.hidden == 8
    model, train = LazyConfig.load(path, keys=("model", "train"))
    assert train.iters == 10
    with pytest.raises(KeyError, match="did you mean"):
        LazyConfig.load(path, keys="modle")


def test_load_bad_relative_import(tmp_path):
    path = _write(tmp_path / "c.py", "from .missing import x\n")
    with pytest.raises(ImportError, match="missing.py does not exist"):
        LazyConfig.load(path)


def test_load_missing_and_unsupported_files(tmp_path):
    with pytest.raises(FileNotFoundError):
        LazyConfig.load(tmp_path / "nope.py")
    path = _write(tmp_path / "c.txt", "a")
    with pytest.raises(ValueError, match="unsupported"):
        LazyConfig.load(path)


def test_import_patch_is_removed_after_load(config_tree):
    import builtins

    before = builtins.__import__
    LazyConfig.load(config_tree / "configs" / "top.py")
    assert builtins.__import__ is before
    _write(config_tree / "bad.py", "raise RuntimeError('inside config')\n")
    with pytest.raises(RuntimeError, match="inside config"):
        LazyConfig.load(config_tree / "bad.py")
    assert builtins.__import__ is before


def test_load_yaml(tmp_path):
    path = _write(
        tmp_path / "c.yaml",
        """
        model:
          _target_: collections.OrderedDict
          hidden: 4
        train:
          lr: 0.1
          name: ${model.hidden}
        """,
    )
    cfg = LazyConfig.load(path)
    assert cfg.train.name == 4
    assert instantiate(cfg.model)["hidden"] == 4


def _build_lists(items, table):
    return {"items": items, "table": table}


def _make_cfg():
    return DictConfig(
        {
            "model": LazyCall(_build_lists)(
                items=[1, [2, 3], {"k": [4, 5]}],
                table=[LazyCall("collections.OrderedDict")(a=1), None],
            ),
            "optim": LazyCall("engine.optim.AdamW")(lr=1e-3, betas=(0.9, 0.99)),
            "train": dict(iters=5, name="run 1", flag=True, nothing=None, ref="${train.iters}"),
        },
        flags={"allow_objects": True},
    )


def test_save_load_round_trip(tmp_path):
    cfg = _make_cfg()
    path = tmp_path / "out" / "config.yaml"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing unserialisable here
        LazyConfig.save(cfg, path)
    loaded = LazyConfig.load(path)
    # the function target is stored as its dotted path; everything else is identical
    expected = OmegaConf.to_container(cfg, resolve=False)
    expected["model"]["_target_"] = f"{__name__}._build_lists"
    expected["optim"]["betas"] = [0.9, 0.99]
    assert OmegaConf.to_container(loaded, resolve=False) == expected
    assert loaded.train.ref == 5  # interpolation kept, resolves after loading
    # save of the loaded config gives the same file; instantiate gives the same objects
    path2 = tmp_path / "again.yaml"
    LazyConfig.save(loaded, path2)
    assert path2.read_text() == path.read_text()
    assert loaded == LazyConfig.load(path2)
    built = instantiate(loaded.model)
    assert built == instantiate(cfg.model)
    assert built["items"] == [1, [2, 3], {"k": [4, 5]}]


def test_a_plain_dict_root_holding_lazy_nodes_saves_their_lists(tmp_path):
    """tools/convert_checkpoint.py saves {"model": LazyCall(...)(img_size=[16, 24])}: the node's
    ListConfig was written as an "unserializable" string."""
    cfg = {"model": LazyCall(dict)(size=[16, 24], nested={"pair": (1, 2)})}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        LazyConfig.save(cfg, tmp_path / "c.yaml")
    loaded = LazyConfig.load(tmp_path / "c.yaml")
    assert instantiate(loaded.model) == {"size": [16, 24], "nested": {"pair": [1, 2]}}


def test_save_prefers_short_public_target_path(tmp_path):
    import engine as flow

    cfg = DictConfig({"optim": LazyCall(flow.optim.AdamW)(lr=0.1)}, flags={"allow_objects": True})
    LazyConfig.save(cfg, tmp_path / "c.yaml")
    assert LazyConfig.load(tmp_path / "c.yaml").optim._target_ == "engine.optim.AdamW"


def test_save_unserialisable_values(tmp_path):
    cfg = DictConfig({"a": {"obj": object(), "fn": (lambda: 1)}}, flags={"allow_objects": True})
    with pytest.raises(ValueError, match=r"a\.obj"):
        LazyConfig.save(cfg, tmp_path / "strict.yaml", strict=True)
    with pytest.warns(RuntimeWarning, match=r"a\.obj.*a\.fn|a\.fn.*a\.obj"):
        LazyConfig.save(cfg, tmp_path / "c.yaml")
    loaded = LazyConfig.load(tmp_path / "c.yaml")
    assert loaded.a.obj.startswith("<unserializable object")


def test_save_lazy_target_local_function(tmp_path):
    def local(x):
        return x

    cfg = DictConfig({"m": LazyCall(local)(x=1)}, flags={"allow_objects": True})
    with pytest.raises(ValueError, match=r"m\._target_"):
        LazyConfig.save(cfg, tmp_path / "c.yaml", strict=True)


def test_to_py_is_libai_pseudo_code():
    """LiBai's to_py text (laid out as black lays it out; the expected strings were checked
    against black 26): dotted assignments, keys sorted, targets by import path,
    interpolations resolved, call arguments kept on one line when they fit."""
    assert LazyConfig.to_py(_make_cfg()) == (
        f"cfg.model = {__name__}._build_lists(\n"
        '    items=[1, [2, 3], {"k": [4, 5]}], table=[collections.OrderedDict(a=1), None]\n'
        ")\n"
        "cfg.optim = engine.optim.AdamW(betas=[0.9, 0.99], lr=0.001)\n"
        "cfg.train.flag = True\n"
        "cfg.train.iters = 5\n"
        'cfg.train.name = "run 1"\n'
        "cfg.train.nothing = None\n"
        "cfg.train.ref = 5\n"
    )


def test_to_py_layout_of_long_values():
    cfg = DictConfig(
        {
            "m": LazyCall("pkg.Model")(
                layers=[dict(width=w, name=f"layer number {w}") for w in range(3)], act="it's", z=None
            ),
            "long_name_" * 8: "a string value that does not fit on the line",
            "q": {"s": 'say "hi"', "empty": {}},
        },
        flags={"allow_objects": True},
    )
    assert LazyConfig.to_py(cfg, prefix="c.") == (
        "c.long_name_long_name_long_name_long_name_long_name_long_name_long_name_long_name_ = (\n"
        '    "a string value that does not fit on the line"\n'
        ")\n"
        "c.m = pkg.Model(\n"
        '    act="it\'s",\n'
        "    layers=[\n"
        '        {"name": "layer number 0", "width": 0},\n'
        '        {"name": "layer number 1", "width": 1},\n'
        '        {"name": "layer number 2", "width": 2},\n'
        "    ],\n"
        "    z=None,\n"
        ")\n"
        "c.q.empty = {}\n"
        "c.q.s = 'say \"hi\"'\n"
    )


def test_load_keys_returns_any_top_level_value(tmp_path):
    """LiBai's load(file, keys): any top-level name of a .py file (a str too), dicts as DictConfig."""
    path = _write(tmp_path / "c.py", """
        name = "base"
        size = 3
        table = dict(a=1)
        _hidden = 1
        """)
    assert LazyConfig.load(path, "name") == "base"
    size, table = LazyConfig.load(path, ("size", "table"))
    assert size == 3 and isinstance(table, DictConfig) and table.a == 1
    assert list(LazyConfig.load(path).keys()) == ["table"]  # without keys: the dicts only
    with pytest.raises(KeyError, match="did you mean"):
        LazyConfig.load(path, "nmae")
    yaml_path = _write(tmp_path / "c.yaml", "x: 1\ny: {z: 2}\n")
    assert LazyConfig.load(yaml_path, "x") == 1 and LazyConfig.load(yaml_path, "y").z == 2


def test_yaml_of_a_plain_config_is_reused_only_for_the_same_config():
    """plain_to_yaml keeps the last config's YAML (a run writes one config at its start and into
    every checkpoint): equal-comparing values of other types or another key order are other YAML."""
    from omegaconf import OmegaConf

    from libai.config.lazy import plain_to_yaml

    def fresh(plain):
        return OmegaConf.to_yaml(OmegaConf.create(plain), resolve=False)

    configs = [{"a": 1, "b": {"c": [1, 2]}}, {"a": 1, "b": {"c": [1, 2]}}, {"a": 1.0, "b": {"c": [1, 2]}},
               {"a": True, "b": {"c": [1, 2]}}, {"b": {"c": [1, 2]}, "a": True}, {"a": 0.0}, {"a": -0.0},
               {"a": "1"}, {"a": 1, "b": {"c": [1, 2]}}]
    texts = [plain_to_yaml(p) for p in configs]
    assert texts == [fresh(p) for p in configs]
    assert len({texts[i] for i in (0, 2, 3, 4, 5, 6, 7)}) == 7


def test_a_value_the_saved_yaml_could_not_hold_is_named_when_instantiated(tmp_path):
    """A function defined in a config file is saved as a placeholder string; building from the
    saved config.yaml names the key instead of failing later with "'str' object is not callable"."""
    import warnings

    from libai.config import InstantiationError, LazyCall, instantiate

    def local_collate(batch):
        return batch

    cfg = OmegaConf.create({"loader": LazyCall(dict)(collate_fn=local_collate, size=3)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        LazyConfig.save(cfg, str(tmp_path / "config.yaml"))
    back = LazyConfig.load(str(tmp_path / "config.yaml"))
    with pytest.raises(InstantiationError, match=r"config node 'loader.collate_fn' holds '<unserializable function"):
        instantiate(back.loader)
