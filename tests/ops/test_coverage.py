"""No public op without a parity case: adding an op to a family's __all__ without a case fails."""
import engine
from op_cases import ALL_CASES, COVERED_ELSEWHERE


def test_every_public_op_has_a_parity_case():
    covered = {c.op for c in ALL_CASES} | set(COVERED_ELSEWHERE)
    missing = sorted(set(engine.ops.PUBLIC_OPS) - covered)
    assert not missing, f"public ops without a parity case in tests/ops/cases_*.py: {missing}"


def test_cases_name_real_ops():
    unknown = sorted({c.op for c in ALL_CASES} - set(engine.ops.PUBLIC_OPS))
    assert not unknown, f"cases name ops that no family exports: {unknown}"


def test_each_case_file_covers_its_namesake_family():
    """tests/ops/cases_<family>.py holds the cases of the ops of engine/ops/<family>.py
    (cases_large.py, the large inputs of the threaded kernels, spans the families on purpose)."""
    import importlib
    import pathlib

    misplaced = []
    for path in sorted(pathlib.Path(__file__).parent.glob("cases_*.py")):
        if path.name == "cases_large.py":
            continue
        family = importlib.import_module(f"engine.ops.{path.stem[len('cases_'):]}")
        mod = importlib.import_module(f"ops.{path.stem}")
        ops = {c.op for c in mod.CASES} | set(getattr(mod, "COVERED_ELSEWHERE", {}))
        assert ops, f"{path.name} covers no op"
        misplaced += [f"{path.name}: {op} is not in engine/ops/{family.__name__.split('.')[-1]}.py"
                      for op in sorted(ops - set(family.__all__))]
    assert not misplaced, misplaced
