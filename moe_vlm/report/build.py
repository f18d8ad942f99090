"""The report's output: results.csv and report.md with its plots (build_report).

Reading every run.json as a row is report/table.py, the markdown cells and tables
report/markdown.py, --compare and baselines report/compare.py; the command line, `moe-vlm report`
and `--diff`, is cli/report.py.
"""

from __future__ import annotations

import glob
import tempfile
from pathlib import Path

import pandas as pd

from moe_vlm.base import inputs
from moe_vlm.base.errors import EXIT_FAILED, EXIT_INVALID
from moe_vlm.base.files import write_atomic
from moe_vlm.perf import stragglers
from moe_vlm.predict import report_section as prediction_report
from moe_vlm.report import basis as report_basis
from moe_vlm.report import card as report_card
from moe_vlm.report import halving as halving_report
from moe_vlm.report import module_table, plots
from moe_vlm.report.compare import compare, compare_markdown
from moe_vlm.report.markdown import (
    DEFAULT_TOP,
    _cell,
    _peak_lines,
    markdown_table,
    records,
    rest_line,
    results_table,
)
from moe_vlm.report.table import ranked, varying_knobs

EXIT_OK = 0
EXIT_REGRESSED = EXIT_FAILED  # the work "failed": --baseline found a regression
EXIT_BAD_INPUT = EXIT_INVALID
DEFAULT_TOLERANCE = 0.05
DEFAULT_LABEL_KNOBS = ["model", "parallelism", "mbs", "recompute"]
# ---------------------------------------------------------------- output


def write_table(table: pd.DataFrame, out: Path) -> None:
    parquet = table.to_parquet(index=False)
    assert parquet is not None  # without a path pandas returns the bytes
    write_atomic(out / "results.csv", table.to_csv(index=False))
    write_atomic(out / "results.parquet", parquet)


REPORT_TITLE = "# moe_vlm sweep report"
# What the report writes in its directory, and how an earlier one of its own is told from a user's
# file of the same name (base/inputs.output_file: never overwritten).
OUTPUTS = {
    "report.md": inputs.starts_with(REPORT_TITLE.encode()),
    "results.csv": inputs.starts_with(b"run_dir,"),
    "results.parquet": inputs.starts_with(b"PAR1"),
}


def check_outputs(out: Path) -> None:
    """BadInput (nothing written yet) when `out` holds a file of a report's name the tool did not write."""
    for name, ours in OUTPUTS.items():
        inputs.output_file("--out", out / name, ours)


def _png(plot: plots.Plot) -> bytes:
    """The plot's PNG, rendered to a scratch file (Plot.save takes a path) for files.write_atomic."""
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / f"{plot.name}.png"
        plot.save(path)
        return path.read_bytes()


def output_dir(paths: list[str], out: str | None) -> Path:
    if out:
        return Path(out)
    first = Path(paths[0])
    if first.is_file():
        return first.parent
    if glob.has_magic(paths[0]):
        # The deepest directory above the first wildcard.
        parts = []
        for part in first.parts:
            if glob.has_magic(part):
                break
            parts.append(part)
        return Path(*parts) if parts else Path(".")
    return first


def build_report(
    table: pd.DataFrame, out: Path, compare_knob: str | None, top: int = DEFAULT_TOP
) -> tuple[str, list[plots.Plot]]:
    """report.md's text and the plots; ranked tables show the best `top` rows, plots at most PLOT_TOP."""
    varying = varying_knobs(table)
    knobs = [k for k in varying if k != "data"] or DEFAULT_LABEL_KNOBS
    counts = table["status"].value_counts().to_dict()
    lines = [
        REPORT_TITLE,
        "",
        f"{len(table)} runs: " + ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) + ".",
        "Ranked by effective (real, unpadded) tokens/s/GPU = real tokens / (step time x world size); "
        "nominal = GBS x seq_length. TFLOP/s/GPU and MFU use our model FLOPs (real tokens, frozen-aware).",
        "Order: the median step's rate; runs whose p10-p90 bands overlap a better run's share its place "
        "(#2=) and are listed by name: their difference is inside the step-time noise, a tie.",
    ]
    made: list[plots.Plot] = []
    mock_title = (
        "## MOCK data (image-free, or bridge_mock: Bridge's noise-image perf workload): NOT a VLM "
        "performance proxy, not ranked with synthetic/real"
    )
    forced_title = (
        "## FORCED-BALANCE routing (random router logits, MCore: benchmark only): NOT a measure of "
        "real routing, not ranked with real-routing runs"
    )
    sections = [
        (False, False, "## Ranked: synthetic and real data, real routing"),
        (True, False, mock_title),
        (False, True, forced_title),
    ]
    for mock, forced, title in sections:
        rows = ranked(table, mock, forced)
        if rows.empty:
            continue
        lines += ["", title, "", results_table(rows, knobs, top), ""]
        rest = rest_line(rows, top)
        lines += [rest, ""] if rest else []
        lines += [f"- {line}" for line in _peak_lines(rows, top)]
        lines.append(
            "- vis/proj/dec %: vision encoder / projector / decoder share of measured component time."
        )
        if not made and not forced:  # from the ranked class if any, else mock (labelled), never mixed
            made = plots.all_plots(rows, knobs, mock, min(top, plots.PLOT_TOP))

    completed = records(table[table["status"] == "completed"])
    basis = report_basis.table(completed, top)
    lines += (
        ["", report_basis.TITLE, "", report_basis.NOTE, "", markdown_table(report_basis.HEADER, basis)]
        if basis
        else []
    )
    cards = report_card.table(completed, top)
    lines += (
        ["", report_card.TITLE, "", report_card.NOTE, "", markdown_table(report_card.HEADER, cards)]
        if cards
        else []
    )
    lines += stragglers.section(completed, top) + module_table.section(completed, top)
    lines += halving_report.section(table["run_dir"])
    lines += prediction_report.section(completed, top)

    unfinished = table[table["status"] != "completed"]
    if not unfinished.empty:
        lines += ["", "## Not completed", ""]
        body = [
            [str(r["run"]), *(_cell(r[k]) for k in knobs), str(r["status"]), _cell(r["reason"])]
            for r in records(unfinished.head(top))
        ]
        lines.append(markdown_table(["run", *knobs, "status", "reason"], body))
        if len(unfinished) > top:
            counts = unfinished["status"].value_counts().sort_index()
            lines += [
                "",
                f"+ {len(unfinished) - top} more not shown; not completed in all: "
                + ", ".join(f"{n} {status}" for status, n in counts.items())
                + "; every row is in results.csv; more with --top N.",
            ]

    if compare_knob:
        lines += [
            "",
            f"## Compare: {compare_knob}",
            "",
            compare_markdown(compare(table, compare_knob), compare_knob),
        ]

    if made:
        lines += ["", "## Plots", ""] + [f"![{p.name}]({p.name}.png)" for p in made]
    lines += ["", f"Table: results.csv, results.parquet (one row per run.json) in {out}."]
    return "\n".join(lines) + "\n", made
