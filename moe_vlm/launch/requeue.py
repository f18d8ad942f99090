"""Inside a Slurm task: survive preemption and time limits by rerunning the point.

Slurm sends USR2 `signal_delay_s` before the time limit (`--signal=USR2@N`; NCCL catches
USR1), and `scancel --signal=USR2` does the same for a preemption. A benchmark point has
nothing worth checkpointing, so every rank stops at once and rank 0 leaves a requeue marker
in the point directory; the batch script sees it after srun returns and runs `scontrol
requeue` from outside any container (pyxis containers have no scontrol). When the job comes
back (SLURM_RESTART_COUNT = 1, 2, ...) the previous attempt's records are moved to
attempts/<n>/ and the point runs again. Past `max_requeues` the point is recorded as failed
(timeout or preempted) instead.

In a pack (launch/pack.py) the job resumes at its first unfinished point: the points that
finished before the USR2 are skipped by the batch script, the interrupted one reruns here with
its own restart count (one more than its requeue marker says), the others start fresh.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from moe_vlm.base.files import PREVIOUS_REQUEUE_MARKER, REQUEUE_MARKER, RUN_JSON, RunPaths, write_json_atomic
from moe_vlm.launch.slurm import (
    ENV_JOB_START_S,
    ENV_MAX_REQUEUES,
    ENV_SIGNAL_DELAY_S,
    ENV_TIME_LIMIT_S,
    EXIT_REQUEUE,
)
from moe_vlm.record.records import REQUEUED, RUNNING
from moe_vlm.runtime import points
from moe_vlm.runtime.dist_env import ENV_PACK_INDEX, ENV_POINT_RESTARTS, global_rank
from moe_vlm.runtime.failures import Diagnosis, base_from_point, launch_info, requeue_count, write_failure

# A USR2 this close to the expected time-limit signal counts as the time limit.
TIME_LIMIT_SLACK_S = 60


def restart_count() -> int:
    return int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)


def prepare_attempt(point_dir: Path) -> None:
    """Rank 0, before the run: count this point's restarts and move an interrupted attempt aside."""
    if global_rank() != 0:
        return
    marker = points.read_json(point_dir / PREVIOUS_REQUEUE_MARKER) or points.read_json(
        point_dir / REQUEUE_MARKER
    )
    if marker is not None:
        restarts = int(marker.get("restarts") or 0) + 1
    else:  # a packed point that no USR2 stopped starts afresh, whatever the job's restart count
        restarts = 0 if os.environ.get(ENV_PACK_INDEX) else restart_count()
    os.environ[ENV_POINT_RESTARTS] = str(restarts)
    if restart_count() > 0 or marker is not None:
        points.archive_attempt(point_dir)


def signal_reason(started_s: float, now_s: float) -> str:
    limit_s = int(os.environ.get(ENV_TIME_LIMIT_S, "0") or 0)
    delay_s = int(os.environ.get(ENV_SIGNAL_DELAY_S, "0") or 0)
    if limit_s and now_s - started_s >= limit_s - delay_s - TIME_LIMIT_SLACK_S:
        return "timeout"
    return "preempted"


def install(point_dir: Path) -> None:
    """Handle USR2 for the rest of this process (replaces submitit's handler, which would call
    scontrol from inside the container)."""
    # The time limit counts from the allocation's start, not this point's (a packed point starts late).
    started_s = float(os.environ.get(ENV_JOB_START_S) or time.time())

    def on_usr2(signum: int, frame: FrameType | None) -> None:
        reason = signal_reason(started_s, time.time())
        restarts = restart_count()
        budget = int(os.environ.get(ENV_MAX_REQUEUES, "0") or 0)
        if global_rank() == 0:
            if restarts < budget:
                marker = {"reason": reason, "restarts": requeue_count(), "time_unix_s": time.time()}
                write_json_atomic(RunPaths(point_dir).requeue_marker, marker)
                _record_requeue(point_dir, marker, budget)
            else:
                diagnosis = Diagnosis(
                    reason,
                    f"the job got USR2 ({reason}) after {restarts} requeue(s); max_requeues={budget}",
                    None,
                )
                write_failure(point_dir, diagnosis, [], base_from_point(point_dir), launch_info())
        print(f"moe_vlm: USR2 ({reason}) on rank {global_rank()}: stopping for a requeue", file=sys.stderr)
        sys.stderr.flush()
        sys.stdout.flush()
        # Exit without unwinding: the engine may sit inside a collective that will never finish.
        os._exit(EXIT_REQUEUE)

    signal.signal(signal.SIGUSR2, on_usr2)


def _record_requeue(point_dir: Path, marker: dict[str, object], budget: int) -> None:
    """The running record becomes `requeued`: this attempt ended by a USR2 and is archived when
    the job comes back, so a report over the sweep does not take it for a killed run."""
    run = points.read_run(point_dir)
    if not run or run.status != RUNNING:
        return
    reason = str(marker["reason"])
    message = f"stopped by USR2 ({reason}) and requeued; the job may requeue {budget} time(s)"
    record = {
        **run.to_json(),
        "status": REQUEUED,
        "requeue": marker,
        "failure": {"class": reason, "message": message},
    }
    write_json_atomic(point_dir / RUN_JSON, record)
