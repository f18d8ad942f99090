"""best.yaml (moe_vlm/report/best.py): the winner by class, its figures and its rerun command. The
rerun itself, resolved field for field: tests/integration/test_decision.py."""

from __future__ import annotations

from pathlib import Path

import yaml

from moe_vlm.report import best
from moe_vlm.runtime import points
from tests.unit.test_report import GB200, run_report, write_run


def test_mock_and_forced_balance_runs_never_win_against_a_real_one(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    # The mock and forced-balance points are faster; the slower synthetic one still wins.
    write_run(sweep / "mock", (*GB200, "data=mock", "mbs=1"), 2.0, sequences_per_rank=64)
    write_run(
        sweep / "forced", (*GB200, "data=synthetic", "router=forced_balance"), 3.0, sequences_per_rank=64
    )
    write_run(sweep / "slow", (*GB200, "data=synthetic", "mbs=1"), 5.0, sequences_per_rank=64)
    write_run(sweep / "real", (*GB200, "data=synthetic", "mbs=2"), 4.0, sequences_per_rank=64)
    points.write_point(
        sweep / "real",
        {"overrides": ["data=synthetic", "mbs=2"], "launcher_overrides": ["hydra/launcher=slurm_gb200"]},
    )
    code, text = run_report(str(sweep), "--best")
    assert code == 0
    written = yaml.safe_load((sweep / best.BEST_YAML).read_text())
    assert written["winner"]["run_dir"] == str(sweep / "real") and written["winner"]["class"] == "ranked"
    assert written["figures"]["data"] == "synthetic" and written["figures"]["routing"] == "real"
    assert written["overrides"] == ["data=synthetic", "mbs=2"]
    assert written["rerun"] == "python train.py -m data=synthetic mbs=2 hydra/launcher=slurm_gb200"
    assert f"Rerun it: `{written['rerun']}`" in text
    assert set(written["software"]) >= {"container_image"}


def test_without_a_real_run_the_winner_says_what_it_is(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    write_run(sweep / "mock", (*GB200, "data=mock", "mbs=1"), 2.0, sequences_per_rank=64)
    write_run(
        sweep / "forced", (*GB200, "data=synthetic", "router=forced_balance"), 3.0, sequences_per_rank=64
    )
    code, _ = run_report(str(sweep), "--best")
    written = yaml.safe_load((sweep / best.BEST_YAML).read_text())
    assert code == 0 and written["winner"]["class"] == "forced_balance"
    assert "not a real winner" in written["winner"]["class_means"]
    assert written["figures"]["routing"] == "forced_balance"
    # No point.json: the overrides that rebuild the run from its config.
    assert "data=synthetic" in written["overrides"] and written["rerun"].startswith("python train.py -m ")
