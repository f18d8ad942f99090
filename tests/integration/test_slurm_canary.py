"""The canary and the bare command, on a real single-node Slurm (see test_slurm_sweeps.py).

- A canary whose interpreter lacks the stack (the venv's own base Python: real, just without
  the project's packages, as a container image without them would be) holds every point: none
  starts, Slurm cancels them (or keeps them PENDING where the site asks), and `moe-vlm status`
  records them `failed`, class `stack`, with the canary's last error line.
- A bare `python train.py ...` on a "login node" (no SLURM_JOB_ID) whose site file names the
  cluster and launcher is submitted as a one-point sweep behind a canary that passes, and runs;
  the canary's probe stores the first step-time calibration, which the point records.
- The same bare command inside an allocation (a batch job; MOE_VLM_GPUS_VISIBLE=1 states the
  GPUs this machine lacks) runs in place and submits nothing.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from moe_vlm.launch.canary import FAILED_PREFIX
from moe_vlm.launch.entry import ENV_GPUS_VISIBLE
from moe_vlm.launch.status import snapshot
from moe_vlm.predict.calibration import CALIBRATION_ENV
from moe_vlm.runtime import points
from tests.integration.test_slurm_sweeps import (  # noqa: F401  (slurm is a fixture)
    PYTHON,
    REPO,
    RUN,
    ended,
    run_json,
    scontrol_job,
    slurm,
    status,
    steps_written,
    sweep,
    wait_for,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
BROKEN_PYTHON = getattr(sys, "_base_executable", sys.executable)
EVIDENCE = f"{FAILED_PREFIX}: ModuleNotFoundError: No module named 'submitit'"


@pytest.fixture
def sweeps(tmp_path: Path) -> Iterator[list[Path]]:
    """Sweep directories a test used; every point and canary job left in them is cancelled."""
    used: list[Path] = []
    yield used
    jobs = [json.loads(p.read_text()).get("job_id") for d in used for p in d.glob("*/point.json")]
    jobs += [c["job_id"] for d in used for c in points.iter_canaries(d)]
    if any(jobs):
        subprocess.run(["scancel", *[j for j in jobs if j]], capture_output=True)


def only_canary(sweep_dir: Path) -> dict:
    (canary,) = list(points.iter_canaries(sweep_dir))
    return canary


def site_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    site = tmp_path / "site.yaml"
    site.write_text("cluster: local\nlauncher: slurm\n")
    # A login node: no job of ours around this shell.
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_JOB") and k != ENV_GPUS_VISIBLE}
    return {**clean, "MOE_VLM_SITE_FILE": str(site), **extra}


def test_a_canary_that_cannot_import_the_stack_holds_and_fails_every_point(
    slurm: None,  # noqa: F811
    tmp_path: Path,
    sweeps: list[Path],
) -> None:
    if subprocess.run([BROKEN_PYTHON, "-c", "import submitit"], capture_output=True).returncode == 0:
        pytest.skip(f"{BROKEN_PYTHON} imports submitit: run the tests from a virtual environment")
    cancelled, kept = tmp_path / "cancelled", tmp_path / "kept"
    sweeps += [cancelled, kept]
    broken = f"hydra.launcher.python={BROKEN_PYTHON}"
    done = sweep(cancelled, "seed=31,32", broken)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 point(s) queued in 2 job(s)" in done.stdout and "checks the job environment" in done.stdout
    # A site that keeps held jobs (to re-point their dependency by hand) gets them PENDING instead.
    held = sweep(kept, "seed=33", broken, "+hydra.launcher.additional_parameters.kill_on_invalid_dep=no")
    assert held.returncode == 0, held.stderr[-3000:]

    canary = only_canary(cancelled)
    wait_for(lambda: ended(canary["job_id"]) and ended(only_canary(kept)["job_id"]), 300, "both canaries")
    assert scontrol_job(canary["job_id"])["JobState"] == "FAILED"
    rows, canaries = snapshot(cancelled)
    assert [(c.job_id, c.state, c.detail) for c in canaries] == [(canary["job_id"], "failed", EVIDENCE)]
    assert len(rows) == 2
    wait_for(
        lambda: all(scontrol_job(str(r.job_id)).get("JobState") == "CANCELLED" for r in rows),
        30,
        "Slurm to cancel them",
    )
    for row in rows:
        assert (row.state, row.detail) == ("failed", f"stack: {EVIDENCE}"), row
        failure = run_json(row.point_dir)["failure"]
        assert failure["class"] == "stack" and failure["evidence"] == EVIDENCE
        assert steps_written(row.point_dir) == 0  # the point never ran
        job = scontrol_job(str(row.job_id))
        assert job["Reason"] == "DependencyNeverSatisfied"
        assert job["Dependency"].startswith(f"afterok:{canary['job_id']}")

    pending = status(kept)["seed=33"]
    assert (pending["state"], pending["detail"]) == ("failed", f"stack: {EVIDENCE}")
    # Slurm names the reason at its next scheduling pass; the job stays queued for good.
    job = wait_for(
        lambda: (info := scontrol_job(pending["job_id"]))["Reason"] == "DependencyNeverSatisfied" and info,
        30,
        "Slurm to give up on the held job",
    )
    assert job["JobState"] == "PENDING"

    table = subprocess.run(
        [PYTHON, "-m", "moe_vlm.cli.main", "status", str(cancelled)], cwd=REPO, capture_output=True, text=True
    ).stdout
    assert f"canary job {canary['job_id']} (cluster=local, image (none)): failed: {EVIDENCE}" in table
    assert "2/2 finished: 2 failed" in table


def test_a_bare_command_on_a_login_node_is_submitted_behind_a_canary_that_passes(
    slurm: None,  # noqa: F811
    tmp_path: Path,
    sweeps: list[Path],
) -> None:
    sweep_dir = tmp_path / "sweep"
    sweeps.append(sweep_dir)
    done = subprocess.run(
        [PYTHON, "train.py", *RUN, "seed=41", "train_iters=3", f"hydra.sweep.dir={sweep_dir}"],
        cwd=REPO,
        env=site_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "one-point sweep through hydra/launcher=slurm" in done.stderr
    assert (
        "1 point(s) queued in 1 job(s)" in done.stdout
        and f"moe-vlm status {sweep_dir} --watch 30" in done.stdout
    )
    (row,) = status(sweep_dir).values()
    canary = only_canary(sweep_dir)
    assert scontrol_job(row["job_id"])["Dependency"].startswith(f"afterok:{canary['job_id']}")

    final = wait_for(
        lambda: (r := next(iter(status(sweep_dir).values())))["state"] in ("completed", "failed") and r,
        600,
        "the point",
    )
    assert final["state"] == "completed", final
    record = run_json(final["point_dir"])
    assert (
        record["launch"]["slurm_job_id"] == row["job_id"] and record["config"]["cluster"]["name"] == "local"
    )
    (passed,) = snapshot(sweep_dir)[1]
    assert passed.state == "passed" and passed.detail.startswith("moe_vlm canary: ok in ")
    # The canary's probe stored this machine's rates (cluster=local has no published ones), so the
    # point, which ran after it, recorded a prediction at them, with the CPU family's band.
    assert passed.detail.endswith(f"probe rates stored in {os.environ[CALIBRATION_ENV]}")
    predicted = record["prediction"]["predicted"]
    assert predicted["step_time_s"] > 0 and "measured on this machine by the probe" in predicted["source"]
    assert record["prediction"]["sigmas"] is not None


def test_a_bare_command_inside_an_allocation_runs_in_place(
    slurm: None,  # noqa: F811
    tmp_path: Path,
    sweeps: list[Path],
) -> None:
    run_dir, would_be_sweep = tmp_path / "run", tmp_path / "sweep"
    sweeps.append(would_be_sweep)
    command = [PYTHON, "train.py", *RUN, "nproc=1", "train_iters=2", f"hydra.run.dir={run_dir}"]
    command.append(f"hydra.sweep.dir={would_be_sweep}")
    log = tmp_path / "allocation.log"
    submitted = subprocess.run(
        ["sbatch", "--parsable", f"--output={log}", f"--chdir={REPO}", "--wrap", shlex.join(command)],
        env=site_env(tmp_path, **{ENV_GPUS_VISIBLE: "1"}),
        capture_output=True,
        text=True,
        check=True,
    )
    allocation = submitted.stdout.strip()
    wait_for(lambda: ended(allocation), 300, "the allocation's job")
    output = log.read_text()
    assert scontrol_job(allocation)["JobState"] == "COMPLETED", output[-3000:]
    record = run_json(run_dir)
    assert record["status"] == "completed" and record["config"]["cluster"]["name"] == "local"
    # Nothing was submitted from inside: no sweep directory, no note, no later job id.
    assert not would_be_sweep.exists() and "one-point sweep" not in output
    assert scontrol_job(str(int(allocation) + 1)) == {}
