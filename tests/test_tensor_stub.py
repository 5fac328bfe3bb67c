"""engine/tensor.pyi lists every Tensor attribute with the file that defines it, and stays in sync
with the runtime class (regenerate with `python tools/gen_tensor_stub.py`)."""
import ast
import importlib.util
import os

import engine

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STUB = os.path.join(ROOT, "engine", "tensor.pyi")


def _generator():
    spec = importlib.util.spec_from_file_location("gen_tensor_stub", os.path.join(ROOT, "tools", "gen_tensor_stub.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _stub_tensor_members():
    """{member name: the '# ---- file' group it is listed under} of class Tensor in the stub."""
    text = open(STUB).read()
    tree = ast.parse(text)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Tensor")
    lines = text.splitlines()
    members = {}
    for node in cls.body:
        name = node.name if isinstance(node, ast.FunctionDef) else node.target.id
        group = next(lines[i].split("# ---- ")[1] for i in range(node.lineno - 1, cls.lineno - 1, -1)
                     if "# ---- " in lines[i])
        members[name] = group
    return members


def test_stub_is_generated_from_the_runtime_class():
    assert open(STUB).read() == _generator().render(), \
        "engine/tensor.pyi is out of date: run `python tools/gen_tensor_stub.py`"


def test_every_tensor_attribute_is_in_the_stub():
    skip = {"__module__", "__dict__", "__weakref__", "__doc__", "__slots__"}
    runtime = {name for name in vars(engine.Tensor) if name not in skip}
    listed = set(_stub_tensor_members())
    assert runtime - listed == set(), "missing from the stub"
    assert listed - runtime == set(), "in the stub but not on Tensor"
    assert len(runtime) > 250


def test_stub_names_the_file_that_defines_each_method():
    members = _stub_tensor_members()
    assert members["softmax"] == "engine/ops/softmax.py"
    assert members["add"] == members["__add__"] == members["pow"] == "engine/ops/elementwise.py"
    assert members["eq"] == members["__eq__"] == "engine/ops/comparison.py"
    assert members["to_global"] == members["placement"] == "engine/distributed/global_tensor.py"
    assert members["backward"] == "engine/tensor.py"
    for name, group in members.items():
        assert os.path.isfile(os.path.join(ROOT, group)), (name, group)


def test_a_method_added_at_runtime_makes_the_stub_stale():
    def fresh_method(self, k=2):
        return self

    engine.Tensor.fresh_method = fresh_method
    try:
        text = _generator().render()
    finally:
        del engine.Tensor.fresh_method
    assert "    def fresh_method(self, k=2): ..." in text
    assert text != open(STUB).read()
