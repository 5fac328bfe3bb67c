"""The longest tests (measured on the 2-core CI machine, docs/testing.md), run first: xdist hands
out tests in collection order, and the BERT fine-tuning claim (~9 minutes beside the other
worker) collected among the last left one worker alone for its last minutes (the other worker
takes the rest of the queue by work stealing, tests/conftest.py)."""
LONGEST_FIRST = (
    "tests/projects/test_fine_tuning_claim.py::test_fine_tuning_the_pretrained_bert_beats_chance_and_scratch",
    "tests/test_cuda_double_suite.py::test_device_aware_tests_pass_on_cuda_through_the_double",
    "tests/vision/test_vit_recipe.py::test_readme_command_learns_the_digits",
    "tests/vision/test_swin_recipe.py::test_readme_command_learns_the_digits",
    "tests/distributed/test_pipeline.py::test_gpt2_pipeline_layouts_match_one_process",
    "tests/distributed/test_pipeline.py::test_bert_pipeline_layouts_match_one_process",
)
