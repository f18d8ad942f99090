"""`moe-vlm report`'s section for a halving search: the ladder and the node-seconds it saved.

For every sweep directory among the report's runs that holds a search's state (halving.json,
moe_vlm/launch/halving.py): one row per point with what each rung measured and decided (effective
tokens/s/GPU, its place in its rank class, promoted / stopped / final, or why it failed), the
node-seconds the search used, and the full grid's node-seconds: measured where each point's
full-length run is in the sweep directory (the grid run there after the search), else
extrapolated (its last run plus its remaining steps at its mean steady step time).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from moe_vlm.launch.halving import (
    STATE_JSON,
    Decision,
    HalvingState,
    Verdict,
    full_length_node_seconds,
    grid_basis,
)


def state_dirs(run_dirs: Iterable[str]) -> list[Path]:
    """The sweep directories of these runs that hold a halving search's state."""
    found: dict[Path, None] = {}
    for run_dir in run_dirs:
        parent = Path(run_dir).parent
        if parent not in found and (parent / STATE_JSON).is_file():
            found[parent] = None
    return list(found)


def short_labels(labels: dict[str, str]) -> dict[str, str]:
    """Each point's overrides without those every point shares (the sweep's fixed settings)."""
    split = {point: label.split() for point, label in labels.items()}
    common = set.intersection(*(set(words) for words in split.values())) if split else set()
    return {
        point: " ".join(w for w in words if w not in common) or "(defaults)" for point, words in split.items()
    }


def _cell(verdict: Verdict | None) -> str:
    if verdict is None:
        return ""
    if verdict.place is None:  # failed or rejected in this rung
        return f"{verdict.decision}: {verdict.reason}"
    tokens = "-" if verdict.tokens_per_s_per_gpu is None else f"{verdict.tokens_per_s_per_gpu:,.1f}"
    return f"{tokens} (#{verdict.place}/{verdict.finished}) {verdict.decision}"


def ladder(state: HalvingState, sweep_dir: Path) -> list[str]:
    labels = short_labels(state.points)
    settings = state.settings
    header = ["point", *(f"rung {r.rung + 1} ({_steps(r.steps)} steps)" for r in state.rungs), "node-s"]
    rows = []

    def reached(point: str) -> tuple[int, float]:
        depth = max((r.rung for r in state.rungs if point in r.verdicts), default=-1)
        last = state.rungs[depth].verdicts[point] if depth >= 0 else None
        return depth, (last.tokens_per_s_per_gpu or 0.0) if last else 0.0

    for point in sorted(state.points, key=lambda p: (-reached(p)[0], -reached(p)[1], labels[p])):
        used = state.point_node_seconds(point)
        rows.append([labels[point], *(_cell(r.verdicts.get(point)) for r in state.rungs), f"{used:,.0f}"])
    lines = [
        "",
        f"## Halving search: {sweep_dir.name}",
        "",
        f"eta={settings.eta} (each rung keeps the top 1/eta of each rank class, and every point whose "
        f"p10-p90 range overlaps the last one kept, up to {settings.tie_factor:g}x the top 1/eta), "
        f"{settings.rungs} rung(s), the first with "
        f"{settings.first_steps} steady step(s) after the warm-up; figures: effective tokens/s/GPU "
        "over the rung's steady window (#place/finished in its class). The tables above hold every "
        "rung's run: its train_iters says which.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
    ]
    used = state.used_node_seconds()
    full = full_length_node_seconds(state, sweep_dir)
    grid, extrapolated = state.grid_estimate(full)
    decided = sum(r.decided for r in state.rungs)
    lines.append(f"- rungs decided: {decided} of {settings.rungs}.")
    for cls, (point, verdict) in sorted(state.best().items()):
        tokens = verdict.tokens_per_s_per_gpu
        lines.append(
            f"- best ({cls}): {labels[point]}: {'-' if tokens is None else f'{tokens:,.1f}'} effective tokens/s/GPU "
            f"(rung {max(r.rung for r in state.rungs if point in r.verdicts) + 1})."
        )
    if grid > 0:
        lines.append(
            f"- node-seconds: the search used {used:,.0f}; the full grid {'~' if extrapolated else ''}"
            f"{grid:,.0f} ({grid_basis(len(state.points), extrapolated)}): saved "
            f"{'~' if extrapolated else ''}{grid - used:,.0f} ({1 - used / grid:.0%})."
        )
    lines += [f"- ties over the cap: {line}." for line in state.overflows()]
    stopped = sum(
        1
        for r in state.rungs
        for v in r.verdicts.values()
        if v.decision is Decision.stopped and v.place is None
    )
    if stopped:
        lines.append(
            f"- {stopped} run(s) failed or were rejected in a rung: stopped there, their records keep why."
        )
    return lines


def _steps(steps: dict[str, int]) -> str:
    values = sorted(set(steps.values()))
    if not values:
        return "-"
    return str(values[0]) if len(values) == 1 else f"{values[0]}-{values[-1]}"


def section(run_dirs: Iterable[str]) -> list[str]:
    """Report lines for every halving search among these runs' sweep directories ([] when none)."""
    lines: list[str] = []
    for sweep_dir in state_dirs(run_dirs):
        state = HalvingState.read(sweep_dir)
        if state is not None:
            lines += ladder(state, sweep_dir)
    return lines
