"""`moe-vlm status`: states from records, a progress bar, and no guessing when Slurm is away."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moe_vlm.launch import slurm
from moe_vlm.launch.status import collect, main, passed_canary, pending_detail, progress_bar, snapshot
from moe_vlm.runtime import points


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


def test_a_corrupt_run_json_is_listed_and_counted_not_left_out(
    sweep: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A truncated run.json (a copy cut short, a full disk): the point is one of the sweep's, shown as
    unreadable with the file and why; the file is left as it is."""
    torn = sweep / "a" / "run.json"
    torn.write_text('{"status": "compl')
    assert main([str(sweep)]) == 0
    out = capsys.readouterr().out
    assert "5 point(s), 1 with a record that cannot be read" in out
    row = next(line for line in out.splitlines() if line.startswith("unreadable"))
    assert " a " in row and "run.json: not JSON" in row
    assert "1 unreadable" in out and torn.read_text() == '{"status": "compl'


@pytest.mark.parametrize("interval", ["-5", "0", "nan"])
def test_a_watch_interval_not_above_zero_is_one_line_exit_2(
    sweep: Path, capsys: pytest.CaptureFixture[str], interval: str
) -> None:
    assert main([str(sweep), "--watch", interval]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.splitlines()) == 1 and "--watch" in captured.err


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


CANARY_ERR = """\
Traceback (most recent call last):
  File "/work/moe_vlm/launch/canary.py", line 40, in compose_spec
ModuleNotFoundError: No module named 'submitit'
moe_vlm canary: FAILED: ModuleNotFoundError: No module named 'submitit'
srun: error: localhost: task 0: Exited with exit code 1
"""


def held_sweep(root: Path, rc: str, err: str = "", out: str = "") -> Path:
    """A sweep whose canary (job 7) ended with exit status `rc` and one point (job 8) held behind it."""
    canary = root / points.CANARIES / "local-0"
    canary.mkdir(parents=True)
    (canary / "7_0_log.err").write_text(err)
    (canary / "7_0_log.out").write_text(out)
    (canary / "7.rc").write_text(rc + "\n")
    record = {
        "job_id": "7",
        "cluster": "local",
        "container_image": None,
        "point_ids": ["p"],
        "dir": str(canary),
    }
    (canary / points.CANARY_JSON).write_text(json.dumps(record))
    submission = {"job_id": "8", "executor": "slurm", "canary": {"job_id": "7", "dir": str(canary)}}
    points.write_point(
        root / "p", {"point_id": "p", "overrides": ["seed=1"], "submissions": [submission], "job_id": "8"}
    )
    return root / "p"


def test_a_failed_canary_fails_the_points_it_held_with_class_stack_and_its_last_error_line(
    sweep: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # No Slurm here (the fixture empties PATH): the canary's exit status file alone decides.
    point_dir = held_sweep(sweep.parent / "held", "1", CANARY_ERR)
    statuses, canaries = snapshot(point_dir.parent)
    evidence = "moe_vlm canary: FAILED: ModuleNotFoundError: No module named 'submitit'"
    assert [(c.job_id, c.state, c.detail) for c in canaries] == [("7", "failed", evidence)]
    assert [(s.state, s.detail) for s in statuses] == [("failed", f"stack: {evidence}")]
    failure = json.loads((point_dir / "run.json").read_text())
    assert failure["status"] == "failed" and failure["failure"]["class"] == "stack"
    assert failure["failure"]["evidence"] == evidence and failure["launch"]["canary_job_id"] == "7"
    assert failure["failure"]["log_tail"][-2] == f"[canary] {evidence}"
    assert main([str(point_dir.parent)]) == 0
    assert f"canary job 7 (cluster=local, image (none)): failed: {evidence}" in capsys.readouterr().out


@pytest.mark.parametrize("rc, reused", [("0", "7"), ("1", None), ("", None)])
def test_only_a_passed_canary_is_reused_by_a_later_launch_of_the_sweep(
    tmp_path: Path, rc: str, reused: str | None
) -> None:
    """One canary per sweep: a halving rung after the first finds the sweep's canary passed (its
    own exit status file says 0) and submits none; a failed or unfinished one is no verdict."""
    point_dir = held_sweep(tmp_path / "sweep", rc)
    canary = point_dir.parent / points.CANARIES / "local-0"
    if not rc:
        (canary / "7.rc").unlink()
    assert passed_canary(canary) == reused
    assert passed_canary(tmp_path / "no-canary") is None


def test_a_passed_canary_shows_its_summary_and_leaves_its_points_to_slurm(sweep: Path) -> None:
    ok = (
        "moe_vlm canary: ok in 6.7 s: cluster=local engine=torch: torch 2.14.1 and transformers 5.12.1 import"
    )
    point_dir = held_sweep(sweep.parent / "passed", "0", out=ok + "\n")
    statuses, canaries = snapshot(point_dir.parent)
    assert [(c.state, c.detail) for c in canaries] == [("passed", ok)]
    assert statuses[0].state == "unknown" and not (point_dir / "run.json").exists()


def test_a_dry_run_point_the_library_refused_says_why(tmp_path: Path) -> None:
    """A dry run's point.json `refused` (the sweeper's library checks, issue 31): status names the
    library's check and its message, not just "its rules would reject it"."""
    refusal = {"code": "LIB-ARGS", "message": "AssertionError: Must use --overlap-param-gather"}
    points.write_point(
        tmp_path / "p",
        {"point_id": "p", "overrides": [], "config": {"dry_run": True}, "valid": False, "refused": [refusal]},
    )
    (row,) = snapshot(tmp_path, record=False)[0]
    assert row.state == "planned"
    assert row.detail == (
        "dry run: planned, not submitted; would be rejected: refused by the library's own check LIB-ARGS: "
        "AssertionError: Must use --overlap-param-gather"
    )


def test_a_requeued_job_held_to_its_begin_time_says_why_and_how_to_release_it() -> None:
    held = slurm.JobState("41", "PENDING", "BeginTime", restarts=1)
    assert pending_detail(held) == (
        "pending (BeginTime): Slurm holds a requeued job about two minutes before it may start again; "
        "`scontrol update JobId=41 StartTime=now` releases it"
    )
    # A job never requeued that waits for a --begin the user gave, or for resources: Slurm's words.
    assert pending_detail(slurm.JobState("42", "PENDING", "BeginTime")) == "pending (BeginTime)"
    assert pending_detail(slurm.JobState("43", "PENDING", "Resources", restarts=1)) == "pending (Resources)"
    assert pending_detail(slurm.JobState("44", "PENDING", "None")) == "pending"
