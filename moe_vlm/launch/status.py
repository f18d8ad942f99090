"""`moe-vlm status SWEEP_DIR`: where every point of a sweep stands.

States: queued, running, completed, failed, rejected (and `planned` for a point the sweeper
wrote down but never submitted, `unknown` when Slurm cannot be reached). A packed point
(`points_per_job` > 1) shows its Slurm step once it runs and its place in the pack; it is
`queued` until its step starts. Slurm is asked once
per refresh for all jobs (`scontrol show job`, plus one `sacct` where accounting keeps jobs the
controller forgot), never once per job. A job that ended without writing its record (scancel,
node loss) is classified from Slurm's state and its logs, and the failure is written to the
point's run.json, so reports see it too. A run outside Slurm whose `running` record outlived its
process (SIGKILL, the OOM killer) is recorded failed, class killed (failures.settle_running).

Each canary (launch/canary.py) is shown above the table: queued, running, passed or failed
with its last error line. Points held behind a failed canary never start: Slurm cancels them
(`--kill-on-invalid-dep=yes`) or, where a site keeps them, leaves them PENDING with
Reason=DependencyNeverSatisfied; either way they are recorded `failed` with class `stack` and
the canary's evidence.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from moe_vlm.base import inputs
from moe_vlm.base.files import POINT_JSON, RUN_JSON
from moe_vlm.launch import slurm
from moe_vlm.launch.canary import OK_PREFIX
from moe_vlm.record.records import RUNNING, TERMINAL, Failure, RecordError, RunRecord, RunStatus
from moe_vlm.runtime import points
from moe_vlm.runtime.failures import (
    Diagnosis,
    base_from_point,
    record_job_failure,
    settle_running,
    write_failure,
)

UNREADABLE = "unreadable"  # a point whose point.json or run.json no reader can use (shown, never rewritten)
STATES = ("completed", "failed", "rejected", "running", "queued", "planned", "unknown", UNREADABLE)
BAR_WIDTH = 30
# Slurm's reason for a job whose afterok dependency failed: it can never start.
NEVER_SATISFIED = "DependencyNeverSatisfied"
# Slurm's reason for a job waiting for its begin time: after a requeue, about two minutes.
BEGIN_TIME = "BeginTime"
# Lines Slurm itself writes into a job's stderr; the canary's evidence is the job's own last line.
SLURM_LINE = ("srun: ", "slurmstepd", "srun(")
CANARY_TAIL_LINES = 15


@dataclass
class PointStatus:
    point_id: str
    state: str
    job_id: str | None
    restarts: int
    overrides: list[str]
    detail: str
    point_dir: str
    step: str | None = None  # the Slurm step it runs (ran) in, once known
    pack: str | None = None  # "2/5": its place in a packed job
    rung: str | None = None  # a halving search's rung: "2/3", then "2/3 promoted" once decided


@dataclass
class CanaryStatus:
    job_id: str
    cluster: str
    container_image: str | None
    state: str  # queued | running | passed | failed | unknown
    detail: str  # the evidence line when failed
    point_ids: list[str]
    directory: str


def _canary_lines(directory: Path, job_id: str, stream: str) -> list[str]:
    path = directory / f"{job_id}_0_log.{stream}"
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    return [line.strip() for line in text.splitlines() if line.strip()]


def canary_evidence(directory: Path, job_id: str) -> str | None:
    """The canary's last error line (its `moe_vlm canary: FAILED ...` line, or whatever the
    interpreter or the container runtime said last), not Slurm's own lines."""
    own = [line for line in _canary_lines(directory, job_id, "err") if not line.startswith(SLURM_LINE)]
    return own[-1][:300] if own else None


def canary_state(directory: Path, job_id: str, states: dict[str, slurm.JobState] | None) -> tuple[str, str]:
    """(state, detail) of one canary: its exit status file decides; Slurm says the rest."""
    try:
        rc: int | None = int((directory / f"{job_id}{slurm.CANARY_RC_SUFFIX}").read_text().strip())
    except (OSError, ValueError):
        rc = None
    evidence = canary_evidence(directory, job_id)
    if rc == 0:
        passed = [line for line in _canary_lines(directory, job_id, "out") if line.startswith(OK_PREFIX)]
        return "passed", passed[-1] if passed else "exit status 0"
    if rc is not None:
        return "failed", evidence or f"the canary exited with status {rc}"
    job = (states or {}).get(job_id)
    if states is None:
        return "unknown", "Slurm is not reachable from here"
    if job is not None and job.state in slurm.PENDING_STATES:
        return "queued", job.state.lower()
    if job is not None and job.state in slurm.RUNNING_STATES:
        return "running", ""
    if job is not None and job.state == "COMPLETED":
        return "passed", "Slurm state COMPLETED"
    if job is not None:
        ended = f"the canary job ended {job.state}"
        return "failed", f"{ended}: {evidence}" if evidence else ended
    return "unknown", "Slurm forgot the canary job and it left no exit status"


def passed_canary(canary_dir: Path) -> str | None:
    """The job id of the canary recorded in this (sweep, cluster, image) directory when its exit
    status file says it passed, else None. The launcher submits no second canary for such a key:
    one canary per sweep, not per launch (a halving search launches once per rung). Only its own
    exit status counts as passed, not Slurm's state: a canary Slurm forgot proves nothing."""
    record = points.read_json(canary_dir / points.CANARY_JSON)
    if not record or not record.get("job_id"):
        return None
    job_id = str(record["job_id"])
    state, _ = canary_state(Path(str(record.get("dir") or canary_dir)), job_id, None)
    return job_id if state == "passed" else None


def collect_canaries(sweep_dir: Path, states: dict[str, slurm.JobState] | None) -> list[CanaryStatus]:
    out = []
    for record in points.iter_canaries(sweep_dir):
        job_id = str(record["job_id"])
        state, detail = canary_state(Path(str(record["dir"])), job_id, states)
        out.append(
            CanaryStatus(
                job_id=job_id,
                cluster=str(record.get("cluster")),
                container_image=record.get("container_image"),
                state=state,
                detail=detail,
                point_ids=list(record.get("point_ids") or []),
                directory=str(record["dir"]),
            )
        )
    return out


def _canary_of(point: dict[str, Any]) -> dict[str, Any] | None:
    canary = (point.get("submissions") or [{}])[-1].get("canary")
    return canary if isinstance(canary, dict) and canary.get("job_id") else None


def _open_canaries(sweep_dir: Path, info: dict[Path, tuple[dict[str, Any], RunRecord | None]]) -> list[str]:
    """Canary jobs without an exit status yet: the sweep's latest ones and those open points wait on."""
    wanted = {(str(r["dir"]), str(r["job_id"])) for r in points.iter_canaries(sweep_dir)}
    for point, run in info.values():
        canary = _canary_of(point)
        if canary and (run.status if run else None) not in TERMINAL:
            wanted.add((str(canary["dir"]), str(canary["job_id"])))
    return [job for folder, job in wanted if not (Path(folder) / f"{job}{slurm.CANARY_RC_SUFFIX}").exists()]


def _pack_of(point: dict[str, Any]) -> dict[str, Any] | None:
    pack = (point.get("submissions") or [{}])[-1].get("pack")
    return pack if isinstance(pack, dict) and pack.get("index") else None


def _rung_of(point: dict[str, Any]) -> str | None:
    """A halving search's rung (the sweeper writes it into point.json), with its decision once made."""
    halving = point.get("halving")
    if not isinstance(halving, dict) or halving.get("rung") is None:
        return None
    decision = halving.get("decision")
    return f"{halving['rung']}/{halving.get('rungs', '?')}" + (f" {decision}" if decision else "")


def _overrides(point: dict[str, Any]) -> list[str]:
    return [o for o in point.get("overrides", []) if not str(o).startswith("hydra.")]


def _finished_detail(record: RunRecord | Mapping[str, Any]) -> str:
    run = RunRecord.of(record)
    if run.status == RunStatus.failed:
        failure = run.failure or Failure("unknown", "")
        return f"{failure.name}: {failure.evidence or failure.message}"
    if run.status == RunStatus.rejected:
        return refusal_detail(
            [
                {"code": f.get("code"), "message": f.get("message")}
                for f in run.findings or []
                if f.get("level") == "error"
            ]
        ) or "rule(s) " + ", ".join(run.error_codes())
    summary = run.summary or {}
    parts = []
    p50 = (summary.get("step_time_s") or {}).get("p50")
    if isinstance(p50, int | float):
        parts.append(f"p50 step {p50:.3g} s")
    tokens = summary.get("effective_tokens_per_s_per_gpu")
    if isinstance(tokens, int | float):
        parts.append(f"{tokens:.4g} effective tok/s/GPU")
    return ", ".join(parts)


def refusal_detail(refused: list[dict[str, Any]]) -> str:
    """The refusing codes; a library refusal (LIB-*) with the library's own message, since no rule
    explains it ("" when nothing is refused)."""
    codes = [str(r.get("code")) for r in refused]
    if not codes:
        return ""
    library = next((r for r in refused if str(r.get("code")).startswith("LIB-")), None)
    if library is None:
        return "rule(s) " + ", ".join(codes)
    message = " ".join(str(library.get("message")).split())
    return f"refused by the library's own check {library['code']}: {message}"


def in_flight(status: PointStatus) -> bool:
    """Queued or running; or `unknown` for a Slurm job (the controller did not answer: under
    load squeue can time out). Whoever waits for points (submit_and_exit=false, a halving
    rung) waits through a moment Slurm could not be asked instead of taking it for the end."""
    if status.state in ("queued", "running"):
        return True
    if status.state != "unknown":
        return False
    submissions = (points.read_point(Path(status.point_dir)) or {}).get("submissions") or [{}]
    return bool(submissions[-1].get("executor") == "slurm")


def collect(sweep_dir: Path, record: bool = True) -> list[PointStatus]:
    """Every point's state; with `record`, write failed run.json for jobs that died silently."""
    return snapshot(sweep_dir, record)[0]


def read_points(
    sweep_dir: Path, skipped: list[RecordError]
) -> dict[Path, tuple[dict[str, Any], RunRecord | None]]:
    """Each point's point.json and run.json (None: not written yet); a point whose point.json or
    run.json no reader can use (read_point_checked, RunRecord.read) is left out, and why is added
    to `skipped`: shown, never overwritten by a failure record."""
    info: dict[Path, tuple[dict[str, Any], RunRecord | None]] = {}
    for point_dir in points.iter_points(sweep_dir):
        try:
            point = points.read_point_checked(point_dir)
            run = RunRecord.read(point_dir / RUN_JSON) if (point_dir / RUN_JSON).exists() else None
        except RecordError as exc:
            skipped.append(exc)
            continue
        info[point_dir] = (point, run)
    return info


def snapshot(
    sweep_dir: Path, record: bool = True, skipped: list[RecordError] | None = None
) -> tuple[list[PointStatus], list[CanaryStatus]]:
    """Every point's and every canary's state, from one Slurm query; points whose record cannot
    be used go to `skipped`."""
    info = read_points(sweep_dir, [] if skipped is None else skipped)
    open_jobs = [
        str(p.get("job_id"))
        for p, run in info.values()
        if p.get("job_id") and (run.status if run else None) not in TERMINAL
    ] + _open_canaries(sweep_dir, info)
    states = slurm.query_jobs(open_jobs) if open_jobs else {}
    out = []
    for point_dir, (point, run) in info.items():
        job_id = str(point["job_id"]) if point.get("job_id") else None
        launch = run.launch if run else {}
        restarts = int(launch.get("restarts") or 0)
        pack = _pack_of(point)
        state, detail = _state(point_dir, point, run, job_id, states, record)
        if job_id and states and job_id in states and pack is None:
            # A packed point counts its own restarts: the job's belong to whichever point a USR2 stopped.
            restarts = max(restarts, states[job_id].restarts)
        out.append(
            PointStatus(
                point_id=str(point.get("point_id") or (run.point_id if run else None) or point_dir.name),
                state=state,
                job_id=job_id,
                restarts=restarts,
                overrides=_overrides(point),
                detail=detail,
                point_dir=str(point_dir),
                step=str(launch["slurm_step_id"])
                if launch.get("slurm_step_id") is not None and pack
                else None,
                pack=f"{pack['index']}/{pack['size']}" if pack else None,
                rung=_rung_of(point),
            )
        )
    return out, collect_canaries(sweep_dir, states)


def _state(
    point_dir: Path,
    point: dict[str, Any],
    run: RunRecord | None,
    job_id: str | None,
    states: dict[str, slurm.JobState] | None,
    record: bool,
) -> tuple[str, str]:
    status = run.status if run else None
    if run and status in TERMINAL:
        return str(status), _finished_detail(run)
    executor = (point.get("submissions") or [{}])[-1].get("executor", "slurm")
    if not job_id or executor != "slurm":
        # No Slurm to ask: the record's own process (PID, heartbeat) says whether it still runs.
        if run and status == RUNNING:
            settled = settle_running(point_dir, run, write=record)
            if settled.status == "failed":
                return "failed", _finished_detail(settled)
            return "running", ""
        if not job_id:
            if points.planned_by_dry_run(point):
                refused = refusal_detail(point.get("refused") or [])
                verdict = (
                    ""
                    if point.get("valid", True)
                    else f"; would be rejected: {refused}"
                    if refused
                    else "; its rules would reject it (see its plan.json)"
                )
                return "planned", f"dry run: planned, not submitted{verdict}"
            return "planned", "not submitted"
        return "unknown", f"{executor} job {job_id} left no record"
    job = (states or {}).get(job_id)
    canary = _canary_of(point)
    if canary is not None:
        # The canary's exit status file decides even where Slurm cannot be asked: with afterok,
        # a point whose canary failed never started.
        canary_id, directory = str(canary["job_id"]), Path(str(canary["dir"]))
        verdict, evidence = canary_state(directory, canary_id, states)
        if verdict == "failed" or (job is not None and job.reason == NEVER_SATISFIED):
            if verdict != "failed":
                evidence = f"Slurm will never start it ({NEVER_SATISFIED}); canary job {canary_id}: {verdict}"
            return _held_behind_canary(point_dir, job_id, job, canary_id, directory, evidence, record)
        if job is not None and job.state in slurm.PENDING_STATES and verdict in ("queued", "running"):
            return "queued", f"waiting for canary job {canary_id} ({verdict})"
    if states is None:
        return "unknown", "Slurm is not reachable from here"
    if job is not None and job.state in slurm.PENDING_STATES:
        return "queued", pending_detail(job)
    if job is not None and job.state in slurm.RUNNING_STATES:
        pack = _pack_of(point)
        if pack is None:
            return "running", ""
        place = f"point {pack['index']}/{pack['size']} of pack job {job_id}"
        # The job runs another point of the pack, or this one's step is about to start.
        return ("running", place) if status == RUNNING else ("queued", f"waiting: {place}")
    if not record:
        return "unknown", f"job ended ({job.state if job else 'forgotten by Slurm'}) without a record"
    failed = record_job_failure(
        point_dir,
        job_id,
        job.state if job else None,
        job.exit_code if job else None,
        job.signal if job else None,
        # A packed point keeps the restarts it recorded: the job's may belong to another point.
        job.restarts if job and _pack_of(point) is None else None,
    )
    status = str(failed.get("status"))
    return status, _finished_detail(failed)


def pending_detail(job: slurm.JobState) -> str:
    """A pending job's state and Slurm's reason; a requeued job held to its begin time says why
    and how to release it."""
    if job.reason in ("", "None"):
        return job.state.lower()
    detail = f"{job.state.lower()} ({job.reason})"
    if job.reason == BEGIN_TIME and job.restarts:
        detail += (
            f": Slurm holds a requeued job about two minutes before it may start again; "
            f"`scontrol update JobId={job.job_id} StartTime=now` releases it"
        )
    return detail


def _held_behind_canary(
    point_dir: Path,
    job_id: str,
    job: slurm.JobState | None,
    canary_id: str,
    directory: Path,
    evidence: str,
    record: bool,
) -> tuple[str, str]:
    """The canary failed, so this point never started: record a `stack` failure with its evidence."""
    if not record:
        return "failed", f"stack: {evidence}"
    diagnosis = Diagnosis(
        "stack",
        f"the canary job {canary_id} failed in the job environment, so this point never started. "
        "Fix the environment (container image, setup lines, interpreter), then rerun the sweep command",
        evidence,
    )
    tail = [f"[canary] {line}" for line in _canary_lines(directory, canary_id, "err")[-CANARY_TAIL_LINES:]]
    launch = {
        "slurm_job_id": job_id,
        "slurm_state": job.state if job else None,
        "slurm_reason": job.reason if job else None,
        "canary_job_id": canary_id,
    }
    failed = write_failure(point_dir, diagnosis, tail, base_from_point(point_dir), launch)
    return str(failed.get("status")), _finished_detail(failed)


def progress_bar(statuses: list[PointStatus]) -> str:
    total = len(statuses)
    done = sum(s.state in TERMINAL for s in statuses)
    filled = BAR_WIDTH * done // total if total else BAR_WIDTH
    counts = ", ".join(f"{n} {state}" for state in STATES if (n := sum(s.state == state for s in statuses)))
    return f"[{'#' * filled}{'-' * (BAR_WIDTH - filled)}] {done}/{total} finished: {counts or 'no points'}"


def table(statuses: list[PointStatus]) -> str:
    rungs = any(s.rung for s in statuses)  # a halving search: which rung each run belongs to
    rows = [
        ("STATE", "POINT", "JOB", "STEP", "RESTARTS", *(("RUNG",) if rungs else ()), "OVERRIDES", "DETAIL")
    ]
    for s in statuses:
        rows.append(
            (
                s.state,
                s.point_id[:12],
                s.job_id or "-",
                _step_cell(s),
                str(s.restarts) if s.job_id else "-",
                *((s.rung or "-",) if rungs else ()),
                " ".join(s.overrides) or "-",
                s.detail,
            )
        )
    last = len(rows[0]) - 1
    widths = [max(len(row[i]) for row in rows) for i in range(last)]
    return "\n".join(
        "  ".join(cell.ljust(widths[i]) if i < last else cell for i, cell in enumerate(row)).rstrip()
        for row in rows
    )


def _step_cell(s: PointStatus) -> str:
    """`JOB.STEP` is what `scancel` and `sacct -j` take; `(2/5)` the point's place in its pack."""
    if s.pack is None:
        return "-"
    step = f"{s.job_id}.{s.step}" if s.step is not None and s.job_id else "-"
    return f"{step} ({s.pack})"


def canary_lines(canaries: list[CanaryStatus]) -> list[str]:
    return [
        f"canary job {c.job_id} (cluster={c.cluster}, image {c.container_image or '(none)'}): {c.state}"
        + (f": {c.detail}" if c.detail else "")
        for c in canaries
    ]


def unreadable_row(error: RecordError) -> PointStatus:
    """A point whose record cannot be read, as a row: counted and listed, never left out."""
    point_dir = error.path.parent
    return PointStatus(
        point_dir.name, UNREADABLE, None, 0, [], f"{error.path.name}: {error.why}", str(point_dir)
    )


def render(sweep_dir: Path, statuses: list[PointStatus], canaries: list[CanaryStatus] | None = None) -> str:
    bad = sum(s.state == UNREADABLE for s in statuses)
    return "\n".join(
        [
            f"sweep {sweep_dir}: {len(statuses)} point(s)"
            + (
                f", {bad} with a record that cannot be read (state {UNREADABLE}; fix or delete the file)"
                if bad
                else ""
            ),
            *canary_lines(canaries or []),
            progress_bar(statuses),
            "",
            table(statuses),
        ]
    )


def parser() -> argparse.ArgumentParser:
    parser = inputs.Parser(
        prog="moe-vlm status",
        description=__doc__.splitlines()[0] if __doc__ else None,
        epilog="example: moe-vlm status multirun/mbs=1,2-8d92f47b --watch 30   (the directory a sweep printed)",
    )
    parser.add_argument(
        "sweep_dir",
        type=inputs.ReadDir("multirun/<name>"),
        help="a sweep directory (hydra.sweep.dir), e.g. multirun/<name>",
    )
    parser.add_argument(
        "--watch",
        # time.sleep raises on a negative or huge interval, and 0 or NaN would poll without pause
        type=inputs.Number(0, inputs.MAX_SECONDS, "--watch 30", open_low=True),
        metavar="SECONDS",
        help="refresh every SECONDS until nothing is queued or running",
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object per point instead of the table"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
    except SystemExit as done:  # --help, or a refusal already printed on one line
        return int(done.code or 0)
    if not any(points.iter_points(args.sweep_dir)):
        single = (args.sweep_dir / RUN_JSON).exists()
        print(
            f"moe-vlm status: error: {args.sweep_dir}: not a sweep directory (no point directory with "
            f"{POINT_JSON} or {RUN_JSON} in it). Fix: pass the sweep directory the sweep printed "
            "(hydra.sweep.dir)" + (f"; for this one run: moe-vlm report {args.sweep_dir}" if single else "."),
            file=sys.stderr,
        )
        return 2
    while True:
        skipped: list[RecordError] = []
        readable, canaries = snapshot(args.sweep_dir, skipped=skipped)
        statuses = [*readable, *map(unreadable_row, skipped)]
        if args.json:
            for c in canaries:
                print(json.dumps({"canary": asdict(c)}, sort_keys=True))
            for s in statuses:
                print(json.dumps(asdict(s), sort_keys=True))
        else:
            print(render(args.sweep_dir, statuses, canaries))
        if not readable:
            print(
                f"moe-vlm status: error: {args.sweep_dir}: no point has a record status can use (each is listed "
                "above with why).",
                file=sys.stderr,
            )
            return 2
        states = [s.state for s in statuses] + [c.state for c in canaries]
        active = any(state in ("queued", "running") for state in states)
        if not args.watch or not active:
            return 0
        sys.stdout.flush()
        time.sleep(args.watch)
        print()
