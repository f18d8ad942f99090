"""Inside a Slurm task: survive preemption and time limits by rerunning the point.

Slurm sends USR2 `signal_delay_s` before the time limit (`--signal=USR2@N`; NCCL catches
USR1), and `scancel --signal=USR2` does the same for a preemption. A benchmark point has
nothing worth checkpointing, so every rank stops at once and rank 0 leaves a requeue marker
in the point directory; the batch script sees it after srun returns and runs `scontrol
requeue` from outside any container (pyxis containers have no scontrol). When the job comes
back (SLURM_RESTART_COUNT = 1, 2, ...) the previous attempt's records are moved to
attempts/<n>/ and the point runs again. Past `max_requeues` the point is recorded as failed
(timeout or preempted) instead.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from moe_vlm.launch import points
from moe_vlm.launch.failures import Diagnosis, base_from_point, launch_info, write_failure
from moe_vlm.launch.slurm import (
    ENV_MAX_REQUEUES,
    ENV_SIGNAL_DELAY_S,
    ENV_TIME_LIMIT_S,
    EXIT_REQUEUE,
    PREVIOUS_REQUEUE_MARKER,
    REQUEUE_MARKER,
)

# A USR2 this close to the expected time-limit signal counts as the time limit.
TIME_LIMIT_SLACK_S = 60


def restart_count() -> int:
    return int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)


def global_rank() -> int:
    return int(os.environ.get("SLURM_PROCID", os.environ.get("RANK", "0")) or 0)


def prepare_attempt(point_dir: Path) -> None:
    """Rank 0, before the run: a requeued job moves the interrupted attempt aside."""
    if global_rank() != 0:
        return
    if (
        restart_count() > 0
        or (point_dir / PREVIOUS_REQUEUE_MARKER).exists()
        or (point_dir / REQUEUE_MARKER).exists()
    ):
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
    started_s = time.time()

    def on_usr2(signum: int, frame: FrameType | None) -> None:
        reason = signal_reason(started_s, time.time())
        restarts = restart_count()
        budget = int(os.environ.get(ENV_MAX_REQUEUES, "0") or 0)
        if global_rank() == 0:
            if restarts < budget:
                marker = {"reason": reason, "restarts": restarts, "time_unix_s": time.time()}
                tmp = point_dir / f".{REQUEUE_MARKER}.tmp"
                tmp.write_text(json.dumps(marker))
                os.replace(tmp, point_dir / REQUEUE_MARKER)
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
