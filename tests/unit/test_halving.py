"""Successive halving's arithmetic (moe_vlm/launch/halving.py): rung lengths, the decision, the
state file, and the settings' one-line errors. The search on a real Slurm is
tests/integration/test_slurm_halving.py."""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from hydra_plugins.moe_vlm_sweeper._halving import first_rung_order, wait
from moe_vlm.base.errors import BadInput
from moe_vlm.launch.halving import (
    STATE_JSON,
    Decision,
    HalvingSettings,
    HalvingState,
    Measured,
    NodeSteps,
    PlanPoint,
    RankClass,
    RungState,
    decide,
    full_length_node_seconds,
    node_steps,
    plan,
    plan_text,
    rung_steps,
    schedule,
    search_of,
)
from moe_vlm.launch.status import PointStatus, in_flight
from moe_vlm.record.records import RunRecord, RunStatus
from moe_vlm.report import halving as halving_report
from moe_vlm.run.plan import prediction_of
from moe_vlm.runtime import points
from tests.conftest import make_spec

REPO = Path(__file__).resolve().parents[2]


def run(
    point: str,
    tokens: float | None,
    spread: float = 0.01,
    cls: RankClass = RankClass.ranked,
    status: str = "completed",
    failure: str | None = None,
) -> Measured:
    low = high = None
    if tokens is not None:
        low, high = tokens * (1 - spread), tokens * (1 + spread)
    return Measured(point, status, cls, tokens, low, high, failure, 10.0, "task", 0.5)


def settings(eta: int, tie_factor: float = 2.0) -> HalvingSettings:
    return HalvingSettings(eta=eta, first_steps=10, rungs=2, tie_factor=tie_factor)


def test_rungs_grow_by_eta_and_the_last_is_the_full_length() -> None:
    settings = HalvingSettings(eta=3, first_steps=10, rungs=3, tie_factor=1)
    assert [rung_steps(settings, r, warmup_steps=2, train_iters=100) for r in range(3)] == [12, 32, 100]
    # Never longer than the point itself.
    assert rung_steps(settings, 1, warmup_steps=2, train_iters=20) == 20
    rungs = plan(settings, [PlanPoint(100, 2, 1)] * 12)
    assert [r.points for r in rungs] == [12, 4, 2]
    # With room for ties: at most tie_factor x the top 1/eta per rung, never more than were there.
    wide = HalvingSettings(eta=3, first_steps=10, rungs=3, tie_factor=2)
    assert [r.points for r in plan(wide, [PlanPoint(100, 2, 1)] * 12)] == [12, 8, 6]


def test_the_plan_text_compares_node_steps_with_the_grid() -> None:
    text = plan_text(HalvingSettings(eta=4, first_steps=10, rungs=2), [PlanPoint(40, 1, 1)] * 12)
    # 12 x 11 + (2 x ceil(12/4) = 6) x 40 node-steps against 12 x 40: ties included.
    assert "grid 480" in text and "halving at most 372 (78% of the grid)" in text
    assert "     2  <=   6  40 (full train_iters)" in text, text


def test_each_rank_class_is_planned_alone() -> None:
    planned = [PlanPoint(40, 1, 1, "mock")] * 6 + [PlanPoint(40, 1, 1, "ranked")] * 6
    rungs = plan(settings(eta=6, tie_factor=1), planned)
    assert [r.points for r in rungs] == [12, 2]  # one of each class goes on, not one of the twelve
    assert node_steps(settings(eta=6, tie_factor=1), planned) == NodeSteps(480, 12 * 11 + 2 * 40)
    assert "ranked in 2 classes (mock, ranked)" in plan_text(settings(eta=6), planned)


def test_the_top_third_is_promoted_and_the_rest_stopped() -> None:
    runs = [run(f"p{i}", 100.0 + 10 * i) for i in range(9)]
    verdicts = decide(runs, settings(eta=3), last=False)
    assert sorted(verdicts[p].decision for p in ("p8", "p7", "p6")) == [Decision.promoted] * 3
    assert all(verdicts[f"p{i}"].decision is Decision.stopped for i in range(6))
    assert verdicts["p8"].place == 1 and verdicts["p6"].keep == 3 and verdicts["p0"].cut == 160.0


def test_a_point_inside_the_cut_s_noise_is_promoted_with_it() -> None:
    # p1 is below the cut (p2 is kept), but their p10-p90 ranges overlap: no coin toss.
    runs = [run("p3", 200.0), run("p2", 150.0, spread=0.05), run("p1", 145.0, spread=0.05), run("p0", 100.0)]
    verdicts = decide(runs, settings(eta=2), last=False)
    assert verdicts["p1"].decision is Decision.promoted and "overlaps" in verdicts["p1"].reason
    assert verdicts["p0"].decision is Decision.stopped
    assert verdicts["p1"].cap == 4 and verdicts["p1"].tied == 3 and not verdicts["p1"].split


def test_ties_over_the_cap_are_stopped_together_and_the_clear_top_goes_on() -> None:
    # p11 is clear of everything; p10..p3 all overlap the second place's range (the cut of the
    # top 2 = 12/6): eight tied points, more than the cap of 3. None of them is picked by a
    # difference inside their noise: the cut moves up to the first place, which is clear.
    runs = [run("p11", 300.0)] + [run(f"p{i}", 150.0 + i, spread=0.1) for i in range(3, 11)]
    runs += [run(f"p{i}", 50.0 + i) for i in range(3)]
    verdicts = decide(runs, settings(eta=6, tie_factor=1.5), last=False)
    promoted = {p for p, v in verdicts.items() if v.decision is Decision.promoted}
    assert promoted == {"p11"}
    tied = verdicts["p10"]
    assert tied.decision is Decision.stopped and "stopped together" in tied.reason, tied.reason
    assert (tied.keep, tied.cap, tied.tied, tied.split) == (2, 3, 9, False)
    assert "outside the cut" in verdicts["p0"].reason
    state = HalvingState(settings(eta=6, tie_factor=1.5), {r.point: r.point for r in runs})
    state.rung(0).verdicts, state.rung(0).decided = verdicts, True
    (line,) = state.overflows()
    assert "9 point(s) tied at the top 2's cut, more than the cap of 3" in line and "stopped together" in line


def test_when_even_the_first_place_s_ties_overflow_the_cap_it_splits_and_says_so() -> None:
    runs = [run(f"p{i}", 100.0 + i, spread=0.2) for i in range(12)]
    verdicts = decide(runs, settings(eta=6, tie_factor=1.5), last=False)
    promoted = sorted(p for p, v in verdicts.items() if v.decision is Decision.promoted)
    assert promoted == ["p10", "p11", "p9"]  # the cap (3), by measured rate: never all twelve
    assert all(v.split and "SPLIT BY THE CAP" in v.reason for v in verdicts.values())
    state = HalvingState(settings(eta=6, tie_factor=1.5), {r.point: r.point for r in runs})
    state.rung(0).verdicts, state.rung(0).decided = verdicts, True
    assert "taken by measured rate" in state.overflows()[0]


@pytest.mark.parametrize("seed", range(40))
def test_no_rung_promotes_more_than_its_cap_whatever_is_measured(seed: int) -> None:
    rng = random.Random(seed)
    runs = [
        run(f"p{i}", rng.uniform(50, 150), spread=rng.uniform(0, 0.5), cls=rng.choice(list(RankClass)))
        for i in range(rng.randint(1, 30))
    ]
    eta, factor = rng.randint(2, 6), rng.choice([1, 1.5, 2, 3])
    verdicts = decide(runs, settings(eta, factor), last=False)
    for cls in RankClass:
        mine = [v for v in verdicts.values() if v.rank_class == cls]
        if not mine:
            continue
        promoted = [v for v in mine if v.decision is Decision.promoted]
        assert 1 <= len(promoted) <= settings(eta, factor).cap(len(mine)) == mine[0].cap
        if not mine[0].split:  # no stopped point is inside the cut's noise: no tie was split
            cut_low, cut_high = mine[0].cut_range or (0.0, 0.0)
            for r in runs:
                if r.rank_class is cls and verdicts[r.point].decision is Decision.stopped:
                    assert r.high is not None and r.low is not None
                    assert r.high < cut_low or r.low > cut_high, (r, mine[0])


def test_mock_and_forced_balance_points_are_halved_among_themselves() -> None:
    runs = [run("real_fast", 50.0), run("real_slow", 10.0)]
    runs += [run("mock_fast", 500.0, cls=RankClass.mock), run("mock_slow", 100.0, cls=RankClass.mock)]
    runs += [run("forced", 900.0, cls=RankClass.forced_balance)]
    verdicts = decide(runs, settings(eta=2), last=False)
    promoted = {p for p, v in verdicts.items() if v.decision is Decision.promoted}
    # The fastest real point survives although mock and forced-balance points are faster.
    assert promoted == {"real_fast", "mock_fast", "forced"}
    assert verdicts["real_fast"].place == 1 and verdicts["real_fast"].finished == 2


def test_a_failed_point_is_stopped_with_its_class_and_the_rung_is_decided_on_the_rest() -> None:
    runs = [run("oom", None, status="failed", failure="oom"), run("a", 20.0), run("b", 10.0)]
    verdicts = decide(runs, settings(eta=2), last=False)
    assert verdicts["oom"].decision is Decision.stopped and "oom" in verdicts["oom"].reason
    assert verdicts["oom"].place is None and verdicts["oom"].node_seconds == 10.0
    assert verdicts["a"].decision is Decision.promoted and verdicts["a"].finished == 2


def test_the_last_rung_is_final() -> None:
    verdicts = decide([run(f"p{i}", 20.0 + i, spread=0.5) for i in range(5)], settings(eta=2), last=True)
    assert {v.decision for v in verdicts.values()} == {Decision.final}
    # It promotes nothing: no cap to overflow, whatever the ties.
    assert {(v.cap, v.tied, v.split) for v in verdicts.values()} == {(0, 0, False)}


def test_the_state_file_round_trips_and_estimates_the_grid(tmp_path: Path) -> None:
    state = HalvingState(settings(eta=2), {"a": "mbs=1", "b": "mbs=2"}, {"a": 1, "b": 2}, {"a": 10, "b": 10})
    first = state.rung(0)
    first.runs, first.steps = {"a": "a3", "b": "b3"}, {"a": 3, "b": 3}
    first.verdicts = decide([run("a", 20.0), run("b", 10.0)], settings(eta=2), last=False)
    first.decided = True
    second = state.rung(1)
    second.runs, second.steps = {"a": "a"}, {"a": 10}
    second.verdicts = decide([run("a", 20.0)], settings(eta=2), last=True)
    second.decided = True
    state.write(tmp_path)
    assert not list(tmp_path.glob(f".{STATE_JSON}*"))  # written atomically: no temp file left
    back = HalvingState.read(tmp_path)
    assert back is not None and back.to_json() == state.to_json()
    assert isinstance(back.rungs[0], RungState) and back.rungs[0].promoted() == ["a"]
    assert back.used_node_seconds() == 30.0
    # a: its full run (10); b: its rung run (10) + 7 more steps x 0.5 s x 2 nodes.
    assert back.grid_estimate() == (27.0, 1)
    assert back.best()["ranked"][0] == "a"


def test_a_run_two_rungs_share_is_counted_once() -> None:
    """Rung 2 reached the point's full train_iters (30): rung 3's run of it is the same run (same
    identity, found completed), so its steps and node-seconds count once (they counted twice)."""
    state = HalvingState(
        HalvingSettings(eta=2, first_steps=10, rungs=3, tie_factor=1), {"a": "mbs=1", "b": "mbs=2"}
    )
    state.nodes, state.train_iters = {"a": 1, "b": 1}, {"a": 30, "b": 30}
    first = state.rung(0)
    first.runs, first.steps = {"a": "a12", "b": "b12"}, {"a": 12, "b": 12}
    first.verdicts = decide([run("a", 20.0), run("b", 10.0)], settings(eta=2), last=False)
    for rung in (1, 2):
        again = state.rung(rung)
        again.runs, again.steps = {"a": "a"}, {"a": 30}
        again.verdicts = decide([run("a", 20.0)], settings(eta=2), last=rung == 2)
    assert state.node_steps() == 12 + 12 + 30
    assert state.used_node_seconds() == 3 * 10.0  # a12, b12 and a: 10 node-s each
    assert state.point_node_seconds("a") == 20.0
    assert state.grid_estimate() == (10.0 + 10.0 + 18 * 0.5, 1)


def test_the_plan_collapses_rungs_that_reach_train_iters_early() -> None:
    # eta=3 from 10 steady steps: 12, 32 -> 30 (the full length), 30: rung 3 would repeat rung 2.
    planned = [PlanPoint(30, 2, 1)] * 12
    wide = HalvingSettings(eta=3, first_steps=10, rungs=3, tie_factor=1)
    assert node_steps(wide, planned) == NodeSteps(360, 12 * 12 + 4 * 30)  # the repeated length: once
    shaped, notes = schedule(wide, planned)
    assert shaped.rungs == 2 and shaped.eta == 3 and notes[0].startswith("rungs=3 -> 2")
    assert [r.steps for r in plan(shaped, planned)] == [(12, 12), (30, 30)]


def test_a_schedule_that_saves_only_with_fewer_rungs_is_reshaped() -> None:
    # 9 points, eta=3, ties up to 1.5x: 3 rungs cost 9 x 11 + 5 x 31 + 3 x 40 = 374 of the grid's
    # 360 at worst; 2 rungs 9 x 11 + 5 x 40 = 299.
    planned = [PlanPoint(40, 1, 1)] * 9
    asked = HalvingSettings(eta=3, first_steps=10, rungs=3, tie_factor=1.5)
    assert node_steps(asked, planned) == NodeSteps(360, 374)
    shaped, notes = schedule(asked, planned)
    assert shaped.rungs == 2 and node_steps(shaped, planned) == NodeSteps(360, 299)
    assert "374 node-steps against the grid's 360" in notes[0] and "299" in notes[0], notes
    # A schedule that saves as asked is left alone.
    assert (
        schedule(
            HalvingSettings(eta=6, first_steps=10, rungs=2, tie_factor=1.5), [PlanPoint(120, 1, 1)] * 12
        )[1]
        == []
    )


def test_a_schedule_that_cannot_save_is_refused_with_its_cost() -> None:
    # The issue's sweep: 6 points x 30 steps, the defaults (eta=3, 3 rungs, ties up to 2x): at worst
    # 6 x 12 + 4 x 30 node-steps, more than the grid's 180, whatever the rung count.
    with pytest.raises(BadInput) as refused:
        schedule(HalvingSettings(), [PlanPoint(30, 2, 1)] * 6)
    line = str(refused.value)
    assert "\n" not in line and line.startswith("hydra.sweeper.search=halving cannot save")
    assert (
        "at most 192 node-steps against the grid's 180 (107%)" in line
        and "Fix: hydra.sweeper.search=grid" in line
    )
    # Predicted step times: the cost in node-seconds too.
    with pytest.raises(BadInput, match="predicted node-seconds"):
        schedule(HalvingSettings(), [PlanPoint(30, 2, 1, step_s=2.0)] * 6)
    # A first rung as long as the run leaves nothing to decide.
    with pytest.raises(BadInput, match=r"first rung .* already runs every point.s full train_iters"):
        schedule(HalvingSettings(), [PlanPoint(12, 2, 1)] * 12)


@pytest.mark.slow
def test_the_issue_s_sweep_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    done = train(
        tmp_path,
        *["model=tiny_moe_vlm", "data=mock", "nproc=1", "mbs=1,2", "recompute=none,full,selective"],
        "train_iters=30",
        "hydra.sweeper.search=halving",
    )
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("moe_vlm: error: hydra.sweeper.search=halving cannot save on these 6 point(s)"), (
        last
    )
    assert "node-steps against the grid's 180" in last and "Fix:" in last
    assert not (tmp_path / "sweep").exists()


def test_an_unreadable_state_file_is_no_search(tmp_path: Path) -> None:
    (tmp_path / STATE_JSON).write_text("{not json")
    assert HalvingState.read(tmp_path) is None


@pytest.mark.parametrize(
    "raw, key",
    [
        ({"eta": 1}, "eta"),
        ({"first_steps": 4}, "first_steps"),
        ({"tie_factor": 0.5}, "tie_factor"),
        ({"rungs": 1}, "rungs"),
        ({"speed": 2}, "speed"),
    ],
)
def test_bad_settings_name_the_key(raw: dict[str, int], key: str) -> None:
    with pytest.raises(BadInput, match=rf"hydra\.sweeper\.halving\.{key}.*Fix:"):
        HalvingSettings.of(raw)


def test_good_settings_and_search_values() -> None:
    assert HalvingSettings.of({"eta": 4, "rungs": 2}) == HalvingSettings(eta=4, rungs=2)
    assert HalvingSettings.of({"eta": 6, "tie_factor": 1.5}).cap(12) == 3  # ceil(1.5 x ceil(12/6))
    assert HalvingSettings.of({"eta": 4, "tie_factor": 1.5}).cap(10) == 5  # ceil(1.5 x ceil(10/4))
    assert str(search_of("halving")) == "halving"
    with pytest.raises(BadInput, match=r"hydra\.sweeper\.search=random: allowed values are grid, halving"):
        search_of("random")


def train(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MOE_VLM_SITE_FILE": "none", "PYTHONPATH": str(REPO)}
    command = [sys.executable, "train.py", "-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", *overrides]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)


@pytest.mark.slow
def test_a_halving_dry_run_prints_the_rung_plan_and_submits_nothing(tmp_path: Path) -> None:
    done = train(
        tmp_path,
        "hydra/launcher=slurm",
        # scripts/bench_halving.py's points and search (docs/slurm.md shows this command).
        *["model=tiny_moe_vlm", "data=mock", "nproc=1", "warmup_steps=1", "seq_length=256", "gbs=16"],
        "mbs=1,2,4,8",
        "recompute=none,selective,full",
        "train_iters=120",
        "hydra.sweeper.search=halving",
        "hydra.sweeper.halving.eta=6",
        "hydra.sweeper.halving.rungs=2",
        "hydra.sweeper.halving.first_steps=10",
        "hydra.sweeper.halving.tie_factor=1.5",
        "dry_run=true",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "halving plan: 12 valid point(s), eta=6, 2 rung(s)" in done.stdout, done.stdout
    assert "     1      12  11\n     2  <=   3  120 (full train_iters)" in done.stdout, done.stdout
    # 12 x 11 + 3 x 120 node-steps against 12 x 120: the cap (1.5 x 12/6) bounds the ties.
    assert "grid 1440; halving at most 492 (34% of the grid)" in done.stdout, done.stdout
    assert not (tmp_path / "sweep" / STATE_JSON).exists()
    # Each point's point.json says planned (for `moe-vlm status`); none was submitted.
    planned = [json.loads(p.read_text()) for p in (tmp_path / "sweep").glob("*/point.json")]
    assert len(planned) == 12 and not any(p.get("job_id") or p.get("submissions") for p in planned)


@pytest.mark.slow
def test_a_bad_search_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = train(tmp_path, "model=tiny_moe_vlm", "mbs=1,2", "hydra.sweeper.search=random")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("moe_vlm: error: hydra.sweeper.search=random")
    assert not (tmp_path / "sweep").exists()


def test_the_report_s_ladder_says_where_ties_overflowed_the_cap(tmp_path: Path) -> None:
    runs = [run("p11", 300.0)] + [run(f"p{i}", 150.0 + i, spread=0.1) for i in range(3, 11)]
    runs += [run(f"p{i}", 50.0 + i) for i in range(3)]
    state = HalvingState(settings(eta=6, tie_factor=1.5), {r.point: f"mbs=1 seed={r.point}" for r in runs})
    first = state.rung(0)
    first.runs, first.steps = {r.point: r.point for r in runs}, {r.point: 11 for r in runs}
    first.verdicts, first.decided = decide(runs, state.settings, last=False), True
    second = state.rung(1)
    second.runs, second.steps = {"p11": "p11"}, {"p11": 80}
    second.verdicts, second.decided = decide([run("p11", 310.0)], state.settings, last=True), True
    state.write(tmp_path)
    text = "\n".join(halving_report.section([str(tmp_path / "p11")]))
    assert "## Halving search" in text and "up to 1.5x the top 1/eta" in text
    assert "| seed=p11 | 300.0 (#1/12) promoted | 310.0 (#1/1) final |" in text, text
    assert "- ties over the cap: rung 1 (ranked): 9 point(s) tied at the top 2's cut" in text, text
    assert "- best (ranked): seed=p11" in text


@pytest.mark.parametrize(
    "state, executor, waits",
    [
        ("queued", "slurm", True),
        ("running", "local", True),
        ("unknown", "slurm", True),  # squeue did not answer: not the end of the job
        ("unknown", "local", False),  # a local job that left no record: nothing will come
        ("completed", "slurm", False),
        ("failed", "slurm", False),
    ],
)
def test_a_waiter_waits_through_a_moment_slurm_cannot_be_asked(
    tmp_path: Path, state: str, executor: str, waits: bool
) -> None:
    points.write_point(tmp_path, {"point_id": "p"})
    points.add_submission(tmp_path, {"job_id": "7", "executor": executor})
    status = PointStatus("p", state, "7", 0, [], "", str(tmp_path))
    assert in_flight(status) is waits


def test_the_first_rung_starts_the_points_predicted_fastest() -> None:
    def point(name: str, *overrides: str) -> SimpleNamespace:
        spec = make_spec("model=qwen3_vl_30b_a3b", "cluster=gb200", "nodes=2", *overrides)
        return SimpleNamespace(point_id=name, spec=spec, label=lambda: name)

    grid = [point("full", "recompute=full"), point("selective", "recompute=selective"), point("none")]
    predicted = {p.point_id: prediction_of(p.spec) for p in grid}
    rates = {
        k: v.effective_tokens_per_s_per_gpu or 0.0 for k, v in predicted.items() if not isinstance(v, str)
    }
    assert len(set(rates.values())) == 3  # full recompute's extra forward is predicted slower
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        ordered = [p.point_id for p in first_rung_order(grid)]
    assert ordered == sorted(rates, key=lambda name: -rates[name]) and ordered != [p.point_id for p in grid]
    assert "predicted fastest first" in said.getvalue()
    # A point without a prediction (no rates measured for the CPU cluster): the grid's order, and why.
    cpu = SimpleNamespace(point_id="cpu", spec=make_spec("model=tiny_moe_vlm"), label=lambda: "cpu")
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        kept = [p.point_id for p in first_rung_order([*grid, cpu])]
    assert kept == ["full", "selective", "none", "cpu"]
    assert "in the grid's order: no prediction for cpu (no rates for cluster=local" in said.getvalue()


def finished_slurm_run(point_dir: Path) -> None:
    """A run that has written its completed record while its Slurm task is still to record its end."""
    points.write_point(point_dir, {"point_id": point_dir.name})
    points.add_submission(point_dir, {"job_id": "7", "executor": "slurm"})
    RunRecord(status=RunStatus.completed, config={}, point_id=point_dir.name).write(point_dir)


def test_a_rung_is_decided_after_each_slurm_task_records_its_end(tmp_path: Path) -> None:
    # The run's status turns `completed` before its task's record_launch adds the task's wall time:
    # measured in between, the node-seconds were the steps' and the verdict's write raced the task's.
    finished_slurm_run(tmp_path / "p")

    def task_ends() -> None:
        time.sleep(1.0)
        run = points.read_run(tmp_path / "p")
        assert run is not None
        run.with_launch({"task_started_unix_s": 1.0, "task_ended_unix_s": 2.0}).write(tmp_path / "p")

    ender = threading.Thread(target=task_ends)
    ender.start()
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        wait({"p"}, tmp_path, poll_s=0.1, rung=1, settle_s=60.0)
    run = points.read_run(tmp_path / "p")  # as the rung's decision reads it, the moment the wait ends
    ender.join()
    assert run is not None and run.launch.get("task_ended_unix_s") == 2.0
    assert "without recording" not in said.getvalue()


def test_a_task_that_never_records_its_end_is_waited_for_a_while_and_said(tmp_path: Path) -> None:
    finished_slurm_run(tmp_path / "p")
    said = io.StringIO()
    started = time.monotonic()
    with contextlib.redirect_stdout(said):
        wait({"p"}, tmp_path, poll_s=0.1, rung=2, settle_s=0.5)
    assert time.monotonic() - started >= 0.5
    assert "halving rung 2: 1 Slurm task(s) ended without recording their end (p)" in said.getvalue()


def test_once_the_grid_has_run_the_report_uses_its_measured_node_seconds(tmp_path: Path) -> None:
    """b was stopped after rung 1 (extrapolated: 10 + 7 steps x 0.5 s x 2 nodes); the grid run in the
    same directory since holds b's full-length run, whose node-seconds the report then uses."""
    state = HalvingState(settings(eta=2), {"a": "mbs=1", "b": "mbs=2"}, {"a": 1, "b": 2}, {"a": 10, "b": 10})
    first = state.rung(0)
    first.runs, first.steps = {"a": "a3", "b": "b3"}, {"a": 3, "b": 3}
    first.verdicts, first.decided = (
        decide([run("a", 20.0), run("b", 10.0)], settings(eta=2), last=False),
        True,
    )
    second = state.rung(1)
    second.runs, second.steps = {"a": "a"}, {"a": 10}
    second.verdicts, second.decided = decide([run("a", 20.0)], settings(eta=2), last=True), True
    state.write(tmp_path)
    (tmp_path / "a").mkdir()
    ladder = "\n".join(halving_report.section([str(tmp_path / "a")]))
    assert "the full grid ~27 (1 point(s) measured at full length, 1 stopped early and extrapolated" in ladder
    finished_slurm_run(tmp_path / "b")  # the grid's run of b: its task held the node 40 s
    grid_run = points.read_run(tmp_path / "b")
    assert grid_run is not None
    grid_run.with_launch({"task_started_unix_s": 100.0, "task_ended_unix_s": 140.0}).write(tmp_path / "b")
    halving_full = full_length_node_seconds(state, tmp_path)
    assert halving_full == {"b": 40.0}  # a's directory holds no record here: its verdicts count
    assert state.grid_estimate(halving_full) == (10.0 + 40.0, 0)
    ladder = "\n".join(halving_report.section([str(tmp_path / "a")]))
    assert "the full grid 50 (measured: each of its 2 point(s) ran its full length): saved 20 (40%)" in ladder
