"""The validation catalogue: every rule the engine would enforce after a long queue wait,
plus the field guide's warnings, checked before anything runs.

Each rule has a stable code, a level, and a check that yields violations naming the keys
involved and a fix. Codes are grouped by concern:

    C  config values          L  layout arithmetic       F  FSDP
    D  MoE dispatcher         G  CUDA graphs             R  recompute
    E  engine support         A  data                    W  field-guide warnings
    P  precision (FP8/FP4 number formats)
    X  MoE routing (capacity, router dtype, aux loss) and kernel fusions
    O  communication overlap, HSDP, host-memory offload, garbage collection, vision-encoder graphs
    T  profiling and experiment logging (telemetry)
    M  memory (moe_vlm/perf/memory's per-GPU estimate against cluster.gpu_memory_gib)
    B  checks ported from the library code the engine does not run (Megatron-LM's argument validation)

Engine rules cite where Megatron enforces them (MLM = Megatron-LM, MB = Megatron-Bridge).
One module per code group; importing it registers its rules, so SECTIONS fixes the
catalogue's order (and the order findings print in).
"""

import importlib

from moe_vlm.rules.catalogue import (
    CATALOGUE,
    Finding,
    Level,
    Rule,
    Violation,
    errors,
    rule,
    unplannable,
    validate,
)

__all__ = ["CATALOGUE", "Finding", "Level", "Rule", "Violation", "errors", "rule", "unplannable", "validate"]

SECTIONS = (
    "config",
    "layout",
    "fsdp",
    "dispatcher",
    "graphs",
    "recompute",
    "precision",
    "routing",
    "overlap",
    "telemetry",
    "engine",
    "data",
    "guide",
    "memory",
    "library",
)
for _section in SECTIONS:
    importlib.import_module(f"moe_vlm.rules.{_section}")
