"""The engine's layers import downward only, and no module takes part in an import cycle.

    backend -> autograd -> tensor -> ops -> nn / optim / serialization -> distributed -> engine (namespace)
    and libai above all of engine; engine never imports libai.

Every `import` and `from ... import` in every module counts, deferred ones (inside functions)
included: an upward import hidden in a function is still an upward dependency. An upper layer
reaches a lower one's extension points by registering into them (e.g. engine.distributed calls
`engine.ops.op.set_global_dispatch` when it loads); see docs/engine.md "Layers".
"""
import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("engine", "libai")

# module prefix -> layer rank; the longest matching prefix decides
LAYERS = {
    "engine.backend": 0,
    "engine.kernels": 0,  # fused kernels: numpy references and CuPy launchers, beside the backend
    "engine.autograd": 1,
    "engine.tensor": 2,
    "engine.ops": 3,
    "engine.nn": 4,
    "engine.optim": 4,
    "engine.serialization": 4,
    "engine._torch_checkpoint": 4,
    "engine.utils": 4,
    "engine.amp": 4,
    "engine.distributed": 5,
    "engine": 6,  # engine/__init__.py: the public namespace, gathers every layer
    "engine.distributions": 4,
    "libai": 7,
}
LAYER_NAMES = {0: "backend", 1: "autograd", 2: "tensor", 3: "ops", 4: "nn/optim", 5: "distributed",
               6: "engine namespace", 7: "libai"}


def layer_of(module):
    best = None
    for prefix in LAYERS:
        if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > len(best)):
            best = prefix
    if best is None:
        raise KeyError(f"module {module} is in no layer: add it to LAYERS in tests/test_layering.py")
    return LAYERS[best]


def find_modules(root):
    """{module name: file path} for every .py file of the packages under `root`."""
    modules = {}
    for pkg in PACKAGES:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, pkg)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for f in filenames:
                if f.endswith(".py"):
                    path = os.path.join(dirpath, f)
                    name = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                    modules[name[: -len(".__init__")] if name.endswith(".__init__") else name] = path
    return modules


def _absolute(module, is_package, level, name):
    if not level:
        return name
    parts = module.split(".")
    if not is_package:
        parts = parts[:-1]
    parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts + ([name] if name else []))


def imports_of(module, path, modules):
    """[(imported module, line)] of every project import in the file, at any depth. `from p
    import x` counts as importing p.x when that is a module, else p."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    is_package = path.endswith("__init__.py")
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(module, is_package, node.level, node.module)
            for a in node.names:
                sub = f"{target}.{a.name}"
                found.append((sub if sub in modules else target, node.lineno))
    return [(m, line) for m, line in found if m.split(".")[0] in PACKAGES and m != module]


def import_graph(root):
    modules = find_modules(root)
    return modules, {m: imports_of(m, p, modules) for m, p in modules.items()}


def upward_imports(modules, graph):
    bad = []
    for m, deps in graph.items():
        for dep, line in deps:
            if dep not in modules and dep.split(".")[0] in PACKAGES and dep not in PACKAGES:
                bad.append(f"{modules[m]}:{line}: imports {dep}, which does not exist")
            elif layer_of(dep) > layer_of(m):
                bad.append(f"{os.path.relpath(modules[m], ROOT)}:{line}: {m} ({LAYER_NAMES[layer_of(m)]}) imports "
                           f"{dep} ({LAYER_NAMES[layer_of(dep)]}), a higher layer")
    return sorted(bad)


def import_cycles(graph):
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, cycles = {}, {}, set(), [], []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            for w, _ in it:
                if w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(graph[w])))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        cycles.append(sorted(comp))
    return cycles


def test_every_import_goes_down_the_layers():
    modules, graph = import_graph(ROOT)
    bad = upward_imports(modules, graph)
    assert not bad, "upward imports (register into a hook of the lower layer instead):\n" + "\n".join(bad)


def test_no_import_cycles():
    _, graph = import_graph(ROOT)
    cycles = import_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_engine_never_imports_libai():
    modules, graph = import_graph(ROOT)
    bad = [f"{m} imports {d}" for m, deps in graph.items() if m.startswith("engine") for d, _ in deps
           if d.split(".")[0] == "libai"]
    assert not bad, bad


# ------------------------------------------------------------------ the checker itself
def _write(root, files):
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)


def test_checker_catches_a_deferred_upward_import(tmp_path):
    _write(tmp_path, {
        "engine/__init__.py": "",
        "engine/ops/__init__.py": "",
        "engine/tensor.py": "def f():\n    from .ops import creation\n",
        "engine/ops/creation.py": "from ..tensor import f\n",
    })
    modules, graph = import_graph(str(tmp_path))
    bad = upward_imports(modules, graph)
    assert len(bad) == 1 and "engine.tensor (tensor) imports engine.ops.creation (ops)" in bad[0]
    assert import_cycles(graph) == [["engine.ops.creation", "engine.tensor"]]


def test_checker_catches_a_cycle_inside_one_layer(tmp_path):
    _write(tmp_path, {
        "engine/__init__.py": "",
        "engine/ops/__init__.py": "",
        "engine/ops/a.py": "from . import b\n",
        "engine/ops/b.py": "def g():\n    from .a import x\n",
        "engine/ops/c.py": "from .b import g\n",
    })
    modules, graph = import_graph(str(tmp_path))
    assert upward_imports(modules, graph) == []
    assert import_cycles(graph) == [["engine.ops.a", "engine.ops.b"]]


@pytest.mark.parametrize("module,layer", [("engine.ops._core", 3), ("engine.tensor", 2), ("engine", 6),
                                          ("engine.distributed.rules.linalg", 5), ("libai.engine.hooks", 7)])
def test_layer_of(module, layer):
    assert layer_of(module) == layer


# ------------------------------------------------------------------ one op, one place
def _rule_registrations(path):
    """[(ops module alias, line)] of every op an `sbp_rule(...)` call in a rules file names
    (`sbp_rule(unary.Exp)`, `sbp_rule(*concrete_ops(unary))`)."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "sbp_rule":
            for arg in node.args:
                for sub in ast.walk(arg):
                    if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name):
                        found.append((sub.value.id, node.lineno))
                    elif isinstance(sub, ast.Call) and getattr(sub.func, "id", None) == "concrete_ops":
                        found.append((sub.args[0].id, node.lineno))
    return found


def test_sbp_rules_mirror_the_op_families():
    """The rule of an op defined in engine/ops/<family>.py is registered in
    engine/distributed/rules/<family>.py, and every registered op class lives in ops/<family>."""
    import engine  # noqa: F401
    from engine.distributed.rules import registered_ops

    rules_dir = os.path.join(ROOT, "engine", "distributed", "rules")
    ops_dir = os.path.join(ROOT, "engine", "ops")
    misplaced = []
    for f in sorted(os.listdir(rules_dir)):
        if f.endswith(".py") and f not in ("__init__.py", "base.py", "patterns.py"):
            assert os.path.isfile(os.path.join(ops_dir, f)), f"rules/{f} mirrors no engine/ops/{f}"
            found = _rule_registrations(os.path.join(rules_dir, f))
            assert found, f"rules/{f} registers no rule"
            misplaced += [f"rules/{f}:{line} registers a rule for an op of ops/{alias}.py"
                          for alias, line in found if alias != f[:-3]]
    assert not misplaced, misplaced
    for op_cls in registered_ops():
        assert op_cls.__module__.startswith("engine.ops."), op_cls

