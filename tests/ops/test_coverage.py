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
