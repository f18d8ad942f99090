"""The metrics contract: from steps.jsonl records and the RunSpec to the run.json summary.

Engine-independent: every engine writes ``moe_vlm.record.records.StepRecord`` lines and calls
``summarize(steps, spec)`` (a JSON line reads as a StepRecord). The rules a careful engineer
applies by hand:

- Steady window: steps after the declared warm-up (``warmup_steps``, or a record's own
  ``warmup: true``), and without steps an engine marked ``"exclude": "<reason>"`` (profiler or
  checkpoint steps). The window and what it left out are part of the summary.
- Tokens per step, summed over data-parallel ranks: nominal (GBS x seq_length), padded (what was
  computed), real (unpadded: text + image placeholders), loss-bearing, image.
- Throughput per GPU = tokens / (step period x world size), so FSDP and 3D layouts of the same
  world compare; sums over the window divided by summed seconds (a ratio of totals, not a mean of
  ratios). The seconds are each step's full period, from its start to the next step's start
  (``time_basis``): what the loop runs between steps (logging, barriers, manual GC) is part of
  the run's wall clock, and a knob that moves work there (gc=manual) must not look faster for it.
  Records without periods fall back to the step time, and the summary says so. ``step_time_s``
  (the step alone), ``step_period_s`` and ``between_steps_s`` sit beside each other. The ranking
  metric is effective (real) tokens/s/GPU; nominal sits beside it.
- FLOPs from ``moe_vlm.perf.flops``: ours (model), Bridge-comparable, hardware. TFLOP/s/GPU and MFU
  from ours, against the cluster's dense BF16 peak, named in the summary; beside it the same run's
  MFU against its precision's own dense peaks (``mfu_precision``: the decoder at FP8 or FP4, the
  vision encoder and projector at BF16, which they run in), named. A cluster without a
  peak (cluster=local) gets no MFU and a reason; an MFU above 100% means the FLOPs or the timing
  are wrong, so it is reported as an error, never as a number.
- Peak memory per GPU (max over ranks), and the vision encoder / projector / decoder shares of
  the component time the engine measured. Where an engine records them (Megatron), the device's
  used memory and the allocator's reserved memory beside it (``device_memory``), so buffers
  outside the allocator (NCCL, DeepEP/HybridEP, TE userbuffers) show next to its peak.
- The time the training loop waited for data (``data_wait``), so an input-bound run shows as one.
- Each rank's steady-window medians of step, component and data-wait time, with its host
  (``per_rank``), for the report's straggler view (``moe_vlm.perf.stragglers``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from statistics import median
from typing import Any

from moe_vlm.config.spec import RunSpec
from moe_vlm.perf.flops import MODULES, Workload, step_flops
from moe_vlm.perf.flops_basis import flops_basis
from moe_vlm.perf.peaks import TERA, peak_of, precision_peak_of
from moe_vlm.perf.stragglers import rank_medians
from moe_vlm.record.records import TOKEN_KINDS, StepRecord, as_step


class MemoryKind(StrEnum):
    """What a recorded memory figure counts (steps.jsonl, run.json summary)."""

    cuda_max_allocated = "cuda_max_allocated"  # torch.cuda.max_memory_allocated: live tensors' peak
    process_peak_rss = "process_peak_rss"  # CPU runs: the process's peak resident set
    cuda_memory_reserved = "cuda_memory_reserved"  # torch.cuda.memory_reserved: allocator segments
    cuda_device_used = "cuda_device_used"  # cudaMemGetInfo total - free: the whole GPU, as nvidia-smi


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass
class SteadyWindow:
    steps: list[int]  # steady optimizer steps, ascending
    excluded: dict[str, list[int]] = field(default_factory=dict)  # reason -> steps left out

    def describe(self) -> str:
        if not self.steps:
            kept = "no steady steps"
        else:
            kept = f"steps {self.steps[0]}-{self.steps[-1]} ({len(self.steps)} steps)"
        left_out = "; ".join(f"{reason}: {_ranges(steps)}" for reason, steps in self.excluded.items())
        return f"{kept}; excluded {left_out}" if left_out else kept


def _ranges(steps: list[int]) -> str:
    """[1, 2, 3, 7] -> '1-3, 7'."""
    parts: list[str] = []
    for n in sorted(steps):
        if parts and parts[-1].split("-")[-1] == str(n - 1):
            parts[-1] = parts[-1].split("-")[0] + f"-{n}"
        else:
            parts.append(str(n))
    return ", ".join(parts)


def by_step(steps: Iterable[StepRecord | Mapping[str, Any]]) -> dict[int, list[StepRecord]]:
    """Records grouped by step, one per rank (the last one wins if a resumed run repeated a step)."""
    grouped: dict[int, dict[int, StepRecord]] = {}
    for line in steps:
        record = as_step(line)
        grouped.setdefault(int(record.step), {})[int(record.rank)] = record
    return {step: list(ranks.values()) for step, ranks in sorted(grouped.items())}


def steady_window(grouped: dict[int, list[StepRecord]], warmup_steps: int) -> SteadyWindow:
    excluded: dict[str, list[int]] = {}
    steady: list[int] = []
    for step, records in grouped.items():
        reason = next((str(r.exclude) for r in records if r.exclude), None)
        if step <= warmup_steps or any(r.warmup for r in records):
            reason = "warm-up"
        if reason:
            excluded.setdefault(reason, []).append(step)
        else:
            steady.append(step)
    return SteadyWindow(steps=steady, excluded=excluded)


def workload_of(records: list[StepRecord]) -> Workload:
    """One step's statistics summed over its data-parallel ranks."""
    return Workload(
        sequences=sum(int(r.sequences) for r in records),
        padded_tokens=sum(int(r.padded_tokens) for r in records),
        real_tokens=sum(int(r.real_tokens) for r in records),
        sum_seq_len_squared=sum(int(r.sum_seq_len_squared) for r in records),
        vision_patches=sum(int(r.vision_patches) for r in records),
        sum_patches_squared=sum(int(r.sum_patches_squared) for r in records),
        samples=sum(int(r.samples or 0) for r in records),
    )


def mean_workload(workloads: list[Workload]) -> Workload:
    """The mean step of a window (each statistic's mean, rounded)."""
    count = max(len(workloads), 1)
    return Workload(
        **{f.name: round(sum(getattr(w, f.name) for w in workloads) / count) for f in fields(Workload)}
    )


def mfu_of(
    model_flops_per_s_per_gpu: float, spec: RunSpec, peak: dict[str, Any] | None = None
) -> tuple[float | None, str | None]:
    """(MFU, None), or (None, why there is no MFU). Above 100% is an error, not a number.

    `peak`: another named denominator (precision_peak_of) instead of the dense BF16 one."""
    peak = peak or peak_of(spec)
    if peak["flops"] is None:
        kind = peak.get("kind", "bf16")
        return None, (
            f"cluster={spec.cluster.name} ({spec.cluster.gpu}) has no dense {kind.upper()} peak "
            f"(cluster.peak_{kind}_flops=0), so MFU is not defined; a CPU peak would be made up"
        )
    mfu = model_flops_per_s_per_gpu / peak["flops"]
    if mfu > 1.0:
        return None, (
            f"ERROR: MFU {mfu:.0%} exceeds 100% of {peak['name']}: the FLOPs count or the step timing is "
            "wrong (check step_time_s synchronisation and the token statistics)"
        )
    return mfu, None


def summarize(steps: Iterable[StepRecord | Mapping[str, Any]], spec: RunSpec) -> dict[str, Any]:
    """The run.json "summary": steady-window statistics, throughput, FLOPs, MFU, memory, shares."""
    grouped = by_step(steps)
    window = steady_window(grouped, spec.warmup_steps)
    world = spec.layout.world_size
    peak = peak_of(spec)
    summary: dict[str, Any] = {
        "steady_steps": [window.steps[0], window.steps[-1]] if window.steps else None,
        "steady_window": {
            "steps": len(window.steps),
            "excluded": window.excluded,
            "text": window.describe(),
        },
        "world_size": world,
        "peak": peak,
        "precision_peak": precision_peak_of(spec),
        "errors": [],
    }
    peaks = [(r.peak_memory_gib, r.memory_kind) for records in grouped.values() for r in records]
    memory = [(float(peak), kind) for peak, kind in peaks if peak is not None]
    summary["peak_memory_gib"] = max((peak for peak, _ in memory), default=None)
    summary["memory_kind"] = memory[-1][1] if memory else None
    summary["device_memory"] = device_memory_of([r for records in grouped.values() for r in records])
    if not window.steps:
        summary["errors"].append(
            f"no steady steps: {len(grouped)} step(s) recorded, warmup_steps={spec.warmup_steps}; "
            "raise train_iters"
        )
        summary["mfu"] = summary["mfu_precision"] = None
        summary["mfu_note"] = summary["mfu_precision_note"] = "no steady steps"
        return summary

    steady = [grouped[n] for n in window.steps]
    step_times = [max(float(r.step_time_s) for r in records) for records in steady]
    summary["step_time_s"] = _spread(step_times)
    basis = time_basis(steady, step_times)
    summary["time_basis"] = basis.describe()
    summary["step_period_s"] = _spread(basis.seconds) if basis.periods else None
    summary["between_steps_s"] = basis.between_steps()

    nominal_per_step = spec.gbs * spec.seq_length
    totals = {
        kind: sum(int(getattr(r, f"{kind}_tokens")) for records in steady for r in records)
        for kind in TOKEN_KINDS
    }
    totals["nominal"] = nominal_per_step * len(steady)
    summary["tokens_per_step"] = {kind: total / len(steady) for kind, total in totals.items()}
    # Of the positions the model computed, the share that was padding (0 when packed without CP/SP).
    summary["padding_fraction"] = 1.0 - totals["real"] / totals["padded"] if totals["padded"] else None
    # The rates: what the rated steps did over the seconds they took (time_basis), per GPU.
    rated = [steady[i] for i in basis.indices]
    totals = {
        kind: sum(int(getattr(r, f"{kind}_tokens")) for records in rated for r in records)
        for kind in TOKEN_KINDS
    }
    totals["nominal"] = nominal_per_step * len(rated)
    per_gpu_second = sum(basis.seconds) * world
    summary["effective_tokens_per_s_per_gpu"] = totals["real"] / per_gpu_second
    summary["nominal_tokens_per_s_per_gpu"] = totals["nominal"] / per_gpu_second
    summary["padded_tokens_per_s_per_gpu"] = totals["padded"] / per_gpu_second
    summary["loss_tokens_per_s_per_gpu"] = totals["loss"] / per_gpu_second
    summary["image_tokens_per_s_per_gpu"] = totals["image"] / per_gpu_second

    flops = [step_flops(spec, workload_of(records)) for records in steady]
    summary["flops_per_step"] = {
        "model": sum(f.model for f in flops) / len(flops),
        "bridge": sum(f.bridge for f in flops) / len(flops),
        "hardware": sum(f.hardware for f in flops) / len(flops),
        "recompute": sum(f.recompute for f in flops) / len(flops),
        "model_by_module": {m: sum(f.model_by_module[m] for f in flops) / len(flops) for m in MODULES},
        "multipliers": {m: vars(multiplier) for m, multiplier in flops[0].multipliers.items()},
    }
    # Bridge's logged basis beside ours for the window's mean step (moe_vlm/perf/flops_basis.py).
    summary["flops_basis"] = flops_basis(
        spec,
        mean_workload([workload_of(records) for records in steady]),
        "measured: the steady window's mean step",
    ).to_dict()
    rated_flops = [flops[i] for i in basis.indices]
    model_flops = sum(f.model for f in rated_flops)
    summary["tflops_per_gpu"] = model_flops / per_gpu_second / TERA
    summary["bridge_tflops_per_gpu"] = sum(f.bridge for f in rated_flops) / per_gpu_second / TERA
    summary["hardware_tflops_per_gpu"] = sum(f.hardware for f in rated_flops) / per_gpu_second / TERA
    mfu, note = mfu_of(model_flops / per_gpu_second, spec)
    summary["mfu"] = mfu
    summary["mfu_note"] = note
    if note and note.startswith("ERROR"):
        summary["errors"].append(note)
    # The same run against its own format's peaks (precision=fp8cs|fp8mx|nvfp4), beside the BF16 one:
    # each module at the peak it runs at, blended by this window's FLOPs.
    summary["precision_peak"] = precision_peak_of(
        spec, {m: sum(f.model_by_module[m] for f in rated_flops) for m in MODULES}
    )
    summary["mfu_precision"], summary["mfu_precision_note"] = mfu_of(
        model_flops / per_gpu_second, spec, summary["precision_peak"]
    )

    component_seconds = {m: 0.0 for m in MODULES}
    rank_step_seconds = 0.0
    for records in steady:
        for record in records:
            measured = record.components_s or {}
            for module in MODULES:
                component_seconds[module] += float(measured.get(module, 0.0))
            rank_step_seconds += float(record.step_time_s)
    measured_total = sum(component_seconds.values())
    if measured_total > 0:
        summary["components"] = {m: component_seconds[m] / measured_total for m in MODULES}
        # How much of the step the three components explain (the rest: optimizer, comms, data).
        summary["component_coverage"] = measured_total / rank_step_seconds if rank_step_seconds else None
    else:
        summary["components"] = None
        summary["component_coverage"] = None
    rank_steps = sum(len(records) for records in steady)
    summary["component_time_s_per_rank_step"] = {m: s / rank_steps for m, s in component_seconds.items()}
    summary["data_wait"] = data_wait_of(steady)
    summary["per_rank"] = rank_medians(steady)  # the report's straggler view (moe_vlm/perf/stragglers.py)
    return summary


def _spread(seconds: list[float]) -> dict[str, float]:
    return {
        "p10": _percentile(seconds, 0.1),
        "p50": median(seconds),
        "p90": _percentile(seconds, 0.9),
        "mean": sum(seconds) / len(seconds),
    }


class TimeBasis(StrEnum):
    """What the summary's rates (tokens/s, TFLOP/s, MFU) divide by."""

    step_period = "step_period"
    step_time = "step_time"

    @property
    def meaning(self) -> str:
        return TIME_BASIS_MEANING[self]


TIME_BASIS_MEANING = {
    # StepRecord.step_period_s: as wall clock sees the run.
    TimeBasis.step_period: "the full step period, step start to next step start: logging, barriers, "
    "manual GC and checkpoints between steps included",
    # StepRecord.step_time_s: records without periods (older lines, a window of only the run's
    # last step). Not comparable with the above.
    TimeBasis.step_time: "the step time alone (no step period recorded): what runs between steps is "
    "left out, so the rates overstate wall-clock throughput",
}


@dataclass
class RatedSteps:
    """The steady steps the rates are taken over and the seconds each took (max over its ranks)."""

    basis: TimeBasis
    indices: list[int]  # into the steady steps
    seconds: list[float]
    step_times: list[float]  # the same steps' step_time_s (max over ranks)
    steady_steps: int

    @property
    def periods(self) -> bool:
        return self.basis is TimeBasis.step_period

    def describe(self) -> dict[str, Any]:
        left = self.steady_steps - len(self.indices)
        text = f"rates over {self.basis.meaning}; {len(self.indices)} steady step(s)"
        if left:
            text += f"; {left} without a period (the run's last step) left out of the rates"
        return {"name": self.basis.value, "steps": len(self.indices), "text": text}

    def between_steps(self) -> dict[str, float] | None:
        """Seconds per step the loop spent between steps, and their share of the period."""
        if not self.periods:
            return None
        gaps = [period - step for period, step in zip(self.seconds, self.step_times, strict=True)]
        total = sum(self.seconds)
        return {
            "mean": sum(gaps) / len(gaps),
            "max": max(gaps),
            "fraction_of_period": sum(gaps) / total if total > 0 else 0.0,
        }


def time_basis(steady: list[list[StepRecord]], step_times: list[float]) -> RatedSteps:
    """The steady steps whose every line has a step period, timed by it (max over ranks, as step
    time); when none has one, every steady step timed by its step time."""
    indices, periods = [], []
    for i, records in enumerate(steady):
        values = [r.step_period_s for r in records]
        if all(value is not None for value in values):
            indices.append(i)
            periods.append(max(float(value) for value in values if value is not None))
    if indices:
        chosen_times = [step_times[i] for i in indices]
        return RatedSteps(TimeBasis.step_period, indices, periods, chosen_times, len(steady))
    everything = list(range(len(steady)))
    return RatedSteps(TimeBasis.step_time, everything, list(step_times), list(step_times), len(steady))


def data_wait_of(steady: list[list[StepRecord]]) -> dict[str, Any] | None:
    """How long the training loop waited for batches (steps.jsonl data_wait_s), over the window.

    fraction_of_step_time is the waits over the step times of the same rank-steps: near 0, the
    loader kept up; a large share means the run measured its input pipeline as much as its model.
    None when the engine recorded no waits.
    """
    pairs = [
        (float(r.data_wait_s), float(r.step_time_s))
        for records in steady
        for r in records
        if r.data_wait_s is not None
    ]
    if not pairs:
        return None
    waits = [wait for wait, _ in pairs]
    step_seconds = sum(step for _, step in pairs)
    return {
        "mean_s": sum(waits) / len(waits),
        "p90_s": _percentile(waits, 0.9),
        "max_s": max(waits),
        "fraction_of_step_time": sum(waits) / step_seconds if step_seconds > 0 else None,
        "rank_steps": len(pairs),
    }


def device_memory_of(records: list[StepRecord]) -> dict[str, Any] | None:
    """The GPU beyond the allocator's peak, max over every recorded rank-step (as peak_memory_gib).

    outside_allocator_gib is device_used_gib - reserved_gib of the same rank-step (both read at
    its end): the CUDA context plus NCCL, DeepEP/HybridEP and TE userbuffer allocations, which
    torch's allocator never sees. None when the engine recorded neither (the torch engine).
    """
    read = [(r.device_used_gib, r.reserved_gib) for r in records]
    pairs = [(float(used), float(kept)) for used, kept in read if used is not None and kept is not None]
    if not pairs:
        return None
    return {
        "device_used_gib": max(used for used, _ in pairs),
        "device_used_kind": MemoryKind.cuda_device_used.value,
        "reserved_gib": max(reserved for _, reserved in pairs),
        "reserved_kind": MemoryKind.cuda_memory_reserved.value,
        "outside_allocator_gib": max(used - reserved for used, reserved in pairs),
    }
