"""Successive halving's plan: its settings, each rung's length, the points each rung keeps at
most, and the search's cost against the grid's, decided before anything is submitted.

A schedule that cannot save is reshaped or refused here (`schedule`): the rungs collapse where
every point already reaches its train_iters (a later rung would rerun the same length), and a
plan whose worst case (each rung promoting its cap, ties included) costs the grid's node-steps or
more is refused, one line naming the setting and a fix. The search's state and decisions are
moe_vlm/launch/halving.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from moe_vlm.base.errors import BadInput

# The first rung's steady steps at least: the p10 and p90 of n steps interpolate between the
# sorted steps (metrics._percentile); from 10 steps on, the slowest step weighs 10 % in p90.
MIN_FIRST_STEPS = 10
SEARCH_HELP = "Fix: hydra.sweeper.search=grid (every point to the end) or hydra.sweeper.search=halving"


class Search(StrEnum):
    """hydra.sweeper.search."""

    grid = "grid"
    halving = "halving"


def search_of(value: Any) -> Search:
    try:
        return Search(str(value))
    except ValueError:
        raise BadInput(
            f"hydra.sweeper.search={value}: allowed values are grid, halving. {SEARCH_HELP}"
        ) from None


@dataclass(frozen=True)
class HalvingSettings:
    """hydra.sweeper.halving.*: eta (keep the top 1/eta per rung), first_steps (steady steps of
    the first rung), rungs (the last one is the full train_iters), tie_factor (the points tied
    with the cut go on too, but a rung promotes at most tie_factor x the top 1/eta of a class:
    the search's cost stays bounded by its plan), poll_s (seconds between looks at the rung's
    jobs while it runs)."""

    eta: int = 3
    first_steps: int = MIN_FIRST_STEPS
    rungs: int = 3
    tie_factor: float = 2.0
    poll_s: float = 15.0

    def checked(self) -> HalvingSettings:
        checks = (
            ("eta", self.eta, 2, 3, "keep the top 1/eta: eta=2 halves, eta=3 keeps a third"),
            (
                "first_steps",
                self.first_steps,
                MIN_FIRST_STEPS,
                MIN_FIRST_STEPS,
                "steady steps of the first rung: over fewer, the p10-p90 range that decides a tie "
                "is near the min-max, and one slow step ties every point",
            ),
            ("rungs", self.rungs, 2, 3, "the last rung is the full train_iters"),
        )
        for name, value, low, example, what in checks:
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise BadInput(
                    f"hydra.sweeper.halving.{name}={value}: must be an integer >= {low} ({what}). "
                    f"Fix: e.g. hydra.sweeper.halving.{name}={example}"
                )
        if (
            isinstance(self.tie_factor, bool)
            or not isinstance(self.tie_factor, int | float)
            or self.tie_factor < 1
        ):
            raise BadInput(
                f"hydra.sweeper.halving.tie_factor={self.tie_factor}: must be a number >= 1 (a rung "
                "promotes at most tie_factor x the top 1/eta of a class, ties included; 1 = no room "
                "for ties). Fix: e.g. hydra.sweeper.halving.tie_factor=2"
            )
        if not self.poll_s > 0:
            raise BadInput(f"hydra.sweeper.halving.poll_s={self.poll_s}: must be > 0. Fix: e.g. 15")
        return self

    def keep(self, finished: int) -> int:
        """The top 1/eta of `finished` points of a class (at least one)."""
        return max(1, math.ceil(finished / self.eta)) if finished else 0

    def cap(self, finished: int) -> int:
        """The most points of a class a rung promotes, ties with the cut included."""
        keep = self.keep(finished)
        return min(finished, max(keep, math.ceil(self.tie_factor * keep - 1e-9)))

    @classmethod
    def of(cls, raw: Mapping[str, Any] | None) -> HalvingSettings:
        raw = dict(raw or {})
        unknown = sorted(set(raw) - {f for f in cls.__dataclass_fields__})
        if unknown:
            raise BadInput(
                f"hydra.sweeper.halving.{unknown[0]}: unknown; allowed keys are eta, first_steps, rungs, "
                "tie_factor, poll_s. Fix: e.g. hydra.sweeper.halving.eta=3"
            )
        return cls(**raw).checked()

    def same_search(self, other: HalvingSettings) -> bool:
        mine = (self.eta, self.first_steps, self.rungs, self.tie_factor)
        return mine == (other.eta, other.first_steps, other.rungs, other.tie_factor)


def rung_steps(settings: HalvingSettings, rung: int, warmup_steps: int, train_iters: int) -> int:
    """The train_iters a point runs in rung `rung` (0-based): its warm-up plus first_steps x eta^rung
    steady steps, never more than its own train_iters; the last rung is its train_iters."""
    if rung >= settings.rungs - 1:
        return train_iters
    return min(train_iters, warmup_steps + settings.first_steps * settings.eta**rung)


def survivors_planned(settings: HalvingSettings, points: int) -> list[int]:
    """Points per rung at most: each rung promotes at most its cap (the top 1/eta and the ties
    with the cut, tie_factor x the top 1/eta at most), so this bound holds whatever is measured."""
    counts = [points]
    for _ in range(settings.rungs - 1):
        counts.append(settings.cap(counts[-1]))
    return counts


@dataclass(frozen=True)
class PlanPoint:
    """What the rung plan needs of a point: its steps, its nodes and the class it is ranked in."""

    train_iters: int
    warmup_steps: int
    nodes: int
    rank_class: str = "ranked"
    step_s: float | None = None  # the predicted step time (moe_vlm/predict), when there is one

    def lengths(self, settings: HalvingSettings) -> list[int]:
        """The train_iters this point runs in each rung."""
        return [rung_steps(settings, r, self.warmup_steps, self.train_iters) for r in range(settings.rungs)]

    def rung_costs(self, settings: HalvingSettings, per_step: float = 1.0) -> list[float]:
        """Nodes x steps x per_step for each rung; 0 where the rung's length is the one before's: a
        rung that already reached the point's train_iters ran the grid's own run, which the next
        rung finds completed (same identity) and does not rerun."""
        lengths = self.lengths(settings)
        return [
            0.0 if r and steps == lengths[r - 1] else self.nodes * steps * per_step
            for r, steps in enumerate(lengths)
        ]


@dataclass(frozen=True)
class RungPlan:
    rung: int  # 0-based
    points: int  # at most (the cap of every class, summed)
    steps: tuple[int, int]  # min, max train_iters of a point in this rung


def _by_class(planned: Sequence[PlanPoint]) -> dict[str, list[PlanPoint]]:
    out: dict[str, list[PlanPoint]] = {}
    for point in planned:
        out.setdefault(point.rank_class, []).append(point)
    return out


def plan(settings: HalvingSettings, planned: Sequence[PlanPoint]) -> list[RungPlan]:
    counts = [0] * settings.rungs
    for members in _by_class(planned).values():
        for rung, count in enumerate(survivors_planned(settings, len(members))):
            counts[rung] += count
    out = []
    for rung, count in enumerate(counts):
        steps = [rung_steps(settings, rung, p.warmup_steps, p.train_iters) for p in planned] or [0]
        out.append(RungPlan(rung, count, (min(steps), max(steps))))
    return out


@dataclass(frozen=True)
class NodeSteps:
    """The plan's cost in node-steps: the grid's, and the search's at most (each class's most
    expensive points surviving up to every rung's cap, ties included, a length run once)."""

    grid: int
    worst: int

    @property
    def ratio(self) -> float:
        return self.worst / self.grid if self.grid else 0.0


def _worst(settings: HalvingSettings, planned: Sequence[PlanPoint], per_step: Any) -> float:
    worst = 0.0
    for members in _by_class(planned).values():
        counts = survivors_planned(settings, len(members))
        per_point = [p.rung_costs(settings, per_step(p)) for p in members]
        for rung, count in enumerate(counts):
            worst += sum(sorted((cost[rung] for cost in per_point), reverse=True)[:count])
    return worst


def node_steps(settings: HalvingSettings, planned: Sequence[PlanPoint]) -> NodeSteps:
    grid = sum(p.nodes * p.train_iters for p in planned)
    return NodeSteps(grid, round(_worst(settings, planned, lambda p: 1.0)))


def predicted_node_seconds(
    settings: HalvingSettings, planned: Sequence[PlanPoint]
) -> tuple[float, float] | None:
    """(grid, halving at most) node-seconds at each point's predicted step time, start-up not
    counted; None when a point has no prediction."""
    if not planned or any(not p.step_s for p in planned):
        return None
    grid = sum(p.nodes * p.train_iters * (p.step_s or 0.0) for p in planned)
    return grid, _worst(settings, planned, lambda p: p.step_s)


def collapsed_rungs(settings: HalvingSettings, planned: Sequence[PlanPoint]) -> int:
    """The rungs the search needs: the first rung at which every point already runs its full
    train_iters is the last (a later rung would only repeat that length)."""
    for rung in range(settings.rungs - 1):
        if all(rung_steps(settings, rung, p.warmup_steps, p.train_iters) >= p.train_iters for p in planned):
            return rung + 1
    return settings.rungs


def _cost_line(settings: HalvingSettings, planned: Sequence[PlanPoint]) -> str:
    cost = node_steps(settings, planned)
    seconds = predicted_node_seconds(settings, planned)
    line = f"at most {cost.worst} node-steps against the grid's {cost.grid} ({cost.ratio:.0%})"
    if seconds is not None:
        grid_s, worst_s = seconds
        line += f", {worst_s:,.0f} predicted node-seconds against {grid_s:,.0f} ({worst_s / grid_s:.0%})"
    return line


def _saves(settings: HalvingSettings, planned: Sequence[PlanPoint]) -> bool:
    seconds = predicted_node_seconds(settings, planned)
    if seconds is not None and seconds[1] >= seconds[0]:
        return False
    cost = node_steps(settings, planned)
    return cost.worst < cost.grid


def schedule(settings: HalvingSettings, planned: Sequence[PlanPoint]) -> tuple[HalvingSettings, list[str]]:
    """The schedule the search runs, before anything is submitted, and what was reshaped. Rungs
    that would repeat the full length collapse; when the plan's worst case (every rung promoting
    its cap, ties included) would cost the grid's node-steps (or predicted node-seconds) or more,
    fewer rungs are tried; when none saves, BadInput: halving would spend more than the grid."""
    if not planned:
        return settings, []
    notes = []
    rungs = collapsed_rungs(settings, planned)
    longest = max(p.train_iters for p in planned)
    if rungs == 1:
        raise BadInput(
            f"hydra.sweeper.search=halving: the first rung (warm-up + first_steps={settings.first_steps} steady "
            f"steps) already runs every point's full train_iters (at most {longest}): it would be the grid plus "
            f"nothing to decide. Allowed: halving when the first rung is shorter than train_iters. "
            f"{SEARCH_HELP.replace(' or hydra.sweeper.search=halving', '')}, or a longer train_iters"
        )
    if rungs < settings.rungs:
        notes.append(
            f"rungs={settings.rungs} -> {rungs}: rung {rungs} already runs every point's full train_iters "
            f"(at most {longest}); a later rung would repeat that length"
        )
    shaped = replace(settings, rungs=rungs)
    if _saves(shaped, planned):
        return shaped, notes
    for fewer in range(rungs - 1, 1, -1):
        candidate = replace(settings, rungs=fewer)
        if _saves(candidate, planned):
            notes.append(
                f"rungs={rungs} -> {fewer}: with {rungs} rung(s) the plan costs {_cost_line(shaped, planned)}; "
                f"with {fewer}, {_cost_line(candidate, planned)}"
            )
            return candidate, notes
    collapsed = f" ({rungs} once collapsed)" if rungs < settings.rungs else ""
    raise BadInput(
        f"hydra.sweeper.search=halving cannot save on these {len(planned)} point(s) (train_iters at most "
        f"{longest}): eta={settings.eta}, rungs={settings.rungs}{collapsed} and ties up to tie_factor={settings.tie_factor:g}x "
        f"the top 1/eta cost {_cost_line(shaped, planned)}. Allowed: halving where its worst case is under "
        "the grid's. Fix: hydra.sweeper.search=grid, or a larger hydra.sweeper.halving.eta, a lower "
        ".tie_factor (1 = no ties beyond the top 1/eta), more points or a longer train_iters"
    )


def plan_text(settings: HalvingSettings, planned: Sequence[PlanPoint]) -> str:
    """What `dry_run=true` prints for `search=halving`: points and steps per rung, and node-steps
    (a dry run measures no step time: node-seconds scale with them at equal step time, start-up
    not counted) against the grid's."""
    if not planned:
        return "moe_vlm: halving: no valid point to search."
    rungs = plan(settings, planned)
    cost = node_steps(settings, planned)
    classes = _by_class(planned)
    lines = [
        f"moe_vlm: halving plan: {len(planned)} valid point(s), eta={settings.eta}, "
        f"{settings.rungs} rung(s), first rung {settings.first_steps} steady step(s) after each point's warm-up, "
        f"ties promoted up to {settings.tie_factor:g}x the top 1/eta"
        + (
            ""
            if len(classes) == 1
            else f"; ranked in {len(classes)} classes ({', '.join(sorted(classes))}), each halved alone"
        ),
        f"{'rung':>6}  {'points':>6}  steps per point",
    ]
    for r in rungs:
        low, high = r.steps
        steps = f"{low}" if low == high else f"{low}-{high}"
        last = " (full train_iters)" if r.rung == len(rungs) - 1 else ""
        at_most = "<=" if r.rung else "  "
        lines.append(f"{r.rung + 1:>6}  {at_most}{r.points:>4}  {steps}{last}")
    lines += [
        f"moe_vlm: node-steps (node-seconds at equal step time, start-up not counted): grid {cost.grid}; "
        f"halving at most {cost.worst} ({cost.ratio:.0%} of the grid): each rung promotes at most "
        f"{settings.tie_factor:g}x its top 1/eta, ties with the cut included; a length already run is not rerun.",
    ]
    seconds = predicted_node_seconds(settings, planned)
    if seconds is not None:
        grid_s, worst_s = seconds
        lines.append(
            f"moe_vlm: predicted node-seconds (each point's predicted step time, start-up not counted): grid "
            f"{grid_s:,.0f}; halving at most {worst_s:,.0f} ({worst_s / grid_s:.0%} of the grid)."
        )
    return "\n".join(lines)
