"""GLUE/CLUE readers and the tokenized classification dataset."""
from .classification_dataset import ClassificationDataset, build_clue_dataset, build_glue_dataset
from .readers import (CLUE_TASKS, GLUE_TASKS, Example, TaskSpec, get_clue_task, get_glue_task, labels_from_examples,
                      read_json_lines, read_tsv)

__all__ = ["ClassificationDataset", "build_glue_dataset", "build_clue_dataset", "Example", "TaskSpec",
           "GLUE_TASKS", "CLUE_TASKS", "get_glue_task", "get_clue_task", "read_tsv", "read_json_lines",
           "labels_from_examples"]
