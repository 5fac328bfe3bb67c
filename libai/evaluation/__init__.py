"""Evaluation: evaluators (top-k accuracy and F1, perplexity, regression correlations, masked-LM) and inference
over a data loader."""
from .cls_evaluator import ClsEvaluator
from .evaluator import (DatasetEvaluator, DatasetEvaluators, EvaluationInterrupted, inference_context,
                        inference_on_dataset)
from .mlm_evaluator import MLMEvaluator
from .ppl_evaluator import PPLEvaluator
from .reg_evaluator import RegEvaluator
from .utils import flatten_results_dict, print_csv_format

__all__ = ["DatasetEvaluator", "DatasetEvaluators", "EvaluationInterrupted", "inference_on_dataset",
           "inference_context", "ClsEvaluator", "PPLEvaluator", "RegEvaluator", "MLMEvaluator", "print_csv_format",
           "flatten_results_dict"]
