"""Where a bare `python train.py ...` runs: in place, or submitted as a one-point sweep.

The logic with real site files (moe_vlm/launch/entry.py), then the bare command itself through
real Hydra: rejected on a laptop, planned for the site's cluster with its canary on a login node.
On the local Slurm, tests/integration/test_slurm_canary.py submits and runs it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from moe_vlm.base.errors import BadInput
from moe_vlm.launch.entry import ENV_GPUS_VISIBLE, command_line, in_allocation

REPO = Path(__file__).resolve().parents[2]
BARE = ["parallelism=fsdp", "dispatcher=hybridep"]
LOGIN: dict[str, str] = {}  # a login node: no job id
ALLOCATION = {"SLURM_JOB_ID": "41", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "site.yaml"
    path.write_text("cluster: gb200\nlauncher: slurm_gb200\naccount: acct\ngb200:\n  partition: gb200\n")
    monkeypatch.setenv("MOE_VLM_SITE_FILE", str(path))
    for key in ("CLUSTER", "LAUNCHER"):
        monkeypatch.delenv(f"MOE_VLM_{key}", raising=False)
    return path


def test_without_a_site_cluster_and_launcher_the_command_is_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MOE_VLM_SITE_FILE", "none")
    entry = command_line(BARE, LOGIN)
    assert entry.argv == BARE and entry.note is None


def test_on_a_login_node_the_bare_command_becomes_a_one_point_sweep_on_the_site_launcher(site: Path) -> None:
    entry = command_line(BARE, LOGIN)
    assert entry.argv == ["-m", *BARE, "cluster=gb200", "hydra/launcher=slurm_gb200"]
    assert entry.note is not None and "one-point sweep" in entry.note and str(site) in entry.note
    # A sweep gets the site's launcher too, and stays one -m.
    assert command_line(["-m", "mbs=1,2"], LOGIN).argv == [
        "-m",
        "mbs=1,2",
        "cluster=gb200",
        "hydra/launcher=slurm_gb200",
    ]


def test_inside_an_allocation_it_runs_in_place_on_the_site_cluster(site: Path) -> None:
    assert in_allocation(ALLOCATION)
    entry = command_line(BARE, ALLOCATION)
    assert entry.argv == [*BARE, "cluster=gb200"] and entry.note is None
    # An salloc shell on the login node has a job id but no GPUs: submitted like the login node.
    salloc = {"SLURM_JOB_ID": "41", "CUDA_VISIBLE_DEVICES": ""}
    assert not in_allocation(salloc) and command_line(BARE, salloc).argv[0] == "-m"
    # The documented override states the GPUs where detection cannot see them (and in tests).
    assert in_allocation({"SLURM_JOB_ID": "41", ENV_GPUS_VISIBLE: "1", "CUDA_VISIBLE_DEVICES": ""})
    assert not in_allocation({"SLURM_JOB_ID": "41", ENV_GPUS_VISIBLE: "0", "CUDA_VISIBLE_DEVICES": "0"})
    with pytest.raises(BadInput, match=ENV_GPUS_VISIBLE):
        in_allocation({"SLURM_JOB_ID": "41", ENV_GPUS_VISIBLE: "yes"})


def test_the_command_line_wins_over_the_site_file(site: Path) -> None:
    # Another cluster: run as typed, without the site's launcher (it belongs to the site's cluster).
    assert command_line([*BARE, "cluster=local"], LOGIN).argv == [*BARE, "cluster=local"]
    # The same cluster named explicitly, or another launcher: still submitted, with that launcher.
    assert command_line(["cluster=gb200"], LOGIN).argv == [
        "-m",
        "cluster=gb200",
        "hydra/launcher=slurm_gb200",
    ]
    assert command_line(["hydra/launcher=slurm"], LOGIN).argv == [
        "-m",
        "hydra/launcher=slurm",
        "cluster=gb200",
    ]
    # Looking at the config changes nothing but the cluster.
    assert command_line(["--cfg", "job"], LOGIN).argv == ["--cfg", "job", "cluster=gb200"]
    assert command_line(["--help"], LOGIN).argv == ["--help"]


def test_environment_variables_override_the_site_file_and_bad_names_say_where_they_came_from(
    site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MOE_VLM_CLUSTER", "b200")
    monkeypatch.setenv("MOE_VLM_LAUNCHER", "slurm_b200")
    assert command_line([], LOGIN).argv == ["-m", "cluster=b200", "hydra/launcher=slurm_b200"]
    monkeypatch.delenv("MOE_VLM_CLUSTER")
    monkeypatch.delenv("MOE_VLM_LAUNCHER")
    site.write_text("cluster: gb900\nlauncher: slurm_gb200\n")
    with pytest.raises(BadInput, match=r"cluster: 'gb900' in the site file .*Allowed: b200, .*gb200.*local"):
        command_line(BARE, LOGIN)


def train(site: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MOE_VLM_"))}
    return subprocess.run(
        [sys.executable, "train.py", *args],
        cwd=REPO,
        env={**clean, "MOE_VLM_SITE_FILE": str(site), **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_the_bare_command_is_rejected_on_a_laptop_and_planned_for_the_cluster_on_a_login_node(
    tmp_path: Path,
) -> None:
    laptop = train(Path("none"), *BARE)
    assert laptop.returncode == 2 and "E003" in laptop.stderr and "Fix:" in laptop.stderr

    site = tmp_path / "site.yaml"
    site.write_text("cluster: gb200\nlauncher: slurm_gb200\naccount: acct\n")
    login = train(site, *BARE, "dry_run=true", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert login.returncode == 0, login.stderr[-3000:]
    assert "one-point sweep through hydra/launcher=slurm_gb200" in login.stderr
    out = login.stdout
    assert out.count("===== point") == 1 and "cluster=gb200" in out and "engine=megatron" in out
    assert "#SBATCH --gpus-per-node=4" in out and "#SBATCH --dependency=afterok:CANARY_JOB_ID" in out
    assert "-m moe_vlm.launch.canary --probe parallelism=fsdp dispatcher=hybridep cluster=gb200" in out
    assert "nothing was submitted" in out
    # The one point's plan.json (moe_vlm/run/plan_record.py) and point.json (planned, not
    # submitted: what `moe-vlm status` lists), nothing else.
    written = [
        p.relative_to(tmp_path / "sweep").parts for p in (tmp_path / "sweep").rglob("*") if p.is_file()
    ]
    assert sorted(w[-1] for w in written) == ["plan.json", "point.json"] and len({w[0] for w in written}) == 1
