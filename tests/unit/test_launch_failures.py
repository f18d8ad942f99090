"""Failure classes from exit status, Slurm state and real log lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moe_vlm.runtime.failures import Diagnosis, classify, current_attempt, job_logs, write_failure

TRACEBACK = 'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\nValueError: bad\n'

# (log text, slurm state, exit code, signal) -> class
CASES = {
    "timeout": (
        "slurmstepd: error: *** JOB 7 ON gpu01 CANCELLED AT 2026-01-01T00:00:00 DUE TO TIME LIMIT ***",
        None,
        0,
        15,
    ),
    "timeout-state": ("", "TIMEOUT", None, None),
    "preempted": (
        "slurmstepd: error: *** JOB 7 ON gpu01 CANCELLED AT 2026-01-01T00:00:00 DUE TO PREEMPTION ***",
        None,
        None,
        None,
    ),
    "node": (
        "slurmstepd: error: *** JOB 7 ON gpu01 CANCELLED AT 2026-01-01T00:00:00 DUE TO NODE FAILURE ***",
        None,
        None,
        None,
    ),
    "node-xid": ("NVRM: Xid (PCI:0000:1b:00): 79, GPU has fallen off the bus.", None, None, None),
    "oom": (
        TRACEBACK.replace(
            "ValueError: bad", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
        ),
        None,
        1,
        None,
    ),
    "oom-state": ("", "OUT_OF_MEMORY", None, None),
    "cancelled": (
        "slurmstepd: error: *** JOB 8 ON localhost CANCELLED AT 2026-11-30T12:46:25 ***",
        None,
        None,
        None,
    ),
    "cancelled-state": ("", "CANCELLED", 0, 15),
    "killed": (
        "RuntimeError: [gloo/transport/tcp/pair.cc:561] Connection closed by peer [127.0.0.1]:7569\n"
        "srun: error: localhost: task 1: Killed\n"
        "slurmstepd-localhost: error: *** STEP 7.0 ON localhost CANCELLED AT 2026-11-30T12:44:03 ***",
        None,
        137,
        9,
    ),
    "killed-exit": ("", None, 137, 9),
    "nccl": (
        TRACEBACK.replace(
            "ValueError: bad",
            "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system",
        ),
        None,
        1,
        None,
    ),
    "nccl-watchdog": (
        "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE)",
        None,
        134,
        6,
    ),
    # The job environment lacks a module: the canary's line, or a run's own import.
    "stack": (
        TRACEBACK.replace("ValueError: bad", "ModuleNotFoundError: No module named 'deep_ep'"),
        None,
        1,
        None,
    ),
    "stack-canary": ("moe_vlm canary: FAILED: CanaryFailed: engine=megatron: ...", None, 1, None),
    "stack-engine": (
        "moe_vlm: error: engine=megatron: the run would import 1 thing(s) that fail here: from deep_ep ...",
        None,
        2,
        None,
    ),
    "python": (TRACEBACK, None, 1, None),
    "unknown": ("all good until it was not", None, 3, None),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_classify(case: str) -> None:
    text, state, code, sig = CASES[case]
    assert classify(text, state, code, sig).name == case.split("-")[0]


def test_requeue_lines_of_an_earlier_attempt_are_not_a_cancellation() -> None:
    text = (
        "slurmstepd: error: *** JOB 2 ON localhost CANCELLED AT 2026-11-30T12:28:10 DUE TO JOB REQUEUE ***\n"
        + TRACEBACK
    )
    assert classify(text).name == "python"


def test_only_the_last_attempt_counts() -> None:
    text = (
        "submitit INFO - Starting with JobEnvironment(job_id=5)\nCUDA out of memory\n"
        "submitit INFO - Starting with JobEnvironment(job_id=5)\nall fine\n"
    )
    assert "out of memory" not in current_attempt(text)
    assert current_attempt(text).endswith("all fine\n")


def test_job_logs_tail_is_labelled_by_task(tmp_path: Path) -> None:
    (tmp_path / "5_0_log.err").write_text("srun: error: localhost: task 1: Killed\n")
    (tmp_path / "5_1_log.err").write_text(TRACEBACK)
    text, tail = job_logs(tmp_path)
    assert classify(text).name == "killed"  # task 0's srun line outranks the traceback
    assert (
        "[task 1] ValueError: bad" in tail and tail[-1] == "[task 0] srun: error: localhost: task 1: Killed"
    )


def _failure(point_dir: Path, name: str) -> str:
    write_failure(point_dir, Diagnosis(name, name, None), [], {"point_id": "p", "status": "failed"})
    return json.loads((point_dir / "run.json").read_text())["failure"]["class"]


def test_a_more_specific_failure_is_kept(tmp_path: Path) -> None:
    assert _failure(tmp_path, "nccl") == "nccl"
    assert _failure(tmp_path, "killed") == "killed"  # the dead rank explains the broken collective
    assert _failure(tmp_path, "python") == "killed"
    assert _failure(tmp_path, "oom") == "oom"


def test_a_completed_record_is_never_overwritten(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text(json.dumps({"status": "completed"}))
    write_failure(tmp_path, Diagnosis("cancelled", "x", None), [], {"status": "failed"})
    assert json.loads((tmp_path / "run.json").read_text())["status"] == "completed"


def test_a_packed_point_killed_before_its_record_keeps_its_step_and_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch script records a step whose rank died before writing run.json: from point.json,
    with the step its loop counted and the place in the pack its environment holds."""
    from moe_vlm.runtime import failures, points

    points.write_point(tmp_path, {"point_id": tmp_path.name, "config": {}})
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "9_0_log.err").write_text("srun: error: node1: task 0: Killed\n")
    points.add_submission(
        tmp_path, {"job_id": "9", "executor": "slurm"}, submitit_folder=str(tmp_path / "folder")
    )
    for name in ("SLURM_STEP_ID", "SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MOE_VLM_PACK_INDEX", "2")
    monkeypatch.setenv("MOE_VLM_PACK_SIZE", "3")
    failures.main(["--point-dir", str(tmp_path), "--job-id", "9", "--exit-code", "137", "--step-id", "1"])
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["failure"]["class"] == "killed"
    assert record["launch"]["slurm_step_id"] == "1" and record["launch"]["pack"] == {"index": 2, "size": 3}
    # Rank 1 killed in a two-rank step: rank 0 recorded the broken collective first (with its
    # step and place); the batch script's `killed` outranks it and keeps them.
    record["failure"] = {"class": "nccl", "message": "gloo", "evidence": "Connection closed by peer"}
    record["launch"] = {"slurm_step_id": "4", "pack": {"index": 2, "size": 3}, "host": "node1"}
    (tmp_path / "run.json").write_text(json.dumps(record))
    monkeypatch.delenv("MOE_VLM_PACK_INDEX")
    failures.main(["--point-dir", str(tmp_path), "--job-id", "9", "--exit-code", "137"])
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["failure"]["class"] == "killed" and record["launch"]["host"] == "node1"
    assert record["launch"]["slurm_step_id"] == "4" and record["launch"]["pack"] == {"index": 2, "size": 3}
