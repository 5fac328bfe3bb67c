"""Collects the OpCases of every family module under tests/ops/ (files named cases_*.py)."""
import importlib
import pathlib

ALL_CASES = []
COVERED_ELSEWHERE = {}  # op name -> test that covers it (random ops are checked statistically)

for path in sorted((pathlib.Path(__file__).parent / "ops").glob("cases_*.py")):
    mod = importlib.import_module(f"ops.{path.stem}")
    ALL_CASES.extend(mod.CASES)
    COVERED_ELSEWHERE.update(getattr(mod, "COVERED_ELSEWHERE", {}))
