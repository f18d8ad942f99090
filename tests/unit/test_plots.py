"""Reports at scale: over 1,000 runs each plot draws the best few configs and summarises the rest,
and --top limits the ranked tables. The numbers are read from the figures (artists), not pixels.

The 1,000 run.json files are one record written as a run writes it (record.base_record +
metrics.summarize, via test_report.write_run), copied with write_json_atomic and edited so that
run i has effective throughput 1000 + i tokens/s/GPU (a strict ranking: run 999 is the best),
GBS 64 x (i // 4 + 1) (250 lines over MBS) and MBS 2 ** (i % 4).
"""

from __future__ import annotations

import copy
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.collections import PathCollection
from matplotlib.container import ErrorbarContainer
from matplotlib.patches import Rectangle
from matplotlib.text import Annotation

from moe_vlm.base.files import RUN_JSON, write_json_atomic
from moe_vlm.report import build as report
from moe_vlm.report import markdown as report_format
from moe_vlm.report import plots
from moe_vlm.report import table as report_table
from tests.unit.test_report import GB200, run_report, section, table_rows, write_run

N_RUNS = 1000
TOP = plots.PLOT_TOP


def throughput(index: int) -> float:
    return 1000.0 + index


def vision_share(index: int) -> float:
    return 0.1 + 0.5 * (index % 7) / 6


@pytest.fixture(scope="module")
def thousand(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("thousand")
    template = write_run(tmp_path_factory.mktemp("template"), (*GB200, "data=synthetic"), 4.0,
                         sequences_per_rank=64, components_s={"vision_encoder": 1.0, "projector": 0.1,
                                                              "decoder": 2.5})  # fmt: skip
    for index in range(N_RUNS):
        record: dict[str, Any] = copy.deepcopy(template)
        group, power = divmod(index, 4)
        record["spec"]["gbs"] = 64 * (group + 1)
        record["spec"]["mbs"] = 2**power
        summary = record["summary"]
        summary["effective_tokens_per_s_per_gpu"] = throughput(index)
        summary["peak_memory_gib"] = 20.0 + (index * 37) % 150
        vision = vision_share(index)
        summary["components"] = {"vision_encoder": vision, "projector": 0.02, "decoder": 0.98 - vision}
        write_json_atomic(root / f"{index:04d}" / RUN_JSON, record)
    return root


@pytest.fixture(scope="module")
def ranked(thousand: Path) -> tuple[Any, list[str]]:
    table = report_table.load_table([str(thousand)])
    knobs = [k for k in report_table.varying_knobs(table) if k != "data"]
    assert knobs == ["mbs", "gbs"]
    return report_table.ranked(table, mock=False), knobs


def drawn_lines(plot: plots.Plot) -> dict[str, list[float]]:
    """Legend label -> y values of every line that has data (legend-only notes have none)."""
    return {
        str(line.get_label()): [float(y) for y in np.asarray(line.get_ydata())]
        for line in plot.figure.axes[0].get_lines()
        if len(np.asarray(line.get_xdata()))
    }


def legend_labels(plot: plots.Plot) -> list[str]:
    legend = plot.figure.axes[0].get_legend()
    assert legend is not None
    return [text.get_text() for text in legend.get_texts()]


def test_line_plots_draw_the_best_lines_and_summarise_the_rest(ranked: tuple[Any, list[str]]) -> None:
    rows, knobs = ranked
    recompute = rows["recompute"].iloc[0]
    # A line per GBS; its best point is its MBS-8 run, index 4g + 3. The best 10 lines: g = 249..240.
    best_groups = range(249, 249 - TOP, -1)
    expected = {f"recompute={recompute} gbs={64 * (g + 1)}": g for g in best_groups}
    rest = [throughput(4 * g + 3) for g in range(250 - TOP)]  # median 1003 + 4 x 119.5 = 1,481

    plot = plots.throughput_vs_mbs(rows, knobs)
    lines = drawn_lines(plot)
    assert set(lines) == set(plot.series) == set(expected)
    for label, group in expected.items():
        assert lines[label] == [throughput(4 * group + p) for p in range(4)]
    note = f"+ {250 - TOP} more, median {statistics.median(rest):,.0f} tok/s/GPU (each line's best)"
    assert note == "+ 240 more, median 1,481 tok/s/GPU (each line's best)"
    assert plot.notes == [note] and plot.omitted == 240
    assert note in legend_labels(plot)

    memory = plots.memory_vs_mbs(rows, knobs)
    memory_lines = {k: v for k, v in drawn_lines(memory).items() if not k.startswith("GPU memory")}
    assert set(memory_lines) == set(expected)  # the same configs as the throughput plot
    rest_memory = [max(20.0 + ((4 * g + p) * 37) % 150 for p in range(4)) for g in range(250 - TOP)]
    assert (
        memory.notes[0] == f"+ 240 more, median {statistics.median(rest_memory):,.0f} GiB (each line's max)"
    )


def test_component_shares_draw_the_best_bars_and_one_mean_bar(ranked: tuple[Any, list[str]]) -> None:
    rows, knobs = ranked
    plot = plots.component_shares(rows, knobs)
    bars = [bar for bar in plot.figure.axes[0].patches if isinstance(bar, Rectangle)]
    assert len(bars) == 3 * (TOP + 1)  # three modules x (10 configs + the summary bar)
    vision = [bar.get_width() for bar in bars[: TOP + 1]]  # the first module's bars, top to bottom
    assert vision[:TOP] == pytest.approx([vision_share(i) for i in range(999, 999 - TOP, -1)])
    assert vision[TOP] == pytest.approx(statistics.fmean(vision_share(i) for i in range(N_RUNS - TOP)))
    assert plot.categories[0] == "mbs=8 gbs=16000" and plot.categories[-1] == "+ 990 more (mean)"
    assert [t.get_text() for t in plot.figure.axes[0].get_yticklabels()] == plot.categories
    assert plot.omitted == 990


def test_scatter_keeps_every_point_and_numbers_the_best(ranked: tuple[Any, list[str]]) -> None:
    rows, knobs = ranked
    plot = plots.throughput_vs_memory(rows, knobs)
    axes = plot.figure.axes[0]
    scatter = next(c for c in axes.collections if isinstance(c, PathCollection))
    assert len(np.asarray(scatter.get_offsets())) == N_RUNS  # a cloud of 1,000 points stays readable
    ranks = [int(t.get_text()) for t in axes.texts if isinstance(t, Annotation)]
    # Rank r is run 1000 - r; labelled: the best 10 and every point on the Pareto front.
    points = [(20.0 + (i * 37) % 150, throughput(i)) for i in range(N_RUNS)]
    front = set(plots.pareto_front(points))
    expected = [r for r in range(1, N_RUNS + 1) if r <= TOP or points[N_RUNS - r] in front]
    assert ranks == expected and len(front) > 1
    assert plot.omitted == N_RUNS - len(expected)
    assert plot.notes[0].startswith(f"+ {plot.omitted} more, median ")
    assert plot.categories[0] == "1: mbs=8 gbs=16000"


def test_top_limits_the_ranked_table(thousand: Path, tmp_path: Path) -> None:
    code, text = run_report(str(thousand), "--out", str(tmp_path / "default"))
    assert code == 0
    ranked_section = section(text, "Ranked")
    rows = table_rows(ranked_section)
    assert len(rows) == report_format.DEFAULT_TOP == 50
    assert [row[0] for row in rows[:2]] == ["1", "2"] and rows[0][1] == "0999"
    # The other 950: runs 0..949, throughput 1000..1949.
    assert "+ 950 more ranked runs not shown, median eff tok/s/GPU 1,474.5 (range 1,000.0-1,949.0)" in text

    code, text = run_report(str(thousand), "--top", "7", "--out", str(tmp_path / "top7"))
    assert code == 0 and len(table_rows(section(text, "Ranked"))) == 7
    assert "+ 993 more ranked runs not shown" in text

    table = report_table.load_table([str(thousand)])
    _, made = report.build_report(table, tmp_path, None, top=3)  # below PLOT_TOP: plots follow --top
    assert len(made[0].series) == 3 and made[0].notes[0].startswith("+ 247 more")
    everything, _ = report.build_report(table, tmp_path, None, top=N_RUNS)
    assert len(table_rows(section(everything, "Ranked"))) == N_RUNS and "more ranked runs" not in everything


def test_small_sweep_shows_every_row(tmp_path: Path) -> None:
    for mbs in (1, 2):
        write_run(tmp_path / str(mbs), (*GB200, "data=synthetic", f"mbs={mbs}"), 4.0)
    code, text = run_report(str(tmp_path))
    assert code == 0 and len(table_rows(section(text, "Ranked"))) == 2
    assert "more ranked runs not shown" not in text
    plot = plots.throughput_vs_mbs(
        report_table.ranked(report_table.load_table([str(tmp_path)]), False), ["mbs"]
    )
    assert plot.notes == [] and plot.omitted == 0


CPU_SWEEP = Path(__file__).resolve().parent.parent / "fixtures" / "cpu_sweep"


def test_scatter_fits_the_axes_to_the_points_and_shows_each_runs_spread(tmp_path: Path) -> None:
    """A real CPU sweep's two runs (tests/fixtures/cpu_sweep): about 0.86 and 0.90 GiB, 400 and 750
    tokens/s/GPU. From zero both points sat against the right edge; now the axes fit them and each
    has its p10-p90 bar, throughput x mean / p90 up to x mean / p10 of its own step times."""
    table = report_table.load_table([str(CPU_SWEEP)])
    rows = report_table.ranked(table, mock=False)
    plot = plots.throughput_vs_memory(rows, ["mbs", "recompute"])
    axes = plot.figure.axes[0]
    memory = [m for m, _ in plot.series["configs"]]
    (left, right), (bottom, top) = axes.get_xlim(), axes.get_ylim()
    assert 0 < left < min(memory) and max(memory) < right
    assert (max(memory) - min(memory)) / (right - left) > 0.7  # the points spread over the axes
    expected = []
    for record in rows.to_dict("records"):
        scale = record["effective_tokens_per_s_per_gpu"] * record["step_time_mean_s"]
        expected.append(
            (record["peak_memory_gib"], scale / record["step_time_p90_s"], scale / record["step_time_p10_s"])
        )
    low = [(m, pytest.approx(v)) for m, v, _ in expected]
    high = [(m, pytest.approx(v)) for m, _, v in expected]
    assert plot.series["p90_step"] == low and plot.series["p10_step"] == high
    assert all(lo < t < hi for (_, lo, hi), (_, t) in zip(expected, plot.series["configs"], strict=True))
    assert bottom < min(v for _, v, _ in expected) and max(v for _, _, v in expected) < top
    (bars,) = axes.containers  # one errorbar container: a bar per point
    assert isinstance(bars, ErrorbarContainer)
    assert len(bars.lines[2][0].get_segments()) == len(expected) == 2
    plot.save(tmp_path / "throughput_vs_memory.png")


def test_a_run_whose_mean_step_is_above_its_p90_keeps_its_bar() -> None:
    """A short run with one slow step has its mean step time above p90 (the halving search's
    11-step rungs): the point then sits outside its p10-p90 bar, which is drawn where it is."""
    rows = report_table.ranked(report_table.load_table([str(CPU_SWEEP)]), mock=False).copy()
    first = rows.index[0]
    rows.loc[first, "step_time_mean_s"] = rows.loc[first, "step_time_p90_s"] * 1.2
    plot = plots.throughput_vs_memory(rows, ["mbs", "recompute"])
    (bars,) = plot.figure.axes[0].containers
    assert isinstance(bars, ErrorbarContainer)
    spans = sorted(
        (min(y for _, y in seg), max(y for _, y in seg)) for seg in bars.lines[2][0].get_segments()
    )
    expected = sorted(
        (lo, hi) for (_, lo), (_, hi) in zip(plot.series["p90_step"], plot.series["p10_step"], strict=True)
    )
    assert spans == [pytest.approx(e) for e in expected]
    point = plot.series["configs"][0][1]
    assert point < plot.series["p90_step"][0][1]  # below its own bar: the mean is above p90


def test_scatter_numbers_a_point_many_identical_runs_share_once(tmp_path: Path) -> None:
    """1,000 copies of one run are one point on the front: numbered once, not 1,000 times."""
    run = next(p for p in CPU_SWEEP.iterdir() if p.is_dir())
    for copy_number in range(30):
        (tmp_path / str(copy_number)).mkdir()
        (tmp_path / str(copy_number) / RUN_JSON).write_bytes((run / RUN_JSON).read_bytes())
    rows = report_table.ranked(report_table.load_table([str(tmp_path)]), mock=False)
    plot = plots.throughput_vs_memory(rows, ["mbs"], top=1)
    assert [t.get_text() for t in plot.figure.axes[0].texts if isinstance(t, Annotation)] == ["1"]
    assert plot.omitted == 29 and len(plot.series["configs"]) == 30
    plot = plots.throughput_vs_memory(rows, ["mbs"])  # the best 10 share the point: one number
    assert [t.get_text() for t in plot.figure.axes[0].texts if isinstance(t, Annotation)] == ["1-10"]
    assert len(plot.categories) == 10 and plot.omitted == 20
