"""The entry point: the per-rank peak memory of a RunSpec, from the engine that will run it."""

from __future__ import annotations

from dataclasses import replace

from moe_vlm.config.schema import Engine, Packing
from moe_vlm.config.spec import RunSpec
from moe_vlm.perf.memory.estimate import MemoryEstimate
from moe_vlm.perf.memory.images import image_budget
from moe_vlm.perf.memory.megatron import megatron_estimate
from moe_vlm.perf.memory.micro_batch import PERCENTILE, micro_batch_shape
from moe_vlm.perf.memory.shared import param_counts
from moe_vlm.perf.memory.torch_cpu import torch_estimate


def estimate(
    spec: RunSpec, patches_per_micro_batch: int | None = None, padded: bool = True
) -> MemoryEstimate:
    """The per-rank peak memory of `spec`.

    patches_per_micro_batch overrides the data kind's worst case, and padded=False says every
    row was full (calibration passes what a run actually saw, so the comparison measures the
    estimator, not the draw).
    """
    budget = image_budget(spec)
    shape = micro_batch_shape(spec) if spec.data.packing is not Packing.none else None
    if shape is not None and shape.patches is not None and patches_per_micro_batch is None:
        # Packed: the vision tower sees the micro-batch's own images, sized like its tokens. Buffer
        # packing puts several samples' images in a row, so the padded budget does not bound it.
        buffered = spec.data.packing is Packing.buffer
        budget = replace(
            budget,
            patches=shape.patches if buffered else min(shape.patches, budget.patches),
            source=f"packed: p{100 * PERCENTILE:.0f} of the data's patches per micro-batch; {shape.source}",
        )
    if patches_per_micro_batch is not None:
        budget = replace(
            budget,
            patches=patches_per_micro_batch,
            source=f"{patches_per_micro_batch} patches per micro-batch (given)",
        )
    if spec.engine is Engine.torch:
        return torch_estimate(spec, budget, param_counts(spec.model), padded)
    return megatron_estimate(spec, budget)
