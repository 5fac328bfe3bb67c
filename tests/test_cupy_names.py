"""Every CuPy name the engine uses exists in the real CuPy wheel, and the strict double exposes
exactly the real wheel's names (the wheel installs and imports without a GPU).

The real wheel is imported in a subprocess: in this process `cupy` may be the double
(ENGINE_CUPY_DOUBLE=1).
"""
import json
import keyword
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.dirname(os.path.abspath(__file__))

# `xp` is the array module of the data at hand (numpy or CuPy); the others name CuPy itself
_USE = re.compile(r"\b(xp|cp|cupy|_cupy|cupyx)\.([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")
# names used only where xp is known to be numpy (the CPU branch of a kernel), with the reason
CPU_ONLY = {}


def _engine_uses():
    """{dotted CuPy name: first 'file:line' using it} over engine/ and libai/."""
    uses = {}
    for top in ("engine", "libai"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if not f.endswith(".py"):
                    continue
                path = os.path.join(dirpath, f)
                with open(path) as fh:
                    for lineno, line in enumerate(fh, 1):
                        for mod, chain in _USE.findall(line.split("#")[0]):
                            if keyword.iskeyword(chain.split(".")[0]):
                                continue  # no Python attribute: PTX text such as `cp.async` in a kernel
                            root = "cupyx" if mod == "cupyx" else "cupy"
                            uses.setdefault(f"{root}.{chain}", f"{os.path.relpath(path, ROOT)}:{lineno}")
    return uses


_PROBE = r"""
import importlib, json, sys
import cupy
names = json.loads(sys.stdin.read())
missing = []
for name in names:
    parts = name.split(".")
    obj = importlib.import_module(parts[0])
    for i, p in enumerate(parts[1:], 1):
        try:
            obj = getattr(obj, p)
        except AttributeError:
            try:
                obj = importlib.import_module(".".join(parts[: i + 1]))
            except ImportError:
                missing.append(name)
                break
print(json.dumps({"version": cupy.__version__, "missing": missing}))
"""


def _real_cupy(names):
    """Ask the real CuPy wheel (in a clean subprocess) which of `names` it lacks."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ENGINE_CUPY_DOUBLE")}
    proc = subprocess.run([sys.executable, "-c", _PROBE], input=json.dumps(sorted(names)), env=env,
                          capture_output=True, text=True, cwd="/")
    if proc.returncode != 0 and "No module named 'cupy'" in proc.stderr:
        pytest.fail("the real cupy-cuda12x wheel is not installed; it is in the test extra (pip install -e '.[test]')")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _attribute_chains(uses):
    """Module attributes only: `xp.add.at` checks add and add.at; array methods are not chains here."""
    return {name for name in uses if name not in CPU_ONLY}


def test_every_cupy_name_the_engine_uses_exists_in_the_real_wheel():
    uses = _engine_uses()
    assert len(uses) > 50, "the scan found too few names: the regex is broken"
    result = _real_cupy(_attribute_chains(uses))
    missing = {n: uses[n] for n in result["missing"]}
    assert not missing, f"names missing from real CuPy {result['version']}: {missing}"


def test_the_scan_catches_a_name_cupy_lacks():
    result = _real_cupy({"cupy.random.Generator.permutation", "cupy.add", "cupy.cuda.runtime.getDevice"})
    assert result["missing"] == ["cupy.random.Generator.permutation"]


def test_the_double_exposes_the_real_wheels_names():
    sys.path.insert(0, HERE)
    from cupy_double import gen_names
    from cupy_double._names import NAMES, VERSION

    probe = "import json, sys; sys.path.insert(0, %r); import gen_names; print(json.dumps(gen_names.real_names()))"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ENGINE_CUPY_DOUBLE")}
    proc = subprocess.run([sys.executable, "-c", probe % os.path.dirname(gen_names.__file__)], env=env,
                          capture_output=True, text=True, cwd="/")
    assert proc.returncode == 0, proc.stderr
    version, real = json.loads(proc.stdout)
    assert version == VERSION, f"_names.py is from CuPy {VERSION}, installed {version}: rerun gen_names.py"
    assert real == NAMES


def test_the_double_refuses_names_cupy_lacks(cuda_double):
    with pytest.raises(AttributeError, match="no attribute 'not_a_cupy_name'"):
        cuda_double.not_a_cupy_name
    gen = cuda_double.random.Generator(cuda_double.random.XORWOW(0))
    for lacking in ("permutation", "normal", "choice"):
        assert not hasattr(gen, lacking)
