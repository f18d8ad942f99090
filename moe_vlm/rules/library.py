"""Checks that live only in the library's code the engine does not run, ported (B...).

moe_vlm/engines/megatron/library_checks.py runs the library's own validation on every planned
point, and tests/megatron/test_fuzz_combinations.py on 2,000 random ones; what it finds that no
other rule says, and that Bridge itself does not check, is ported here with its citation.
"""

from __future__ import annotations

from collections.abc import Iterator

from moe_vlm.config.schema import Engine, ParallelismFamily
from moe_vlm.config.spec import RunSpec
from moe_vlm.rules.catalogue import Level, Violation, rule

HOPPER_MAJOR = 9  # compute capability; Blackwell (10) lifted the requirement


@rule("B001", Level.warning, "TP/CP > 1 on Hopper wants CUDA_DEVICE_MAX_CONNECTIONS=1 (MLM arguments.py)")
def _hopper_device_connections(spec: RunSpec) -> Iterator[Violation]:
    lay, capability = spec.layout, spec.cluster.compute_capability
    if (
        spec.engine != Engine.megatron
        or spec.family is ParallelismFamily.fsdp
        or max(lay.tp, lay.cp) <= 1
        or not 0 < capability < HOPPER_MAJOR + 1
    ):
        return
    yield Violation(
        ("tp", "cp", "cluster"),
        f"TP={lay.tp} CP={lay.cp} on {spec.cluster.gpu}: Megatron-LM's argument validation refuses tensor or "
        "context parallelism below Blackwell unless CUDA_DEVICE_MAX_CONNECTIONS=1, so that communication "
        "kernels are issued before the compute they overlap (megatron/training/arguments.py:1411-1439); "
        "Bridge does not check it and the H100 perf recipes set 32 (perf_recipes/qwen_vl/h100/qwen35_vl.py:66). "
        "Bridge runs it; whether TP/CP communication then overlaps as on Blackwell is unmeasured.",
        "compare against EP-only layouts (tp=1 cp=1, as the H100 perf recipes) before attributing a "
        "Hopper TP/CP result to the layout.",
    )
