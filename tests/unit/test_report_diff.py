"""`moe-vlm report --diff RUN_A RUN_B` on run directories written the way the engines write them
(run.json from record.base_record + metrics.summarize over steps.jsonl records; torch-engine
style, without Bridge's effective configuration: tests/megatron/test_effective.py has Megatron's)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from tests.conftest import REPO
from tests.unit.test_report import run_report, table_rows, write_run

TORCH = ("model=tiny_moe_vlm", "cluster=local", "engine=torch", "train_iters=6", "data=synthetic")
WORK: dict[str, Any] = {
    "sequences_per_rank": 8,
    "real_len": 300,
    "images_per_rank": 8,
    "patches_per_image": 64,
}


def test_diff_explains_the_time_difference_by_component_and_knob(tmp_path: Path) -> None:
    # A recomputes nothing: 2 s per step; B recomputes fully: 3 s, the decoder 0.8 s slower.
    write_run(tmp_path / "a", (*TORCH, "recompute=none"), 2.0, **WORK,
              components_s={"vision_encoder": 0.4, "projector": 0.1, "decoder": 1.0})  # fmt: skip
    write_run(tmp_path / "b", (*TORCH, "recompute=full"), 3.0, **WORK,
              components_s={"vision_encoder": 0.5, "projector": 0.1, "decoder": 1.8})  # fmt: skip
    code, text = run_report("--diff", str(tmp_path / "a"), str(tmp_path / "b"))
    assert code == 0
    # Same work: throughput is the step-time ratio, 3 s / 2 s.
    assert "A runs at 1.500x B's effective tokens/s/GPU; its mean step is -1 s (2 vs 3 s), of which " in text
    assert "vision_encoder -0.1 s, projector +0 s, decoder -0.8 s, rest of the step -0.1 s." in text
    assert "**FLAG**" not in text
    times = {
        row[0]: row[1:] for row in table_rows(text.split("## Where the step time goes")[1].split("##")[0])
    }
    assert times["decoder (s per rank-step)"] == ["1", "1.8", "-0.8", "0.556x"]
    assert times["step time p50 (s)"] == ["2", "3", "-1", "0.667x"]
    knobs = {row[0]: row[1:] for row in table_rows(text.split("## Knobs that differ")[1].split("##")[0])}
    assert knobs["recompute.name"] == ["none", "full"]
    assert knobs["recompute.granularity"] == ["none", "full"]
    assert "train_iters" not in knobs and "model.name" not in knobs  # only what differs
    assert "Neither run recorded one (torch engine runs have none" in text


def test_diff_flags_runs_that_are_not_like_for_like(tmp_path: Path) -> None:
    write_run(tmp_path / "a", TORCH, 2.0, **WORK)
    write_run(tmp_path / "b", (*TORCH, "data=mock"), 1.0, sequences_per_rank=8)
    code, text = run_report("--diff", str(tmp_path / "a"), str(tmp_path / "b"))
    assert code == 0
    # each run's own data kind: a synthetic run is never labelled "synthetic/real"
    assert "**FLAG**: A is synthetic data, real routing, B is mock data: not a like-for-like" in text
    assert "**FLAG**: A and B do different effective work: image tokens/step" in text


def test_diff_bad_input_is_one_line_exit_2(tmp_path: Path) -> None:
    write_run(tmp_path / "sweep" / "a", TORCH, 2.0, **WORK)
    write_run(tmp_path / "sweep" / "b", TORCH, 2.5, **WORK)
    for argv, message in (
        ([str(tmp_path / "sweep" / "a")], "--diff takes two runs, RUN_A RUN_B; got 1 PATH(s)"),
        ([str(tmp_path / "sweep"), str(tmp_path / "sweep" / "a")], "2 run.json files under it"),
        ([str(tmp_path / "gone"), str(tmp_path / "sweep" / "a")], "no such file or directory"),
    ):
        done = subprocess.run(
            [str(REPO / ".venv" / "bin" / "moe-vlm"), "report", "--diff", *argv],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert (done.returncode, done.stdout) == (2, ""), done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("moe-vlm report: error: ") and message in lines[0]
