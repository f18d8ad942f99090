"""Recorded runs as calibration samples: each run's terms on the workload it measured, and the
step period it measured (the basis its rates use, moe_vlm/perf/metrics.py time_basis)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moe_vlm.base.files import RUN_JSON, STEPS_JSONL
from moe_vlm.config.spec import RunSpec
from moe_vlm.perf.flops import Workload
from moe_vlm.perf.metrics import by_step, steady_window, workload_of
from moe_vlm.predict.calibration import Sample, stack_of
from moe_vlm.predict.hardware import Hardware
from moe_vlm.predict.model import measured_window
from moe_vlm.predict.step_time import loads
from moe_vlm.record.records import RunRecord, RunStatus, read_steps
from moe_vlm.record.shape import RecordError


@dataclass(frozen=True)
class RecordedRun:
    run_dir: Path
    record: RunRecord
    spec: RunSpec
    workload: Workload  # mean over the steady steps
    measured_s: float  # mean step period (else step time) over the steady window
    cluster: str
    stack: str

    def sample(self, hw: Hardware) -> Sample:
        """The run's terms on the workload it recorded, at `hw`'s rates, and its measured step."""
        return Sample(
            str(self.run_dir),
            {load.term: load.base_s for load in loads(self.spec, self.workload, hw)},
            self.measured_s,
        )


def measured_step_s(summary: dict[str, Any]) -> float | None:
    """The mean of the seconds the summary's rates divide by (model.measured_window decides which)."""
    window = measured_window(summary)
    mean = window[0].get("mean") if window is not None else None
    return float(mean) if isinstance(mean, int | float) and not isinstance(mean, bool) and mean > 0 else None


def mean_workload(run_dir: Path, warmup_steps: int) -> Workload | None:
    grouped = by_step(read_steps(run_dir / STEPS_JSONL))
    window = steady_window(grouped, warmup_steps)
    found = [workload_of(grouped[n]) for n in window.steps]
    if not found:
        return None
    n = len(found)

    def mean(name: str) -> int:
        return round(sum(getattr(w, name) for w in found) / n)

    return Workload(**{name: mean(name) for name in vars(found[0])})


def recorded(run_dir: Path) -> RecordedRun | str:
    """A completed run as a calibration sample, or why it cannot be one (one line)."""
    try:
        record = RunRecord.read(run_dir)
    except (RecordError, OSError) as exc:
        return str(exc)
    if record.status != RunStatus.completed.value:
        return f"{run_dir}: status {record.status}, not completed"
    measured = measured_step_s(record.summary or {})
    if measured is None:
        return f"{run_dir}: no steady step time in its summary"
    try:
        spec = RunSpec.from_recorded(record.config)
    except Exception as exc:  # a config this version no longer builds: said, not fatal
        return f"{run_dir}: its config no longer builds a RunSpec ({type(exc).__name__}: {exc})"
    workload = mean_workload(run_dir, spec.warmup_steps)
    if workload is None:
        return f"{run_dir}: no steady steps in {STEPS_JSONL}"
    return RecordedRun(
        run_dir, record, spec, workload, measured, spec.cluster.name, stack_of(spec.engine, record.env)
    )


def find_runs(paths: Iterable[Path]) -> list[Path]:
    """Every run directory (one holding run.json) under the given paths, sorted."""
    found: set[Path] = set()
    for path in paths:
        if (path / RUN_JSON).is_file():
            found.add(path)
        elif path.is_dir():
            found.update(p.parent for p in path.rglob(RUN_JSON))
    return sorted(found)
