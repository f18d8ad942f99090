"""A point the canary refused (point.json `refused`, moe_vlm/launch/canary.py) never starts: its job's
task exits 2 before any work and leaves the canary's record alone (moe_vlm/run/task.py, issue 31)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from moe_vlm.runtime import points

REPO = Path(__file__).resolve().parents[2]


def test_a_refused_point_exits_before_any_work(tmp_path: Path) -> None:
    point_dir = tmp_path / "point"
    refusal = {"code": "LIB-ARGS", "message": "AssertionError: the library refused it"}
    points.write_point(point_dir, {"point_id": "point", "overrides": [], "config": {}, "refused": [refusal]})
    done = subprocess.run(
        [
            sys.executable,
            "train.py",
            "model=tiny_moe_vlm",
            "data=mock",
            "train_iters=4",
            "warmup_steps=1",
            f"hydra.run.dir={point_dir}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={
            "MOE_VLM_SITE_FILE": "none",
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
        },
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "refused before any work by LIB-ARGS: AssertionError: the library refused it" in done.stderr
    assert not (point_dir / "run.json").exists() and not (point_dir / "steps.jsonl").exists()
    assert json.loads((point_dir / "point.json").read_text())["refused"] == [refusal]


def test_a_run_the_rules_refuse_says_so_in_one_line(tmp_path: Path) -> None:
    """A010 (packing with the allgather dispatcher) once took four lines: the error, two warnings that
    wait for a run that will not happen, and a closing line. One line now, the error and its fix."""
    done = subprocess.run(
        [
            sys.executable,
            "train.py",
            "engine=megatron",
            "cluster=gb200",
            "model=qwen3_vl_30b_a3b",
            "dispatcher=allgather",
            "data.packing=in_batch",
            "mbs=2",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={"MOE_VLM_SITE_FILE": "none", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert (
        line.startswith("moe_vlm: rejected, nothing was run: ERROR A010 ")
        and "Fix: use dispatcher=alltoall" in line
    )
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "rejected"
