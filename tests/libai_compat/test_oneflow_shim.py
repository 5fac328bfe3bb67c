"""`import oneflow as flow` without OneFlow: the top-level `oneflow` shim over `engine` (its names
and module aliases), and a real OneFlow on sys.path always winning over it."""
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import engine

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_python(code, pythonpath, cwd):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(pythonpath), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip()


def test_names_and_module_aliases_are_engine_s():
    import oneflow as flow
    import oneflow.comm
    import oneflow.env
    import oneflow.nn.functional as F2
    import oneflow.optim
    from oneflow import nn
    from oneflow.nn import functional as F

    assert flow.__libai_engine_shim__ is True and flow.__version__ == engine.__version__
    assert flow.Tensor is engine.Tensor and flow.tensor is engine.tensor and flow.float32 is engine.float32
    assert nn is engine.nn and F is engine.nn.functional and F2 is F
    assert oneflow.optim is engine.optim and flow.optim.AdamW is engine.optim.AdamW
    assert oneflow.env is engine.distributed and oneflow.comm is engine.distributed
    assert flow.placement is engine.placement and flow.sbp.split(0) == engine.sbp.split(0)
    # the aliases are the same module objects under a second name; engine's own specs stay
    assert sys.modules["oneflow.nn.functional"] is engine.nn.functional
    assert engine.nn.functional.__spec__.name == "engine.nn.functional"
    x = flow.ones(2, 3, requires_grad=True)
    F.relu(x * 2).sum().backward()
    assert isinstance(x.grad, engine.Tensor) and x.grad.tolist() == [[2.0] * 3] * 2
    assert flow.env.get_rank() == 0 and flow.env.get_world_size() == 1


def test_missing_names_are_clear_errors():
    import oneflow as flow

    with pytest.raises(AttributeError, match="module 'oneflow' .*shim.* has no attribute 'boxing'"):
        flow.boxing
    with pytest.raises(ModuleNotFoundError, match="No module named 'oneflow.framework'"):
        import oneflow.framework  # noqa: F401


def test_a_libai_config_with_import_oneflow_instantiates_engine_objects(tmp_path):
    from libai.config import LazyConfig, instantiate

    (tmp_path / "c.py").write_text(textwrap.dedent("""
        import oneflow as flow
        from oneflow import nn
        from libai.config import LazyCall
        model = LazyCall(nn.Linear)(in_features=3, out_features=2)
        optim = LazyCall(flow.optim.AdamW)(lr=1e-3, do_bias_correction=False)
    """))
    cfg = LazyConfig.load(str(tmp_path / "c.py"))
    model = instantiate(cfg.model)
    assert isinstance(model, engine.nn.Linear)
    opt = instantiate(cfg.optim, params=model.parameters())
    assert isinstance(opt, engine.optim.AdamW) and opt.param_groups[0]["do_bias_correction"] is False
    LazyConfig.save(cfg, tmp_path / "c.yaml")
    assert LazyConfig.load(tmp_path / "c.yaml").optim._target_ == "engine.optim.AdamW"


def test_pyproject_installs_the_shim_package():
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        text = f.read()
    assert 'include = ["engine*", "libai*", "oneflow*"]' in text


@pytest.fixture
def fake_oneflow(tmp_path):
    """tmp/real/oneflow: a stand-in for an installed OneFlow; tmp/copy/oneflow: a copy of the shim."""
    real = tmp_path / "real" / "oneflow"
    real.mkdir(parents=True)
    (real / "__init__.py").write_text("REAL = True\nfrom . import nn\n")
    (real / "nn.py").write_text("WHO = 'real oneflow.nn'\n")
    shutil.copytree(os.path.join(ROOT, "oneflow"), tmp_path / "copy" / "oneflow",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


PROBE = """
    import sys, oneflow
    print(getattr(oneflow, "REAL", False), getattr(oneflow, "__libai_engine_shim__", False),
          getattr(sys.modules.get("oneflow.nn"), "WHO", "-"))
"""


@pytest.mark.parametrize("order", ["shim first", "real first"])
def test_a_real_oneflow_on_sys_path_wins(fake_oneflow, order):
    paths = [ROOT, str(fake_oneflow / "real")]
    if order == "real first":
        paths.reverse()
    # cwd = the repository root puts the shim first on sys.path ('' for python -c)
    assert run_python(PROBE, paths, cwd=ROOT) == "True False real oneflow.nn"


def test_a_directory_named_oneflow_without_init_is_not_taken_for_oneflow(fake_oneflow):
    (fake_oneflow / "stray" / "oneflow").mkdir(parents=True)  # e.g. a data folder
    assert run_python(PROBE, [str(fake_oneflow / "stray"), ROOT], cwd=str(fake_oneflow)) == "False True -"


def test_another_copy_of_the_shim_is_not_taken_for_oneflow(fake_oneflow):
    out = run_python(PROBE, [str(fake_oneflow / "copy"), ROOT], cwd=str(fake_oneflow))
    assert out == "False True -"
    # a copy of the shim ahead of a real OneFlow still hands over to the real one
    out = run_python(PROBE, [str(fake_oneflow / "copy"), str(fake_oneflow / "real")], cwd=str(fake_oneflow))
    assert out == "True False real oneflow.nn"
