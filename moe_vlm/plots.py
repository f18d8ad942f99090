"""Report plots (matplotlib Agg, PNG), each built from the results table of ``moe_vlm.report``.

Every builder returns a ``Plot``: the figure plus the exact series drawn, so tests and the report
can read the plotted numbers instead of trusting a PNG. Callers pass rows of ONE data class
(mock, or synthetic/real): mock and real never share a plot, as they never share a ranking.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on cluster login nodes or CI

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

Point = tuple[float, float]
THROUGHPUT = "effective_tokens_per_s_per_gpu"
MEMORY = "peak_memory_gib"
SHARES = {
    "vision_encoder": "share_vision_encoder",
    "projector": "share_projector",
    "decoder": "share_decoder",
}


@dataclass
class Plot:
    name: str  # file stem
    figure: Figure
    series: dict[str, list[Point]]  # legend label -> (x, y) points as drawn
    notes: list[str] = field(default_factory=list)  # legend-only entries (e.g. why no GPU memory line)
    categories: list[str] = field(default_factory=list)  # bar charts: the config drawn at y = index

    def save(self, path: Path) -> None:
        """Write the PNG to `path` and close the figure (the report writes it atomically)."""
        try:
            self.figure.savefig(path, format="png", dpi=110, bbox_inches="tight")
        finally:
            plt.close(self.figure)


def label_of(row: pd.Series, knobs: list[str]) -> str:
    return " ".join(f"{knob}={row[knob]}" for knob in knobs) if knobs else str(row.get("run", ""))


def _title(base: str, mock: bool) -> str:
    return f"{base}\nMOCK data (image-free): not a VLM performance proxy" if mock else base


def _lines_over_mbs(rows: pd.DataFrame, value: str, group_knobs: list[str]) -> dict[str, list[Point]]:
    """One line per setting of group_knobs; at equal MBS the best (max) value is kept."""
    series: dict[str, list[Point]] = {}
    for _, row in rows.dropna(subset=[value]).iterrows():
        label = label_of(row, group_knobs) or "all"
        series.setdefault(label, []).append((float(row["mbs"]), float(row[value])))
    for label, points in series.items():
        best: dict[float, float] = {}
        for x, y in points:
            best[x] = max(y, best.get(x, y))
        series[label] = sorted(best.items())
    return dict(sorted(series.items()))


def _mbs_axes(axes: Axes, rows: pd.DataFrame) -> None:
    """Integer MBS ticks, and a y axis from zero: a truncated axis turns 5% into a cliff."""
    axes.set_xticks(sorted({int(m) for m in rows["mbs"].dropna()}))
    axes.set_xlabel("micro-batch size (MBS)")
    axes.set_ylim(0, max(axes.get_ylim()[1], axes.dataLim.ymax * 1.08))


def _group_knobs(varying: list[str], first: str) -> list[str]:
    """The knob that names the lines first, then every other varying knob except MBS (the x axis)."""
    return [first] + [k for k in varying if k not in (first, "mbs")]


def throughput_vs_mbs(rows: pd.DataFrame, varying: list[str], mock: bool = False) -> Plot:
    figure, axes = plt.subplots(figsize=(7, 4.5))
    series = _lines_over_mbs(rows, THROUGHPUT, _group_knobs(varying, "recompute"))
    for label, points in series.items():
        axes.plot([x for x, _ in points], [y for _, y in points], marker="o", label=label)
    _mbs_axes(axes, rows)
    axes.set_ylabel("effective (real) tokens/s/GPU")
    axes.set_title(_title("Throughput vs MBS per recompute setting", mock))
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    return Plot("throughput_vs_mbs", figure, series)


def memory_vs_mbs(rows: pd.DataFrame, varying: list[str], mock: bool = False) -> Plot:
    figure, axes = plt.subplots(figsize=(7, 4.5))
    series = _lines_over_mbs(rows, MEMORY, _group_knobs(varying, "recompute"))
    for label, points in series.items():
        axes.plot([x for x, _ in points], [y for _, y in points], marker="o", label=label)
    notes: list[str] = []
    limits = rows[["gpu", "gpu_memory_gib"]].drop_duplicates()
    for _, limit in limits.iterrows():
        if limit["gpu_memory_gib"] and float(limit["gpu_memory_gib"]) > 0:
            line_label = f"GPU memory {float(limit['gpu_memory_gib']):g} GiB ({limit['gpu']})"
            axes.axhline(float(limit["gpu_memory_gib"]), color="red", linestyle="--", label=line_label)
            series[line_label] = [
                (float(x), float(limit["gpu_memory_gib"])) for x in sorted(set(rows["mbs"]))
            ]
        else:
            note = f"no GPU memory line: {limit['gpu']} run (peak is the process RSS)"
            axes.plot([], [], linestyle="none", label=note)
            notes.append(note)
    kinds = sorted({str(k) for k in rows.get("memory_kind", pd.Series(dtype=str)).dropna()})
    axes.set_ylabel("peak memory per GPU (GiB)" + (f" [{', '.join(kinds)}]" if kinds else ""))
    _mbs_axes(axes, rows)
    axes.set_title(_title("Peak memory vs MBS", mock))
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    return Plot("memory_vs_mbs", figure, series, notes)


def component_shares(rows: pd.DataFrame, varying: list[str], mock: bool = False) -> Plot:
    """Stacked horizontal bars: vision encoder / projector / decoder share of component time."""
    measured = rows.dropna(subset=list(SHARES.values()))
    labels = [label_of(row, varying) for _, row in measured.iterrows()]
    figure, axes = plt.subplots(figsize=(7, 0.5 + 0.45 * max(len(labels), 1)))
    series: dict[str, list[Point]] = {}
    left = [0.0] * len(labels)
    for module, column in SHARES.items():
        shares = [float(v) for v in measured[column]]
        axes.barh(range(len(labels)), shares, left=left, label=module)
        series[module] = [(float(i), share) for i, share in enumerate(shares)]
        left = [a + b for a, b in zip(left, shares, strict=True)]
    axes.set_yticks(range(len(labels)), labels, fontsize=8)
    axes.set_xlim(0, 1)
    axes.set_xlabel("share of measured component time (forward + backward)")
    axes.set_title(_title("Where the time goes, per config", mock))
    axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return Plot("component_shares", figure, series, categories=labels)


def pareto_front(points: list[Point]) -> list[Point]:
    """Points (memory, throughput) that no other point beats on both: less memory AND more throughput."""
    front: list[Point] = []
    for memory, throughput in sorted(points, key=lambda p: (p[0], -p[1])):
        if not front or throughput > front[-1][1]:
            front.append((memory, throughput))
    return front


def throughput_vs_memory(rows: pd.DataFrame, varying: list[str], mock: bool = False) -> Plot:
    measured = rows.dropna(subset=[THROUGHPUT, MEMORY])
    points = [(float(row[MEMORY]), float(row[THROUGHPUT])) for _, row in measured.iterrows()]
    front = pareto_front(points)
    figure, axes = plt.subplots(figsize=(7, 4.5))
    axes.scatter([m for m, _ in points], [t for _, t in points], color="tab:blue", label="configs")
    for (_, row), (memory, throughput) in zip(measured.iterrows(), points, strict=True):
        axes.annotate(label_of(row, varying), (memory, throughput), fontsize=6, alpha=0.7)
    axes.plot(
        [m for m, _ in front],
        [t for _, t in front],
        color="tab:red",
        marker="*",
        markersize=12,
        label="Pareto front",
    )
    axes.set_xlabel("peak memory per GPU (GiB)")
    axes.set_ylabel("effective (real) tokens/s/GPU")
    axes.set_ylim(bottom=0)
    axes.set_xlim(left=0)
    axes.set_title(_title("Throughput vs memory", mock))
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    return Plot("throughput_vs_memory", figure, {"configs": points, "pareto_front": front})


def all_plots(rows: pd.DataFrame, varying: list[str], mock: bool = False) -> list[Plot]:
    return [
        throughput_vs_mbs(rows, varying, mock),
        memory_vs_mbs(rows, varying, mock),
        component_shares(rows, varying, mock),
        throughput_vs_memory(rows, varying, mock),
    ]
