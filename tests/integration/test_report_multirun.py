"""`moe-vlm report` on a real Hydra multirun of the tiny model (torch engine, CPU ranks)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from moe_vlm.base.files import RUN_JSON
from moe_vlm.report import plots
from moe_vlm.report import table as report_table
from tests.conftest import REPO

POINTS = {(mbs, recompute) for mbs in (1, 2) for recompute in ("none", "full")}


@pytest.mark.slow
def test_report_on_a_real_tiny_multirun(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    command = [
        sys.executable, "train.py", "-m", "mbs=1,2", "recompute=none,full", "data=synthetic",
        # Small images and sequences: each point is startup plus 3 steps of about a second.
        "seq_length=512", "data.min_long_side_px=224", "data.max_long_side_px=448",
        "train_iters=3", "warmup_steps=1", f"hydra.sweep.dir={sweep}",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(list(sweep.rglob(RUN_JSON))) == len(POINTS)

    done = subprocess.run(
        [str(REPO / ".venv" / "bin" / "moe-vlm"), "report", str(sweep)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "## Ranked: synthetic and real data" in text and "MOCK data" not in text
    assert "MFU n/a: cluster=local (cpu) has no dense BF16 peak" in text
    assert (sweep / "report.md").read_text() == text

    table = pd.read_parquet(sweep / "results.parquet")
    assert set(zip(table["mbs"], table["recompute"], strict=True)) == POINTS
    assert set(table["status"]) == {"completed"}
    assert (table["effective_tokens_per_s_per_gpu"] > 0).all()
    assert table["mfu"].isna().all()  # CPU: no peak, no made-up MFU
    # Real tokens never exceed the padded ones; the nominal figure counts padding.
    assert (table["effective_tokens_per_s_per_gpu"] <= table["nominal_tokens_per_s_per_gpu"]).all()
    assert (table["share_vision_encoder"] > 0).all()  # synthetic images went through the ViT

    # The plot written to disk draws exactly the table's numbers.
    assert (sweep / "throughput_vs_mbs.png").stat().st_size > 0
    rows = report_table.ranked(report_table.load_table([str(sweep)]), mock=False)
    drawn = plots.throughput_vs_mbs(rows, ["mbs", "recompute"]).series
    for recompute in ("none", "full"):
        expected = table[table["recompute"] == recompute].sort_values("mbs")
        assert drawn[f"recompute={recompute}"] == [
            (float(mbs), pytest.approx(value))
            for mbs, value in zip(expected["mbs"], expected["effective_tokens_per_s_per_gpu"], strict=True)
        ]
