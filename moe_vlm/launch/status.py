"""`moe-vlm status SWEEP_DIR`: where every point of a sweep stands.

States: queued, running, completed, failed, rejected (and `planned` for a point the sweeper
wrote down but never submitted, `unknown` when Slurm cannot be reached). Slurm is asked once
per refresh for all jobs (`scontrol show job`, plus one `sacct` where accounting keeps jobs the
controller forgot), never once per job. A job that ended without writing its record (scancel,
node loss) is classified from Slurm's state and its logs, and the failure is written to the
point's run.json, so reports see it too.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from moe_vlm.launch import points, slurm
from moe_vlm.launch.failures import record_job_failure

STATES = ("completed", "failed", "rejected", "running", "queued", "planned", "unknown")
FINISHED = ("completed", "failed", "rejected")
BAR_WIDTH = 30


@dataclass
class PointStatus:
    point_id: str
    state: str
    job_id: str | None
    restarts: int
    overrides: list[str]
    detail: str
    point_dir: str


def _overrides(point: dict[str, Any]) -> list[str]:
    return [o for o in point.get("overrides", []) if not str(o).startswith("hydra.")]


def _finished_detail(run: dict[str, Any]) -> str:
    status = run.get("status")
    if status == "failed":
        failure = run.get("failure") or {}
        return f"{failure.get('class', 'unknown')}: {failure.get('evidence') or failure.get('message', '')}"
    if status == "rejected":
        codes = [f.get("code") for f in run.get("findings", []) if f.get("level") == "error"]
        return "rule(s) " + ", ".join(str(c) for c in codes)
    summary = run.get("summary") or {}
    parts = []
    p50 = (summary.get("step_time_s") or {}).get("p50")
    if isinstance(p50, int | float):
        parts.append(f"p50 step {p50:.3g} s")
    tokens = summary.get("effective_tokens_per_s_per_gpu")
    if isinstance(tokens, int | float):
        parts.append(f"{tokens:.4g} effective tok/s/GPU")
    return ", ".join(parts)


def collect(sweep_dir: Path, record: bool = True) -> list[PointStatus]:
    """Every point's state; with `record`, write failed run.json for jobs that died silently."""
    dirs = list(points.iter_points(sweep_dir))
    info = {d: (points.read_point(d) or {}, points.read_run(d)) for d in dirs}
    open_jobs = [
        str(p.get("job_id"))
        for p, run in info.values()
        if p.get("job_id") and (run or {}).get("status") not in points.TERMINAL
    ]
    states = slurm.query_jobs(open_jobs) if open_jobs else {}
    out = []
    for point_dir, (point, run) in info.items():
        job_id = str(point["job_id"]) if point.get("job_id") else None
        restarts = int(((run or {}).get("launch") or {}).get("restarts") or 0)
        state, detail = _state(point_dir, point, run, job_id, states, record)
        if job_id and states and job_id in states:
            restarts = max(restarts, states[job_id].restarts)
        out.append(
            PointStatus(
                point_id=str(point.get("point_id") or (run or {}).get("point_id") or point_dir.name),
                state=state,
                job_id=job_id,
                restarts=restarts,
                overrides=_overrides(point),
                detail=detail,
                point_dir=str(point_dir),
            )
        )
    return out


def _state(
    point_dir: Path,
    point: dict[str, Any],
    run: dict[str, Any] | None,
    job_id: str | None,
    states: dict[str, slurm.JobState] | None,
    record: bool,
) -> tuple[str, str]:
    if run and run.get("status") in points.TERMINAL:
        return str(run["status"]), _finished_detail(run)
    if not job_id:
        return "planned", "not submitted"
    executor = (point.get("submissions") or [{}])[-1].get("executor", "slurm")
    if executor != "slurm":
        return "unknown", f"{executor} job {job_id} left no record"
    if states is None:
        return "unknown", "Slurm is not reachable from here"
    job = states.get(job_id)
    if job is not None and job.state in slurm.PENDING_STATES:
        return "queued", f"{job.state.lower()} ({job.reason})" if job.reason not in (
            "",
            "None",
        ) else job.state.lower()
    if job is not None and job.state in slurm.RUNNING_STATES:
        return "running", ""
    if not record:
        return "unknown", f"job ended ({job.state if job else 'forgotten by Slurm'}) without a record"
    failed = record_job_failure(
        point_dir,
        job_id,
        job.state if job else None,
        job.exit_code if job else None,
        job.signal if job else None,
        job.restarts if job else None,
    )
    status = str(failed.get("status"))
    return status, _finished_detail(failed)


def progress_bar(statuses: list[PointStatus]) -> str:
    total = len(statuses)
    done = sum(s.state in FINISHED for s in statuses)
    filled = BAR_WIDTH * done // total if total else BAR_WIDTH
    counts = ", ".join(f"{n} {state}" for state in STATES if (n := sum(s.state == state for s in statuses)))
    return f"[{'#' * filled}{'-' * (BAR_WIDTH - filled)}] {done}/{total} finished: {counts or 'no points'}"


def table(statuses: list[PointStatus]) -> str:
    rows = [("STATE", "POINT", "JOB", "RESTARTS", "OVERRIDES", "DETAIL")]
    for s in statuses:
        rows.append(
            (
                s.state,
                s.point_id[:12],
                s.job_id or "-",
                str(s.restarts) if s.job_id else "-",
                " ".join(s.overrides) or "-",
                s.detail,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    return "\n".join(
        "  ".join(cell.ljust(widths[i]) if i < 5 else cell for i, cell in enumerate(row)).rstrip()
        for row in rows
    )


def render(sweep_dir: Path, statuses: list[PointStatus]) -> str:
    return "\n".join(
        [f"sweep {sweep_dir}: {len(statuses)} point(s)", progress_bar(statuses), "", table(statuses)]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="moe-vlm status", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument(
        "sweep_dir", type=Path, help="a sweep directory (hydra.sweep.dir), e.g. multirun/<name>"
    )
    parser.add_argument(
        "--watch",
        type=float,
        metavar="SECONDS",
        help="refresh every SECONDS until nothing is queued or running",
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object per point instead of the table"
    )
    args = parser.parse_args(argv)
    if not args.sweep_dir.is_dir():
        print(
            f"moe-vlm status: error: {args.sweep_dir}: no such directory. Fix: pass the sweep directory "
            "the sweep printed (hydra.sweep.dir).",
            file=sys.stderr,
        )
        return 2
    while True:
        statuses = collect(args.sweep_dir)
        if args.json:
            for s in statuses:
                print(json.dumps(asdict(s), sort_keys=True))
        else:
            print(render(args.sweep_dir, statuses))
        active = any(s.state in ("queued", "running") for s in statuses)
        if not args.watch or not active:
            return 0
        sys.stdout.flush()
        time.sleep(args.watch)
        print()
