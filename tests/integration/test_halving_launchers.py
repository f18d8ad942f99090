"""Successive halving through the in-process launchers: Hydra's basic one (the default) and the
local submitit executor (the Slurm launcher: tests/integration/test_slurm_halving.py).

Each search runs to its end with real CPU runs of the tiny model. What is asserted holds
whatever the timing: every point runs the first rung; at most the cap goes on; each rank class
(mock data, and the rest) is halved among itself; the last rung is the point's full length and
the grid's run of it (a grid command in the same directory finds it completed); each run's
record says its rung and decision; a rerun resumes nothing but prints the decided search; a dry
run before the search in the same directory leaves no point `planned` once the search runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from moe_vlm.launch.halving import Decision, HalvingState, RankClass, compare_with_grid
from moe_vlm.launch.status import collect
from moe_vlm.runtime import points

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
BASE = ["model=tiny_moe_vlm", "nproc=1", "warmup_steps=1", "seq_length=128", "gbs=4", "train_iters=24"]
# 24 steps: two points of a class cost 2 x 11 + 1 x 24 node-steps at worst, under the grid's 48 (at 14
# steps, 36 against 28: the plan refuses a search that cannot save).
# One small image per synthetic sample: it fits seq_length (rule A007).
BASE += ["data.min_images=1", "data.max_images=1", "data.max_long_side_px=336"]
SEARCH = [
    "hydra.sweeper.search=halving",
    "hydra.sweeper.halving.eta=2",
    "hydra.sweeper.halving.rungs=2",
    "hydra.sweeper.halving.first_steps=10",
    "hydra.sweeper.halving.tie_factor=1",  # exactly the top 1/eta of each class goes on
    "hydra.sweeper.halving.poll_s=0.5",
]


def train(sweep_dir: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MOE_VLM_SITE_FILE": "none", "PYTHONPATH": str(REPO)}
    command = [sys.executable, "train.py", "-m", f"hydra.sweep.dir={sweep_dir}", *BASE, *overrides]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.parametrize(
    "launcher, axes",
    [
        # Hydra's basic launcher (the default), two rank classes of two points each.
        ([], ["data=mock,synthetic", "mbs=1,2"]),
        (["hydra/launcher=local"], ["data=mock", "mbs=1,2"]),
    ],
    ids=["basic", "local"],
)
def test_a_halving_search_runs_through_an_in_process_launcher(
    tmp_path: Path, launcher: list[str], axes: list[str]
) -> None:
    sweep_dir = tmp_path / "sweep"
    if not launcher:  # a dry run first, in the same directory: its planned points do not outlive the search
        dry = train(sweep_dir, *axes, *SEARCH, "dry_run=true")
        assert dry.returncode == 0 and "nothing was submitted" in dry.stdout, dry.stderr[-3000:]
        assert {s.state for s in collect(sweep_dir)} == {"planned"}
    done = train(sweep_dir, *launcher, *axes, *SEARCH)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    if not launcher:
        assert "4 point(s) a dry run planned here are kept in" in done.stdout, done.stdout
        assert len(list((sweep_dir / points.DRY_RUN_DIR).glob("*/point.json"))) == 4
    assert "planned" not in {s.state for s in collect(sweep_dir)}
    state = HalvingState.read(sweep_dir)
    assert state is not None and all(r.decided for r in state.rungs)
    first, last = state.rungs
    classes = {str(RankClass.mock): 0, str(RankClass.ranked): 0}
    for verdict in first.verdicts.values():
        classes[verdict.rank_class] += 1
    # Each class halved alone: ceil(n/2) of it goes on, ranked among its own.
    promoted = [first.verdicts[p] for p in first.promoted()]
    for cls, count in classes.items():
        mine = [v for v in promoted if v.rank_class == cls]
        assert len(mine) == (count + 1) // 2, (cls, first.verdicts)
        assert all(v.finished == count for v in mine)
    assert set(last.verdicts) == set(first.promoted())
    assert all(v.decision is Decision.final for v in last.verdicts.values())
    for rung in state.rungs:
        for point, run_id in rung.runs.items():
            record = json.loads((sweep_dir / run_id / "run.json").read_text())
            assert record["status"] == "completed" and record["halving"]["rung"] == rung.rung + 1
            assert record["halving"]["decision"] == str(rung.verdicts[point].decision)
            assert len((sweep_dir / run_id / "steps.jsonl").read_text().splitlines()) == rung.steps[point]
            assert record["halving"]["node_seconds"] > 0
    assert state.node_steps() == sum(11 for _ in first.runs) + sum(24 for _ in last.runs)
    assert "halving best (mock)" in done.stdout

    again = train(sweep_dir, *launcher, *axes, *SEARCH)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (
        "resuming after 2 decided rung(s) of 2" in again.stdout and "point(s) submitted" not in again.stdout
    )
    # Against the grid (scripts/bench_halving.py's figures): not before every point has its full run.
    with pytest.raises(ValueError, match="completed full-length run"):
        compare_with_grid(sweep_dir, RankClass.mock)
    # The last rung's runs are the grid's: the grid command finds them completed.
    grid = train(sweep_dir, *launcher, *axes)
    assert grid.returncode == 0, grid.stderr[-3000:]
    assert f"{len(last.runs)} already completed" in grid.stdout, grid.stdout
    for cls in {v.rank_class for v in first.verdicts.values()}:
        figures = compare_with_grid(sweep_dir, RankClass(cls))
        of_class = [p for p, v in first.verdicts.items() if v.rank_class == cls]
        assert figures.found == state.best()[cls][0] and figures.grid_best in of_class
        assert figures.grid_best_tokens >= figures.found_tokens > 0
        assert figures.within_noise or figures.found != figures.grid_best
        assert figures.halving_node_seconds > 0 and figures.grid_node_seconds > 0
