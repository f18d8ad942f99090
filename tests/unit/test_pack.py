"""A packed job's script (moe_vlm/launch/pack.py) and the failure classes of its steps.

The real packed job, with faults, runs in tests/integration/test_slurm_packing.py; here: the
script's time limits and dependency, the skip test (real grep on run.json files as the project
writes them), an array's prologue, and Slurm's own lines for a cancelled step against those for
a step srun ended after one rank died (captured from the local Slurm, scripts/slurm_local.sh).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from moe_vlm.base.files import write_json_atomic
from moe_vlm.launch import pack, slurm
from moe_vlm.runtime import failures
from tests.conftest import make_spec


@pytest.fixture(autouse=True)
def no_site(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MOE_VLM_SITE_FILE", "none")


def pack_script(points: int, canary: str | None = None) -> str:
    spec = make_spec("cluster=local", "nproc=2")
    settings = slurm.checked(slurm.SlurmSettings(timeout_min=20, srun_args=["--cpu-bind=none"]), spec)
    params = pack.pack_parameters(slurm.job_parameters(settings, spec, points=points), canary)
    dirs = [Path(f"/sweeps/s/p{i}") for i in range(points)]
    entries = pack.entries_for(Path("/sweeps/s/.submitit/pack-x"), dirs)
    return pack.render(params, Path("/sweeps/s/.submitit/pack-x"), entries, "python3", settings.timeout_min)


def test_a_pack_asks_for_the_sum_of_its_points_limits_and_holds_each_step_to_its_own() -> None:
    script = pack_script(3, canary="42")
    assert "#SBATCH --time=60" in script and f"export {slurm.ENV_TIME_LIMIT_S}=3600" in script
    assert "#SBATCH --dependency=afterok:42" in script and "#SBATCH --kill-on-invalid-dep=yes" in script
    assert "#SBATCH --requeue" in script and "#SBATCH --signal=USR2@120" in script
    steps = [line.strip() for line in script.splitlines() if line.strip().startswith("srun ")]
    assert len(steps) == 1  # one srun line, run once per point by the loop
    assert steps[0].startswith("srun --unbuffered --time=20 --kill-on-bad-exit=1 --cpu-bind=none ")
    assert '-m submitit.core._submit "$moe_vlm_folder"' in steps[0]
    # No srun of submitit's own before the loop, no single-point teardown after it.
    assert script.count("srun ") == 1 and "# teardown" not in script
    assert "  /sweeps/s/p2" in script and "  /sweeps/s/.submitit/pack-x/p2" in script
    assert 'scontrol requeue "$SLURM_JOB_ID" && exit 0' in script and "moe_vlm.runtime.failures" in script


@pytest.mark.parametrize(
    ("record", "skipped"),
    [
        ({"status": "completed"}, True),
        ({"status": "failed", "failure": {"class": "killed"}}, True),
        ({"status": "rejected"}, True),
        ({"status": "running", "process": {"pid": 1}}, False),
        # A nested "status" is not the record's.
        ({"status": "requeued", "requeue": {"status": "completed"}}, False),
        (None, False),
    ],
)
def test_the_loop_skips_exactly_the_points_that_finished(
    tmp_path: Path, record: dict | None, skipped: bool
) -> None:
    if record is not None:
        write_json_atomic(tmp_path / "run.json", {"config": {"status": "completed"}, **record})
    done = subprocess.run(["grep", "-Eqs", pack.FINISHED_LINE, str(tmp_path / "run.json")])
    assert (done.returncode == 0) is skipped
    assert f"grep -Eqs '{pack.FINISHED_LINE}'" in pack_script(2)


def test_an_array_task_finds_its_point_and_its_job_id() -> None:
    lines = slurm.prologue([Path("/s/a b"), Path("/s/c")])
    script = "\n".join(lines)
    assert "moe_vlm_points=(\n  '/s/a b'\n  /s/c\n)" in script
    assert 'moe_vlm_point="${moe_vlm_points[$SLURM_ARRAY_TASK_ID]}"' in script
    assert 'moe_vlm_job="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"' in script
    single = "\n".join(slurm.prologue(Path("/s/a b")))
    assert "moe_vlm_point='/s/a b'" in single and 'moe_vlm_job="$SLURM_JOB_ID"' in single


# Task 0's stderr after `scancel 69.0` and after rank 1 of step 69.1 was killed with SIGKILL
# (srun --kill-on-bad-exit=1), as the local Slurm wrote them.
STEP_CANCELLED = """\
srun: Job step aborted: Waiting up to 7 seconds for job step to finish.
slurmstepd-localhost: error: *** STEP 69.0 ON localhost CANCELLED AT 2026-12-01T10:05:08 ***
srun: error: localhost: tasks 0-1: Killed
srun: launch/slurm: _step_signal: Terminating StepId=69.0
"""
RANK_KILLED = """\
srun: error: localhost: task 1: Killed
srun: launch/slurm: _step_signal: Terminating StepId=69.1
slurmstepd-localhost: error: *** STEP 69.1 ON localhost CANCELLED AT 2026-12-01T10:05:17 ***
srun: error: localhost: task 0: Killed
srun: Force Terminated StepId=69.1
"""


def test_a_cancelled_step_is_cancelled_and_a_step_ended_after_a_killed_rank_is_killed() -> None:
    cancelled = failures.classify(STEP_CANCELLED, exit_code=137, signal_number=9)
    assert (cancelled.name, cancelled.evidence) == (
        "cancelled",
        "slurmstepd-localhost: error: *** STEP 69.0 ON localhost CANCELLED AT 2026-12-01T10:05:08 ***",
    )
    killed = failures.classify(RANK_KILLED, exit_code=137, signal_number=9)
    assert (killed.name, killed.evidence) == ("killed", "srun: error: localhost: task 1: Killed")
