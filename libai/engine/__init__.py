"""The training engine: trainer loop, hooks, DefaultTrainer and job setup."""
from .default import DefaultTrainer, default_argument_parser, default_setup, write_eval_results
from .hooks import (
    BestCheckpointer, CallbackHook, EvalHook, IterationTimer, LRScheduler, PeriodicCheckpointer, PeriodicWriter,
)
from .trainer import EagerTrainer, GraphTrainer, HookBase, SimpleTrainer, TrainerBase

__all__ = ["DefaultTrainer", "default_argument_parser", "default_setup", "write_eval_results", "HookBase",
           "TrainerBase", "EagerTrainer", "SimpleTrainer", "GraphTrainer", "hooks", "CallbackHook", "IterationTimer",
           "LRScheduler", "PeriodicCheckpointer", "EvalHook", "BestCheckpointer", "PeriodicWriter"]
