"""`moe-vlm report --diff RUN_A RUN_B`: why is A faster than B?

Sets two runs side by side: where the step time goes (the steady window's step time, the seconds
per rank-step in the vision encoder, the projector and the decoder, the rest of the step, the data
wait), the throughput they add up to, then every configuration difference that can explain it:

- the knobs (run.json ``config``, the resolved Hydra config), for both engines;
- on the Megatron engine, Bridge's effective configuration (run.json ``bridge.effective``, or
  ``bridge_effective.json`` beside a run that failed before writing run.json): the config after
  Bridge's own runtime update, as the fields that differ from the library defaults
  (moe_vlm/engines/megatron/effective.py).

Runs of different classes (mock data, forced-balance routing) or of different effective work are
flagged: their time difference is not the configuration's alone. Prints Markdown; writes nothing.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from moe_vlm.base.errors import BadInput
from moe_vlm.config.schema import MOCK_KINDS
from moe_vlm.engines.megatron.effective import EFFECTIVE_JSON, differing
from moe_vlm.perf.flops import MODULES
from moe_vlm.record.records import RecordError, RunRecord
from moe_vlm.record.shape import RUN_SHAPE, load_json, problem
from moe_vlm.report import basis as report_basis
from moe_vlm.report.compare import _differs
from moe_vlm.report.markdown import markdown_table
from moe_vlm.report.table import PATH_HINT, find_run_files, row_of

OUTSIDE = "rest of the step"  # step time the three components do not explain: optimizer, comms, data


def load(path: str) -> tuple[Path, RunRecord]:
    """The one run.json under `path` (a run directory or its run.json)."""
    found = find_run_files([path])
    if len(found) != 1:
        where = "no run.json" if not found else f"{len(found)} run.json files"
        raise BadInput(f"--diff {path}: {where} under it; --diff compares two runs: {PATH_HINT}")
    try:
        return found[0], RunRecord.read(found[0])
    except RecordError as exc:
        raise BadInput(f"--diff {path}: {exc}; pass a run that wrote its record") from None


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as dotted leaves; lists stay one value."""
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key, item in value.items():
            out |= flatten(item, f"{prefix}{key}.")
        return out
    return {prefix.rstrip("."): value}


def effective(run_file: Path, record: RunRecord) -> dict[str, Any] | None:
    """Bridge's effective configuration, flat ("section.field"); None for a run without one (or
    whose bridge_effective.json is no such record: skipped with one line naming it and why)."""
    recorded = (record.sections.get("bridge") or {}).get("effective")
    beside = run_file.parent / EFFECTIVE_JSON
    if recorded is None and beside.is_file():
        try:
            recorded = load_json(beside)
            found = problem(recorded, RUN_SHAPE["bridge"]["effective"], EFFECTIVE_JSON)
            if found or not isinstance(recorded, dict):
                raise RecordError(beside, found or "not an object")
        except RecordError as exc:
            print(exc.skipped("moe-vlm report --diff"), file=sys.stderr)
            return None
    if not isinstance(recorded, dict):
        return None
    sections = recorded.get("sections") or {}
    return {f"{s}.{name}" if name else s: v for s, fields in sections.items() for name, v in fields.items()}


def _seconds(value: Any) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def times(record: RunRecord) -> dict[str, float | None]:
    """Seconds per step where the run spent them (steady window), and what they add up to."""
    summary = record.summary or {}
    step = summary.get("step_time_s") or {}
    per_component = summary.get("component_time_s_per_rank_step") or {}
    mean = _seconds(step.get("mean"))
    components = {m: _seconds(per_component.get(m)) for m in MODULES}
    known = [v for v in components.values() if v is not None]
    wait = (summary.get("data_wait") or {}).get("mean_s")
    return {
        "step time p50 (s)": _seconds(step.get("p50")),
        "step time mean (s)": mean,
        **{f"{m} (s per rank-step)": v for m, v in components.items()},
        f"{OUTSIDE} (s)": mean - sum(known) if mean is not None and known else None,
        "data wait mean (s)": _seconds(wait),
        "effective tokens/s/GPU": _seconds(summary.get("effective_tokens_per_s_per_gpu")),
        "TFLOP/s/GPU (model)": _seconds(summary.get("tflops_per_gpu")),
        "peak memory (GiB)": _seconds(summary.get("peak_memory_gib")),
    }


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.4g}"


def time_table(a: Mapping[str, float | None], b: Mapping[str, float | None]) -> str:
    body = []
    for name in a:
        left, right = a[name], b[name]
        delta = _number(left - right) if left is not None and right is not None else "-"
        ratio = f"{left / right:.3f}x" if left is not None and right else "-"
        body.append([name, _number(left), _number(right), delta, ratio])
    return markdown_table(["per step", "A", "B", "A - B", "A / B"], body)


def _cell(value: Any) -> str:
    text = "-" if value is None else json.dumps(value) if isinstance(value, dict | list) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def config_table(a: Mapping[str, Any], b: Mapping[str, Any], header: str) -> str:
    names = differing({"A": a, "B": b})
    if not names:
        return "No differences."
    return markdown_table([header, "A", "B"], [[n, _cell(a.get(n)), _cell(b.get(n))] for n in names])


def basis_table(a: RunRecord, b: RunRecord) -> str:
    rows = report_basis.diff_rows(a.summary or {}, b.summary or {})
    if not rows:
        return "Neither run recorded one (recorded from this version on)."
    return markdown_table(["per step", "A", "B"], rows)


def _class(row: Mapping[str, Any]) -> str:
    if row.get("data") in {kind.value for kind in MOCK_KINDS}:
        return "mock data"
    if row.get("forced_balance"):
        return "forced-balance routing"
    return f"{row.get('data') or 'unknown'} data, real routing"  # the run's own kind, never "synthetic/real"


def flags(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """Why the time difference may not be the configuration's alone."""
    out = []
    if _class(a) != _class(b):
        out.append(f"A is {_class(a)}, B is {_class(b)}: not a like-for-like comparison")
    for column, what in (
        ("real_tokens_per_step", "effective tokens/step"),
        ("image_tokens_per_step", "image tokens/step"),
    ):
        if _differs(a.get(column), b.get(column)):
            out.append(f"A and B do different effective work: {what} {a.get(column)} vs {b.get(column)}")
    for run, row in (("A", a), ("B", b)):
        if row.get("status") != "completed":
            out.append(f"{run} did not complete ({row.get('status')}): it has no step times")
    return out


def headline(a: Mapping[str, float | None], b: Mapping[str, float | None]) -> str:
    """The step-time difference, split into where it went."""
    tput_a, tput_b = a["effective tokens/s/GPU"], b["effective tokens/s/GPU"]
    mean_a, mean_b = a["step time mean (s)"], b["step time mean (s)"]
    if not (tput_a and tput_b and mean_a is not None and mean_b is not None):
        return "No throughput to compare (a run without steady steps)."
    parts = []
    for name in [f"{m} (s per rank-step)" for m in MODULES] + [f"{OUTSIDE} (s)"]:
        left, right = a[name], b[name]
        if left is not None and right is not None:
            parts.append(f"{name.split(' (')[0]} {left - right:+.4g} s")
    split = f", of which {', '.join(parts)}" if parts else " (no component times recorded)"
    return (
        f"A runs at {tput_a / tput_b:.3f}x B's effective tokens/s/GPU; its mean step is "
        f"{mean_a - mean_b:+.4g} s ({mean_a:.4g} vs {mean_b:.4g} s){split}."
    )


def render(path_a: str, path_b: str) -> str:
    (file_a, rec_a), (file_b, rec_b) = load(path_a), load(path_b)
    row_a, row_b = row_of(file_a, rec_a), row_of(file_b, rec_b)
    time_a, time_b = times(rec_a), times(rec_b)
    lines = [
        "# moe-vlm report --diff: why is A faster than B?",
        "",
        f"- A: {file_a.parent} (engine {row_a['engine']}, {_class(row_a)}, {row_a['status']})",
        f"- B: {file_b.parent} (engine {row_b['engine']}, {_class(row_b)}, {row_b['status']})",
        "",
        headline(time_a, time_b),
        *(f"\n**FLAG**: {flag}" for flag in flags(row_a, row_b)),
        "",
        "## Where the step time goes (steady window)",
        "",
        time_table(time_a, time_b),
        "",
        f"Component times are forward + backward seconds per rank-step; {OUTSIDE} = mean step time minus "
        "them (optimizer, communication not overlapped, data wait).",
        "",
        "## Bridge's logged FLOPs basis vs ours (mean steady step)",
        "",
        basis_table(rec_a, rec_b),
        "",
        "Bridge's count - the terms = ours: padded positions, the padded vocabulary, how the ViT and mergers "
        "are counted, frozen modules counted x3 (moe_vlm/perf/flops_basis.py).",
        "",
        "## Knobs that differ (resolved config)",
        "",
        config_table(flatten(rec_a.config), flatten(rec_b.config), "key"),
    ]
    eff_a, eff_b = effective(file_a, rec_a), effective(file_b, rec_b)
    lines += ["", "## Bridge's effective configuration that differs (after its runtime update)", ""]
    if eff_a is None and eff_b is None:
        lines.append(
            "Neither run recorded one (torch engine runs have none: their knobs above are the config)."
        )
    elif eff_a is None or eff_b is None:
        lines.append(
            f"Only {'B' if eff_a is None else 'A'} recorded one (a Megatron run): nothing to set beside it."
        )
    else:
        lines.append(config_table(eff_a, eff_b, "field"))
    return "\n".join(lines) + "\n"
