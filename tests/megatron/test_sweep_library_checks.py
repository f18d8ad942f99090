"""The library's own checks (LIB-*) judge every point of a sweep, as they judge a one-point dry run
(hydra_plugins/moe_vlm_sweeper/_planning.py check_library, issue 31)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import pytest
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext
from omegaconf import OmegaConf

from hydra_plugins.moe_vlm_sweeper._planning import Planner, Point, check_library, library_worker
from moe_vlm.config.spec import RunSpec
from moe_vlm.engines.megatron import plan_cache
from moe_vlm.engines.megatron.plan_cache import CACHE_ENV
from moe_vlm.launch.status import refusal_detail
from moe_vlm.rules import catalogue, validate
from moe_vlm.run.library_worker import LibraryWorker
from tests.conftest import make_spec
from tests.megatron.conftest import needs_stack

GB200 = ("engine=megatron", "cluster=gb200", "model=qwen3_vl_30b_a3b", "nodes=2")


def _point(index: int, *overrides: str) -> Point:
    spec = make_spec(*GB200, *overrides)
    return Point(index, list(overrides), f"p{index}", {}, spec, validate(spec))


@needs_stack
def test_a_sweep_point_the_rules_let_through_is_rejected_by_the_library(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A combination the catalogue has no rule for (X009, the ported fp64-router refusal, taken
    out: what a rule nobody wrote yet looks like) is refused by TE's own router check
    (transformer_engine/pytorch/router.py:345-346), and the sweep rejects that point alone."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(catalogue, "CATALOGUE", [r for r in catalogue.CATALOGUE if r.code != "X009"])
    fp64, fp32 = _point(0, "router.dtype=fp64"), _point(1, "router.dtype=fp32")
    assert fp64.valid and fp32.valid  # what the sweep planned before issue 31
    check_library([fp64, fp32], enabled=True, canary=True)
    assert not fp64.valid and fp32.valid
    refused = [{"code": f.code, "message": f.message} for f in fp64.findings if f.is_error]
    assert [r["code"] for r in refused] == ["LIB-ROUTER"]
    assert "float64" in refused[0]["message"]
    assert refusal_detail(refused).startswith("refused by the library's own check LIB-ROUTER: ")
    assert "LIB-STACK" not in capsys.readouterr().err
    assert sorted(p.name.split("-")[0] for p in (tmp_path / "plan").iterdir()) == ["library", "library"]


def _three() -> list[Point]:
    """A point TE's router check refuses (with X009 taken out), and two it lets through."""
    return [_point(0, "router.dtype=fp64"), _point(1, "router.dtype=fp32"), _point(2, "mbs=2")]


def _handed_to(worker: LibraryWorker, planned: list[Point]) -> None:
    for point in planned:  # as Planner.plan hands each point over as soon as it is planned
        worker.submit(point.point_id, point.spec)


@needs_stack
def test_a_worker_process_finds_what_the_sweeps_own_process_finds(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The points handed to the worker while the sweep plans (moe_vlm/run/library_worker.py) get,
    point by point and in order, the findings the sweep's own process gives them; once the plan
    cache holds them, a sweep of the same points starts no worker at all. The worker keys its entries
    as the sweep does, even when a fresh process reads another install stamp: what the sweep read at
    its start is not what the worker would read after `pip install --dry-run -e .` (another CI test)
    rewrote the project's egg-info, and a CI run once saw the cached sweep start a worker."""
    monkeypatch.setattr(catalogue, "CATALOGUE", [r for r in catalogue.CATALOGUE if r.code != "X009"])
    found = plan_cache.installed()
    read_at_start = plan_cache.Install(found.versions, found.stamp[::-1])
    monkeypatch.setattr(plan_cache, "installed", lambda: read_at_start)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "worker"))
    through_worker, worker = _three(), LibraryWorker()
    _handed_to(worker, through_worker)
    try:
        assert worker.started
        check_library(through_worker, enabled=True, canary=True, worker=worker)
    finally:
        worker.close()
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "here"))
    here = _three()
    check_library(here, enabled=True, canary=True)
    assert [p.valid for p in here] == [False, True, True]
    assert [p.findings for p in through_worker] == [p.findings for p in here]
    assert "LIB-STACK" not in capsys.readouterr().err

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "worker"))  # what the worker's checks stored
    cached, idle = _three(), LibraryWorker()
    _handed_to(idle, cached)
    assert not idle.started
    check_library(cached, enabled=True, canary=True, worker=idle)
    assert [p.findings for p in cached] == [p.findings for p in here]


@needs_stack
def test_the_points_of_a_worker_that_dies_are_checked_in_the_sweeps_process(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(catalogue, "CATALOGUE", [r for r in catalogue.CATALOGUE if r.code != "X009"])
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    planned, worker = _three(), LibraryWorker()
    _handed_to(worker, planned)
    assert worker._process is not None
    worker._process.kill()
    try:
        check_library(planned, enabled=True, canary=True, worker=worker)
    finally:
        worker.close()
    assert [p.valid for p in planned] == [False, True, True]
    assert [f.code for f in planned[0].findings if f.is_error] == ["LIB-ROUTER"]


class _Recording(LibraryWorker):
    """Records what the planner hands over instead of starting a process."""

    def __init__(self) -> None:
        super().__init__()
        self.handed: list[str] = []

    def submit(self, key: str, spec: RunSpec) -> None:
        self.handed.append(key)


def test_the_planner_hands_each_point_the_library_will_judge_to_the_worker_as_it_plans_it() -> None:
    """Planner.plan (the sweep's real planning: Hydra's composition, the rules) hands over every
    valid Megatron point once, in grid order, and nothing else: not a point the rules refuse
    (tp=3 divides neither the heads nor the GPUs), not a torch-engine point, not a second spelling of a point."""
    planner = Planner(
        params={},
        force=False,
        search="grid",
        halving=None,
        predict_keep=1.0,
        config=OmegaConf.create({"hydra": {"overrides": {"hydra": []}}}),
        hydra_context=cast(HydraContext, object()),  # plan() composes each point itself
        launcher=cast(Launcher, None),
    )
    grid = [[*GB200, "mbs=1"], [*GB200, "tp=3"], ["mbs=1"], [*GB200, "mbs=2"], [*GB200, "mbs=01"]]
    worker = _Recording()
    planned = planner.plan(grid, worker)
    assert [p.overrides[-1] for p in planned] == ["mbs=1", "tp=3", "mbs=1", "mbs=2"]
    assert [p.valid for p in planned] == [True, False, True, True]
    assert worker.handed == [planned[0].point_id, planned[3].point_id]


def test_a_sweep_starts_a_worker_only_when_the_checks_run_and_this_process_lacks_the_stack(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    assert library_worker(False) is None
    monkeypatch.setitem(sys.modules, "megatron.bridge", sys.modules.get("megatron.bridge") or object())
    assert library_worker(True) is None  # imported here already: checking here is faster
    monkeypatch.delitem(sys.modules, "megatron.bridge")
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    assert library_worker(True) is None  # not installed: one LIB-STACK line, from here


def test_without_the_stack_one_warning_for_the_sweep_and_nothing_cached(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from moe_vlm.engines.megatron import library_checks

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(library_checks, "stack_problem", lambda: "no Megatron here")
    monkeypatch.setattr(library_checks, "_STACK_IMPORTED", [])  # as in a process that never imported it
    planned = [_point(0, "mbs=1"), _point(1, "mbs=2")]
    before = [list(p.findings) for p in planned]
    check_library(planned, enabled=True, canary=True)
    err = capsys.readouterr().err
    assert err.count("LIB-STACK") == 1 and "no Megatron here" in err and "the canary runs them" in err
    assert [p.findings for p in planned] == before and all(p.valid for p in planned)
    # "did not run here" is no verdict on the point: the next plan, on a machine with the stack, checks it
    assert not (tmp_path / "plan").exists() or not list((tmp_path / "plan").glob("library-*"))


def test_switched_off_they_are_left_to_the_canary(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hydra_plugins.moe_vlm_sweeper import _planning

    def never(spec: object) -> list[object]:
        raise AssertionError("library checks ran")

    monkeypatch.setattr(_planning, "check_here", never)
    check_library([_point(0)], enabled=False, canary=False)
    out = capsys.readouterr().out
    assert "library_checks=false" in out and "nothing runs them" in out


@needs_stack
def test_the_canary_refuses_a_point_before_it_starts_and_status_says_why(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The canary's pass over its points file (moe_vlm/launch/canary.py check_points), on this
    machine's stack as it would on the cluster's: the point the library refuses gets a rejected
    run.json and point.json's `refused` (moe_vlm/run/task.py exits on it before any work), the
    other is left to start; `moe-vlm status` gives the library's reason."""
    from moe_vlm.launch.canary import REFUSED_PREFIX, check_points
    from moe_vlm.launch.status import snapshot
    from moe_vlm.runtime import points

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(catalogue, "CATALOGUE", [r for r in catalogue.CATALOGUE if r.code != "X009"])
    sweep_dir, listed = tmp_path / "sweep", []
    for name, dtype in (("refused", "fp64"), ("passes", "fp32")):
        overrides = [*GB200, f"router.dtype={dtype}"]
        points.write_point(
            sweep_dir / name,
            {"point_id": name, "overrides": overrides, "config": {}, "valid": True, "refused": []},
        )
        listed.append({"point_dir": str(sweep_dir / name), "overrides": overrides})
    points_file = tmp_path / points.CANARY_POINTS
    points_file.write_text(json.dumps({"points": listed}))

    assert check_points(points_file).endswith("shape(s) built): 1 refused (they never start)")
    assert f"{REFUSED_PREFIX} refused: LIB-ROUTER: " in capsys.readouterr().out
    assert [r["code"] for r in points.refused(sweep_dir / "refused")] == ["LIB-ROUTER"]
    assert points.refused(sweep_dir / "passes") == [] and not (sweep_dir / "passes" / "run.json").exists()
    rows = {s.point_id: s for s in snapshot(sweep_dir, record=False)[0]}
    assert rows["refused"].state == "rejected"
    assert rows["refused"].detail.startswith("refused by the library's own check LIB-ROUTER: ")
    assert "float64" in rows["refused"].detail
