"""Runs killed with SIGKILL still leave a record that `moe-vlm report` and `status` account for.

Three real `python train.py` runs (engine=torch on CPU, the tiny model) are killed with SIGKILL
at three moments: before the first step, mid-run, and near the end. Nothing in the run can react
to SIGKILL; what it leaves is run.json written at its start (`status: running`, host, PID),
heartbeat.json and the steps it finished. While they run, run.json is read every few
milliseconds and must always parse (it is replaced atomically, never written in place). After:

- `moe-vlm report` (read-only) lists each as failed, class killed, with its finished steps;
- `moe-vlm status` does the same and writes the verdict into run.json, summary included.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from moe_vlm.launch.status import collect
from moe_vlm.report.table import load_table

REPO = Path(__file__).resolve().parents[2]
STEPS = 40
RUN = [
    "model=tiny_moe_vlm",
    "data=mock",
    "nproc=1",
    "warmup_steps=1",
    "seq_length=128",
    f"train_iters={STEPS}",
]
# When each run is killed: after this many steps (0 = once its running record exists).
MOMENTS = {"before_first_step": 0, "mid_run": STEPS // 2, "near_the_end": STEPS - 3}

pytestmark = pytest.mark.slow


def steps_done(run_dir: Path) -> int:
    path = run_dir / "steps.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def status_of(run_dir: Path) -> str | None:
    try:
        return json.loads((run_dir / "run.json").read_text()).get("status")
    except FileNotFoundError:
        return None


class Reader(threading.Thread):
    """Reads every run.json and heartbeat.json over and over; counts reads, keeps any that failed."""

    def __init__(self, paths: list[Path]) -> None:
        super().__init__(daemon=True)
        self.paths = paths
        self.reads = 0
        self.torn: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for path in self.paths:
                try:
                    text = path.read_text()
                except FileNotFoundError:
                    continue
                try:
                    json.loads(text)
                    self.reads += 1
                except json.JSONDecodeError:
                    self.torn.append(f"{path}: {text[:200]!r}")
            time.sleep(0.002)


def test_runs_killed_at_any_moment_are_reported_killed_with_their_steps(tmp_path: Path) -> None:
    dirs = {name: tmp_path / name for name in MOMENTS}
    reader = Reader([d / name for d in dirs.values() for name in ("run.json", "heartbeat.json")])
    reader.start()
    procs = {
        name: subprocess.Popen(
            [sys.executable, "train.py", *RUN, f"hydra.run.dir={run_dir}"],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=(tmp_path / f"{name}.err").open("w"),
        )
        for name, run_dir in dirs.items()
    }
    try:
        pending = dict(MOMENTS)
        deadline = time.monotonic() + 240
        while pending:
            assert time.monotonic() < deadline, f"timed out waiting for {sorted(pending)}"
            for name, after in list(pending.items()):
                run_dir = dirs[name]
                if procs[name].poll() is not None:
                    log = (tmp_path / f"{name}.err").read_text()[-3000:]
                    raise AssertionError(f"{name} ended before it was killed ({status_of(run_dir)}):\n{log}")
                if status_of(run_dir) == "running" and steps_done(run_dir) >= after:
                    record = json.loads((run_dir / "run.json").read_text())
                    # The PID in the record is the process that runs: train.py itself.
                    assert record["process"]["pid"] == procs[name].pid
                    os.kill(procs[name].pid, signal.SIGKILL)
                    procs[name].wait()
                    del pending[name]
            time.sleep(0.01)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        reader.stop.set()
        reader.join()
    assert not reader.torn, reader.torn
    assert reader.reads > 100

    finished = {name: steps_done(run_dir) for name, run_dir in dirs.items()}
    assert finished["before_first_step"] == 0
    assert STEPS // 2 <= finished["mid_run"] < STEPS and STEPS - 3 <= finished["near_the_end"] < STEPS
    for run_dir in dirs.values():
        assert status_of(run_dir) == "running"  # what SIGKILL leaves

    # The report reads only: each run is failed, class killed, with the steps it finished.
    table = load_table([str(tmp_path)]).set_index("run")
    for name, steps in finished.items():
        row = table.loc[name]
        assert row["status"] == "failed", row
        assert row["reason"].startswith("killed: the run died without writing its final record "), row
        assert f"after {steps} of {STEPS} step(s)" in row["reason"], row
    assert table.loc["mid_run", "steady_steps"] == f"2-{finished['mid_run']}"
    assert status_of(dirs["mid_run"]) == "running"  # the report wrote nothing

    # `moe-vlm status` sees the same and writes it down.
    rows = {Path(row.point_dir).name: row for row in collect(tmp_path)}
    assert set(rows) == set(MOMENTS)
    for name, run_dir in dirs.items():
        assert rows[name].state == "failed", rows[name]
        assert rows[name].detail.startswith(f"killed: process {procs[name].pid} on "), rows[name]
        record = json.loads((run_dir / "run.json").read_text())
        assert record["status"] == "failed" and record["failure"]["class"] == "killed"
        assert record["process"]["pid"] == procs[name].pid
        summary = record.get("summary") or {}
        if finished[name] >= 2:
            assert summary["steady_steps"] == [2, finished[name]], summary
        else:
            assert not summary.get("steady_steps")
