"""LazyCall / instantiate: recursion, _recursive_=False, dotted targets, error paths, LiBai's lazy
targets, namedtuples and dataclasses."""
import collections
import dataclasses
import functools
from collections import OrderedDict

import pytest
from omegaconf import DictConfig, ListConfig, OmegaConf

from libai.config import InstantiationError, LazyCall, instantiate, locate


class Point:
    def __init__(self, x=0, y=0):
        self.x, self.y = x, y


class Holder:
    def __init__(self, child=None, items=None, raw=None):
        self.child, self.items, self.raw = child, items, raw


def add(a, b):
    return a + b


def fail(**kwargs):
    raise RuntimeError("boom")


def test_lazycall_is_dictconfig_with_target():
    cfg = LazyCall(Point)(x=1, y=2)
    assert isinstance(cfg, DictConfig)
    assert cfg._target_ is Point
    assert cfg.x == 1 and cfg.y == 2
    assert LazyCall("collections.OrderedDict")(a=1)._target_ == "collections.OrderedDict"


def test_lazycall_rejects_bad_targets():
    with pytest.raises(TypeError):
        LazyCall(3)
    with pytest.raises(ValueError):
        LazyCall("")
    with pytest.raises(TypeError):
        LazyCall(Point)(_target_=1)


def test_instantiate_simple_and_function():
    p = instantiate(LazyCall(Point)(x=1, y=2))
    assert isinstance(p, Point) and (p.x, p.y) == (1, 2)
    assert instantiate(LazyCall(add)(a=2, b=3)) == 5


def test_instantiate_recursive_nested_lists_and_dicts():
    cfg = LazyCall(Holder)(
        child=LazyCall(Point)(x=LazyCall(add)(a=1, b=1)),
        items=[LazyCall(Point)(x=i) for i in range(3)] + [7],
        raw=dict(a=1, b=[1, 2]),
    )
    h = instantiate(cfg)
    assert isinstance(h.child, Point) and h.child.x == 2
    assert isinstance(h.items, list) and [p.x for p in h.items[:3]] == [0, 1, 2] and h.items[3] == 7
    # a plain mapping without LazyCall inside is passed on unchanged (DictConfig)
    assert isinstance(h.raw, DictConfig) and h.raw.a == 1


def test_lists_become_python_lists():
    out = instantiate(LazyCall(dict)(betas=(0.9, 0.999)))
    assert out["betas"] == [0.9, 0.999] and type(out["betas"]) is list


def test_instantiate_top_level_containers():
    lst = instantiate(ListConfig([LazyCall(add)(a=1, b=2), 3]))
    assert lst == [3, 3]
    assert instantiate([LazyCall(add)(a=1, b=2)]) == [3]
    assert instantiate({"k": LazyCall(add)(a=1, b=2)}) == {"k": 3}
    plain = DictConfig({"a": 1, "b": {"c": 2}})
    assert instantiate(plain) is plain  # non-LazyCall dicts are returned as they are
    mixed = instantiate(DictConfig({"m": LazyCall(add)(a=1, b=1), "n": 1}, flags={"allow_objects": True}))
    assert mixed == {"m": 2, "n": 1}
    assert instantiate(5) == 5 and instantiate(None) is None


def test_plain_dict_lazy_node_and_dict_target():
    assert instantiate({"_target_": add, "a": 1, "b": 2}) == 3
    od = instantiate(LazyCall(OrderedDict)(a=1))
    assert isinstance(od, OrderedDict) and od["a"] == 1


def test_recursive_false_passes_children_uninstantiated():
    cfg = LazyCall(Holder)(child=LazyCall(Point)(x=1), items=[LazyCall(Point)(x=2)], _recursive_=False)
    h = instantiate(cfg)
    assert isinstance(h.child, DictConfig) and h.child._target_ is Point
    assert isinstance(h.items, ListConfig)
    # the child can be built later
    assert instantiate(h.child).x == 1


def test_dotted_string_targets():
    assert instantiate({"_target_": "fractions.Fraction", "numerator": 2, "denominator": 4}) == 0.5
    assert instantiate(LazyCall("collections.OrderedDict")(a=1)) == OrderedDict(a=1)
    opt_cls = instantiate(LazyCall("libai.config.locate")(path="engine.optim.AdamW"))
    assert opt_cls.__name__ == "AdamW"
    assert locate("engine.optim.AdamW").__name__ == "AdamW"
    assert locate("os.path.join") is __import__("os").path.join


def test_locate_errors():
    with pytest.raises(ImportError, match="no module named 'no_such_module_xyz'"):
        locate("no_such_module_xyz.f")
    with pytest.raises(ImportError, match="has no attribute 'nope'"):
        locate("collections.nope")
    with pytest.raises(ImportError):
        locate("not a path")


def test_error_names_node_path_and_target():
    cfg = DictConfig(
        {"model": {"encoder": LazyCall(Holder)(child=LazyCall(fail)(v=1))}},
        flags={"allow_objects": True},
    )
    with pytest.raises(InstantiationError) as info:
        instantiate(cfg.model.encoder)
    msg = str(info.value)
    assert "model.encoder.child" in msg and "fail" in msg and "boom" in msg
    assert info.value.path == "model.encoder.child"
    assert isinstance(info.value.__cause__, RuntimeError)


def test_error_for_bad_kwargs_and_unknown_dotted_target():
    cfg = DictConfig({"a": [LazyCall(Point)(z=1)]}, flags={"allow_objects": True})
    with pytest.raises(InstantiationError, match=r"a\[0\].*Point.*TypeError"):
        instantiate(cfg)
    with pytest.raises(InstantiationError, match="nope_mod.X"):
        instantiate(LazyCall("nope_mod.X")())


def test_error_for_missing_value():
    cfg = OmegaConf.create({"_target_": "operator.add", "a": "???", "b": 1})
    with pytest.raises(InstantiationError, match="<root>"):
        instantiate(cfg)


def test_interpolation_resolved_against_root():
    cfg = DictConfig(
        {"size": 4, "p": LazyCall(Point)(x="${size}")}, flags={"allow_objects": True}
    )
    assert instantiate(cfg.p).x == 4


def test_overrides_replace_top_level_arguments():
    cfg = LazyCall(Holder)(child=LazyCall(fail)(), items=[1])
    marker = object()
    h = instantiate(cfg, child=marker)  # the failing child is never built
    assert h.child is marker and h.items == [1]
    h = instantiate(cfg, child=LazyCall(Point)(x=9))
    assert h.child.x == 9
    with pytest.raises(TypeError):
        instantiate(DictConfig({"a": 1}), a=2)


def test_object_values_kept_by_identity():
    obj = object()
    cfg = LazyCall(Holder)(child=None)
    cfg.child = obj
    assert instantiate(cfg).child is obj


# ---------------------------------------------------------------------- LiBai's semantics
def test_instantiate_recursive_false_keyword_is_not_forwarded():
    cfg = LazyCall(Holder)(child=LazyCall(Point)(x=1), items=[LazyCall(Point)(x=2)])
    h = instantiate(cfg, _recursive_=False)
    assert isinstance(h.child, DictConfig) and isinstance(h.items, ListConfig)
    h = instantiate(cfg, _recursive_=True)
    assert isinstance(h.child, Point) and h.items[0].x == 2
    # on a list: each element's target gets its arguments unbuilt
    out = instantiate([LazyCall(Holder)(child=LazyCall(Point)(x=3))], _recursive_=False)
    assert isinstance(out[0].child, DictConfig)
    # an override given with _recursive_=False is passed as it is too
    h = instantiate(cfg, _recursive_=False, child=LazyCall(Point)(x=5))
    assert isinstance(h.child, DictConfig) and h.child.x == 5
    for bad in ("no", 1):
        with pytest.raises(TypeError, match="_recursive_"):
            instantiate(cfg, _recursive_=bad)
    with pytest.raises(TypeError, match="config node '<root>': _recursive_ must be a bool, got 'no'"):
        instantiate(LazyCall(Holder)(_recursive_="no"))


def test_lazy_target_and_namedtuple_and_dataclass():
    make_adder = LazyCall(functools_partial)(func=add, a=10)
    assert instantiate(LazyCall(make_adder)(b=5)) == 15
    Pair = collections.namedtuple("Pair", ["a", "b"])
    got = instantiate(LazyCall(Holder)(child=Pair(LazyCall(add)(a=1, b=1), 3))).child
    assert type(got) is Pair and got == Pair(2, 3)
    # OmegaConf stores a plain tuple as a list (a namedtuple as the object it is)
    assert instantiate(LazyCall(Holder)(child=(1, LazyCall(add)(a=1, b=2)))).child == [1, 3]
    assert instantiate({"_target_": Holder, "child": (1, LazyCall(add)(a=1, b=2))}).child == (1, 3)

    cfg = LazyCall(Span)(lo=1, hi=3)
    assert cfg._target_ == f"{__name__}.Span"  # OmegaConf would turn the class into a config
    assert instantiate(cfg) == Span(1, 3)

    @dataclasses.dataclass
    class Local:
        x: int

    with pytest.raises(TypeError, match="define it at module level"):
        LazyCall(Local)(x=1)
    with pytest.raises(TypeError, match="must be a LazyCall node"):
        LazyCall({"a": 1})


def functools_partial(func, **kwargs):
    return functools.partial(func, **kwargs)


@dataclasses.dataclass
class Span:
    lo: int
    hi: int
