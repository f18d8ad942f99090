"""The planning sweeper through real Hydra (`python train.py -m ...`), without submitting anything."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from moe_vlm.config.compose import compose_config
from moe_vlm.runtime import points
from moe_vlm.runtime.points import sweep_name

REPO = Path(__file__).resolve().parents[2]
SECRET = "s3cr3t-token-value-42"


def train(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MOE_VLM_TEST_TOKEN": SECRET, "MOE_VLM_SITE_FILE": "none"}
    return subprocess.run(
        [sys.executable, "train.py", "-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", *overrides],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_dry_run_prints_each_points_sbatch_and_srun_and_submits_nothing(tmp_path: Path) -> None:
    done = train(
        tmp_path,
        "hydra/launcher=slurm",
        "dry_run=true",
        "nproc=1",
        "tp=1,3",
        "data.path=/data/${oc.env:MOE_VLM_TEST_TOKEN}",
        "hydra.launcher.setup=['echo ${oc.env:MOE_VLM_TEST_TOKEN}']",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert (
        out.count("===== point") == 2 and out.count("-- sbatch script --") == 1
    )  # the invalid point has none
    assert "INVALID" in out and "L001" in out
    assert "#SBATCH --ntasks-per-node=1" in out and "#SBATCH --signal=USR2@120" in out
    assert out.count("-- srun command --") == 1 and "\nsrun --unbuffered" in out
    assert SECRET not in out + done.stderr and "echo ***" in out
    assert "1 valid, 1 would be rejected; nothing was submitted" in out
    # Nothing but each point's plan.json (moe_vlm/run/plan_record.py) and point.json (planned, not
    # submitted: what `moe-vlm status` lists), secrets masked there too.
    written = sorted((tmp_path / "sweep").rglob("*"))
    assert sorted(p.name for p in written if p.is_file()) == [
        "plan.json",
        "plan.json",
        "point.json",
        "point.json",
    ]
    assert all(SECRET not in p.read_text() for p in written if p.is_file())
    # The canary the valid point waits on: its script and srun line, with the point's overrides.
    assert "#SBATCH --dependency=afterok:CANARY_JOB_ID" in out and "#SBATCH --kill-on-invalid-dep=yes" in out
    assert out.count("-- canary srun command --") == 1 and "#SBATCH --job-name=moe_vlm-canary" in out
    # The point's own overrides, as its job gets them (the variable is resolved in the job).
    assert (
        "-m moe_vlm.launch.canary --probe nproc=1 tp=1 'data.path=/data/$\\{oc.env\\:MOE_VLM_TEST_TOKEN\\}'"
        in out
    )
    assert out.count("export HF_HUB_OFFLINE=1") == out.count("export TRANSFORMERS_OFFLINE=1") == 2


@pytest.mark.slow
def test_a_packed_dry_run_prints_one_script_per_job_naming_its_points(tmp_path: Path) -> None:
    """points_per_job=8 over three points: one packed job, as the launcher submits it (the
    scripts' identity with what sbatch receives: tests/integration/test_slurm_dry_run.py)."""
    done = train(
        tmp_path,
        "hydra/launcher=slurm",
        "nproc=1",
        "mbs=1,2,4",
        "hydra.launcher.points_per_job=8",
        "dry_run=true",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    (job,) = [line for line in out.splitlines() if line.startswith("===== job ")]
    assert job.startswith("===== job 1/1: a packed job of 3 point(s)") and job.count("(id ") == 3
    assert out.count("-- sbatch script --") == 1 and "export MOE_VLM_PACK_SIZE=3" in out
    assert "MOE_VLM_PACK_SIZE=1" not in out and "#SBATCH --time=90" in out  # three points' limits


@pytest.mark.slow
def test_canary_false_submits_the_points_without_one(tmp_path: Path) -> None:
    done = train(tmp_path, "hydra/launcher=slurm", "dry_run=true", "nproc=1", "hydra.launcher.canary=false")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "-- sbatch script --" in done.stdout and "moe_vlm.launch.canary" not in done.stdout
    assert "--dependency" not in done.stdout


@pytest.mark.slow
def test_unsafe_launcher_values_stop_the_sweep_with_one_line(tmp_path: Path) -> None:
    done = train(tmp_path, "hydra/launcher=slurm", "mbs=1,2", "hydra.launcher.partition='gpu;touch /tmp/x'")
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "hydra.launcher.partition" in done.stderr
    assert not (tmp_path / "sweep").exists()


def test_a_sweep_directory_that_is_a_file_is_one_line_exit_2(tmp_path: Path) -> None:
    (tmp_path / "sweep").write_text("a file the user has\n")
    done = train(tmp_path, "mbs=1,2", "dry_run=true")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().count("\n") == 0 and "is a file, not a directory" in done.stderr
    assert (tmp_path / "sweep").read_text() == "a file the user has\n"  # nothing lost


@pytest.mark.slow
def test_a_preset_gives_the_axes_and_the_command_line_replaces_one(tmp_path: Path) -> None:
    done = train(tmp_path, "sweep=mbs_recompute", "mbs=2", "dry_run=true")
    assert done.returncode == 0, done.stderr[-2000:]
    headers = [line for line in done.stdout.splitlines() if line.startswith("===== point")]
    assert len(headers) == 2 and all("mbs=2" in h for h in headers)
    assert any("recompute=full" in h for h in headers) and any("recompute=selective" in h for h in headers)


@pytest.mark.slow
def test_rejected_points_are_recorded_not_run_and_secrets_stay_out(tmp_path: Path) -> None:
    done = train(tmp_path, "nproc=1", "tp=3,5", "data.path=/data/${oc.env:MOE_VLM_TEST_TOKEN}")
    assert done.returncode == 2  # every point rejected: nothing to run
    records = [json.loads(p.read_text()) for p in (tmp_path / "sweep").glob("*/run.json")]
    assert sorted(r["config"]["tp"] for r in records) == [3, 5]
    assert all(r["status"] == "rejected" and "L001" in {f["code"] for f in r["findings"]} for r in records)
    assert all(r["config"]["data"]["path"] == "/data/***" for r in records)
    for path in (tmp_path / "sweep").rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_text(), path


def test_a_sweep_command_names_the_same_directory_every_time() -> None:
    assert sweep_name(["mbs=1,2", "recompute=full,selective"]) == sweep_name(
        ["recompute=full,selective", "mbs=1,2"]
    )
    assert sweep_name(["mbs=1,2", "dry_run=true"]) == sweep_name(
        ["mbs=1,2"]
    )  # a dry run shows the real directory
    assert sweep_name(["mbs=1,2"]) != sweep_name(["mbs=1,4"])
    assert "/" not in sweep_name(["data.path=/a/b"])


@pytest.mark.slow
def test_a_big_dry_run_prints_one_line_per_point_and_writes_each_plan(tmp_path: Path) -> None:
    done = train(
        tmp_path,
        "hydra/launcher=slurm",
        "nproc=1",
        "mbs=1,2,4",
        "tp=1,3",
        "recompute=none,full",
        "dry_run=true",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out, sweep = done.stdout, tmp_path / "sweep"
    assert "===== point" not in out and "#SBATCH" not in out
    rows = [line for line in out.splitlines() if line[:5].strip().isdigit()]
    assert len(rows) == 12
    rejected = [row for row in rows if row.split()[2] == "REJECTED"]
    assert len(rejected) == 6 and all("tp=3" in row and "L001" in row for row in rejected)
    assert all(" GiB per rank " in row and " 1x1 ranks " in row for row in rows)
    assert "12 point(s), 6 valid, 6 would be rejected (" in out and "L001 x6" in out
    assert "; nothing was submitted." in out
    assert "(dry_run=full prints them)" in out
    # Every plan, every valid point's sbatch script and the canary's in one file; nothing submitted.
    plans = (sweep / "dry_run_plans.txt").read_text()
    assert plans.count("===== point") == 12 and plans.count("== moe_vlm plan ==") == 12
    # The six valid points have the same resources: one job array, as the launcher submits them.
    assert plans.count("#SBATCH --ntasks-per-node=1") == 1 + 1  # the array and the canary
    (job,) = [line for line in plans.splitlines() if line.startswith("===== job ")]
    assert "a job array of 6 tasks" in job and "#SBATCH --array=0-5%6" in plans
    valid = {row.split()[1] for row in rows if row.split()[2] == "valid"}
    assert set(re.findall(r"\(id ([0-9a-f]{16})\)", job)) == valid
    assert "moe_vlm.launch.canary" in plans
    assert (sweep / "dry_run.txt").read_text().count("REJECTED") == 6
    # Besides the two text files, each point's plan.json (moe_vlm/run/plan_record.py) in its directory.
    assert sorted(p.name for p in sweep.iterdir() if p.is_file()) == ["dry_run.txt", "dry_run_plans.txt"]
    assert sorted(p.parent.name for p in sweep.glob("*/plan.json")) == sorted(r.split()[1] for r in rows)
    planned = [json.loads(p.read_text()) for p in sweep.rglob("point.json")]  # for `moe-vlm status`
    assert len(planned) == 12 and not any(p.get("job_id") or p.get("submissions") for p in planned)
    assert not list(sweep.rglob("run.json"))
    assert not (sweep / "multirun.yaml").exists()


@pytest.mark.slow
def test_dry_run_full_prints_every_plan_of_a_big_sweep(tmp_path: Path) -> None:
    done = train(tmp_path, "nproc=1", "mbs=1,2,4", "nodes=1,2,4", "dry_run=full")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("===== point") == 9 and done.stdout.count("== moe_vlm plan ==") == 9
    assert len(list((tmp_path / "sweep").glob("*/plan.json"))) == 9  # and point.json, nothing else
    assert len([p for p in (tmp_path / "sweep").rglob("*") if p.is_file()]) == 18


@pytest.mark.slow
def test_rejected_points_record_what_hydra_composes_and_the_sweeps_launcher(tmp_path: Path) -> None:
    done = train(tmp_path, "hydra/launcher=slurm", "hydra.launcher.qos=high", "nproc=1", "tp=3,5", "mbs=1,2")
    assert done.returncode == 2  # every point rejected: nothing submitted
    points_written = sorted((tmp_path / "sweep").glob("*/point.json"))
    assert len(points_written) == 4
    for path in points_written:
        point = json.loads(path.read_text())
        assert point["launcher_overrides"] == ["hydra/launcher=slurm", "hydra.launcher.qos=high"]
        # The planner's resolved config is Hydra's composition of the point's overrides.
        hydra = points.resolved(compose_config(point["overrides"]))
        assert point["config"] == hydra
        assert json.loads((path.parent / "run.json").read_text())["config"] == hydra
