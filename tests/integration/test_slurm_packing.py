"""Packed points and job arrays on a real single-node Slurm, with faults (see test_slurm_sweeps.py).

One sweep of three points with `points_per_job=3` is one job behind its canary, running the
points one srun step after another. Each point meets a fault while it runs: its step is
cancelled (`scancel JOB.STEP`), its rank is killed with SIGKILL, and a USR2 (what Slurm sends
before the time limit, or a preemption) stops the third. The job goes on after the first two
(each keeps its own failure class) and requeues itself at the third; back from the requeue it
skips the two finished points and reruns the third to completion. Rerunning the sweep command
unpacked submits the two failed points as one job array (one sbatch call) that completes them.
Every point is accounted for at every stage, and no point runs twice; the killed point keeps its
Slurm step and place in the pack, and the job, two of whose points failed, ends FAILED in Slurm's
own record.

One rank per point (nproc=1): the node has two CPUs, and each point pays Python, torch and
transformers start-up again.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from moe_vlm.launch.status import collect, render
from moe_vlm.runtime import points
from tests.integration.test_slurm_sweeps import (  # noqa: F401  (slurm is a fixture)
    REPO,
    ended,
    run_json,
    scontrol_job,
    slurm,
    steps_written,
    wait_for,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
STEPS = 24
GRID = ["model=tiny_moe_vlm", "data=mock", "nproc=1", "warmup_steps=1", "seq_length=128"]
GRID += [f"train_iters={STEPS}", "seed=51,52,53"]
CANCELLED, KILLED, STOPPED = "seed=51", "seed=52", "seed=53"
TIMEOUT_MIN = 10


def sweep(sweep_dir: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "train.py", "-m", "hydra/launcher=slurm", f"hydra.sweep.dir={sweep_dir}"]
    command += [*GRID, f"hydra.launcher.timeout_min={TIMEOUT_MIN}", *overrides]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=180)


def status(sweep_dir: Path) -> dict[str, dict[str, Any]]:
    rows = [asdict(row) for row in collect(sweep_dir)]
    return {next(o for o in row["overrides"] if o.startswith("seed=")): row for row in rows}


def running_step(point_dir: str) -> str | None:
    """The Slurm step of a point whose run has finished a step (from its running record)."""
    try:
        record = run_json(point_dir)
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    if record.get("status") != "running" or steps_written(point_dir) < 2:
        return None
    return str(record["launch"]["slurm_step_id"])


def task_pid(job_id: str, step: str) -> int | None:
    """The process of rank 0 in one step of a job (the srun task running submitit)."""
    for proc in Path("/proc").iterdir():
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        wanted = [f"SLURM_JOB_ID={job_id}", f"SLURM_STEP_ID={step}", "SLURM_PROCID=0"]
        if all(w.encode() in environ for w in wanted) and b"submitit.core._submit" in cmdline:
            return int(proc.name)
    return None


@pytest.fixture
def sweep_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "sweep"
    yield path
    jobs = [str(p.get("job_id")) for d in path.glob("*/") if (p := points.read_point(d)) and p.get("job_id")]
    jobs += [str(c["job_id"]) for c in points.iter_canaries(path)]
    if jobs:
        subprocess.run(["scancel", *jobs], capture_output=True)


def test_a_pack_survives_a_cancelled_step_a_killed_rank_and_a_requeue_and_a_rerun_completes_it(
    slurm: None,  # noqa: F811
    sweep_dir: Path,
) -> None:
    first = sweep(sweep_dir, "hydra.launcher.points_per_job=3")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "3 point(s) submitted in 1 sbatch call(s)" in first.stdout, first.stdout
    assert "3 point(s) queued in 1 job(s)" in first.stdout, first.stdout
    rows = status(sweep_dir)
    job = rows[CANCELLED]["job_id"]
    assert {row["job_id"] for row in rows.values()} == {job}
    assert [rows[k]["pack"] for k in (CANCELLED, KILLED, STOPPED)] == ["1/3", "2/3", "3/3"]
    (canary,) = points.iter_canaries(sweep_dir)
    info = scontrol_job(job)
    # One queue wait for three points; the time limit is the sum of theirs; the canary guards it.
    assert info["TimeLimit"] == f"00:{3 * TIMEOUT_MIN}:00" and info["Requeue"] == "1"
    assert info["Dependency"].startswith(f"afterok:{canary['job_id']}")

    # Point 1: its step is cancelled; the job goes on with point 2.
    step = wait_for(lambda: running_step(rows[CANCELLED]["point_dir"]), 240, "point 1's first steps", 0.2)
    assert status(sweep_dir)[CANCELLED]["step"] == step and status(sweep_dir)[CANCELLED]["state"] == "running"
    subprocess.run(["scancel", f"{job}.{step}"], check=True)
    # Point 2: its rank dies from SIGKILL; srun ends the step and the job goes on with point 3.
    step = wait_for(lambda: running_step(rows[KILLED]["point_dir"]), 240, "point 2's first steps", 0.2)
    os.kill(wait_for(lambda: task_pid(job, step), 30, "point 2's rank"), signal.SIGKILL)
    # Point 3: USR2 mid-run; the job requeues itself at this point.
    wait_for(lambda: running_step(rows[STOPPED]["point_dir"]), 240, "point 3's first steps", 0.2)
    middle = status(sweep_dir)
    assert [middle[k]["state"] for k in (CANCELLED, KILLED, STOPPED)] == ["failed", "failed", "running"]
    failed_records = {k: (Path(rows[k]["point_dir"]) / "run.json").read_text() for k in (CANCELLED, KILLED)}
    subprocess.run(["scancel", "--signal=USR2", job], check=True)
    wait_for(lambda: scontrol_job(job).get("Restarts") == "1", 60, "the requeue")
    assert status(sweep_dir)[STOPPED]["state"] == "queued"
    # Slurm holds a requeued job for about two minutes (BeginTime); release it now.
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True)
    wait_for(lambda: ended(job), 240, "the requeued pack")

    done = status(sweep_dir)
    cancelled, killed, stopped = (run_json(done[k]["point_dir"]) for k in (CANCELLED, KILLED, STOPPED))
    assert (done[CANCELLED]["state"], cancelled["failure"]["class"]) == ("failed", "cancelled"), cancelled
    assert re.search(rf"\*\*\* STEP {job}\.\d+ ON \S+ CANCELLED AT", cancelled["failure"]["evidence"])
    assert (done[KILLED]["state"], killed["failure"]["class"]) == ("failed", "killed"), killed
    assert killed["failure"]["evidence"] == "srun: error: node1: task 0: Killed"
    # The killed point keeps its step and place in the pack (its record and status say so).
    assert killed["launch"]["pack"] == {"index": 2, "size": 3} and killed["launch"]["slurm_step_id"]
    assert done[KILLED]["step"] == killed["launch"]["slurm_step_id"] and done[KILLED]["pack"] == "2/3"
    # Two of its points failed: Slurm's own record of the job says FAILED, not COMPLETED 0:0.
    assert (scontrol_job(job)["JobState"], scontrol_job(job)["ExitCode"]) == ("FAILED", "1:0")
    assert done[STOPPED]["state"] == "completed", done[STOPPED]
    assert stopped["launch"]["restarts"] == 1 and done[STOPPED]["restarts"] == 1
    assert stopped["launch"]["pack"] == {"index": 3, "size": 3} and stopped["launch"]["slurm_job_id"] == job
    interrupted = Path(done[STOPPED]["point_dir"]) / "attempts" / "1"
    assert json.loads((interrupted / "requeue.previous.json").read_text())["reason"] == "preempted"
    assert json.loads((interrupted / "run.json").read_text())["status"] == "requeued"
    assert steps_written(interrupted) >= 2 and steps_written(done[STOPPED]["point_dir"]) == STEPS
    # Nothing ran twice: back from the requeue the job skipped the finished points.
    for key in (CANCELLED, KILLED):
        assert (Path(done[key]["point_dir"]) / "run.json").read_text() == failed_records[key]
        assert not (Path(done[key]["point_dir"]) / "attempts").exists()
        assert steps_written(done[key]["point_dir"]) < STEPS
    batch_log = next(Path(sweep_dir, ".submitit").glob(f"pack-*/{job}_0_log.err")).read_text()
    assert batch_log.count(" starts") == 4 and batch_log.count("has finished; skipped") == 2, batch_log
    assert [done[k]["restarts"] for k in (CANCELLED, KILLED)] == [0, 0]
    table = render(sweep_dir, collect(sweep_dir))
    assert "3/3 finished: 1 completed, 2 failed" in table and f"{job}." in table

    # The same command, unpacked: the two failed points go as one job array and complete (with
    # memory stated, the two tasks share the node instead of each taking all of it).
    rerun = sweep(sweep_dir, "hydra.launcher.mem_gb=2", "hydra.launcher.canary=false")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "2 to run, 1 already completed, 0 in flight" in rerun.stdout, rerun.stdout
    assert "2 point(s) submitted in 1 sbatch call(s)" in rerun.stdout, rerun.stdout
    again = status(sweep_dir)
    array = again[CANCELLED]["job_id"].split("_")[0]
    assert {again[k]["job_id"] for k in (CANCELLED, KILLED)} == {f"{array}_0", f"{array}_1"}
    assert again[STOPPED]["job_id"] == job
    final = wait_for(
        lambda: (
            (rows := status(sweep_dir))
            and all(r["state"] in ("completed", "failed") for r in rows.values())
            and rows
        ),
        240,
        "the rerun",
    )
    assert [final[k]["state"] for k in (CANCELLED, KILLED, STOPPED)] == ["completed"] * 3, final
    for key, cls in ((CANCELLED, "cancelled"), (KILLED, "killed")):
        record = run_json(final[key]["point_dir"])
        assert record["launch"]["slurm_job_id"] == final[key]["job_id"]
        assert steps_written(final[key]["point_dir"]) == STEPS
        earlier = json.loads((Path(final[key]["point_dir"]) / "attempts" / "1" / "run.json").read_text())
        assert earlier["failure"]["class"] == cls  # the failed attempt is kept
    assert steps_written(final[STOPPED]["point_dir"]) == STEPS  # not rerun
