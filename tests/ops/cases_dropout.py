"""engine/ops/dropout.py: dropout draws random masks, so it cannot match PyTorch value for value;
it is checked statistically (fraction kept, scale, gradient through the mask) elsewhere."""
CASES = []
COVERED_ELSEWHERE = {"dropout": "tests/test_dropout.py::test_fraction_and_scale"}
