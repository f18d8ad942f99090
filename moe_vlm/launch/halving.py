"""Successive halving over a sweep's points: stop the losers after a few steady steps.

`hydra.sweeper.search=halving` runs every valid point for a short first rung (its warm-up plus
`first_steps` steady steps), ranks the finished ones by effective tokens/s/GPU over their steady
window, keeps the top 1/eta and reruns those with more steps (`first_steps x eta^r` steady
steps), up to the last rung, which is the point's own `train_iters` (the run a grid sweep makes:
the same identity, so a grid and a halving search share finished runs). This module is the
search's arithmetic and its record; the sweeper's driver (hydra_plugins/moe_vlm_sweeper/
_halving.py) composes, launches and waits.

- Ranking, as `moe-vlm report` ranks: mock-data points, forced-balance points and the rest are
  three classes, each halved among itself; a class is never ranked against another.
- Noise: a point's throughput range is its real tokens per step over the p90 and p10 steady
  step times (of at least MIN_FIRST_STEPS steady steps, so one slow step does not make the
  range). A point below the cut whose range overlaps the range of the last point kept is
  promoted with it: a difference inside the points' own noise never decides.
- Cost bound: a rung promotes at most `tie_factor` x the top 1/eta of a class, ties included,
  so the rung plan's worst case holds whatever is measured. When the ties at the cut overflow
  that cap, they are stopped together and only the points clear of their noise go on (a
  cut higher up); only when even the first place's ties overflow it are the cap's points taken
  by measured rate, and the verdicts (`split`), the summary and the report say so.
- Faults: a point that fails or is rejected in a rung is stopped with its record untouched (its
  failure class stays); the rung is decided on the rest.
- Cost: a run's node-seconds are its nodes times its task's wall time (the launcher records the
  task's start and end in `launch`), else its steps' wall time (an in-process launcher).

The search's state is one typed file in the sweep directory, `halving.json` (HalvingState),
written atomically at the start and the end of every rung: rerunning the command reads it and
goes on where it stopped; a decided rung is never rerun.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from moe_vlm.base.files import RunPaths, write_json_atomic
from moe_vlm.config.schema import MOCK_KINDS
from moe_vlm.launch.halving_plan import (
    MIN_FIRST_STEPS,
    SEARCH_HELP,
    HalvingSettings,
    NodeSteps,
    PlanPoint,
    RungPlan,
    Search,
    node_steps,
    plan,
    plan_text,
    rung_steps,
    schedule,
    search_of,
    survivors_planned,
)
from moe_vlm.predict.model import measured_window
from moe_vlm.record.records import RunRecord, read_steps
from moe_vlm.runtime.points import read_run

# The plan (settings, rung lengths, cost, the schedule's reshape or refusal) is its own module;
# its names are re-exported: the driver, the report and the tests read the search from here.
__all__ = [
    "MIN_FIRST_STEPS",
    "SEARCH_HELP",
    "HalvingSettings",
    "NodeSteps",
    "PlanPoint",
    "RungPlan",
    "Search",
    "node_steps",
    "plan",
    "plan_text",
    "rung_steps",
    "schedule",
    "search_of",
    "survivors_planned",
]

STATE_JSON = "halving.json"
STATE_VERSION = 1


class Decision(StrEnum):
    """What a rung decided for a point (run.json `halving.decision`)."""

    promoted = "promoted"  # in the top 1/eta of its class, or inside the noise of the cut
    stopped = "stopped"  # below the cut, or failed / rejected in this rung
    final = "final"  # completed the last rung: its full train_iters


MOCK_DATA = frozenset(kind.value for kind in MOCK_KINDS)  # labelled mock: ranked apart, as in the report


class RankClass(StrEnum):
    """The classes `moe-vlm report` ranks separately."""

    ranked = "ranked"  # synthetic or real data, real routing
    mock = "mock"
    forced_balance = "forced_balance"


# --- measuring and deciding a rung ---------------------------------------------------------------


@dataclass(frozen=True)
class Measured:
    """One run of a rung, as the decision reads it."""

    point: str  # the grid point's id (its full-length identity)
    status: str
    rank_class: RankClass
    tokens_per_s_per_gpu: float | None  # effective (real) tokens/s/GPU over the steady window
    low: float | None  # ... at the p90 steady step time
    high: float | None  # ... at the p10 steady step time
    failure: str | None  # failure class, or the rule codes of a rejected run
    node_seconds: float | None
    node_seconds_basis: str | None  # "task" (the launcher's task wall time) or "steps"
    step_time_s: float | None = None  # mean steady step time: extrapolates the grid's cost

    @property
    def ranked(self) -> bool:
        return self.status == "completed" and self.tokens_per_s_per_gpu is not None


def spec_rank_class(data: str, force_load_balancing: bool) -> RankClass:
    """As report.table.ranked: mock data first (whatever the routing), then forced-balance routing."""
    if data in MOCK_DATA:
        return RankClass.mock
    if force_load_balancing:
        return RankClass.forced_balance
    return RankClass.ranked


def rank_class(run: RunRecord) -> RankClass:
    return spec_rank_class(str(run.knob("data")), bool(run.setting("router", "force_load_balancing")))


def node_seconds(run: RunRecord, run_dir: Path) -> tuple[float | None, str | None]:
    """Nodes x the wall time the run held them: the task's (launch.task_started/ended_unix_s, from
    the process start, so interpreter and imports count), else its steps' (in-process launchers)."""
    nodes = (run.spec or {}).get("layout", {}).get("nodes") or run.config.get("nodes") or 1
    launch = run.launch
    start, end = launch.get("task_started_unix_s"), launch.get("task_ended_unix_s")
    if isinstance(start, int | float) and isinstance(end, int | float) and end >= start:
        return round(float(nodes) * (end - start), 3), "task"
    steps = read_steps(RunPaths(run_dir).steps)
    if not steps:
        return None, None
    first = min(steps, key=lambda s: s.time_unix_s)
    last = max(s.time_unix_s for s in steps)
    return round(float(nodes) * (last - first.time_unix_s + first.step_time_s), 3), "steps"


def measure(point: str, run_dir: Path) -> Measured:
    """A rung run's figures from its run.json (a missing or unreadable record: failed, unknown)."""
    run = read_run(run_dir)
    if run is None:
        return Measured(point, "failed", RankClass.ranked, None, None, None, "no record", None, None)
    return measured(point, run, run_dir)


def measured(point: str, run: RunRecord, run_dir: Path) -> Measured:
    summary = run.summary or {}
    tokens = summary.get("effective_tokens_per_s_per_gpu")
    step_time = summary.get("step_time_s") or {}
    # The spread of the time the rate is over (predict.model.measured_window decides which), so
    # the ranked figure lies inside its own p10-p90 range: the rate at the p90 and at the p10 time.
    window = measured_window(summary)
    spread = window[0] if window is not None else {}
    low = high = None
    if tokens is not None and spread.get("mean") and spread.get("p10") and spread.get("p90"):
        low = float(tokens) * float(spread["mean"]) / float(spread["p90"])
        high = float(tokens) * float(spread["mean"]) / float(spread["p10"])
    failure = None
    if run.status != "completed":
        failure = run.failure.name if run.failure else (", ".join(run.error_codes()) or run.status)
    used, basis = node_seconds(run, run_dir)
    return Measured(
        point,
        str(run.status),
        rank_class(run),
        float(tokens) if tokens is not None and run.status == "completed" else None,
        low,
        high,
        failure,
        used,
        basis,
        float(step_time["mean"]) if step_time.get("mean") is not None else None,
    )


@dataclass
class Verdict:
    """A rung's decision for one point, with the figures that made it (run.json `halving`)."""

    decision: Decision
    reason: str
    rank_class: str
    tokens_per_s_per_gpu: float | None = None
    range: tuple[float, float] | None = None  # tokens/s/GPU at p90 and p10 step time
    place: int | None = None  # 1 = fastest of its class in this rung
    finished: int = 0  # points of its class that finished this rung
    keep: int = 0  # top 1/eta of them
    cut: float | None = None  # tokens/s/GPU of the last point kept
    cut_range: tuple[float, float] | None = None
    node_seconds: float | None = None
    node_seconds_basis: str | None = None
    step_time_s: float | None = None  # mean steady step time
    cap: int = 0  # the most points of its class this rung could promote, ties included
    tied: int = 0  # the top 1/eta with the points tied at its cut (> cap: the ties overflowed)
    split: bool = False  # the cap split a tie by measured rate (no tie group fit it)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["decision"] = str(self.decision)
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Verdict:
        known = {k: raw[k] for k in cls.__dataclass_fields__ if k in raw}
        for key in ("range", "cut_range"):
            if isinstance(known.get(key), list):
                known[key] = tuple(known[key])
        known["decision"] = Decision(str(raw.get("decision")))
        return cls(**known)


def _overlap(a: Measured, low: float | None, high: float | None) -> bool:
    if a.low is None or a.high is None or low is None or high is None:
        return False
    return a.low <= high and low <= a.high


def _tie_group(done: Sequence[Measured], top: int) -> list[int]:
    """The places (0-based) promoted with a cut after the top `top`: those, and every point
    below whose p10-p90 range overlaps the range of the last of them."""
    cut = done[top - 1]
    return list(range(top)) + [i for i in range(top, len(done)) if _overlap(done[i], cut.low, cut.high)]


@dataclass(frozen=True)
class Cut:
    """How a rung cut one class: the places promoted, the size of the tie group at the top 1/eta,
    and whether the cap split a tie (every clean cut was over the cap)."""

    promoted: frozenset[int]
    top: int  # the cut is after this many places (the top 1/eta, or fewer when ties overflow)
    tied: int  # the top 1/eta with their ties: what promoting every tie would have kept
    split: bool  # True: no tie group fit the cap; the cap's points were taken by measured rate


def cut(done: Sequence[Measured], keep: int, cap: int) -> Cut:
    """The top `keep` and the points tied with the last of them, when they fit in `cap`. When they
    do not, the largest clean cut above (a top whose ties fit): the overflowing tie group is
    stopped together, never split by a difference inside its noise. Only when even the first
    place's ties overflow the cap, the cap's points are taken by measured rate and the cut says
    it split (the record and the report say so)."""
    tied = len(_tie_group(done, keep))
    for top in range(keep, 0, -1):
        group = _tie_group(done, top)
        if len(group) <= cap:
            return Cut(frozenset(group), top, tied, False)
    return Cut(frozenset(range(cap)), cap, tied, True)


def decide(measured: Iterable[Measured], settings: HalvingSettings, last: bool) -> dict[str, Verdict]:
    """Each point's verdict. Per rank class, the finished points best first: the top ceil(n/eta)
    are kept with every point whose range overlaps the last kept one's, up to the cap (`cut`)."""
    runs = list(measured)
    eta = settings.eta
    out: dict[str, Verdict] = {}
    for run in runs:
        if not run.ranked:
            why = f"{run.status}" + (f" ({run.failure})" if run.failure else "") + " in this rung"
            out[run.point] = Verdict(Decision.stopped, why, str(run.rank_class))
    for cls in RankClass:
        done = sorted(
            (r for r in runs if r.ranked and r.rank_class is cls),
            key=lambda r: (-(r.tokens_per_s_per_gpu or 0.0), r.point),
        )
        if not done:
            continue
        n, keep, cap = len(done), settings.keep(len(done)), settings.cap(len(done))
        decided = cut(done, keep, cap)
        last_kept = done[decided.top - 1]
        over = decided.tied > cap
        for place, run in enumerate(done, start=1):
            promoted = place - 1 in decided.promoted
            if last:
                decision, reason = Decision.final, f"completed the last rung, {place} of {n}"
            elif decided.split and promoted:
                decision = Decision.promoted
                reason = (
                    f"{place} of {n}: SPLIT BY THE CAP: even the first place's p10-p90 range overlaps more "
                    f"than the cap ({cap}) allows; promoted by measured rate inside the noise"
                )
            elif decided.split:
                decision = Decision.stopped
                reason = (
                    f"{place} of {n}: SPLIT BY THE CAP: below the cap's {cap} by measured rate, possibly "
                    "inside their noise"
                )
            elif promoted and place <= decided.top:
                decision = Decision.promoted
                reason = f"{place} of {n}: in the top {keep} (1/{eta})"
                if decided.top < keep:
                    reason = (
                        f"{place} of {n}: in the top {decided.top}, clear of the noise of the {decided.tied} "
                        f"point(s) tied at the top {keep} (1/{eta}), more than the cap ({cap})"
                    )
            elif promoted:
                decision = Decision.promoted
                reason = f"{place} of {n}: its p10-p90 range overlaps the cut's (inside the noise)"
            elif over and (place <= keep or _overlap(run, done[keep - 1].low, done[keep - 1].high)):
                decision = Decision.stopped
                reason = (
                    f"{place} of {n}: tied with the top {keep}'s cut, but {decided.tied} points are tied "
                    f"there, more than the cap ({cap}): stopped together, not split inside their noise"
                )
            else:
                decision = Decision.stopped
                reason = f"{place} of {n}: below the top {decided.top} and outside the cut's p10-p90 range"
            out[run.point] = Verdict(
                decision,
                reason,
                str(cls),
                run.tokens_per_s_per_gpu,
                (run.low, run.high) if run.low is not None and run.high is not None else None,
                place,
                n,
                keep,
                last_kept.tokens_per_s_per_gpu,
                (last_kept.low, last_kept.high)
                if last_kept.low is not None and last_kept.high is not None
                else None,
                # The last rung promotes nothing: no cap, no tie to report.
                cap=0 if last else cap,
                tied=0 if last else decided.tied,
                split=decided.split and not last,
            )
    for run in runs:
        verdict = out[run.point]
        verdict.node_seconds, verdict.node_seconds_basis = run.node_seconds, run.node_seconds_basis
        verdict.step_time_s = run.step_time_s
    return out


# --- the state file ------------------------------------------------------------------------------


@dataclass
class RungState:
    """One rung: the run each point makes in it (its directory, a point id) and, once decided,
    the verdicts. `decided` rungs are never rerun."""

    rung: int  # 0-based
    runs: dict[str, str] = field(default_factory=dict)  # grid point id -> this rung's run id
    steps: dict[str, int] = field(default_factory=dict)  # grid point id -> train_iters in this rung
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    decided: bool = False

    def promoted(self) -> list[str]:
        return [p for p, v in self.verdicts.items() if v.decision is Decision.promoted]

    def to_json(self) -> dict[str, Any]:
        return {
            "rung": self.rung,
            "runs": self.runs,
            "steps": self.steps,
            "verdicts": {p: v.to_json() for p, v in self.verdicts.items()},
            "decided": self.decided,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> RungState:
        return cls(
            rung=int(raw["rung"]),
            runs={str(k): str(v) for k, v in (raw.get("runs") or {}).items()},
            steps={str(k): int(v) for k, v in (raw.get("steps") or {}).items()},
            verdicts={str(k): Verdict.from_json(v) for k, v in (raw.get("verdicts") or {}).items()},
            decided=bool(raw.get("decided")),
        )


@dataclass
class HalvingState:
    """halving.json: the search's settings, its points (grid id -> overrides label) and rungs."""

    settings: HalvingSettings
    points: dict[str, str]  # grid point id -> its overrides, as a label
    nodes: dict[str, int] = field(default_factory=dict)  # grid point id -> nodes
    train_iters: dict[str, int] = field(default_factory=dict)  # grid point id -> its full length
    rungs: list[RungState] = field(default_factory=list)
    version: int = STATE_VERSION
    warmup_steps: dict[str, int] = field(default_factory=dict)  # grid point id -> its warm-up
    rank_classes: dict[str, str] = field(default_factory=dict)  # grid point id -> its RankClass

    def rung(self, index: int) -> RungState:
        while len(self.rungs) <= index:
            self.rungs.append(RungState(len(self.rungs)))
        return self.rungs[index]

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "settings": asdict(self.settings),
            "points": self.points,
            "nodes": self.nodes,
            "train_iters": self.train_iters,
            "warmup_steps": self.warmup_steps,
            "rank_classes": self.rank_classes,
            "rungs": [r.to_json() for r in self.rungs],
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> HalvingState:
        return cls(
            settings=HalvingSettings(**raw["settings"]),
            points={str(k): str(v) for k, v in raw["points"].items()},
            nodes={str(k): int(v) for k, v in (raw.get("nodes") or {}).items()},
            train_iters={str(k): int(v) for k, v in (raw.get("train_iters") or {}).items()},
            rungs=[RungState.from_json(r) for r in raw.get("rungs") or []],
            version=int(raw.get("version") or STATE_VERSION),
            warmup_steps={str(k): int(v) for k, v in (raw.get("warmup_steps") or {}).items()},
            rank_classes={str(k): str(v) for k, v in (raw.get("rank_classes") or {}).items()},
        )

    def write(self, sweep_dir: Path) -> None:
        write_json_atomic(sweep_dir / STATE_JSON, self.to_json())

    @classmethod
    def read(cls, sweep_dir: Path) -> HalvingState | None:
        """The sweep's search, None when it has none or the file cannot be read as one."""
        try:
            return cls.from_json(json.loads((sweep_dir / STATE_JSON).read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    # --- what the report and the driver's summary say

    def plan_points(self) -> list[PlanPoint]:
        """The search's points as its rung plan saw them (the plan's bound on its node-steps)."""
        return [
            PlanPoint(
                self.train_iters.get(p, 0),
                self.warmup_steps.get(p, 0),
                self.nodes.get(p, 1),
                self.rank_classes.get(p, str(RankClass.ranked)),
            )
            for p in self.points
        ]

    def runs_once(self) -> list[tuple[str, str, int, Verdict | None]]:
        """(point, run id, train_iters, verdict) of every run the search made, each run once: a
        rung that reached a point's full train_iters ran the grid's run, and a later rung of the
        same length finds it completed (same identity) and decides on it again without rerunning
        it, so its steps and node-seconds are counted where they were spent."""
        seen: set[str] = set()
        out = []
        for rung in self.rungs:
            for point, steps in rung.steps.items():
                run_id = rung.runs.get(point, f"{point}@{rung.rung}")
                if run_id not in seen:
                    seen.add(run_id)
                    out.append((point, run_id, steps, rung.verdicts.get(point)))
        return out

    def node_steps(self) -> int:
        """Node-steps the search ran: every run it made once, nodes x its train_iters."""
        return sum(self.nodes.get(p, 1) * steps for p, _, steps, _ in self.runs_once())

    def used_node_seconds(self, rank_class: str | None = None) -> float:
        """Node-seconds of every run the search made, once (of one rank class, when given)."""
        return sum(
            v.node_seconds or 0.0
            for _, _, _, v in self.runs_once()
            if v is not None and (rank_class is None or v.rank_class == rank_class)
        )

    def point_node_seconds(self, point: str) -> float:
        return sum(v.node_seconds or 0.0 for p, _, _, v in self.runs_once() if p == point and v is not None)

    def grid_estimate(self, full_runs: Mapping[str, float] | None = None) -> tuple[float, int]:
        """The full grid's node-seconds, and how many points of it are extrapolated: a point that
        ran its full train_iters counts that run; one stopped earlier, the node-seconds of its
        full-length run when the grid has run it since (`full_runs`: full_length_node_seconds),
        else its last run's node-seconds (start-up included, once) plus its remaining steps at
        that run's mean steady step time."""
        total, extrapolated = 0.0, 0
        for point in self.points:
            if full_runs and point in full_runs:
                total += full_runs[point]
                continue
            last: tuple[int, Verdict] | None = None
            for rung in self.rungs:
                verdict = rung.verdicts.get(point)
                if verdict is not None and verdict.node_seconds is not None:
                    last = (rung.steps.get(point, 0), verdict)
            if last is None:
                continue
            steps, verdict = last
            used = verdict.node_seconds or 0.0
            full = self.train_iters.get(point, steps)
            total += used
            if steps < full and verdict.step_time_s is not None:
                total += (full - steps) * verdict.step_time_s * self.nodes.get(point, 1)
                extrapolated += 1
        return total, extrapolated

    def overflows(self) -> list[str]:
        """What the summary and the report say of every rung and class whose ties overflowed the
        cap: the search stayed within its plan's cost, and this is what that cost it."""
        out = []
        for rung in self.rungs:
            by_class: dict[str, list[Verdict]] = {}
            for verdict in rung.verdicts.values():
                if verdict.place is not None and verdict.tied > verdict.cap:
                    by_class.setdefault(verdict.rank_class, []).append(verdict)
            for cls, verdicts in sorted(by_class.items()):
                first = verdicts[0]
                promoted = sum(v.decision is Decision.promoted for v in verdicts)
                how = (
                    "even the first place's ties overflowed it: the cap's points were taken by measured "
                    "rate, inside their noise"
                    if first.split
                    else "the tied points were stopped together and only the points clear of their noise went on"
                )
                out.append(
                    f"rung {rung.rung + 1} ({cls}): {first.tied} point(s) tied at the top {first.keep}'s cut, more "
                    f"than the cap of {first.cap} (tie_factor x 1/eta); {how} ({promoted} promoted). A larger "
                    "hydra.sweeper.halving.tie_factor lets more ties go on, at more cost"
                )
        return out

    def best(self) -> dict[str, tuple[str, Verdict]]:
        """Per rank class, the point the search ends with: the fastest of the last rung reached."""
        out: dict[str, tuple[str, Verdict]] = {}
        for rung in self.rungs:
            if not rung.decided:
                continue
            for point, verdict in rung.verdicts.items():
                if verdict.place == 1:
                    out[verdict.rank_class] = (point, verdict)
        return out


def full_length_node_seconds(state: HalvingState, sweep_dir: Path) -> dict[str, float]:
    """The measured node-seconds of each point's completed full-length run in the sweep directory
    (the search's last rung, or the grid run there after it: the same identity)."""
    out: dict[str, float] = {}
    for point in state.points:
        if not (sweep_dir / point).is_dir():
            continue
        found = measure(point, sweep_dir / point)
        if found.status == "completed" and found.node_seconds is not None:
            out[point] = found.node_seconds
    return out


def grid_basis(points: int, extrapolated: int) -> str:
    """How the grid's node-seconds were reached: measured full-length runs, extrapolated ones."""
    if not extrapolated:
        return f"measured: each of its {points} point(s) ran its full length"
    return (
        f"{points - extrapolated} point(s) measured at full length, {extrapolated} stopped early and "
        "extrapolated from their last run"
    )


# --- against the grid: what the benchmark and the tests measure ----------------------------------


@dataclass(frozen=True)
class GridComparison:
    """A halving search against the full grid run in the same sweep directory (the grid command
    after the search: it runs every point's full length except those the search already ran)."""

    rank_class: str
    grid_best: str  # grid point id
    grid_best_tokens: float
    found: str  # the search's best point
    found_tokens: float  # the found point's full-length figure
    within_noise: bool  # found == grid_best, or their full-length p10-p90 ranges overlap
    halving_node_seconds: float
    grid_node_seconds: float

    @property
    def ratio(self) -> float:
        return self.halving_node_seconds / self.grid_node_seconds


def compare_with_grid(sweep_dir: Path, rank: RankClass = RankClass.ranked) -> GridComparison:
    """Raises ValueError when the search or a full-length run of its class is missing."""
    state = HalvingState.read(sweep_dir)
    if state is None:
        raise ValueError(f"no halving search in {sweep_dir}")
    full = {point: measure(point, sweep_dir / point) for point in state.points}
    # Each point's class as the search judged it (every point ran the first rung): a full run that
    # is missing has no class of its own, and leaving it out would compare the grid's best of the
    # points that did run.
    judged = state.rungs[0].verdicts if state.rungs else {}
    mine = [full[point] for point, verdict in judged.items() if verdict.rank_class == str(rank)]
    if not mine or not all(m.ranked and m.node_seconds is not None for m in mine):
        raise ValueError(f"not every {rank} point of {sweep_dir} has a completed full-length run")
    best = max(mine, key=lambda m: m.tokens_per_s_per_gpu or 0.0)
    found_point = state.best().get(str(rank), (None, None))[0]
    if found_point is None:
        raise ValueError(f"the search in {sweep_dir} found no {rank} point")
    found = full[found_point]
    return GridComparison(
        str(rank),
        best.point,
        best.tokens_per_s_per_gpu or 0.0,
        found.point,
        found.tokens_per_s_per_gpu or 0.0,
        found.point == best.point or _overlap(found, best.low, best.high),
        state.used_node_seconds(str(rank)),
        sum(m.node_seconds or 0.0 for m in mine),
    )
