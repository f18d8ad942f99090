"""`moe-vlm status`: states from records, a progress bar, and no guessing when Slurm is away."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moe_vlm.launch import points
from moe_vlm.launch.status import collect, main, progress_bar


def point(sweep: Path, name: str, run: dict | None = None, job_id: str | None = None) -> Path:
    point_dir = sweep / name
    submissions = [{"job_id": job_id, "executor": "slurm"}] if job_id else []
    points.write_point(
        point_dir,
        {"point_id": name, "overrides": [f"mbs={len(name)}"], "submissions": submissions, "job_id": job_id},
    )
    if run is not None:
        (point_dir / "run.json").write_text(json.dumps(run))
    return point_dir


@pytest.fixture
def sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # Looking at a Slurm sweep from a machine without Slurm (a laptop with the shared filesystem).
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    root = tmp_path / "sweep"
    point(root, "a", {"status": "completed", "summary": {"step_time_s": {"p50": 1.25}}})
    point(root, "bb", {"status": "failed", "failure": {"class": "oom", "evidence": "CUDA out of memory"}})
    point(root, "ccc", {"status": "rejected", "findings": [{"code": "L001", "level": "error"}]})
    point(root, "dddd", job_id="77")
    point(root, "eeeee")
    return root


def test_states_and_details(sweep: Path) -> None:
    by_id = {s.point_id: s for s in collect(sweep)}
    assert {k: v.state for k, v in by_id.items()} == {
        "a": "completed",
        "bb": "failed",
        "ccc": "rejected",
        "dddd": "unknown",
        "eeeee": "planned",
    }
    assert by_id["bb"].detail == "oom: CUDA out of memory" and by_id["ccc"].detail == "rule(s) L001"
    assert "not reachable" in by_id["dddd"].detail
    assert not (sweep / "dddd" / "run.json").exists()  # nothing is recorded without Slurm's word


def test_progress_bar_counts_finished_points(sweep: Path) -> None:
    bar = progress_bar(collect(sweep))
    assert bar.startswith("[##################------------] 3/5 finished")
    assert "1 completed, 1 failed, 1 rejected, 1 planned, 1 unknown" in bar


def test_cli_table_and_bad_directory(sweep: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(sweep)]) == 0
    out = capsys.readouterr().out
    assert "5 point(s)" in out and "STATE" in out and "p50 step 1.25 s" in out
    assert main([str(sweep / "missing")]) == 2
    assert "no such directory" in capsys.readouterr().err


def test_slurm_is_asked_once_per_refresh_not_per_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from moe_vlm.launch import slurm

    calls: list[list[str]] = []
    real_run = slurm._run

    def counted(command: list[str]) -> str | None:
        calls.append(command)
        return real_run(command)  # the real scontrol/sacct where Slurm is installed

    monkeypatch.setattr(slurm, "_run", counted)
    root = tmp_path / "sweep"
    for number in range(20):
        point(root, f"p{number:02d}", job_id=str(900000 + number))
    collect(root, record=False)
    assert 1 <= len(calls) <= 2, calls  # scontrol for all jobs, then sacct once for those it forgot
    assert calls[0][:3] == ["scontrol", "--oneliner", "show"]
