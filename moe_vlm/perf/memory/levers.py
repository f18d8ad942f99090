"""Single changes that lower memory, and the first of them predicted to fit.

`fits_after` returns the change and its estimate, not prose: the rules word the fix
(rules/memory.py), the advisor applies `variant.overrides` to a command line.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

from moe_vlm.config.schema import (
    CudaGraphConfig,
    CudaGraphImpl,
    Engine,
    OffloadConfig,
    ParallelismFamily,
    Precision,
    RecomputeConfig,
    RecomputeGranularity,
    RecomputeMethod,
    VisionFreezeConfig,
)
from moe_vlm.config.spec import RunSpec
from moe_vlm.perf.memory.estimate import THIN_HEADROOM_FRACTION, MemoryEstimate
from moe_vlm.perf.memory.predict import estimate

SELECTIVE_DEFAULT = RecomputeConfig(
    name="selective", granularity=RecomputeGranularity.selective, modules=["core_attn"]
)
# Deeper selective recompute Megatron offers for MoE layers, before whole-layer recompute.
SELECTIVE_MOE = RecomputeConfig(
    name="selective",
    granularity=RecomputeGranularity.selective,
    modules=["core_attn", "moe_act", "layernorm"],
)
FULL_RECOMPUTE = RecomputeConfig(
    name="full", granularity=RecomputeGranularity.full, method=RecomputeMethod.uniform, num_layers=1
)
NO_GRAPHS = CudaGraphConfig(name="none")
OPTIMIZER_ON_CPU = OffloadConfig(name="optimizer", optimizer_fraction=1.0)  # conf/offload/optimizer.yaml


def with_recompute(spec: RunSpec, recompute: RecomputeConfig) -> RunSpec:
    return replace(spec, recompute=recompute)


@dataclass(frozen=True)
class Variant:
    overrides: str  # the command-line overrides that produce it, shell-quoted
    spec: RunSpec


class Fit(NamedTuple):
    variant: Variant
    estimate: MemoryEstimate


def memory_variants(spec: RunSpec) -> list[Variant]:
    """Single changes that lower memory, cheapest in throughput first (the order the guide implies)."""
    variants: list[Variant] = []
    scoped_graphs = spec.cuda_graph.impl not in (CudaGraphImpl.none, CudaGraphImpl.full_iteration)
    if spec.recompute.granularity is RecomputeGranularity.none:
        variants.append(Variant("recompute=selective", with_recompute(spec, SELECTIVE_DEFAULT)))
    deeper = not set(SELECTIVE_MOE.modules) <= set(spec.recompute.modules)
    if spec.recompute.granularity is not RecomputeGranularity.full and deeper:
        variants.append(
            Variant(
                "recompute=selective 'recompute.modules=[core_attn,moe_act,layernorm]'",
                with_recompute(spec, SELECTIVE_MOE),
            )
        )
    if spec.recompute.granularity is not RecomputeGranularity.full:
        full = with_recompute(spec, FULL_RECOMPUTE)
        if scoped_graphs:
            variants.append(Variant("recompute=full cuda_graph=none", replace(full, cuda_graph=NO_GRAPHS)))
        else:
            variants.append(Variant("recompute=full", full))
    if not spec.freeze.vision:
        frozen = VisionFreezeConfig(
            name="vision", vision=True, projector=spec.freeze.projector, language=spec.freeze.language
        )
        variants.append(Variant("vision_freeze=vision", replace(spec, freeze=frozen)))
    mbs = spec.mbs
    while mbs > 1:
        mbs //= 2
        variants.append(Variant(f"mbs={mbs}", replace(spec, mbs=mbs)))
    # Last: the optimizer on the CPU trades a host Adam step and device-host copies every step for
    # 8 of its 12 bytes per parameter (Megatron engine only; memory/megatron.optimizer_offload), on
    # Megatron DDP's distributed optimizer without FP8 parameter gather (rules O010, O014).
    offload_runs = spec.family is ParallelismFamily["3d"] and spec.precision.format not in (
        Precision.fp8cs,
        Precision.fp8mx,
    )
    if spec.engine is Engine.megatron and offload_runs and spec.offload.optimizer_fraction < 1.0:
        variants.append(Variant("offload=optimizer", replace(spec, offload=OPTIMIZER_ON_CPU)))
    return variants


def fits_after(spec: RunSpec) -> Fit | None:
    """The first single change (memory_variants order) predicted to fit, with its estimate."""
    estimates = [Fit(variant, estimate(variant.spec)) for variant in memory_variants(spec)]
    # Prefer a change that leaves real headroom; a bare fit only when nothing else does.
    for minimum in (THIN_HEADROOM_FRACTION, 0.0):
        for fit in estimates:
            headroom = fit.estimate.headroom_fraction
            if headroom is not None and headroom >= minimum:
                return fit
    return None
