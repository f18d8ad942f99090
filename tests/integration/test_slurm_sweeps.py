"""Real sweeps of the tiny model through the real Slurm launcher on a real single-node Slurm.

scripts/test.sh starts Slurm (scripts/slurm_local.sh) and sets MOE_VLM_SLURM=1; then these
tests fail, not skip, when Slurm is unreachable. Without MOE_VLM_SLURM they skip, saying how
to run them.

Every job is two Slurm tasks (nproc=2), one torch.distributed rank each, set up from the Slurm
environment. The node has 2 CPUs, so jobs run one after another.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from moe_vlm.launch.status import collect

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
# Mock data keeps the ranks busy with the launcher's work, not the vision path's.
RUN = ["model=tiny_moe_vlm", "data=mock", "nproc=2", "warmup_steps=1", "seq_length=128"]
# Long enough to interrupt after the first step even on 2 idle cores, where a mock-data step takes
# 0.1-0.4 s: submitit bypasses scancel's SIGTERM, so a cancelled job runs on until Slurm's SIGKILL
# (KillWait=5 in scripts/slurm_local.sh) and must not finish first. Short enough to rerun.
STEPS = 80
LONG = f"train_iters={STEPS}"

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@pytest.fixture(scope="module")
def slurm() -> None:
    expected = os.environ.get("MOE_VLM_SLURM") == "1"
    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=20)
        up = ping.returncode == 0 and "UP" in ping.stdout
    except (OSError, subprocess.TimeoutExpired):
        up = False
    if up:
        return
    if expected:
        pytest.fail("MOE_VLM_SLURM=1 but Slurm is not answering `scontrol ping` (is SLURM_CONF exported?)")
    pytest.skip(
        "no Slurm here: run scripts/test.sh (it installs and starts a local Slurm), or "
        "`eval $(scripts/slurm_local.sh start) && MOE_VLM_SLURM=1 pytest -m slurm`"
    )


def sweep(sweep_dir: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    command = [
        PYTHON,
        "train.py",
        "-m",
        "hydra/launcher=slurm",
        f"hydra.sweep.dir={sweep_dir}",
        *RUN,
        *overrides,
    ]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=180)


def status(sweep_dir: Path) -> dict[str, dict[str, Any]]:
    """What `moe-vlm status` sees (in-process: polling must not start a Python per second)."""
    rows = [asdict(row) for row in collect(sweep_dir)]
    # Keyed by the overrides each test varies ("seed=1 tp=3").
    return {
        " ".join(o for o in row["overrides"] if o not in RUN and not o.startswith("train_iters=")): row
        for row in rows
    }


def wait_for(check: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{slurm_picture()}")


def slurm_picture() -> str:
    """What Slurm says of its node and queue: why a wait timed out (a node down, a job pending on
    resources another test still holds), in the failure's message."""
    out = []
    for command in (["sinfo", "-N", "-l"], ["squeue", "-l"], ["scontrol", "show", "jobs"]):
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=20)
            out.append(f"$ {' '.join(command)}\n{(done.stdout + done.stderr)[-4000:]}")
        except (OSError, subprocess.TimeoutExpired) as exc:
            out.append(f"$ {' '.join(command)}: {exc}")
    return "\n".join(out)


def run_json(point_dir: str | Path) -> dict[str, Any]:
    return json.loads((Path(point_dir) / "run.json").read_text())


def steps_written(point_dir: str | Path) -> int:
    path = Path(point_dir) / "steps.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def scontrol_job(job_id: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True).stdout
    return dict(part.split("=", 1) for part in out.split() if "=" in part)


def rank_pid(job_id: str, rank: int) -> int | None:
    """The process of one rank of a running job (the srun task running submitit); the job of an
    array task is ARRAY_TASK, as the launcher records it."""
    array, _, task = job_id.partition("_")
    job = (
        [f"SLURM_ARRAY_JOB_ID={array}", f"SLURM_ARRAY_TASK_ID={task}"] if task else [f"SLURM_JOB_ID={job_id}"]
    )
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if (
            all(item.encode() in environ for item in job)
            and f"SLURM_PROCID={rank}".encode() in environ
            and b"submitit.core._submit" in cmdline
        ):
            return int(proc.name)
    return None


@pytest.fixture
def sweep_dir(tmp_path: Path):
    path = tmp_path / "sweep"
    yield path
    jobs = [json.loads(p.read_text()).get("job_id") for p in path.glob("*/point.json")]
    jobs = [j for j in jobs if j]
    if jobs:
        subprocess.run(["scancel", *jobs], capture_output=True)


def ended(job_id: str) -> bool:
    return scontrol_job(job_id).get("JobState") not in (
        None,
        "PENDING",
        "RUNNING",
        "COMPLETING",
        "CONFIGURING",
    )


def test_a_sweep_rejects_submits_and_exits_classifies_failures_and_resumes(
    slurm: None, sweep_dir: Path
) -> None:
    grid = (LONG, "seed=11,12", "tp=1,3")
    first = sweep(sweep_dir, *grid)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "2 point(s) queued in 2 job(s)" in first.stdout and "moe-vlm status" in first.stdout
    points = status(sweep_dir)
    # Submit-and-exit: the command is back while the jobs wait or run.
    assert {points[k]["state"] for k in ("seed=11 tp=1", "seed=12 tp=1")} <= {"queued", "running"}, points
    # Invalid points are recorded with their rules and never reach sbatch.
    for key in ("seed=11 tp=3", "seed=12 tp=3"):
        assert points[key]["state"] == "rejected" and points[key]["job_id"] is None
        assert "L001" in {f["code"] for f in run_json(points[key]["point_dir"])["findings"]}
    assert "L001" in first.stderr

    cancelled, killed = points["seed=11 tp=1"], points["seed=12 tp=1"]
    wait_for(
        lambda: steps_written(cancelled["point_dir"]) >= 2, 240, "the first step of the job to cancel", 0.2
    )
    subprocess.run(["scancel", cancelled["job_id"]], check=True)
    pid = wait_for(lambda: rank_pid(killed["job_id"], rank=1), 240, "rank 1 of the job to kill")
    wait_for(lambda: steps_written(killed["point_dir"]) >= 2, 240, "the first step of the job to kill", 0.2)
    os.kill(pid, signal.SIGKILL)

    wait_for(lambda: ended(cancelled["job_id"]) and ended(killed["job_id"]), 120, "both jobs to end")
    final = status(sweep_dir)
    assert final["seed=11 tp=1"]["state"] == final["seed=12 tp=1"]["state"] == "failed", final
    assert run_json(cancelled["point_dir"])["failure"]["class"] == "cancelled"
    failure = run_json(killed["point_dir"])["failure"]
    assert failure["class"] == "killed", failure
    assert failure["evidence"] == "srun: error: node1: task 1: Killed", failure
    assert any(line.startswith("[task 0] ") for line in failure["log_tail"]), "the log tail lands in run.json"

    rerun = sweep(sweep_dir, *grid)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "2 to run, 0 already completed, 0 in flight, 2 rejected" in rerun.stdout
    done = wait_for(
        lambda: (
            (rows := status(sweep_dir))
            and all(rows[k]["state"] in ("completed", "failed") for k in ("seed=11 tp=1", "seed=12 tp=1"))
            and rows
        ),
        420,
        "the rerun",
    )
    for key, cls in (("seed=11 tp=1", "cancelled"), ("seed=12 tp=1", "killed")):
        assert done[key]["state"] == "completed", done[key]
        record = run_json(done[key]["point_dir"])
        assert record["launch"]["slurm_job_id"] == done[key]["job_id"] and record["layout"]["world_size"] == 2
        # Every step x 2 ranks, nothing from the failed attempt.
        assert steps_written(done[key]["point_dir"]) == 2 * STEPS
        earlier = json.loads((Path(done[key]["point_dir"]) / "attempts" / "1" / "run.json").read_text())
        assert earlier["failure"]["class"] == cls  # the failed attempt is kept, not overwritten

    table = subprocess.run(
        [PYTHON, "-m", "moe_vlm.cli.main", "status", str(sweep_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "4/4 finished: 2 completed, 2 rejected" in table and done["seed=12 tp=1"]["job_id"] in table

    again = sweep(sweep_dir, *grid)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (
        "0 to run, 2 already completed, 0 in flight, 2 rejected" in again.stdout
        and "queued" not in again.stdout
    )
    assert {row["job_id"] for row in status(sweep_dir).values()} == {row["job_id"] for row in done.values()}


def test_usr2_marks_the_point_for_rerun_and_requeues(slurm: None, sweep_dir: Path) -> None:
    submitted = sweep(sweep_dir, LONG, "seed=21")
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    point = status(sweep_dir)["seed=21"]
    job = point["job_id"]

    wait_for(lambda: steps_written(point["point_dir"]) >= 2, 240, "the first step", 0.2)
    # What Slurm sends signal_delay_s before the time limit, and what a preemption sends here.
    subprocess.run(["scancel", "--signal=USR2", job], check=True)
    # Restarts counts the requeue as soon as it is asked for; the old instance may still be
    # COMPLETING (its epilog and cleanup) for a moment before the job is queued again.
    requeued = wait_for(
        lambda: (
            (info := scontrol_job(job)).get("Restarts") == "1"
            and info.get("JobState") != "COMPLETING"
            and info
        ),
        60,
        "the requeue",
    )
    assert requeued["JobState"] in ("PENDING", "REQUEUED", "CONFIGURING", "RUNNING"), requeued
    # Held to its begin time: status says so, and how to release it.
    held = wait_for(
        lambda: "BeginTime" in (row := status(sweep_dir)["seed=21"])["detail"] and row, 30, "the hold"
    )
    assert held["state"] == "queued", held
    assert (
        f"about two minutes before it may start again; `scontrol update JobId={job} StartTime=now`"
        in (held["detail"])
    )
    # Slurm holds a requeued job for about two minutes (BeginTime); release it now.
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True)

    final = wait_for(
        lambda: (row := status(sweep_dir)["seed=21"])["state"] in ("completed", "failed") and row,
        240,
        "the rerun",
    )
    assert final["state"] == "completed", final
    record = run_json(point["point_dir"])
    assert record["launch"]["restarts"] == 1 and final["restarts"] == 1
    interrupted = Path(point["point_dir"]) / "attempts" / "1"
    assert json.loads((interrupted / "requeue.previous.json").read_text())["reason"] == "preempted"
    assert steps_written(interrupted) >= 2 and steps_written(point["point_dir"]) == 2 * STEPS
