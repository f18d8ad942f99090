"""The torch engine's step period: what its loop runs between two steps (the gather, steps.jsonl,
the console, the tracker, the profiler's export) is outside step_time_s and inside step_period_s,
and the run's rates divide by the period (moe_vlm.perf.metrics.time_basis)."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from moe_vlm.base.files import RUN_JSON, STEPS_JSONL
from moe_vlm.engines import torch_engine
from moe_vlm.engines.torch_engine import Console, run_rank
from moe_vlm.record.records import read_steps
from moe_vlm.runtime.dist_env import DistEnv
from tests.conftest import make_spec

PAUSE_S = 1.0


def test_time_between_steps_counts_in_the_period(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = make_spec("nproc=1", "seq_length=64", "gbs=1", "data=mock", "train_iters=4", "warmup_steps=1")
    printed = Console.step

    def slow_console(self: Console, records: list[Any]) -> None:
        printed(self, records)
        if records[0].step == 2:
            time.sleep(PAUSE_S)  # a deliberate pause in the loop between two steps

    monkeypatch.setattr(torch_engine.Console, "step", slow_console)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    run_rank(spec, {"data": {"kind": "mock"}}, tmp_path, DistEnv(0, 1, 0, 1, "127.0.0.1", port, "spawn"))

    lines = read_steps(tmp_path / STEPS_JSONL)
    assert [line.step for line in lines] == [1, 2, 3, 4]  # none lost by holding each for its period
    periods = [line.step_period_s for line in lines]
    assert periods[3] is None  # the last step has no next start
    # Step 2's line is printed once step 3 has started, so the pause falls between steps 3 and 4:
    # in step 3's period, in no step's time.
    gaps = [period - line.step_time_s for period, line in zip(periods[:3], lines, strict=False) if period]
    assert len(gaps) == 3 and gaps[2] >= PAUSE_S > max(gaps[:2]) and min(gaps) >= 0

    summary = json.loads((tmp_path / RUN_JSON).read_text())["summary"]
    assert summary["time_basis"]["name"] == "step_period" and summary["time_basis"]["steps"] == 2
    window_rate = sum(line.real_tokens for line in lines[1:3]) / sum(line.step_time_s for line in lines[1:3])
    assert summary["effective_tokens_per_s_per_gpu"] < window_rate
    assert summary["between_steps_s"]["max"] >= PAUSE_S
