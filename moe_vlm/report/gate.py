"""`moe-vlm report SWEEP --baseline FILE`: a gate a CI can call, against a baseline saved from a
sweep it trusts (`--save-baseline FILE`).

Every completed run of a config the baseline holds is judged over one fixed window of steps
(`--window A-B`, else the baseline's, which `--save-baseline` takes from its runs: the steps every
one of them has in its steady window), as Bridge's performance scripts gate on a fixed window:

- throughput: its median effective tokens/s/GPU more than `--tolerance` below the baseline's and
  its p10-p90 band clear below the baseline's band (a difference inside the measured noise is
  never a regression; the band is the rate at the window's p90 and p10 step);
- peak memory more than `--memory-tolerance` above the baseline's;
- any NaN loss, any skipped iteration (Megatron's `skipped_iter`) inside the window;
- a window the run does not cover, or a run of the config that no longer completes.

Each failing figure is one line (`GATE FAIL ...`); the exit status is 1 when any run fails a gate,
0 when all pass. Both sides' software (Python, torch, transformers, Megatron, the git commit) and
container image are stated; where they differ the failing line says so, so a regression that
came with a container upgrade is named as one.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from moe_vlm.base.errors import BadInput
from moe_vlm.base.files import STEPS_JSONL, RunPaths, write_atomic
from moe_vlm.config.spec import RunSpec
from moe_vlm.perf.metrics import by_step, summarize
from moe_vlm.record.records import RecordError, RunRecord, read_steps
from moe_vlm.report.compare import BASELINE_METRIC, identity
from moe_vlm.report.table import throughput_band

BASELINE_VERSION = 2
DEFAULT_MEMORY_TOLERANCE = 0.10
SKIPPED = "skipped_iter"
# What "software" names in a run's record (run.json env, base/provenance.environment) and its image.
SOFTWARE = ("python", "torch", "transformers", "megatron_core", "megatron_bridge")


@dataclass(frozen=True)
class Window:
    first: int
    last: int

    def text(self) -> str:
        return f"{self.first}-{self.last}"


@dataclass
class Figures:
    """One run over the window: the median rate and its band, peak memory, NaN and skipped steps."""

    p50: float
    low: float
    high: float
    peak_memory_gib: float | None
    nan_steps: list[int]
    skipped_steps: list[int]
    software: dict[str, Any]


def software_of(run: RunRecord) -> dict[str, Any]:
    env = run.env
    out: dict[str, Any] = {name: env.get(name) for name in SOFTWARE if env.get(name)}
    raw = env.get("git")
    git: dict[str, Any] = raw if isinstance(raw, dict) else {}
    if git.get("commit"):
        out["git"] = str(git["commit"])[:12] + ("-dirty" if git.get("dirty") else "")
    out["container_image"] = run.launch.get("container_image")
    return out


def steady_steps(run: RunRecord) -> Window | None:
    steps = (run.summary or {}).get("steady_steps")
    return Window(int(steps[0]), int(steps[1])) if isinstance(steps, list) and len(steps) == 2 else None


def figures_of(run_dir: Path, run: RunRecord, window: Window) -> Figures | str:
    """The run's figures over the window, or why it has none (the window not covered). A run
    without its steps.jsonl is judged on its summary when its steady window is the window."""
    if not (run_dir / STEPS_JSONL).exists():
        return _from_summary(run, window)
    grouped = by_step(read_steps(run_dir / STEPS_JSONL))
    missing = [s for s in range(window.first, window.last + 1) if s not in grouped]
    warmup = int((run.spec or {}).get("warmup_steps") or 0)
    if missing or window.first <= warmup:
        have = f"{min(grouped)}-{max(grouped)}" if grouped else "none"
        return f"steps {window.text()} not covered (it recorded steps {have}, warm-up {warmup})"
    inside = [grouped[s] for s in range(window.first, window.last + 1)]
    nan = [lines[0].step for lines in inside if any(_nan(r.loss) for r in lines)]
    skipped = [lines[0].step for lines in inside if any(r.exclude == SKIPPED for r in lines)]
    try:
        spec = RunSpec.from_recorded(run.config)
    except Exception as exc:  # a record whose config no longer builds: say so, as a gate failure
        return f"its config no longer builds ({exc.__class__.__name__})"
    summary = summarize([r for lines in inside for r in lines], spec)
    return _figures(run, summary, window, nan, skipped)


def _from_summary(run: RunRecord, window: Window) -> Figures | str:
    own = steady_steps(run)
    if own != window:
        have = own.text() if own else "none"
        return f"steps {window.text()} not covered (no steps.jsonl; its steady window is {have})"
    return _figures(run, run.summary or {}, window, [], [])


def _figures(
    run: RunRecord, summary: dict[str, Any], window: Window, nan: list[int], skipped: list[int]
) -> Figures | str:
    band = throughput_band(summary)
    if band.get("eff_p50") is None:
        why = "; ".join(summary.get("errors") or []) or "no step periods"
        return f"no rate over steps {window.text()}: {why}"
    middle = float(band["eff_p50"] or 0.0)
    return Figures(
        middle,
        float(band["eff_low"] or middle),
        float(band["eff_high"] or middle),
        summary.get("peak_memory_gib"),
        nan,
        skipped,
        software_of(run),
    )


def _nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _read(run_dir: str) -> RunRecord | None:
    try:
        return RunRecord.read(RunPaths(Path(run_dir)).run_json)
    except RecordError:
        return None


# --- saving ------------------------------------------------------------------------------------


def common_window(table: pd.DataFrame) -> Window | None:
    """The steps every completed run has in its steady window (the baseline's default window)."""
    windows = [
        w
        for r in table[table["status"] == "completed"]["run_dir"]
        if (run := _read(r)) and (w := steady_steps(run))
    ]
    if not windows:
        return None
    first, last = max(w.first for w in windows), min(w.last for w in windows)
    return Window(first, last) if first <= last else None


def save(table: pd.DataFrame, path: Path, window: Window | None) -> tuple[int, Window | None, list[str]]:
    """Write the baseline: per config, its runs' median rate over the window, the union of their
    bands, their highest peak memory and their software. Returns (configs saved, the window, the
    completed runs left out and why)."""
    window = window or common_window(table)
    configs: dict[str, dict[str, Any]] = {}
    left_out: list[str] = []
    for _, row in table[table["status"] == "completed"].iterrows():
        run = _read(str(row["run_dir"]))
        if run is None or window is None:
            continue
        found = figures_of(Path(str(row["run_dir"])), run, window)
        if isinstance(found, str):
            left_out.append(f"{row['run']}: {found}")
            continue
        entry = configs.setdefault(
            identity(row),
            {"config": identity(row), "data": row["data"], "runs": [], "software": found.software},
        )
        entry["runs"].append({"run_dir": row["run_dir"], **asdict(found)})
    out = []
    for entry in configs.values():
        runs = entry.pop("runs")
        memory = [r["peak_memory_gib"] for r in runs if r["peak_memory_gib"] is not None]
        out.append(
            {
                **entry,
                BASELINE_METRIC: statistics.median(r["p50"] for r in runs),
                "band": [min(r["low"] for r in runs), max(r["high"] for r in runs)],
                "peak_memory_gib": max(memory) if memory else None,
                "run_dirs": [r["run_dir"] for r in runs],
            }
        )
    payload = {
        "metric": BASELINE_METRIC,
        "version": BASELINE_VERSION,
        "window": [window.first, window.last] if window else None,
        "configs": out,
    }
    write_atomic(path, json.dumps(payload, indent=2, default=str) + "\n")
    return len(out), window, left_out


# --- judging -----------------------------------------------------------------------------------


@dataclass
class Baseline:
    window: Window | None
    configs: dict[str, dict[str, Any]]


def load(path: Path) -> Baseline:
    if not path.is_file():
        raise BadInput(
            f"--baseline {path}: {'a directory' if path.is_dir() else 'no such file'}; pass a file "
            "written by --save-baseline FILE (e.g. moe-vlm report SWEEP --save-baseline baseline.json)"
        )
    try:
        payload = json.loads(path.read_text())
        configs = {str(c["config"]): dict(c) for c in payload["configs"]}
        for entry in configs.values():
            float(entry[BASELINE_METRIC])
        raw = payload.get("window")
        window = Window(int(raw[0]), int(raw[1])) if raw else None
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError, IndexError) as exc:
        raise BadInput(
            f"--baseline {path}: not a baseline file ({exc.__class__.__name__}: {exc}); "
            "write one with --save-baseline FILE"
        ) from exc
    return Baseline(window, configs)


@dataclass
class Judged:
    config: str
    run: str
    verdict: str  # "pass" | "FAIL" | "not run"
    window: str
    now: float | None = None
    band: tuple[float, float] | None = None
    failures: list[str] = field(default_factory=list)
    software: str = ""


def _changes(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    keys = [k for k in (*SOFTWARE, "git", "container_image") if k in before or k in now]
    return [f"{k} {before.get(k) or '-'} -> {now.get(k) or '-'}" for k in keys if before.get(k) != now.get(k)]


def judge(
    table: pd.DataFrame, baseline: Baseline, tolerance: float, memory_tolerance: float, window: Window | None
) -> list[Judged]:
    out = []
    by_config: dict[str, list[pd.Series]] = {}
    for _, row in table.iterrows():
        by_config.setdefault(identity(row), []).append(row)
    for config, before in sorted(baseline.configs.items()):
        rows = by_config.get(config, [])
        if not rows:
            out.append(Judged(config, "-", "not run", "-"))
        for row in rows:
            out.append(
                _judge_run(config, row, before, tolerance, memory_tolerance, window or baseline.window)
            )
    return out


def _judge_run(
    config: str,
    row: pd.Series,
    before: dict[str, Any],
    tolerance: float,
    memory_tolerance: float,
    window: Window | None,
) -> Judged:
    run_dir = str(row["run_dir"])
    run = _read(run_dir)
    name = str(row.get("run", Path(run_dir).name))
    if row["status"] != "completed" or run is None:
        return Judged(
            config, name, "FAIL", "-", failures=[f"the run {row['status']} (it completed in the baseline)"]
        )
    window = window or steady_steps(run)
    if window is None:
        return Judged(config, name, "FAIL", "-", failures=["no steady window"])
    found = figures_of(Path(run_dir), run, window)
    if isinstance(found, str):
        return Judged(config, name, "FAIL", window.text(), failures=[found])
    judged = Judged(config, name, "pass", window.text(), found.p50, (found.low, found.high))
    if before.get("software"):
        changed = _changes(before["software"], found.software)
        judged.software = "software changed: " + ", ".join(changed) if changed else "same software"
    else:  # a baseline saved before it recorded the software
        judged.software = "the baseline records no software"
    base = float(before[BASELINE_METRIC])
    band = before.get("band")
    change = found.p50 / base - 1.0
    clear = band is None or found.high < float(band[0])  # the bands do not overlap
    if change < -tolerance and clear:
        shown = f" [{float(band[0]):,.1f}-{float(band[1]):,.1f}]" if band else ""
        judged.failures.append(
            f"effective tokens/s/GPU {found.p50:,.1f} [{found.low:,.1f}-{found.high:,.1f}] vs baseline "
            f"{base:,.1f}{shown}: {change:+.1%} (tolerance -{tolerance:.0%}, bands apart)"
        )
    memory = before.get("peak_memory_gib")
    if (
        memory
        and found.peak_memory_gib is not None
        and found.peak_memory_gib > memory * (1 + memory_tolerance)
    ):
        judged.failures.append(
            f"peak memory {found.peak_memory_gib:.2f} GiB vs baseline {float(memory):.2f} GiB: "
            f"{found.peak_memory_gib / memory - 1:+.1%} (tolerance +{memory_tolerance:.0%})"
        )
    if found.nan_steps:
        judged.failures.append(f"NaN loss at step(s) {', '.join(map(str, found.nan_steps))}")
    if found.skipped_steps:
        judged.failures.append(f"skipped iteration(s) at step(s) {', '.join(map(str, found.skipped_steps))}")
    if judged.failures:
        judged.verdict = "FAIL"
    return judged


def short_labels(configs: list[str]) -> dict[str, str]:
    """Each config by the knobs that tell it from the others ("the config" when there is one)."""
    split = {c: c.split(",") for c in configs}
    common = set.intersection(*(set(parts) for parts in split.values())) if split else set()
    return {c: ",".join(p for p in parts if p not in common) or "the config" for c, parts in split.items()}


def lines(judged: list[Judged]) -> list[str]:
    """One line per failing figure (what a CI log shows), then one per run that passed."""
    label = short_labels(sorted({j.config for j in judged}))
    out = []
    for j in judged:
        for failure in j.failures:
            software = f"; {j.software}" if j.software else ""
            out.append(f"GATE FAIL {j.run} ({label[j.config]}, steps {j.window}): {failure}{software}")
    for j in judged:
        if j.verdict == "pass":
            out.append(
                f"gate pass {j.run} ({label[j.config]}, steps {j.window}): {j.now:,.1f} effective "
                f"tokens/s/GPU; {j.software}"
            )
        elif j.verdict == "not run":
            out.append(f"gate: {label[j.config]}: in the baseline, not among these runs (not judged)")
    return out


def markdown(judged: list[Judged], path: Path, tolerance: float, memory_tolerance: float) -> str:
    failed = sum(j.verdict == "FAIL" for j in judged)
    head = (
        f"Against {path}: throughput more than {tolerance:.0%} below the baseline with the p10-p90 bands "
        f"apart, peak memory more than {memory_tolerance:.0%} above it, any NaN loss or skipped iteration "
        f"in the window: {failed} of {sum(j.verdict != 'not run' for j in judged)} run(s) failed."
    )
    return head + "\n\n" + "\n".join(f"- {line}" for line in lines(judged))
