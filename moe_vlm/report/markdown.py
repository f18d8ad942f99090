"""The report's formatting: cells, the ranked results table, peak lines (markdown)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from moe_vlm.perf.metrics import TimeBasis
from moe_vlm.report import plots

# Rows per ranked table unless --top says otherwise: every row of a sweep up to this size; beyond
# it the best DEFAULT_TOP and a one-line summary of the rest (results.csv keeps every row).
DEFAULT_TOP = 50


# ---------------------------------------------------------------- formatting

Row = Mapping[str, Any]  # a table row: a plain dict (fast to index) or a pandas Series


def records(rows: pd.DataFrame) -> list[dict[str, Any]]:
    """The rows as plain dicts, a missing value as None: pandas stores one as NaN, in a text column
    too, and NaN is true in an `if` (a run with no straggler would read as flagged)."""
    return [{k: None if _missing(v) else v for k, v in row.items()} for row in rows.to_dict("records")]


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA


def _cell(value: Any) -> str:
    return "-" if _missing(value) else str(value)


def _number(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


def _flops(value: Any) -> str:
    """TFLOP/s: GPU figures in the hundreds, CPU figures in the thousandths; keep 4 significant digits."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.1f}" if abs(value) >= 1000 else f"{value:.4g}"


def _mfu(row: Row, column: str = "mfu") -> str:
    note = row.get(f"{column}_note")
    if isinstance(note, str) and note.startswith("ERROR"):
        return "**ERROR >100%**"
    mfu = row.get(column)
    if mfu is None or (isinstance(mfu, float) and math.isnan(mfu)):
        return "n/a"
    return f"{mfu:.1%}"


def _shares(row: Row) -> str:
    shares = [row.get(c) for c in plots.SHARES.values()]
    if any(s is None or (isinstance(s, float) and math.isnan(s)) for s in shares):
        return "-"
    return "/".join(f"{100 * float(s or 0.0):.0f}" for s in shares)


def _percent(value: Any) -> str:
    return "-" if _missing(value) else f"{100 * float(value):.0f}"


def _step_time(row: Row) -> str:
    p10, p50, p90 = (row.get(f"step_time_p{q}_s") for q in (10, 50, 90))
    if _missing(p50):
        return "-"
    return f"{p50:.3f}" + ("" if _missing(p10) or _missing(p90) else f" ({p10:.3f}-{p90:.3f})")


def _data(row: Row) -> str:
    """The data kind, and `packed` where the run packed its rows: a packed point is never read as a
    padded one beside it (its pad % and rates come from other shapes)."""
    packing = row.get("packing")
    return f"{row['data']}" + (
        f", packed ({packing})" if packing not in (None, "none") and not _missing(packing) else ""
    )


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def results_table(rows: pd.DataFrame, knobs: list[str], top: int | None = None) -> str:
    """The best `top` rows (all when None), ranked as given."""
    header = [
        "#",
        "run",
        *knobs,
        "eff tok/s/GPU",
        "nominal tok/s/GPU",
        "pad %",  # of the positions computed, padding (data.packing=in_batch removes it)
        "TFLOP/s/GPU",
        "MFU",
        "MFU own peak",  # against the precision's dense peak (FP8/FP4); = MFU for BF16
        "step s p50 (p10-p90)",
        "steady",
        "peak mem GiB",
        "vis/proj/dec %",
        "data",
        "status",
    ]
    body = []
    for rank, row in enumerate(records(rows if top is None else rows.head(top)), start=1):
        body.append(
            [
                str(row.get("place") or rank),
                str(row["run"]),
                *(_cell(row[k]) for k in knobs),
                _number(row["effective_tokens_per_s_per_gpu"]),
                _number(row["nominal_tokens_per_s_per_gpu"]),
                _percent(row.get("padding_fraction")),
                _flops(row["tflops_per_gpu"]),
                _mfu(row),
                _mfu(row, "mfu_precision"),
                _step_time(row),
                str(row["steady_steps"] or "-"),
                _number(row["peak_memory_gib"], 2),
                _shares(row),
                _data(row),
                str(row["status"]),
            ]
        )
    return markdown_table(header, body)


def rest_line(rows: pd.DataFrame, top: int) -> str | None:
    """One line for the ranked runs past the best `top`: how many, and where their throughput sits."""
    rest = rows.iloc[top:]
    if rest.empty:
        return None
    values = rest[plots.THROUGHPUT].dropna()
    where = (
        f", median eff tok/s/GPU {_number(values.median())} "
        f"(range {_number(values.min())}-{_number(values.max())})"
        if not values.empty
        else ""
    )
    return f"+ {len(rest)} more ranked runs not shown{where}; every row is in results.csv; more with --top N."


def _peak_lines(rows: pd.DataFrame, top: int = DEFAULT_TOP) -> list[str]:
    lines = []
    bf16_peaks = {str(n) for n in rows["peak_name"].dropna()}
    for name in sorted(bf16_peaks):
        lines.append(f"MFU = model FLOPs (ours: real tokens, frozen-aware) / peak of {name}.")
    for name in sorted({str(n) for n in rows["precision_peak_name"].dropna()} - bf16_peaks):
        lines.append(f"MFU own peak = the same FLOPs / {name} (an upper bound: not every op runs in it).")
    notes = {str(n) for n in rows["mfu_note"].dropna() if not str(n).startswith("ERROR")}
    lines += sorted(f"MFU n/a: {note}." for note in notes)
    failing = rows.dropna(subset=["errors"])
    for row in records(failing.head(top)):
        lines.append(f"**ERROR** in run {row['run']}: {str(row['errors']).removeprefix('ERROR: ')}")
    if len(failing) > top:
        lines.append(f"**ERROR** in {len(failing) - top} more runs: see the errors column of results.csv.")
    windows = {str(w) for w in rows["steady_window"].dropna()}
    lines += sorted(f"Steady window: {w}." for w in windows)
    for basis, runs in (
        rows["time_basis"].fillna(TimeBasis.step_time.value).value_counts().sort_index().items()
    ):
        lines.append(f"Rates of {runs} run(s) over {TimeBasis(basis).meaning}.")
    return lines
