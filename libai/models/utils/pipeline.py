"""The pipeline protocol's step (libai.engine.pipeline runs the steps on their stages)."""
from typing import Callable, NamedTuple

__all__ = ["PipelineStep", "run_steps"]


class PipelineStep(NamedTuple):
    """One piece of a model's training forward: `fn(carry, batch) -> carry`, run on the pipeline
    stage of layer `layer_idx` (0: the first stage; -1: the last)."""
    layer_idx: int
    fn: Callable


def run_steps(steps, batch):
    """Every step in order in this process (what the stages do together): the model's outputs."""
    carry = {}
    for step in steps:
        carry = step.fn(carry, batch)
    return carry
