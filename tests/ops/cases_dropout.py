"""engine/ops/dropout.py: dropout draws random masks, so it cannot match PyTorch value for value;
it is checked statistically (fraction kept, scale, gradient through the mask) elsewhere."""
CASES = []
COVERED_ELSEWHERE = {"dropout": "tests/test_dropout.py::test_fraction_and_scale"}
COVERED_ELSEWHERE.update({name: "tests/test_nn_extra_modules.py::test_channel_dropout_statistics" for name in
                          ("dropout1d", "dropout2d", "dropout3d", "feature_alpha_dropout")})
COVERED_ELSEWHERE["alpha_dropout"] = "tests/test_nn_extra_modules.py::test_alpha_dropout_keeps_mean_and_variance"
