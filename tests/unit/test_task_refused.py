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
