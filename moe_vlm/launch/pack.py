"""Packing: several sweep points in one Slurm job, one srun step after another.

`hydra.launcher.points_per_job=N` puts up to N points that need the same resources (the same
sbatch parameters, interpreter and canary) into one job: one queue wait instead of N. Its time
limit is the sum of the points' limits, and each point's step is held to its own
(`srun --time`), so one runaway point cannot eat the others' time. The batch script:

- runs the points in order, each as `srun ... python -m submitit.core._submit <its folder>`, so
  every point keeps its own directory, run.json, logs and failure class;
- skips a point whose run.json already says completed, failed or rejected: after a requeue the
  job resumes at the first unfinished point and nothing runs twice;
- after a step that failed, records why (runtime/failures.py) and goes on with the next point;
- after a step whose rank 0 left a requeue marker (USR2: time limit or preemption), requeues the
  whole job from outside the container and stops; the interrupted point reruns first;
- after a step whose node preflight failed (launch/preflight.py), records the points left
  `failed` (class node, not run) and ends: they would run on the same node;
- ends FAILED (exit 1) when any of its points did not complete, this run or before a requeue,
  so Slurm's own record of the job says so.

Layout: `.submitit/pack-<token>/` holds the batch script (`pack.sbatch`), the batch log
(`<job>_0_log.*`) and one folder per point (`<point_id>/`: submitit's pickle, the step's task
logs, srun's own lines); each point's point.json names its folder (`submitit_folder`).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moe_vlm.base.files import PREFLIGHT_JSON, REQUEUE_MARKER, RUN_JSON
from moe_vlm.launch import slurm
from moe_vlm.record.records import TERMINAL
from moe_vlm.runtime import dist_env

# A finished point, as write_json_atomic lays out run.json (indent=2, so top-level keys sit at two
# spaces). Read with grep: the batch script runs outside the container, where the job's Python
# may not exist.
FINISHED_LINE = '^  "status": "(' + "|".join(TERMINAL) + ')",?$'
COMPLETED_LINE = '^  "status": "completed",?$'
# A failed verdict in preflight.json (launch/preflight.py: "verdict" at its top level, indent=2).
PREFLIGHT_FAILED_LINE = '^  "verdict": "failed",?$'
PACK_SCRIPT = "pack.sbatch"


@dataclass(frozen=True)
class PackEntry:
    point_dir: Path
    folder: Path  # the point's submitit folder: pickle, task logs, srun's lines


def pack_folder(submitit_root: Path, token: str) -> Path:
    return submitit_root / f"pack-{token}"


def entries_for(pack_dir: Path, point_dirs: Sequence[Path]) -> list[PackEntry]:
    return [PackEntry(point_dir, pack_dir / point_dir.name) for point_dir in point_dirs]


def pack_parameters(params: dict[str, Any], canary_job_id: str | None) -> dict[str, Any]:
    """sbatch parameters of a packed job (`params` from slurm.job_parameters(..., points=N)):
    the loop starts its own srun steps, so submitit's renderer adds none."""
    out = {**params, "use_srun": False}
    out.pop("teardown", None)
    if canary_job_id is not None:
        out.update(slurm.canary_dependency(params, canary_job_id))
    return out


def loop(entries: Sequence[PackEntry], python: str, srun_args: Sequence[str], step_minutes: int) -> str:
    """The batch script's command: every point's srun step in order (see the module docstring)."""
    srun = shlex.join(["srun", "--unbuffered", f"--time={step_minutes}", *srun_args])
    step = (
        f'{srun} --output "$moe_vlm_folder/%j_%t_log.out" --error "$moe_vlm_folder/%j_%t_log.err" '
        f'{python} -u -m submitit.core._submit "$moe_vlm_folder" '
        # srun's own lines (a task killed, the step cancelled) go beside task 0's, where the
        # failure classifier reads them, not into the batch log shared by every point.
        '2>>"$moe_vlm_folder/${SLURM_JOB_ID}_0_log.err"'
    )
    place = f"${dist_env.ENV_PACK_INDEX}/${dist_env.ENV_PACK_SIZE}"
    lines = [
        *slurm.bash_array("moe_vlm_pack", [e.point_dir for e in entries]),
        *slurm.bash_array("moe_vlm_folders", [e.folder for e in entries]),
        f"export {dist_env.ENV_PACK_SIZE}={len(entries)}",
        'moe_vlm_job="$SLURM_JOB_ID"',
        "moe_vlm_failed=0",
        # Slurm numbers a job's steps 0, 1, ... as they start (again from 0 after a requeue): the
        # record of a step whose ranks died before writing theirs still names it.
        "moe_vlm_steps=0",
        'for moe_vlm_index in "${!moe_vlm_pack[@]}"; do',
        '  moe_vlm_point="${moe_vlm_pack[$moe_vlm_index]}"',
        '  moe_vlm_folder="${moe_vlm_folders[$moe_vlm_index]}"',
        f"  export {dist_env.ENV_PACK_INDEX}=$((moe_vlm_index + 1))",
        f'  if grep -Eqs {shlex.quote(FINISHED_LINE)} "$moe_vlm_point/{RUN_JSON}"; then',
        f'    echo "moe_vlm: point {place} ($moe_vlm_point) has finished; skipped" >&2',
        # A point that ended before a requeue without completing still fails the job.
        f'    grep -Eqs {shlex.quote(COMPLETED_LINE)} "$moe_vlm_point/{RUN_JSON}" || moe_vlm_failed=$((moe_vlm_failed + 1))',
        "    continue",
        "  fi",
        *(f"  {line}" for line in slurm.marker_lines()),
        f'  echo "moe_vlm: point {place} ($moe_vlm_point) starts" >&2',
        f"  {step}",
        "  moe_vlm_rc=$?",
        "  moe_vlm_step=$moe_vlm_steps",
        "  moe_vlm_steps=$((moe_vlm_steps + 1))",
        f'  if [ -e "$moe_vlm_point/{REQUEUE_MARKER}" ]; then',
        f'    echo "moe_vlm: requeueing job $SLURM_JOB_ID at point {place} '
        '(restart ${SLURM_RESTART_COUNT:-0})" >&2',
        '    scontrol requeue "$SLURM_JOB_ID" && exit 0',
        "  fi",
        '  if [ "$moe_vlm_rc" -ne 0 ]; then',
        "    moe_vlm_failed=$((moe_vlm_failed + 1))",
        f"    {slurm.record_failure(python, 'moe_vlm_step')} || true",
        "  fi",
        # The node failed its preflight: the points left would run on it too. Each is recorded
        # (class node, not run) for the rerun, which excludes the node; the job ends failed.
        f'  if grep -Eqs {shlex.quote(PREFLIGHT_FAILED_LINE)} "$moe_vlm_point/{PREFLIGHT_JSON}"; then',
        f'    echo "moe_vlm: point {place}: its node preflight failed; the job stops here" >&2',
        '    for moe_vlm_rest in "${!moe_vlm_pack[@]}"; do',
        '      [ "$moe_vlm_rest" -gt "$moe_vlm_index" ] || continue',
        f"      {dist_env.ENV_PACK_INDEX}=$((moe_vlm_rest + 1)) "
        f'{python} -m moe_vlm.launch.preflight --point-dir "${{moe_vlm_pack[$moe_vlm_rest]}}" '
        f'--after "$moe_vlm_point/{PREFLIGHT_JSON}" --job-id "$moe_vlm_job" >&2 || true',
        "    done",
        "    exit 1",
        "  fi",
        "done",
        # Every point has its own record; the job's state says whether any of them failed.
        '[ "$moe_vlm_failed" -eq 0 ]',
    ]
    return "\n".join(lines)


def render(
    params: dict[str, Any], pack_dir: Path, entries: Sequence[PackEntry], python: str, step_minutes: int
) -> str:
    """The packed job's sbatch script, through submitit's renderer (see slurm.render_sbatch)."""
    command = loop(entries, python, params.get("srun_args", []), step_minutes)
    return slurm.render_sbatch(params, str(pack_dir), python, command)
