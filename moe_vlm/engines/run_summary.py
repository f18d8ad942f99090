"""The end-of-run console table: the figures a user reads first, and where to look next.

run.json keeps every figure; this is the short view rank 0 prints when a run completes (both
engines): the run directory, status, data kind and labels, effective tokens/s/GPU, step time
p50 (p10-p90), MFU or why there is none, peak memory against the estimate, the component shares,
the data wait, and the commands and files to read next.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from moe_vlm.base.files import RunPaths
from moe_vlm.config.schema import DataKind, ExperimentLogger, Packing, Profiler
from moe_vlm.config.spec import RunSpec
from moe_vlm.perf.memory.predict import estimate
from moe_vlm.record.profiling import TENSORBOARD_DIR, TORCH_PROFILE_DIR
from moe_vlm.record.router_load import MOCK_KINDS, ROUTER_SECTION

WIDTH = 26  # the label column


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _row(label: str, text: str) -> str:
    return f"  {label:<{WIDTH}}{text}"


def _labels(spec: RunSpec) -> str:
    labels = []
    if spec.data.kind is DataKind.mock:
        labels.append("MOCK: image-free, not a VLM performance proxy, never ranked with real data")
    if spec.data.kind is DataKind.bridge_mock:
        labels.append(
            "MOCK: Bridge's perf-recipe workload (one noise image, mostly padding), never ranked with real data"
        )
    if spec.router.force_load_balancing:
        labels.append("FORCED BALANCE routing: benchmark only, ranked apart")
    if spec.data.packing is not Packing.none:
        labels.append(f"PACKED (data.packing={spec.data.packing.value}): rates count real tokens, not rows")
    return f"{spec.data.kind.value}" + (f" ({'; '.join(labels)})" if labels else "")


def _step_time(summary: Mapping[str, Any]) -> str:
    times = summary.get("step_time_s")
    times = times if isinstance(times, Mapping) else {}
    p10, p50, p90 = (_num(times.get(k)) for k in ("p10", "p50", "p90"))
    if p50 is None:
        return "no steady-state step"
    spread = f" (p10-p90 {p10:.3f}-{p90:.3f} s)" if p10 is not None and p90 is not None else ""
    window = summary.get("steady_window")
    text = window.get("text") if isinstance(window, Mapping) else None
    return f"{p50:.3f} s{spread}" + (f"; {text}" if isinstance(text, str) else "")


def _predicted(record: Mapping[str, Any]) -> str:
    """Predicted vs the measured window's median step (run.json "prediction", moe_vlm/predict)."""
    section = record.get("prediction")
    section = section if isinstance(section, Mapping) else {}
    predicted = section.get("predicted")
    predicted = predicted if isinstance(predicted, Mapping) else {}
    step, sigma, error = (
        _num(predicted.get("step_time_s")),
        _num(predicted.get("sigma")),
        _num(section.get("error")),
    )
    if step is None:
        note = predicted.get("note")
        return f"none: {note}" if isinstance(note, str) else "none"
    text = f"{step:.3f} s +-{sigma or 0:.0%}"
    if error is not None:
        text += f"; measured p50 {error:+.0%} vs predicted"
    flag = section.get("flag") or section.get("note")
    return text + (f" ({flag})" if isinstance(flag, str) else "")


def _mfu(summary: Mapping[str, Any]) -> str:
    mfu = _num(summary.get("mfu"))
    if mfu is None:
        note = summary.get("mfu_note")
        return f"none: {note}" if isinstance(note, str) and note else "none"
    peak = summary.get("peak")
    name = peak.get("name") if isinstance(peak, Mapping) else None
    text = f"{mfu:.1%}" + (f" of {name}" if isinstance(name, str) else "")
    precision = _num(summary.get("mfu_precision"))
    precision_peak = summary.get("precision_peak")
    precision_name = precision_peak.get("name") if isinstance(precision_peak, Mapping) else None
    if precision is not None and isinstance(precision_name, str) and precision_name != name:
        text += f"; {precision:.1%} of {precision_name}"
    return text


def _memory(spec: RunSpec, summary: Mapping[str, Any]) -> str:
    measured = _num(summary.get("peak_memory_gib"))
    kind = str(summary.get("memory_kind") or "")
    if measured is None:
        return "not measured"
    text = f"{measured:.2f} GiB ({kind})"
    try:
        predicted = estimate(spec).comparable_gib(kind)
    except (ArithmeticError, ValueError, IndexError):
        return text
    return (
        text + f" vs {predicted:.2f} GiB predicted ({measured / predicted - 1:+.0%})" if predicted else text
    )


def _shares(summary: Mapping[str, Any]) -> str:
    shares = summary.get("components")
    if not isinstance(shares, Mapping) or not shares:
        return "not timed"
    parts = [f"{name} {value:.0%}" for name, raw in shares.items() if (value := _num(raw)) is not None]
    coverage = _num(summary.get("component_coverage"))
    return ", ".join(parts) + (f" ({coverage:.0%} of the step timed)" if coverage is not None else "")


def _data_wait(summary: Mapping[str, Any]) -> str:
    wait = summary.get("data_wait")
    wait = wait if isinstance(wait, Mapping) else {}
    fraction, mean = _num(wait.get("fraction_of_step_time")), _num(wait.get("mean_s"))
    if fraction is None:
        return "not recorded"
    return f"{fraction:.1%} of the step" + (f" (mean {mean:.3f} s)" if mean is not None else "")


def _router(record: Mapping[str, Any]) -> list[str]:
    """The recorded routing load (torch engine: run.json "router"), and how a plan takes it."""
    section = record.get(ROUTER_SECTION)
    section = section if isinstance(section, Mapping) else {}
    worst, mean = _num(section.get("load_factor")), _num(section.get("mean_load_factor"))
    if worst is None:
        return []
    text = (
        f"x{worst:.2f} worst MoE layer (mean x{mean or 0:.2f}); a plan takes router.assumed_load={worst:.2f}"
    )
    if section.get("data_kind") in MOCK_KINDS:
        text += " (MOCK tokens: not a real workload's routing)"
    return [_row("router load (max/mean)", text)]


def _next(spec: RunSpec, run_dir: Path) -> list[str]:
    where = shlex.quote(str(run_dir))
    lines = [_row("report", f"moe-vlm report {where}")]
    if spec.profiling.tool is Profiler.torch:
        lines.append(_row("per-module table", f"python -m moe_vlm.report.module_table {where}"))
        lines.append(_row("profiler trace", str(run_dir / TORCH_PROFILE_DIR)))
    if spec.logger.backend is ExperimentLogger.tensorboard:
        lines.append(
            _row("TensorBoard", f"tensorboard --logdir {shlex.quote(str(run_dir / TENSORBOARD_DIR))}")
        )
    return lines


def summary_lines(spec: RunSpec, record: Mapping[str, Any], run_dir: Path) -> list[str]:
    """The end-of-run table (at most about 25 lines); run.json in run_dir has everything."""
    summary = record.get("summary")
    summary = summary if isinstance(summary, Mapping) else {}
    throughput = _num(summary.get("effective_tokens_per_s_per_gpu"))
    unit = "GPU" if spec.cluster.is_gpu_cluster else "rank"
    errors = summary.get("errors")
    rule = "-" * 78
    lines = [
        rule,
        _row("run directory", str(run_dir)),
        _row("status", str(record.get("status"))),
        _row("data", _labels(spec)),
        _row(f"effective tokens/s/{unit}", f"{throughput:,.1f}" if throughput is not None else "none"),
        _row("step time p50", _step_time(summary)),
        _row("predicted step", _predicted(record)),
        _row("MFU", _mfu(summary)),
        _row("peak memory", _memory(spec, summary)),
        _row("component shares", _shares(summary)),
        _row("data wait", _data_wait(summary)),
    ]
    lines += _router(record)
    if isinstance(errors, list) and errors:
        lines.append(_row("errors", "; ".join(str(e) for e in errors)[:300]))
    lines += [_row("everything", str(RunPaths(run_dir).run_json)), *_next(spec, run_dir), rule]
    return lines
