"""Successive halving (`hydra.sweeper.search=halving`) on a real single-node Slurm, CPU runs.

1. The search alone: the 12 points of scripts/bench_halving.py (MBS x recompute of the tiny
   model, equal work per step, about 3.5x apart in speed) at a lighter length, eta=6 in 2 rungs,
   ties promoted up to 1.5x the top 1/eta. What is asserted holds whatever the timing: no rung
   promoted more than its cap; the node-steps the search ran are within its plan's bound, and
   that bound is at most 40 % of the grid's (the cap makes it a bound: ties never turn the search
   into the grid); no stopped point lies inside the cut's noise unless its rung says the cap split
   the ties. Every run records its rung and decision; status and report show them. Whether the
   search finds the grid's best, and the node-seconds it saves, are speeds measured minutes apart:
   the benchmark's figures (scripts/bench_halving.py runs the grid after the search; docs/slurm.md),
   not a test's. tests/integration/test_halving_launchers.py compares a search with its grid.
2. Faults, packed: four points in one job per rung (points_per_job=4), behind one canary for the
   whole sweep (rung 2 reuses rung 1's passed canary). In the first rung one
   point's rank is killed with SIGKILL: it is stopped with its failure class (killed). While
   the next point runs, the job gets USR2 (a preemption, or the time limit's warning) and
   requeues itself: back from the requeue it skips the finished point, reruns the interrupted
   one (its interrupted attempt kept) and the rest, and the rung is decided on the three that
   completed. The sweep command is killed while the second rung runs; rerunning it resumes:
   the decided rung is not rerun, the second rung's job is waited for (not resubmitted), and
   the search ends.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from moe_vlm.base.files import RunPaths
from moe_vlm.launch.halving import Decision, HalvingState, node_steps
from moe_vlm.launch.status import collect, render
from moe_vlm.runtime import points
from scripts.bench_halving import GRID as BENCH_POINTS
from tests.integration.test_slurm_packing import running_step, task_pid
from tests.integration.test_slurm_sweeps import (  # noqa: F401  (slurm is a fixture)
    REPO,
    run_json,
    scontrol_job,
    slurm,
    steps_written,
    wait_for,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


@pytest.fixture
def sweep_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "sweep"
    yield path
    jobs = {str(p["job_id"]) for d in path.glob("*/") if (p := points.read_point(d)) and p.get("job_id")}
    if jobs:
        subprocess.run(["scancel", *sorted(jobs)], capture_output=True)


def test_halving_on_slurm_keeps_its_cap_and_bound_and_records_its_ladder(
    slurm: None,  # noqa: F811
    tmp_path: Path,
) -> None:
    # The 12 points of scripts/bench_halving.py at a lighter length (the test asserts the search, not
    # its cost): long enough that the plan's node-steps bound is at most 40 % of the grid's. Whether
    # the search finds the grid's best is a measurement of speeds minutes apart, so it is the
    # benchmark's figure (docs/slurm.md), not a test's.
    sweep_dir = tmp_path / "sweep"
    shape = ["seq_length=128", "gbs=8", "train_iters=80"]
    search = [
        "hydra.sweeper.search=halving",
        *["hydra.sweeper.halving.eta=6", "hydra.sweeper.halving.rungs=2"],
        *["hydra.sweeper.halving.first_steps=10", "hydra.sweeper.halving.tie_factor=1.5"],
        "hydra.sweeper.halving.poll_s=2",
    ]
    done = subprocess.run(
        [
            *[sys.executable, "train.py", "-m", "hydra/launcher=slurm", f"hydra.sweep.dir={sweep_dir}"],
            *BENCH_POINTS,
            *shape,
            *search,
            *["hydra.launcher.canary=false", "hydra.launcher.timeout_min=30", "hydra.launcher.mem_gb=2"],
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
        env=ENV,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]

    state = HalvingState.read(sweep_dir)
    assert state is not None and len(state.points) == 12 and all(r.decided for r in state.rungs)
    first, last = state.rungs
    assert len(first.verdicts) == 12 and set(last.verdicts) == set(first.promoted())
    # The cost, deterministically: at most the cap (ceil(1.5 x 12/6) = 3) went on, so the search
    # ran at most 12 x 11 + 3 x 80 node-steps: 372 of the grid's 960.
    assert 1 <= len(first.promoted()) <= state.settings.cap(12) == 3
    bound = node_steps(state.settings, state.plan_points())
    assert (bound.grid, bound.worst) == (960, 372) and bound.ratio <= 0.4
    assert state.node_steps() <= bound.worst
    # The ranking, deterministically from the records: every point the search stopped is below
    # the cut's noise (no tie split), or the rung says the cap split it.
    for point, verdict in first.verdicts.items():
        if verdict.decision is Decision.stopped and not verdict.split:
            assert verdict.range is not None and verdict.cut_range is not None
            assert verdict.range[1] < verdict.cut_range[0] or verdict.tied > verdict.cap, (point, verdict)
    # Every run of the search says its rung, its decision and the figures behind it.
    for rung in state.rungs:
        for point, run_id in rung.runs.items():
            section = run_json(sweep_dir / run_id)["halving"]
            assert section["rung"] == rung.rung + 1 and section["point"] == point
            assert section["decision"] == str(rung.verdicts[point].decision)
            assert section["node_seconds"] > 0 and section["node_seconds_basis"] == "task"
            assert section["tokens_per_s_per_gpu"] > 0 and section["range"][0] <= section["range"][1]
            assert rung.rung > 0 or section["cap"] == 3
    table = render(sweep_dir, collect(sweep_dir))
    assert "RUNG" in table and "1/2 stopped" in table and "2/2 final" in table
    report = subprocess.run(
        [
            sys.executable,
            "-m",
            "moe_vlm.cli.main",
            "report",
            str(sweep_dir),
            "--out",
            str(tmp_path / "report"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
    )
    assert report.returncode == 0, report.stderr[-2000:]
    assert "## Halving search" in report.stdout and "node-seconds: the search used" in report.stdout


# 256-token sequences: a step long enough to catch a point mid-rung on an idle machine.
GRID = ["model=tiny_moe_vlm", "data=mock", "nproc=1", "warmup_steps=1", "seq_length=256", "gbs=8"]
GRID += ["mbs=1,2,4,8", "train_iters=50"]
SEARCH = [
    "hydra.sweeper.search=halving",
    "hydra.sweeper.halving.eta=2",
    "hydra.sweeper.halving.rungs=2",
    "hydra.sweeper.halving.first_steps=20",
    # Exactly the top 1/eta goes on: with ties up to 2x, 4 x 21 + 4 x 50 node-steps at worst would
    # cost more than the grid's 200, and the plan refuses such a search.
    "hydra.sweeper.halving.tie_factor=1",
    "hydra.sweeper.halving.poll_s=1",
    "hydra.launcher.points_per_job=4",
    # One canary for the sweep (no probe: the environment check alone), not one per rung.
    "hydra.launcher.canary=true",
    "hydra.launcher.canary_probe=false",
    "hydra.launcher.timeout_min=10",
]


def command(sweep_dir: Path) -> list[str]:
    return [
        sys.executable,
        "train.py",
        "-m",
        "hydra/launcher=slurm",
        f"hydra.sweep.dir={sweep_dir}",
        *GRID,
        *SEARCH,
    ]


def rung_runs(sweep_dir: Path, rung: int) -> dict[str, dict[str, Any]]:
    """This rung's runs by their MBS override, from what `moe-vlm status` reads."""
    return {
        next(o for o in row.overrides if o.startswith("mbs=")): asdict(row)
        for row in collect(sweep_dir)
        if row.rung and row.rung.startswith(f"{rung}/")
    }


def test_a_failed_point_keeps_its_class_a_requeue_resumes_the_rung_and_a_rerun_the_search(
    slurm: None,  # noqa: F811
    sweep_dir: Path,
) -> None:
    log = (sweep_dir.parent / "first.log").open("w")
    first = subprocess.Popen(
        command(sweep_dir), cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True, env=ENV
    )
    try:
        # Rung 1: one packed job; the first point's rank dies from SIGKILL mid-run.
        runs = wait_for(
            lambda: (
                (r := rung_runs(sweep_dir, 1)) and len(r) == 4 and all(x["job_id"] for x in r.values()) and r
            ),
            120,
            "rung 1's job",
        )
        victim, preempted = runs["mbs=1"], runs["mbs=2"]
        job = str(victim["job_id"])
        assert {r["job_id"] for r in runs.values()} == {job}  # one job for the rung's four points
        step = wait_for(lambda: running_step(victim["point_dir"]), 300, "the first point's steps", 0.2)
        os.kill(wait_for(lambda: task_pid(job, step), 30, "its rank"), signal.SIGKILL)
        # The second point, mid-run: USR2 (a preemption) requeues the job inside the rung.
        wait_for(lambda: running_step(preempted["point_dir"]), 300, "the second point's steps", 0.2)
        subprocess.run(["scancel", "--signal=USR2", job], check=True)
        wait_for(lambda: scontrol_job(job).get("Restarts") == "1", 60, "the requeue")
        assert rung_runs(sweep_dir, 1)["mbs=2"]["state"] in ("queued", "running")
        state = HalvingState.read(sweep_dir)
        assert state is not None and not state.rungs[0].decided  # the rung waits for its requeued job
        # Slurm holds a requeued job for about two minutes (BeginTime); release it now.
        subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True)
        # Rung 2 is submitted once rung 1 is decided; then the sweep command dies.
        wait_for(lambda: any(r["job_id"] for r in rung_runs(sweep_dir, 2).values()), 600, "rung 2's job", 0.5)
    finally:
        first.kill()
        first.wait()
        log.close()
    state = HalvingState.read(sweep_dir)
    assert state is not None and state.rungs[0].decided and not state.rungs[1].decided
    decided = {p: (sweep_dir / run_id / "run.json").read_text() for p, run_id in state.rungs[0].runs.items()}
    killed = run_json(victim["point_dir"])
    assert killed["status"] == "failed" and killed["failure"]["class"] == "killed", killed
    assert killed["halving"]["decision"] == "stopped" and "killed" in killed["halving"]["reason"]
    # The requeued point finished its rung in the same job, its interrupted attempt kept.
    back = run_json(preempted["point_dir"])
    assert back["status"] == "completed" and back["launch"]["restarts"] == 1, back["launch"]
    assert back["launch"]["slurm_job_id"] == job and back["halving"]["rung"] == 1
    interrupted = RunPaths(Path(preempted["point_dir"])).attempts / "1"
    assert json.loads((interrupted / "requeue.previous.json").read_text())["reason"] == "preempted"
    assert steps_written(preempted["point_dir"]) == 21  # the rung's length: warm-up + 20
    # The rung was decided on the other three: the top ceil(3/2) = 2 go on, or only the first when
    # the third ties the second (tie_factor=1: a cap of 2, and a tie is never split by noise).
    promoted = state.rungs[0].promoted()
    assert 1 <= len(promoted) <= state.settings.cap(3) == 2, state.rungs[0].verdicts
    assert all(state.rungs[0].verdicts[p].finished == 3 for p in promoted)
    # One canary for the sweep: rung 1's, whose verdict rung 2 reused (a second canary would have
    # rewritten the record with rung 2's points).
    canaries = list(points.iter_canaries(sweep_dir))
    assert len(canaries) == 1 and set(canaries[0]["point_ids"]) == set(state.rungs[0].runs.values()), canaries

    rerun = subprocess.run(command(sweep_dir), cwd=REPO, capture_output=True, text=True, timeout=900, env=ENV)
    assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-3000:]
    assert "resuming after 1 decided rung(s) of 2" in rerun.stdout, rerun.stdout
    assert "0 to run" in rerun.stdout and "point(s) submitted in" not in rerun.stdout, rerun.stdout
    state = HalvingState.read(sweep_dir)
    assert state is not None and all(r.decided for r in state.rungs)
    assert set(state.rungs[1].verdicts) == set(promoted)
    assert all(v.decision == "final" for v in state.rungs[1].verdicts.values())
    # The decided rung ran once: its records are as they were, and no attempt was archived but
    # the requeued point's one.
    for point, run_id in state.rungs[0].runs.items():
        assert (sweep_dir / run_id / "run.json").read_text() == decided[point]
        attempts = sorted(p.name for p in RunPaths(sweep_dir / run_id).attempts.glob("*"))
        assert attempts == (["1"] if run_id == Path(preempted["point_dir"]).name else []), attempts
    assert "halving best (mock)" in rerun.stdout
