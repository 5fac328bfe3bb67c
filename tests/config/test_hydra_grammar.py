"""libai.config._hydra_grammar: command-line overrides are parsed by hydra's grammar without running
hydra's package __init__ (its app framework, ~0.2-0.3 s of each train_net start), and hydra stays
whole for anyone who imports it afterwards. Each case runs in a fresh interpreter: the pytest
process may have imported hydra already."""
import subprocess
import sys
import textwrap

import pytest

PARSE = """
import sys
from omegaconf import OmegaConf
from libai.config import LazyConfig

cfg = OmegaConf.create({"a": {"b": 1, "c": "x"}, "d": [1, 2]})
LazyConfig.apply_overrides(cfg, ["a.b=2.5", "+a.e='p q'", "++f=[1,2]", "~a.c", "d=null"])
assert OmegaConf.to_container(cfg) == {"a": {"b": 2.5, "e": "p q"}, "d": None, "f": [1, 2]}, cfg
"""

HYDRA_WHOLE = """
import hydra
from hydra import compose, initialize
from hydra.utils import instantiate

assert callable(hydra.main) and not isinstance(hydra.main, type(sys)), hydra.main  # the function
assert hydra.__version__ and "main" in hydra.__all__
assert callable(compose) and callable(initialize)
assert instantiate({"_target_": "builtins.dict", "k": 3}) == {"k": 3}
assert type(hydra) is type(sys)
LazyConfig.apply_overrides(cfg, ["a.b=7"])
assert cfg.a.b == 7
"""


def _run(code):
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_overrides_parse_without_hydras_app_framework_and_hydra_stays_whole():
    out = _run(PARSE + """
print(sorted(n for n in ("hydra.main", "hydra.compose", "hydra.utils", "hydra.conf") if n in sys.modules))
""" + HYDRA_WHOLE)
    assert out.strip() == "[]"  # none of hydra's app framework was imported to parse the overrides


@pytest.mark.parametrize("first", ["hydra", "hydra.utils"])
def test_hydra_imported_before_the_overrides(first):
    _run(f"import {first}\n" + PARSE + HYDRA_WHOLE)


def test_when_the_deferred_load_fails_the_plain_import_is_used():
    _run("""
import libai.config._hydra_grammar as g

class NoMatch:
    @staticmethod
    def search(*args, **kwargs):
        return None  # as if hydra's __init__ had no __version__ line: the deferred load fails

g.re = NoMatch
""" + PARSE + """
assert "hydra.main" in sys.modules  # the plain import ran hydra's __init__
""" + HYDRA_WHOLE)
