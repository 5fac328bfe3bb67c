"""Random ops cannot match PyTorch value by value (different generators): they are checked
statistically in tests/test_random_ops.py."""

CASES = []

COVERED_ELSEWHERE = {
    "multinomial": "tests/test_random_ops.py::test_multinomial_frequencies_match_weights",
    "bernoulli": "tests/test_random_ops.py::test_bernoulli_rate",
}
