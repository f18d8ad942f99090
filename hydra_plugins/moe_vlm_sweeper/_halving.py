"""The planning sweeper's `search=halving`: rung by rung, launch, wait, decide.

Each rung composes its points with `train_iters` set to the rung's length (the last rung: the
point as the grid has it), hands them to the sweeper's own triage and launcher (so they are
validated, skipped when already completed or in flight, packed with `points_per_job`, guarded by
the canary, like any sweep's points), waits until none is queued or running, and decides
(moe_vlm/launch/halving.py). The state file is written before a rung's launch and after its
decision: a rerun of the command skips decided rungs and waits for, or relaunches, the rest.
"""

# Hydra's plugin scan skips `_`-named modules: this one imports the launch stack (numpy) only when
# a halving search runs.
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from hydra.core.utils import JobReturn
from omegaconf import DictConfig, OmegaConf

from moe_vlm.base.errors import EXIT_INVALID
from moe_vlm.config.compose import override_key
from moe_vlm.config.spec import RunSpec
from moe_vlm.launch.halving import (
    STATE_JSON,
    Decision,
    HalvingSettings,
    HalvingState,
    PlanPoint,
    RungState,
    Verdict,
    decide,
    full_length_node_seconds,
    grid_basis,
    measure,
    node_steps,
    plan_text,
    rung_steps,
    schedule,
    spec_rank_class,
)
from moe_vlm.launch.status import collect, in_flight
from moe_vlm.run.plan import prediction_of
from moe_vlm.runtime import points


class PlannedPoint(Protocol):
    """The sweeper's Point, as this module uses it."""

    index: int
    overrides: list[str]
    point_id: str
    spec: RunSpec

    @property
    def valid(self) -> bool: ...

    def label(self) -> str: ...


class Sweep(Protocol):
    """The planning sweeper, as this module uses it."""

    force: bool

    def plan(self, grid: list[list[str]]) -> Sequence[Any]: ...

    def triage(self, planned: list[Any], sweep_dir: Path) -> tuple[list[Any], dict[str, int]]: ...

    def launch(self, to_launch: list[Any], sweep_dir: Path) -> list[JobReturn]: ...

    def record_rejected(self, point: Any, point_dir: Path) -> None: ...


def settings_of(raw: Any) -> HalvingSettings:
    plain = OmegaConf.to_container(raw, resolve=True) if isinstance(raw, DictConfig) else raw
    return HalvingSettings.of({str(k): v for k, v in plain.items()} if isinstance(plain, dict) else None)


def plan_point(point: PlannedPoint) -> PlanPoint:
    spec = point.spec
    found = prediction_of(spec)
    return PlanPoint(
        spec.train_iters,
        spec.warmup_steps,
        spec.layout.nodes,
        str(spec_rank_class(spec.data.kind.value, bool(spec.router.force_load_balancing))),
        None if isinstance(found, str) else found.step_time_s,
    )


def schedule_of(planned: Sequence[PlannedPoint], settings: HalvingSettings) -> HalvingSettings:
    """The schedule the search will run on the valid points, decided before anything is written
    or submitted: reshaped (said here) or refused (BadInput: exit 2) when it cannot save."""
    shaped, notes = schedule(settings, [plan_point(p) for p in planned if p.valid])
    for note in notes:
        print(f"moe_vlm: halving reshaped: {note}")
    return shaped


def plan_of(dry: Sequence[PlannedPoint], settings: HalvingSettings) -> str:
    """The rung plan a dry run prints (its valid points)."""
    return plan_text(settings, [plan_point(p) for p in dry if p.valid])


def rung_overrides(point: PlannedPoint, steps: int) -> list[str]:
    """The point's overrides with train_iters set to the rung's length; the full length is the
    point as planned, so the last rung's run is the grid's (same identity)."""
    if steps >= point.spec.train_iters:
        return list(point.overrides)
    return [o for o in point.overrides if override_key(o) != "train_iters"] + [f"train_iters={steps}"]


def first_rung_order(valid: Sequence[PlannedPoint]) -> list[PlannedPoint]:
    """The points predicted fastest (effective tokens/s/GPU, moe_vlm/predict) first: in a first rung
    wider than the allocation, or packed into jobs, the likely winners start first. The grid's
    order when any point has no prediction (ties keep it too)."""
    rates: dict[str, float] = {}
    for point in valid:
        found = prediction_of(point.spec)
        rate = None if isinstance(found, str) else found.effective_tokens_per_s_per_gpu
        if not rate:
            why = found if isinstance(found, str) else found.note
            print(f"moe_vlm: halving rung 1 in the grid's order: no prediction for {point.label()} ({why})")
            return list(valid)
        rates[point.point_id] = rate
    print("moe_vlm: halving rung 1 starts the points predicted fastest first (effective tokens/s/GPU)")
    return sorted(valid, key=lambda p: -rates[p.point_id])


def start_state(
    sweeper: Sweep, valid: Sequence[PlannedPoint], sweep_dir: Path, settings: HalvingSettings
) -> HalvingState:
    """The search in this sweep directory: the one recorded, when it is this search (same settings
    and points, no force), else a new one (runs already finished with the same length are
    reused all the same: they have the same identity)."""
    planned = {p.point_id: plan_point(p) for p in valid}
    fresh = HalvingState(
        settings,
        {p.point_id: p.label() for p in valid},
        {p: plan.nodes for p, plan in planned.items()},
        {p: plan.train_iters for p, plan in planned.items()},
        warmup_steps={p: plan.warmup_steps for p, plan in planned.items()},
        rank_classes={p: plan.rank_class for p, plan in planned.items()},
    )
    state = HalvingState.read(sweep_dir)
    if state is None:
        return fresh
    if sweeper.force or not state.settings.same_search(settings) or set(state.points) != set(fresh.points):
        print(
            f"moe_vlm: halving: a new search replaces the one in {sweep_dir / STATE_JSON} (settings or points changed)"
        )
        return fresh
    state.settings = settings  # poll_s may differ
    state.warmup_steps, state.rank_classes = fresh.warmup_steps, fresh.rank_classes  # same points
    decided = sum(r.decided for r in state.rungs)
    if decided:
        print(f"moe_vlm: halving: resuming after {decided} decided rung(s) of {settings.rungs}")
    return state


def search(
    sweeper: Sweep, planned: Sequence[PlannedPoint], sweep_dir: Path, settings: HalvingSettings
) -> list[JobReturn]:
    for point in planned:
        if not point.valid:
            sweeper.record_rejected(point, sweep_dir / point.point_id)
    valid = [p for p in planned if p.valid]
    if not valid:
        print("moe_vlm: every point was rejected; nothing was submitted.", file=sys.stderr)
        sys.exit(EXIT_INVALID)
    valid = first_rung_order(valid)
    by_id = {p.point_id: p for p in valid}
    aside = points.set_aside_dry_runs(sweep_dir)
    if aside:
        print(
            f"moe_vlm: {len(aside)} point(s) a dry run planned here are kept in {sweep_dir / points.DRY_RUN_DIR}: "
            "the search runs its own rung points"
        )
    state = start_state(sweeper, valid, sweep_dir, settings)
    print(
        f"moe_vlm: halving search {sweep_dir}: {len(valid)} valid point(s) ({len(planned) - len(valid)} rejected), "
        f"eta={settings.eta}, {settings.rungs} rung(s)"
    )
    alive = list(by_id)
    results: list[JobReturn] = []
    for index in range(settings.rungs):
        rung = state.rung(index)
        if not rung.decided:
            if not alive:
                break
            results += run_rung(sweeper, state, rung, [by_id[p] for p in alive], sweep_dir)
        last = index == settings.rungs - 1
        alive = [p for p in alive if p in rung.verdicts and rung.verdicts[p].decision is Decision.promoted]
        print(rung_line(state, rung, last))
        if not alive:
            break
    print(summary(state, sweep_dir))
    return results


def run_rung(
    sweeper: Sweep, state: HalvingState, rung: RungState, alive: list[PlannedPoint], sweep_dir: Path
) -> list[JobReturn]:
    settings = state.settings
    steps = {
        p.point_id: rung_steps(settings, rung.rung, p.spec.warmup_steps, p.spec.train_iters) for p in alive
    }
    grid = [rung_overrides(p, steps[p.point_id]) for p in alive]
    composed = {p.index: p for p in sweeper.plan(grid)}
    # plan() numbers the points it returns by their place in `grid`; two identical runs are one.
    runs = {p.point_id: composed[i] for i, p in enumerate(alive) if i in composed}
    rung.runs = {base: run.point_id for base, run in runs.items()}
    rung.steps = {base: steps[base] for base in runs}
    state.write(sweep_dir)
    to_launch, counts = sweeper.triage(list({r.point_id: r for r in runs.values()}.values()), sweep_dir)
    for base, run in runs.items():
        points.update_point(
            sweep_dir / run.point_id,
            halving={
                "point": base,
                "rung": rung.rung + 1,
                "rungs": settings.rungs,
                "train_iters": steps[base],
            },
        )
    span = sorted(set(rung.steps.values()))
    print(
        f"moe_vlm: halving rung {rung.rung + 1}/{settings.rungs}: {len(runs)} point(s), train_iters "
        f"{span[0] if len(span) == 1 else f'{span[0]}-{span[-1]}'}: {len(to_launch)} to run, "
        f"{counts['skipped_completed']} already completed, {counts['skipped_in_flight']} in flight"
    )
    results = sweeper.launch(to_launch, sweep_dir) if to_launch else []
    wait(set(rung.runs.values()), sweep_dir, settings.poll_s, rung.rung + 1)
    last = rung.rung == settings.rungs - 1
    rung.verdicts = decide(
        [measure(base, sweep_dir / run_id) for base, run_id in rung.runs.items()], settings, last
    )
    for base, verdict in rung.verdicts.items():
        record_verdict(sweep_dir / rung.runs[base], base, rung, settings, verdict)
    rung.decided = True
    state.write(sweep_dir)
    return results


# How long a finished run's Slurm task may take to record its end after the run's own last write.
SETTLE_S = 120.0


def wait(run_ids: set[str], sweep_dir: Path, poll_s: float, rung: int, settle_s: float = SETTLE_S) -> None:
    """Until none of the rung's runs is queued or running (Slurm's submit-and-exit returns at
    once; `collect` also records jobs that vanished, so a lost job ends the wait), and then until
    each Slurm task has recorded its end (`record_launch`, after the run's own last write of
    run.json): measured before it, a run's node-seconds would be its steps', not its task's, and
    the verdict's write of run.json would race the task's. A task killed before it could record
    its end is waited for `settle_s`, then counted by its steps, and said."""
    said = -1
    settling_since: float | None = None
    while True:
        statuses = [s for s in collect(sweep_dir) if s.point_id in run_ids]
        open_runs = [s for s in statuses if in_flight(s)]
        if not open_runs:
            unsettled = [s.point_id for s in statuses if not task_ended(Path(s.point_dir))]
            if not unsettled:
                return
            settling_since = time.monotonic() if settling_since is None else settling_since
            if time.monotonic() - settling_since >= settle_s:
                print(
                    f"moe_vlm: halving rung {rung}: {len(unsettled)} Slurm task(s) ended without recording "
                    f"their end ({', '.join(sorted(unsettled))}); their node-seconds come from their steps",
                    flush=True,
                )
                return
        if open_runs and len(open_runs) != said:
            print(
                f"moe_vlm: halving rung {rung}: waiting for {len(open_runs)} of {len(run_ids)} run(s)",
                flush=True,
            )
            said = len(open_runs)
        time.sleep(poll_s)


def task_ended(point_dir: Path) -> bool:
    """Whether the point's task has recorded its end; only a Slurm task records it after the run
    (the in-process launchers return when the task has ended)."""
    submissions = (points.read_point(point_dir) or {}).get("submissions") or [{}]
    if submissions[-1].get("executor") != "slurm":
        return True
    run = points.read_run(point_dir)
    return run is None or run.launch.get("task_ended_unix_s") is not None


def record_verdict(
    run_dir: Path, point: str, rung: RungState, settings: HalvingSettings, verdict: Verdict
) -> None:
    """The decision into the run's run.json (`halving`) and point.json (for `moe-vlm status`)."""
    section = {
        "point": point,
        "rung": rung.rung + 1,
        "rungs": settings.rungs,
        "train_iters": rung.steps.get(point),
    }
    section |= {"eta": settings.eta, **verdict.to_json()}
    record = points.read_run(run_dir)
    if record is not None:
        record.sections["halving"] = section
        record.write(run_dir)
    points.update_point(
        run_dir, halving={k: section[k] for k in ("point", "rung", "rungs", "train_iters", "decision")}
    )


def _tokens(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def rung_line(state: HalvingState, rung: RungState, last: bool) -> str:
    verdicts = rung.verdicts
    count = {d: sum(v.decision is d for v in verdicts.values()) for d in Decision}
    failed = sum(v.place is None for v in verdicts.values())
    tail = f"{count[Decision.final]} finished" if last else f"{count[Decision.promoted]} promoted"
    return (
        f"moe_vlm: halving rung {rung.rung + 1}/{state.settings.rungs} decided: {len(verdicts)} point(s), "
        f"{tail}, {count[Decision.stopped]} stopped ({failed} failed or rejected)"
    )


def summary(state: HalvingState, sweep_dir: Path) -> str:
    used = state.used_node_seconds()
    # A grid run earlier in this sweep directory has measured some points' full length.
    grid, extrapolated = state.grid_estimate(full_length_node_seconds(state, sweep_dir))
    lines = []
    for cls, (point, verdict) in sorted(state.best().items()):
        lines.append(
            f"moe_vlm: halving best ({cls}): {state.points.get(point, point)}: "
            f"{_tokens(verdict.tokens_per_s_per_gpu)} effective tokens/s/GPU"
        )
    bound = node_steps(state.settings, state.plan_points())
    lines.append(
        f"moe_vlm: halving ran {state.node_steps()} node-steps of the plan's at most {bound.worst}; "
        f"the grid {bound.grid} ({state.node_steps() / max(bound.grid, 1):.0%} of it)"
    )
    if grid > 0:
        lines.append(
            f"moe_vlm: halving used {used:,.0f} node-s; the full grid ~{grid:,.0f} node-s "
            f"({grid_basis(len(state.points), extrapolated)}): {used / grid:.0%} of it"
        )
    lines += [f"moe_vlm: halving: {line}" for line in state.overflows()]
    if not all(r.decided for r in state.rungs) or len(state.rungs) < state.settings.rungs:
        lines.append("moe_vlm: the search stopped early (no point left to promote)")
    return "\n".join(lines) or "moe_vlm: halving: nothing decided"
