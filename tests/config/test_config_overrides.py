"""LazyConfig.apply_overrides: typed values, nested keys, +add, ~delete, errors."""
import pytest
from omegaconf import DictConfig

from libai.config import LazyCall, LazyConfig, instantiate


def _cfg():
    return DictConfig(
        {
            "train": {
                "seed": 1,
                "lr": 0.1,
                "amp": {"enabled": False},
                "output_dir": "./output",
                "load_weight": "",
                "topk": [1, 5],
                "dist": {"data_parallel_size": 1, "tensor_parallel_size": 1},
                "pipeline_num_layers": None,
            },
            "model": LazyCall(dict)(hidden_size=8),
        },
        flags={"allow_objects": True},
    )


@pytest.mark.parametrize(
    "override, key, expected",
    [
        ("train.seed=42", "seed", 42),
        ("train.lr=1e-3", "lr", 1e-3),
        ("train.lr=3", "lr", 3),
        ("train.amp.enabled=true", "amp.enabled", True),
        ("train.amp.enabled=False", "amp.enabled", False),
        ("train.pipeline_num_layers=24", "pipeline_num_layers", 24),
        ("train.seed=null", "seed", None),
        ("train.output_dir=/tmp/run_1", "output_dir", "/tmp/run_1"),
        ("train.output_dir='my dir/with spaces'", "output_dir", "my dir/with spaces"),
        ('train.output_dir="quoted, with comma"', "output_dir", "quoted, with comma"),
        ("train.load_weight='42'", "load_weight", "42"),
        ("train.topk=[1,2,3]", "topk", [1, 2, 3]),
        ("train.topk=[]", "topk", []),
        ("train.topk=[a, 'b c', 1.5, null]", "topk", ["a", "b c", 1.5, None]),
        ("train.topk.0=7", "topk", [7, 5]),
        ("train.dist.data_parallel_size=4", "dist.data_parallel_size", 4),
    ],
)
def test_typed_values(override, key, expected):
    cfg = _cfg()
    out = LazyConfig.apply_overrides(cfg, [override])
    assert out is cfg
    value = cfg.train
    for part in key.split("."):
        value = value[part]
    if isinstance(expected, list):
        assert list(value) == expected
    else:
        assert value == expected and type(value) is type(expected)


def test_several_overrides_and_lazy_node_args():
    cfg = _cfg()
    LazyConfig.apply_overrides(cfg, ["model.hidden_size=16", "train.seed=7", "train.amp={enabled:true}"])
    assert instantiate(cfg.model) == {"hidden_size": 16}
    assert cfg.train.seed == 7 and cfg.train.amp.enabled is True


def test_add_new_keys():
    cfg = _cfg()
    LazyConfig.apply_overrides(cfg, ["+new.key=1", "+train.amp.dtype=bf16", "++train.seed=5", "++train.extra=x"])
    assert cfg.new.key == 1 and cfg.train.amp.dtype == "bf16"
    assert cfg.train.seed == 5 and cfg.train.extra == "x"
    with pytest.raises(KeyError, match="already exists"):
        LazyConfig.apply_overrides(cfg, ["+train.seed=1"])


def test_delete_keys():
    cfg = _cfg()
    LazyConfig.apply_overrides(cfg, ["~train.amp", "~train.topk.0", "~train.seed=1"])
    assert "amp" not in cfg.train and list(cfg.train.topk) == [5] and "seed" not in cfg.train
    with pytest.raises(ValueError, match="cannot delete"):
        LazyConfig.apply_overrides(cfg, ["~train.lr=0.5"])
    with pytest.raises(KeyError, match="does not exist"):
        LazyConfig.apply_overrides(cfg, ["~train.nope"])


def test_unknown_key_names_close_matches():
    cfg = _cfg()
    with pytest.raises(KeyError) as info:
        LazyConfig.apply_overrides(cfg, ["train.sed=1"])
    msg = str(info.value)
    assert "'train.sed' does not exist" in msg and "train.seed" in msg and "+key=value" in msg
    with pytest.raises(KeyError, match="train.dist.data_parallel_size"):
        LazyConfig.apply_overrides(cfg, ["train.dist.data_paralel_size=2"])
    # a key in the wrong section is found by its last component
    with pytest.raises(KeyError, match="train.dist.tensor_parallel_size"):
        LazyConfig.apply_overrides(cfg, ["dist.tensor_parallel_size=2"])
    with pytest.raises(KeyError, match="is not a config node"):
        LazyConfig.apply_overrides(cfg, ["train.seed.x=2"])
    with pytest.raises(KeyError, match="does not exist"):
        LazyConfig.apply_overrides(cfg, ["train.topk.5=1"])
    assert cfg.train.seed == 1  # nothing changed


@pytest.mark.parametrize(
    "override",
    ["train.seed", "train.seed==1", "train.topk=[1,2", "=3", "train..seed=1", "train.seed='unterminated"],
)
def test_malformed_overrides(override):
    with pytest.raises(ValueError, match="malformed override"):
        LazyConfig.apply_overrides(_cfg(), [override])


def test_a_python_list_index_in_an_override_gets_the_dotted_form():
    with pytest.raises(ValueError, match=r"a list element is written with a dot: 'train\.topk\.0\.x=3'"):
        LazyConfig.apply_overrides(_cfg(), ["train.topk[0].x=3"])


def test_unsupported_overrides():
    with pytest.raises(ValueError, match="sweeps"):
        LazyConfig.apply_overrides(_cfg(), ["train.seed=1,2"])
    with pytest.raises(ValueError, match="package"):
        LazyConfig.apply_overrides(_cfg(), ["train@pkg.seed=1"])
    with pytest.raises(TypeError):
        LazyConfig.apply_overrides(_cfg(), [3])


def test_empty_and_single_string():
    cfg = _cfg()
    assert LazyConfig.apply_overrides(cfg, []) is cfg
    assert LazyConfig.apply_overrides(cfg, None) is cfg
    LazyConfig.apply_overrides(cfg, "train.seed=9")
    assert cfg.train.seed == 9


def test_interpolation_override():
    cfg = _cfg()
    LazyConfig.apply_overrides(cfg, ["train.seed=${train.dist.data_parallel_size}"])
    assert cfg.train.seed == 1
