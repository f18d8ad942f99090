"""The launcher's jobs: a planned point, the sbatch calls that submit them, and the job side's
record of its launch (launcher.py is the Hydra plugin; Hydra's plugin scan skips `_`-named
modules, so the Slurm rendering and the run records are imported when a launch needs them)."""

from __future__ import annotations

import enum
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import submitit
from hydra.core.utils import JobStatus

from moe_vlm.base.files import RunPaths
from moe_vlm.config.spec import RunSpec
from moe_vlm.launch import slurm
from moe_vlm.runtime import points
from moe_vlm.runtime.failures import launch_info
from moe_vlm.runtime.heartbeat import process_started_unix_s

# dry_run: a packed job's folder is named by a token drawn when it is submitted.
PACK_TOKEN_PLACEHOLDER = "TOKEN"


@dataclass
class PlannedJob:
    overrides: list[str]
    point_dir: Path
    spec: RunSpec
    settings: slurm.SlurmSettings
    params: dict[str, Any]

    @property
    def task_overrides(self) -> list[str]:
        """The point's own overrides, without the sweep directory the sweeper adds (and without
        dry_run, so that a dry run shows the canary command the real sweep submits)."""
        return [o for o in self.overrides if not o.startswith(("hydra.", "dry_run="))]

    @property
    def canary_key(self) -> tuple[str, str | None]:
        return (self.spec.cluster.name, self.settings.container_image)

    @property
    def canary_dir(self) -> Path:
        return points.canary_dir(self.point_dir.parent, *self.canary_key)

    @property
    def resources(self) -> tuple[str, tuple[str, str | None]]:
        """Points with equal keys can share a job array or a pack: same sbatch parameters (so the
        same interpreter and setup lines) and the same canary."""
        return json.dumps(self.params, sort_keys=True, default=str), self.canary_key


Numbered = tuple[int, PlannedJob]  # (the job number Hydra gives the point, the point)


class JobKind(enum.Enum):
    """What one sbatch call submits."""

    job = "job"
    array = "array"
    pack = "pack"


@dataclass(frozen=True)
class Submission:
    """One sbatch call: a job of one point, a job array (task i runs point i), or a pack (its
    points one srun step after another)."""

    kind: JobKind
    points: list[Numbered]

    def describe(self, settings: slurm.SlurmSettings) -> str:
        count = len(self.points)
        if self.kind is JobKind.pack:
            return (
                f"a packed job of {count} point(s) (points_per_job={settings.points_per_job}), one srun "
                f"step after another; its time limit is the sum of theirs; its folder pack-{PACK_TOKEN_PLACEHOLDER} "
                "gets a random name when submitted"
            )
        if self.kind is JobKind.array:
            return f"a job array of {count} tasks, task i runs point i"
        return "one job of one point"


class ScriptOnlyExecutor(submitit.SlurmExecutor):
    """submitit's SlurmExecutor, to render a job's sbatch script only (a dry run): the same
    parameters and the same renderer, without the constructor's check that `srun` is on PATH, so a
    dry run on a laptop or a CI box without Slurm's client tools shows what a cluster would receive."""

    @classmethod
    def affinity(cls) -> int:
        return 1  # submitit's SlurmExecutor refuses to construct when this is not > 0


def chunks(items: Sequence[Numbered], size: int) -> Iterator[list[Numbered]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


def status_of(state: str | None) -> JobStatus:
    return JobStatus.COMPLETED if state == "completed" else JobStatus.FAILED


def record_launch(
    point_dir: Path,
    job_id: str,
    executor: str,
    preflight_s: float | None = None,
    container_image: str | None = None,
) -> None:
    run = points.read_run(point_dir)
    if not run:
        return
    launch = {
        **launch_info(),
        "executor": executor,
        "slurm_job_id": job_id if executor == "slurm" else None,
        "attempts_before": len(list(RunPaths(point_dir).attempts.glob("*"))),
        "host": os.uname().nodename,
        # The task's wall time, from its process start (a halving search counts node-seconds by it).
        "task_started_unix_s": process_started_unix_s(),
        "task_ended_unix_s": points.now(),
        # The image the job's tasks ran in (pyxis --container-image; None: the host's software).
        "container_image": container_image,
    }
    if preflight_s is not None:  # the node preflight's cost in this task (launch/preflight.py)
        launch["preflight_s"] = preflight_s
    run.with_launch(launch).write(point_dir)
