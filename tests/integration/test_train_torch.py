"""`python train.py` end to end on the torch engine: real processes, real ranks, real records."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from moe_vlm.base.files import RUN_JSON, STEPS_JSONL
from moe_vlm.record.records import RunRecord, StepRecord, read_steps
from tests.conftest import REPO

# The default run (tiny_moe_vlm, synthetic images, 2 CPU ranks, FSDP2) with smaller photos and
# fewer steps, to fit the test budget.
SMALL = [
    "seq_length=512",
    "data.max_long_side_px=448",
    "data.max_pixels=200704",
    "warmup_steps=1",
]


def train(run_dir: Path, *overrides: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "train.py", f"hydra.run.dir={run_dir}", *overrides],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
def test_default_run_completes_on_two_ranks(tmp_path: Path) -> None:
    done = train(tmp_path, *SMALL, "train_iters=3")
    assert done.returncode == 0, done.stderr[-3000:]

    record = json.loads((tmp_path / RUN_JSON).read_text())
    assert record["status"] == "completed"
    assert record["engine"] == "torch" and record["layout"]["world_size"] == 2
    assert record["data"]["kind"] == "synthetic"
    assert record["data"]["stats"]["images"] > 0
    assert record["torch_engine"]["sharding"] == "FSDP2 full shard"
    assert record["summary"]["steady_steps"] == [2, 3]
    for package in ("python", "torch", "transformers", "hydra_core", "submitit"):
        assert record["env"][package], package
    assert "commit" in record["env"]["git"] and "dirty" in record["env"]["git"]

    # The records as typed: every line meets the line contract, run.json reads back unchanged.
    for text in (tmp_path / STEPS_JSONL).read_text().splitlines():
        StepRecord.from_json(json.loads(text), strict=True)
    assert RunRecord.read(tmp_path / RUN_JSON).to_json() == record
    steps = read_steps(tmp_path / STEPS_JSONL)
    assert sorted((s.step, s.rank) for s in steps) == [(n, r) for n in (1, 2, 3) for r in (0, 1)]
    assert all(s.grad_norm == steps[0].grad_norm for s in steps if s.step == 1)  # global norm
    assert all(s.images > 0 and (s.components_s or {})["vision_encoder"] > 0 for s in steps)
    # The router's load (issue 32): both ranks' measured positions, each routed top-k times.
    router = record["router"]
    window = sum(s.padded_tokens for s in steps if s.step > 1)
    assert router["data_kind"] == "synthetic" and "note" not in router and router["load_factor"] >= 1
    assert all(sum(layer["tokens_per_expert"]) == window * router["top_k"] for layer in router["layers"])

    # Console: one progress line per step, then the summary table.
    progress = [line for line in done.stdout.splitlines() if line.startswith("step ")]
    assert len(progress) == 3 and "loss" in progress[0] and "tok/s" in progress[0] and "GiB" in progress[0]
    # The end-of-run table (moe_vlm/engines/run_summary.py): short, the run directory, the key figure.
    table = done.stdout.split("\n" + "-" * 78 + "\n", 1)[1].splitlines()
    assert len(table) <= 25, table
    assert f"run directory             {tmp_path}" in done.stdout
    assert "effective tokens/s/rank" in done.stdout and f"moe-vlm report {tmp_path}" in done.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    ("override", "engine_hint"),
    [
        ("parallelism=3d", "Megatron engine"),
        ("tp=2", "Megatron engine"),
        ("dispatcher=deepep", "Megatron engine"),
        ("cuda_graph=te_moe", "Megatron engine"),
    ],
)
def test_megatron_only_knobs_are_rejected_before_training(
    tmp_path: Path, override: str, engine_hint: str
) -> None:
    done = train(tmp_path, override, "engine=torch", timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert engine_hint in done.stderr
    assert not (tmp_path / STEPS_JSONL).exists()
    assert json.loads((tmp_path / RUN_JSON).read_text())["status"] == "rejected"


def _children(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _start_and_wait_for_steps(run_dir: Path, lines: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "train.py", f"hydra.run.dir={run_dir}", *SMALL, "train_iters=500"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and len(read_steps(run_dir / STEPS_JSONL)) < lines:
        if proc.poll() is not None:
            raise AssertionError(f"the run ended (exit {proc.returncode}) before it could be killed")
        time.sleep(0.2)
    assert len(read_steps(run_dir / STEPS_JSONL)) >= lines, "no steps were written within 180 s"
    return proc


@pytest.mark.slow
def test_a_dead_rank_fails_the_run_with_a_record(tmp_path: Path) -> None:
    proc = _start_and_wait_for_steps(tmp_path, 2)
    try:
        ranks = _children(proc.pid)
        assert len(ranks) == 2
        os.kill(ranks[1], signal.SIGKILL)  # as the kernel's OOM killer would
        assert proc.wait(timeout=120) == 1
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    record = json.loads((tmp_path / RUN_JSON).read_text())
    assert record["status"] == "failed"
    assert record["failure"]["class"] == "killed", record["failure"]


@pytest.mark.slow
def test_killed_run_leaves_readable_steps_and_a_whole_running_record(tmp_path: Path) -> None:
    proc = _start_and_wait_for_steps(tmp_path, 4)
    steps_file = tmp_path / STEPS_JSONL
    try:
        ranks = _children(proc.pid)
        assert len(ranks) == 2
        proc.send_signal(signal.SIGKILL)  # the launcher only: its ranks must die with it
        proc.wait(timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_alive(pid) for pid in ranks):
            time.sleep(0.1)
        assert not any(_alive(pid) for pid in ranks), "ranks outlived the killed launcher"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)

    lines = steps_file.read_text().splitlines()
    assert len(lines) >= 4
    for line in lines:  # every line written is complete JSON: rank 0 flushes whole lines
        json.loads(line)
    # The record written at start is whole and still says running (status/report settle it as killed:
    # tests/integration/test_killed_runs.py); no temp file of a half-written record is left.
    assert json.loads((tmp_path / RUN_JSON).read_text())["status"] == "running"
    assert not list(tmp_path.glob(f".{RUN_JSON}.*"))
