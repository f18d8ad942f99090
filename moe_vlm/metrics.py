"""The metrics contract: from steps.jsonl records and the RunSpec to the run.json summary.

Engine-independent. (Minimal first version; FLOPs, MFU and token kinds are added on top.)
"""

from __future__ import annotations

from statistics import median
from typing import Any

from moe_vlm.spec import RunSpec


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(steps: list[dict[str, Any]], spec: RunSpec) -> dict[str, Any]:
    """Summary over the steady window (steps after spec.warmup_steps), one entry per step."""
    by_step: dict[int, list[dict[str, Any]]] = {}
    for record in steps:
        by_step.setdefault(int(record["step"]), []).append(record)
    steady = [n for n in sorted(by_step) if n > spec.warmup_steps]
    if not steady:
        return {"steady_steps": None}
    step_times = [max(r["step_time_s"] for r in by_step[n]) for n in steady]
    real_tokens = [sum(r["tokens"]["real"] for r in by_step[n]) for n in steady]
    world = spec.layout.world_size
    total_time = sum(step_times)
    return {
        "steady_steps": [steady[0], steady[-1]],
        "step_time_s": {"p10": _percentile(step_times, 0.1), "p50": median(step_times), "p90": _percentile(step_times, 0.9)},
        "effective_tokens_per_s_per_gpu": sum(real_tokens) / total_time / world,
        "peak_memory_gib": max(r["peak_memory_gib"] for n in steady for r in by_step[n]),
    }
