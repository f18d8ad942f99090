"""The sweep directory: one subdirectory per point, named by the point's identity.

    <sweep dir>/
      multirun.yaml            the sweep's config (secrets masked)
      <point_id>/point.json    written by the sweeper: overrides, resolved config, submissions
      <point_id>/run.json      written by the run (running at its start, then completed | failed)
                               or the sweeper (rejected); heartbeat.json beside it while it runs
      <point_id>/attempts/N/   an earlier attempt's records, moved aside before a rerun
      .submitit/<job id>/      submitit's pickles and per-task logs (an array task: <array>_<index>)
      .submitit/pack-<token>/  a packed job's batch log; <point_id>/ its pickle and step logs
      canaries/<cluster>-<image hash>/  the canary's script, canary.json, logs, <job id>.rc

A point's directory is its identity (hash of the resolved config and the code version),
so rerunning the same sweep finds every earlier result, whatever the order of the grid.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from moe_vlm.base.errors import BadInput
from moe_vlm.base.files import (
    CANARIES,
    CANARY_JSON,
    POINT_JSON,
    RUN_JSON,
    RunPaths,
    link_atomic,
    write_json_atomic,
)
from moe_vlm.base.provenance import point_id
from moe_vlm.base.safety import scrub
from moe_vlm.config.compose import override_key
from moe_vlm.config.schema import DryRun, dry_run_mode
from moe_vlm.record.records import TERMINAL, RecordError, RunRecord
from moe_vlm.record.shape import POINT_SHAPE, load_json, problem


def identity(config: dict[str, Any], code_version: str | None) -> str:
    """The point_id the real run records: a dry run shows the identity of the run it plans."""
    return point_id({**config, "dry_run": False}, code_version)


def resolved(task: DictConfig) -> dict[str, Any]:
    """The resolved task config as run.json records it (secrets masked)."""
    plain = OmegaConf.to_container(task, resolve=True, enum_to_str=True)
    assert isinstance(plain, dict)
    return scrub({str(k): v for k, v in plain.items()})


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object file (point.json, canary.json, a requeue marker); None when it is missing or
    no object a reader can use (shape.load_json: binary, truncated, nested too deep)."""
    try:
        payload = load_json(path)
    except RecordError:
        return None
    return payload if isinstance(payload, dict) else None


def read_point(point_dir: Path) -> dict[str, Any] | None:
    return read_json(point_dir / POINT_JSON)


def read_point_checked(point_dir: Path) -> dict[str, Any]:
    """point.json as `moe-vlm status` reads it ({} when there is none: a point with only a run.json);
    RecordError when no reader can use it (binary, not JSON, a value of the wrong type: POINT_SHAPE)."""
    path = point_dir / POINT_JSON
    if not path.exists():
        return {}
    point = load_json(path)
    found = problem(point, POINT_SHAPE, POINT_JSON) if isinstance(point, dict) else "not an object"
    if found:
        raise RecordError(path, found.removeprefix(f"{POINT_JSON}."))
    return point


def read_run(point_dir: Path) -> RunRecord | None:
    """The point's run.json (RunRecord.read); None when there is none, or none a reader can use
    (the commands that show records name the file and why: RunRecord.read's RecordError)."""
    try:
        return RunRecord.read(point_dir / RUN_JSON)
    except RecordError:
        return None


def run_status(point_dir: Path) -> str | None:
    run = read_run(point_dir)
    return run.status if run and run.status in TERMINAL else None


def write_point(point_dir: Path, payload: dict[str, Any]) -> None:
    write_json_atomic(point_dir / POINT_JSON, scrub(payload))


def update_point(point_dir: Path, **changes: Any) -> dict[str, Any]:
    payload = read_point(point_dir) or {}
    payload.update(changes)
    write_point(point_dir, payload)
    return payload


CANARY_POINTS = "points.json"  # in a canary's directory: the points it checks (canary.py --points)


def refused(point_dir: Path) -> list[dict[str, Any]]:
    """point.json's refusals ({code, message}): the sweeper's, or the canary's library checks'.
    A point with any never starts (moe_vlm/run/task.py)."""
    found = (read_point(point_dir) or {}).get("refused")
    return [r for r in found if isinstance(r, dict)] if isinstance(found, list) else []


def add_submission(point_dir: Path, submission: dict[str, Any], **changes: Any) -> None:
    """One more submission of the point (its job id becomes the point's), and other `changes`,
    in one write."""
    payload = read_point(point_dir) or {}
    submissions = [*payload.get("submissions", []), submission]
    payload.update(changes, submissions=submissions, job_id=submission.get("job_id"))
    write_point(point_dir, payload)


def archive_attempt(point_dir: Path) -> Path | None:
    """Move the records of the last attempt to attempts/<n>/; None when there were none."""
    paths = RunPaths(point_dir)
    present = paths.attempt_files()
    if not present:
        return None
    attempts = paths.attempts
    attempts.mkdir(parents=True, exist_ok=True)
    number = 1 + max((int(p.name) for p in attempts.iterdir() if p.name.isdigit()), default=0)
    target = attempts / str(number)
    target.mkdir()
    for path in present:
        shutil.move(str(path), target / path.name)
    return target


def iter_points(sweep_dir: Path) -> Iterator[Path]:
    if not sweep_dir.is_dir():
        return
    for child in sorted(sweep_dir.iterdir()):
        if child.is_dir() and ((child / POINT_JSON).exists() or (child / RUN_JSON).exists()):
            yield child


DRY_RUN_DIR = "dry_run"  # in a sweep directory: the plans of a dry run a search superseded


def planned_by_dry_run(point: dict[str, Any]) -> bool:
    """Whether a point's record was written by a dry run (its config asks for one)."""
    try:
        return dry_run_mode((point.get("config") or {}).get("dry_run", False)) is not DryRun.off
    except BadInput:
        return False


def set_aside_dry_runs(sweep_dir: Path) -> list[str]:
    """Move the points a dry run planned here and nothing has run since (no submission, no run
    record) to `dry_run/<point id>/`: a halving search runs its own rung points, and the dry run's
    full-length points it stops early would otherwise read `planned` forever. Returns their ids."""
    moved = []
    for point_dir in list(iter_points(sweep_dir)):
        point = read_point(point_dir)
        if point is None or (point_dir / RUN_JSON).exists() or point.get("submissions"):
            continue
        if planned_by_dry_run(point):
            target = sweep_dir / DRY_RUN_DIR / point_dir.name
            if target.exists():
                shutil.rmtree(target)  # an older dry run's plan of the same point
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(point_dir), target)
            moved.append(point_dir.name)
    return moved


def canary_dir(sweep_dir: Path, cluster: str, container_image: str | None) -> Path:
    """One canary directory per (cluster, container image) of a sweep."""
    digest = hashlib.sha256(str(container_image).encode()).hexdigest()[:8]
    return sweep_dir / CANARIES / f"{cluster}-{digest}"


def iter_canaries(sweep_dir: Path) -> Iterator[dict[str, Any]]:
    """The latest canary submitted for each (cluster, container image) of the sweep."""
    root = sweep_dir / CANARIES
    if not root.is_dir():
        return
    for child in sorted(root.iterdir()):
        record = read_json(child / CANARY_JSON)
        if record and record.get("job_id"):
            yield record


def job_log_dir(point: dict[str, Any]) -> Path | None:
    folder, job_id = point.get("submitit_folder"), point.get("job_id")
    if not folder or not job_id:
        return None
    return Path(str(folder).replace("%j", str(job_id)))


def sweep_name(task_overrides: list[str]) -> str:
    """A stable directory name for a sweep command: readable overrides plus a short hash, so that
    rerunning the same command lands in the same directory (and resumes it)."""
    # dry_run=true plans the same sweep, so it names the same directory.
    ordered = sorted(str(o) for o in task_overrides if override_key(str(o)) != "dry_run")
    digest = hashlib.sha256(json.dumps(ordered).encode()).hexdigest()[:8]
    readable = "_".join(ordered) or "default"
    readable = "".join(c if c.isalnum() or c in "=,.-" else "_" for c in readable)[:60].strip("_")
    return f"{readable}-{digest}"


LATEST = "latest"  # <sweeps' parent>/latest: the sweep (or dry run) started last


def mark_latest(sweep_dir: Path) -> Path:
    """Point `<parent>/latest` at this sweep directory (relative, so the tree can move) and return
    it: `moe-vlm status multirun/latest` follows the sweep just run, dry run or not, where
    `ls -td multirun/*/` picks whichever directory was written last."""
    link = sweep_dir.parent / LATEST
    link_atomic(link, sweep_dir.name)
    return link


def register_resolvers() -> None:
    OmegaConf.register_new_resolver(
        "moe_vlm_sweep_name", lambda overrides: sweep_name(list(overrides or [])), replace=True
    )


def now() -> float:
    return round(time.time(), 3)
