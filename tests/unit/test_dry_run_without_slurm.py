"""The README tour on a machine without Slurm's client tools (a laptop, a CI box): a Slurm dry run
renders its sbatch scripts, `moe-vlm status` reads the dry-run sweep, `multirun/latest` is the
sweep started last."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from moe_vlm.run.plan import SHALLOW_ENV
from tests.conftest import REPO

SLURM_TOOLS = ("sbatch", "srun", "squeue", "scontrol", "sacct", "scancel", "sinfo")


def no_slurm_env(tmp_path: Path) -> dict[str, str]:
    """The environment with PATH holding git only: no Slurm client tool can be found."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    git = shutil.which("git")
    if git is not None and not (bin_dir / "git").exists():
        (bin_dir / "git").symlink_to(git)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        {
            "PATH": str(bin_dir),
            "PYTHONPATH": str(REPO),
            "MOE_VLM_SITE_FILE": "none",
            SHALLOW_ENV: "1",  # plans without Bridge's sections: seconds, not a minute per point
        }
    )
    return env


def run(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = no_slurm_env(tmp_path)
    assert not any(shutil.which(tool, path=env["PATH"]) for tool in SLURM_TOOLS)
    return subprocess.run(
        [sys.executable, *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_a_slurm_dry_run_renders_its_scripts_and_status_reads_it_without_slurm(tmp_path: Path) -> None:
    done = run(
        tmp_path,
        str(REPO / "train.py"),
        "-m",
        "hydra/launcher=slurm_gb200",
        "cluster=gb200",
        "model=qwen3_vl_30b_a3b",
        "mbs=1,2",
        "dry_run=true",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert "-- sbatch script --" in done.stdout and "#SBATCH --nodes=1" in done.stdout
    assert "-- canary srun command --" in done.stdout
    assert "moe-vlm status" in done.stdout and "multirun/latest" in done.stdout
    status = run(tmp_path, "-m", "moe_vlm.cli", "status", "multirun/latest")
    assert status.returncode == 0, status.stderr
    assert "2 planned" in status.stdout and status.stdout.count("dry run: planned, not submitted") == 2


@pytest.mark.slow
def test_multirun_latest_is_the_sweep_started_last(tmp_path: Path) -> None:
    names = []
    for axis in ("mbs=1,2", "mbs=1,4", "mbs=1,2"):  # the third reuses the first one's directory
        done = run(tmp_path, str(REPO / "train.py"), "-m", axis, "nproc=1", "dry_run=true")
        assert done.returncode == 0, done.stderr[-3000:]
        latest = tmp_path / "multirun" / "latest"
        assert latest.is_symlink() and latest.resolve().parent == (tmp_path / "multirun").resolve()
        names.append(os.readlink(latest))
    assert names[0] == names[2] != names[1]
    assert sorted(p.name for p in (tmp_path / "multirun").iterdir()) == sorted({*names, "latest"})
