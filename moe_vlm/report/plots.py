"""Report plots (matplotlib, PNG), each built from the results table of ``moe_vlm.report.build``.

Every builder returns a ``Plot``: the figure plus the exact series drawn, so tests and the report
can read the plotted numbers instead of trusting a PNG. Callers pass rows of ONE data class
(mock, or synthetic/real): mock and real never share a plot, as they never share a ranking.

A plot names at most ``top`` configurations (lines, bars, point labels), the best by effective
tokens/s/GPU; the rest become one legend entry or bar, "+ K more, median X", so a 1,000-run
sweep draws a readable chart (and does not spend seconds laying out 1,000 labels).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.axes import Axes

# The Figure class alone, not pyplot: no backend or global figure registry to set up (faster to
# import, nothing to close, no display needed on a login node); savefig picks Agg for PNG.
from matplotlib.figure import Figure

Point = tuple[float, float]
THROUGHPUT = "effective_tokens_per_s_per_gpu"
MEMORY = "peak_memory_gib"
SHARES = {
    "vision_encoder": "share_vision_encoder",
    "projector": "share_projector",
    "decoder": "share_decoder",
}
PLOT_TOP = 10  # configurations a plot names: one colour each in matplotlib's default cycle (tab10)


@dataclass
class Plot:
    name: str  # file stem
    figure: Figure
    series: dict[str, list[Point]]  # legend label -> (x, y) points as drawn
    notes: list[str] = field(default_factory=list)  # legend-only entries (e.g. why no GPU memory line)
    categories: list[str] = field(default_factory=list)  # configs named: bar at y = index, or point labels
    omitted: int = 0  # configurations summarised in a note instead of drawn (or labelled) one by one

    def save(self, path: Path) -> None:
        """Write the PNG to `path` (the report writes it atomically)."""
        self.figure.savefig(path, format="png", dpi=110, bbox_inches="tight")


def _figure(width: float, height: float) -> tuple[Figure, Axes]:
    figure = Figure(figsize=(width, height))
    return figure, figure.subplots()


def _records(rows: pd.DataFrame) -> list[dict[str, Any]]:
    """Plain dicts: indexing a pandas row costs microseconds, times every run of a big sweep."""
    return rows.to_dict("records")


def best_first(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows by effective tokens/s/GPU, best first; a stable sort keeps the caller's order for ties."""
    return rows.sort_values(THROUGHPUT, ascending=False, na_position="last", kind="stable")


def rest_note(count: int, values: list[float], unit: str, what: str = "median") -> str:
    """The legend entry that stands for the configurations a plot does not draw one by one."""
    if not values:
        return f"+ {count} more"
    middle = statistics.median(values) if what == "median" else statistics.fmean(values)
    return f"+ {count} more, {what} {middle:,.{0 if abs(middle) >= 100 else 2}f} {unit}"


def _legend_note(axes: Axes, note: str) -> None:
    axes.plot([], [], linestyle="none", label=note)


def label_of(row: Mapping[str, Any], knobs: list[str]) -> str:
    return " ".join(f"{knob}={row[knob]}" for knob in knobs) if knobs else str(row.get("run", ""))


def _title(base: str, mock: bool) -> str:
    return f"{base}\nMOCK data (image-free): not a VLM performance proxy" if mock else base


def _lines_over_mbs(
    records: list[dict[str, Any]], value: str, group_knobs: list[str]
) -> dict[str, list[Point]]:
    """One line per setting of group_knobs; at equal MBS the best (max) value is kept."""
    series: dict[str, list[Point]] = {}
    for row in records:
        y = row[value]
        if pd.isna(y):  # not measured
            continue
        label = label_of(row, group_knobs) or "all"
        series.setdefault(label, []).append((float(row["mbs"]), float(y)))
    for label, points in series.items():
        best: dict[float, float] = {}
        for x, y in points:
            best[x] = max(y, best.get(x, y))
        series[label] = sorted(best.items())
    return dict(sorted(series.items()))


def _named_lines(records: list[dict[str, Any]], group_knobs: list[str], top: int) -> list[str]:
    """The `top` line labels whose best point has the most effective tokens/s/GPU.

    Throughput picks the lines of the memory plot too, so both plots name the same configurations.
    """
    throughput = _lines_over_mbs(records, THROUGHPUT, group_knobs)
    return sorted(throughput, key=lambda label: -max(y for _, y in throughput[label]))[:top]


def _draw_lines(
    axes: Axes, series: dict[str, list[Point]], named: list[str], unit: str
) -> tuple[dict[str, list[Point]], list[str], int]:
    """Draw the named lines; the rest become one legend entry with the median of their best points."""
    drawn = {label: points for label, points in series.items() if label in named}
    for label, points in drawn.items():
        axes.plot([x for x, _ in points], [y for _, y in points], marker="o", label=label)
    rest = [max(y for _, y in points) for label, points in series.items() if label not in drawn]
    if not rest:
        return drawn, [], 0
    note = rest_note(len(rest), rest, unit)
    _legend_note(axes, note)
    return drawn, [note], len(rest)


def _line_legend(axes: Axes) -> None:
    """Inside the axes for a few lines; beside them for more, where it cannot cover the data."""
    if len(axes.get_legend_handles_labels()[1]) <= 4:
        axes.legend(fontsize=8)
    else:
        axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def _mbs_axes(axes: Axes, rows: pd.DataFrame) -> None:
    """Integer MBS ticks, and a y axis from zero: a truncated axis turns 5% into a cliff."""
    axes.set_xticks(sorted({int(m) for m in rows["mbs"].dropna()}))
    axes.set_xlabel("micro-batch size (MBS)")
    axes.set_ylim(0, max(axes.get_ylim()[1], axes.dataLim.ymax * 1.08))


def _group_knobs(varying: list[str], first: str) -> list[str]:
    """The knob that names the lines first, then every other varying knob except MBS (the x axis)."""
    return [first] + [k for k in varying if k not in (first, "mbs")]


def throughput_vs_mbs(
    rows: pd.DataFrame, varying: list[str], mock: bool = False, top: int = PLOT_TOP
) -> Plot:
    figure, axes = _figure(7, 4.5)
    records = _records(rows)
    group = _group_knobs(varying, "recompute")
    series, notes, omitted = _draw_lines(
        axes,
        _lines_over_mbs(records, THROUGHPUT, group),
        _named_lines(records, group, top),
        "tok/s/GPU (each line's best)",
    )
    _mbs_axes(axes, rows)
    axes.set_ylabel("effective (real) tokens/s/GPU")
    axes.set_title(_title("Throughput vs MBS per recompute setting", mock))
    axes.grid(alpha=0.3)
    _line_legend(axes)
    return Plot("throughput_vs_mbs", figure, series, notes, omitted=omitted)


def memory_vs_mbs(rows: pd.DataFrame, varying: list[str], mock: bool = False, top: int = PLOT_TOP) -> Plot:
    figure, axes = _figure(7, 4.5)
    records = _records(rows)
    group = _group_knobs(varying, "recompute")
    series, notes, omitted = _draw_lines(
        axes,
        _lines_over_mbs(records, MEMORY, group),
        _named_lines(records, group, top),
        "GiB (each line's max)",
    )
    limits = rows[["gpu", "gpu_memory_gib"]].drop_duplicates()
    for limit in _records(limits):
        if limit["gpu_memory_gib"] and float(limit["gpu_memory_gib"]) > 0:
            line_label = f"GPU memory {float(limit['gpu_memory_gib']):g} GiB ({limit['gpu']})"
            axes.axhline(float(limit["gpu_memory_gib"]), color="red", linestyle="--", label=line_label)
            series[line_label] = [
                (float(x), float(limit["gpu_memory_gib"])) for x in sorted(set(rows["mbs"]))
            ]
        else:
            note = f"no GPU memory line: {limit['gpu']} run (peak is the process RSS)"
            _legend_note(axes, note)
            notes.append(note)
    kinds = sorted({str(k) for k in rows.get("memory_kind", pd.Series(dtype=str)).dropna()})
    axes.set_ylabel("peak memory per GPU (GiB)" + (f" [{', '.join(kinds)}]" if kinds else ""))
    _mbs_axes(axes, rows)
    axes.set_title(_title("Peak memory vs MBS", mock))
    axes.grid(alpha=0.3)
    _line_legend(axes)
    return Plot("memory_vs_mbs", figure, series, notes, omitted=omitted)


def component_shares(rows: pd.DataFrame, varying: list[str], mock: bool = False, top: int = PLOT_TOP) -> Plot:
    """Stacked horizontal bars: vision encoder / projector / decoder share of component time.

    One bar per config for the best `top` configs, then one bar of the rest's mean shares (a
    mean, not a median, so the three parts of that bar still add up to the whole).
    """
    measured = _records(best_first(rows.dropna(subset=list(SHARES.values()))))
    named, rest = measured[:top], measured[top:]
    labels = [label_of(row, varying) for row in named]
    bars = {module: [float(row[column]) for row in named] for module, column in SHARES.items()}
    notes = []
    if rest:
        labels.append(f"+ {len(rest)} more (mean)")
        for module, column in SHARES.items():
            bars[module].append(statistics.fmean(float(row[column]) for row in rest))
        notes.append(
            f"+ {len(rest)} more configs drawn as one bar of their mean shares "
            f"(vision encoder {bars['vision_encoder'][-1]:.0%})"
        )
    figure, axes = _figure(7, 0.5 + 0.45 * max(len(labels), 1))
    series: dict[str, list[Point]] = {}
    left = [0.0] * len(labels)
    for module, shares in bars.items():
        axes.barh(range(len(labels)), shares, left=left, label=module)
        series[module] = [(float(i), share) for i, share in enumerate(shares)]
        left = [a + b for a, b in zip(left, shares, strict=True)]
    axes.set_yticks(range(len(labels)), labels, fontsize=8)
    axes.invert_yaxis()  # best config on top, the summary bar last
    axes.set_xlim(0, 1)
    axes.set_xlabel("share of measured component time (forward + backward)")
    axes.set_title(_title("Where the time goes, per config", mock))
    axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return Plot("component_shares", figure, series, notes, categories=labels, omitted=len(rest))


def pareto_front(points: list[Point]) -> list[Point]:
    """Points (memory, throughput) that no other point beats on both: less memory AND more throughput."""
    front: list[Point] = []
    for memory, throughput in sorted(points, key=lambda p: (p[0], -p[1])):
        if not front or throughput > front[-1][1]:
            front.append((memory, throughput))
    return front


def spread(row: Mapping[str, Any]) -> tuple[float, float] | None:
    """The effective tokens/s/GPU a step at the run's p90 and at its p10 step time would give:
    the point's throughput is over its mean step time, so these are throughput x mean / p90 and x
    mean / p10 (equal work per step). None where the run recorded no step-time percentiles."""
    times = [row.get(f"step_time_{q}_s") for q in ("mean", "p10", "p90")]
    if any(v is None or pd.isna(v) or v <= 0 for v in times):
        return None
    mean, p10, p90 = (float(v) for v in times if v is not None)
    value = float(row[THROUGHPUT])
    return value * mean / p90, value * mean / p10


def throughput_vs_memory(
    rows: pd.DataFrame, varying: list[str], mock: bool = False, top: int = PLOT_TOP
) -> Plot:
    """Every config as a point (a cloud stays readable); the best `top` and the front numbered.

    A point carries its rank by effective tokens/s/GPU; the config of each number is listed beside
    the axes (full labels on the points overlap as soon as the best configs sit close together).
    Each point has a bar from its p90-step to its p10-step throughput (`spread`): CPU points often
    differ by less than their own noise. The axes fit the points and bars, not zero: this plot
    compares configs with each other, and the bars show what a difference is worth.
    """
    measured = _records(best_first(rows.dropna(subset=[THROUGHPUT, MEMORY])))
    points = [(float(row[MEMORY]), float(row[THROUGHPUT])) for row in measured]
    front = pareto_front(points)
    unnamed_front = set(front)  # a front point is numbered once, whatever runs share it
    figure, axes = _figure(7, 4.5)
    axes.scatter([m for m, _ in points], [t for _, t in points], color="tab:blue", label="configs", s=12)
    spreads = [(point, spread(row)) for row, point in zip(measured, points, strict=True)]
    bars = [(point, bar) for point, bar in spreads if bar is not None]
    if bars:
        # Each bar is drawn about its own middle, not about the point: in a short run one slow step
        # can pull the mean step time above p90, which puts the point outside its own range.
        axes.errorbar(
            [m for (m, _), _ in bars],
            [(low + high) / 2 for _, (low, high) in bars],
            yerr=[(high - low) / 2 for _, (low, high) in bars],
            fmt="none",
            ecolor="tab:blue",
            alpha=0.5,
            capsize=2,
            label="p10-p90 step time",
        )
    labelled: list[str] = []
    unlabelled: list[float] = []
    numbers: dict[Point, list[int]] = {}  # each numbered point's ranks: runs may share a point
    for rank, (row, point) in enumerate(zip(measured, points, strict=True), start=1):
        if rank <= top or point in unnamed_front:
            unnamed_front.discard(point)
            labelled.append(f"{rank}: {label_of(row, varying)}")
            numbers.setdefault(point, []).append(rank)
        else:
            unlabelled.append(point[1])
    for point, ranks in numbers.items():
        text = str(ranks[0]) if len(ranks) == 1 else f"{ranks[0]}-{ranks[-1]}"
        if len(ranks) > 1 and ranks != list(range(ranks[0], ranks[-1] + 1)):
            text = ",".join(map(str, ranks))
        axes.annotate(text, point, xytext=(6, 4), textcoords="offset points", fontsize=7)
    if labelled:
        key = "\n".join(["rank by eff tok/s/GPU:", *labelled])
        axes.text(1.02, 1.0, key, transform=axes.transAxes, va="top", fontsize=7)
    axes.plot(
        [m for m, _ in front],
        [t for _, t in front],
        color="tab:red",
        marker="*",
        markersize=12,
        label="Pareto front",
    )
    notes = []
    if unlabelled:
        notes.append(rest_note(len(unlabelled), unlabelled, "tok/s/GPU") + " (unlabelled points)")
        _legend_note(axes, notes[-1])
    axes.set_xlabel("peak memory per GPU (GiB)")
    axes.set_ylabel("effective (real) tokens/s/GPU")
    # Fitted to the data (matplotlib's autoscale) with room for the rank numbers at the edges.
    axes.margins(x=0.08, y=0.1)
    axes.set_title(_title("Throughput vs memory", mock))
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, loc="best")
    series = {
        "configs": points,
        "pareto_front": front,
        # Each bar's ends, (memory, throughput at p90 step time) and (memory, at p10).
        "p90_step": [(m, low) for (m, _), (low, _) in bars],
        "p10_step": [(m, high) for (m, _), (_, high) in bars],
    }
    return Plot("throughput_vs_memory", figure, series, notes, categories=labelled, omitted=len(unlabelled))


def all_plots(rows: pd.DataFrame, varying: list[str], mock: bool = False, top: int = PLOT_TOP) -> list[Plot]:
    return [
        throughput_vs_mbs(rows, varying, mock, top),
        memory_vs_mbs(rows, varying, mock, top),
        component_shares(rows, varying, mock, top),
        throughput_vs_memory(rows, varying, mock, top),
    ]
