"""The entry point: the per-rank peak memory of a RunSpec, from the engine that will run it."""

from __future__ import annotations

from dataclasses import replace

from moe_vlm.memory.estimate import MemoryEstimate
from moe_vlm.memory.images import image_budget
from moe_vlm.memory.megatron import megatron_estimate
from moe_vlm.memory.shared import param_counts
from moe_vlm.memory.torch_cpu import torch_estimate
from moe_vlm.schema import Engine
from moe_vlm.spec import RunSpec


def estimate(
    spec: RunSpec, patches_per_micro_batch: int | None = None, padded: bool = True
) -> MemoryEstimate:
    """The per-rank peak memory of `spec`.

    patches_per_micro_batch overrides the data kind's worst case, and padded=False says every
    row was full (calibration passes what a run actually saw, so the comparison measures the
    estimator, not the draw).
    """
    budget = image_budget(spec)
    if patches_per_micro_batch is not None:
        budget = replace(
            budget,
            patches=patches_per_micro_batch,
            source=f"{patches_per_micro_batch} patches per micro-batch (given)",
        )
    if spec.engine is Engine.torch:
        return torch_estimate(spec, budget, param_counts(spec.model), padded)
    return megatron_estimate(spec, budget)
