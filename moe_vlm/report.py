"""`moe-vlm report PATH...`: every run.json under run dirs, sweep dirs or globs -> ranked tables and plots.

    moe-vlm report multirun/2026-08-30/12-00-00
    moe-vlm report 'sweeps/*' --out reports/today --compare parallelism
    moe-vlm report SWEEP --save-baseline baseline.json       # after a good sweep
    moe-vlm report SWEEP --baseline baseline.json --tolerance 0.05
    moe-vlm report BIG_SWEEP --top 20                         # the best 20 rows per ranked table
    moe-vlm report --diff RUN_A RUN_B                         # why is A faster than B?

Reads completed, failed and rejected runs alike into one pandas table (results.csv and
results.parquet), writes report.md and the plots next to them in the first PATH (or --out), and
prints the Markdown report. Completed synthetic/real runs with real routing are ranked by
effective (real) tokens/s/GPU; mock-data runs and forced-balance runs (router=forced_balance) go
to separate, labelled tables and never into that ranking.
A ranked table shows the best --top rows (see --help) and one summary line for the rest; each
plot names at most plots.PLOT_TOP configs and draws the rest as one "+ K more, median X" entry.

Exit status: 0 fine; 1 the --baseline check found a config whose effective throughput dropped by
more than --tolerance (or that completed in the baseline and no longer does); 2 bad input (a
missing PATH, no run.json found, unknown --compare knob, missing or unreadable baseline, --top
below 1), with a one-line error naming the option, what it allows and a fix.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pandas as pd

from moe_vlm import halving_report, module_table, plots, stragglers
from moe_vlm.errors import EXIT_FAILED, EXIT_INVALID, BadInput
from moe_vlm.launch.failures import settle_running
from moe_vlm.metrics import TimeBasis
from moe_vlm.record import KNOBS, RUN_JSON, RecordError, RunRecord, write_atomic
from moe_vlm.schema import MOCK_KINDS

EXIT_OK = 0
EXIT_REGRESSED = EXIT_FAILED  # the work "failed": --baseline found a regression
EXIT_BAD_INPUT = EXIT_INVALID
DEFAULT_TOLERANCE = 0.05
BASELINE_METRIC = "effective_tokens_per_s_per_gpu"
WORK_MATCH_TOLERANCE = 0.01  # effective tokens or image tokens per step differing more: different work

# KNOBS (moe_vlm.record): the knob columns, each read from the RunSpec, else the Hydra config.
# Knobs that do not change what a step costs: left out of a config's identity for the baseline.
NOT_IDENTITY = ("train_iters",)
# Knobs that belong to another knob's choice: comparing parallelism families compares their layouts.
OWNED_BY = {"parallelism": ("tp", "pp", "vp", "cp", "ep", "etp", "dispatcher")}
# Equal work requires these equal (besides the knob being compared): the issue's "equal model,
# data, GBS in tokens and sequence length".
WORKLOAD = ("model", "data", "gbs_tokens", "seq_length")
DEFAULT_LABEL_KNOBS = ["model", "parallelism", "mbs", "recompute"]
# Rows per ranked table unless --top says otherwise: every row of a sweep up to this size; beyond
# it the best DEFAULT_TOP and a one-line summary of the rest (results.csv keeps every row).
DEFAULT_TOP = 50
PATH_HINT = (
    f"pass run directories, sweep directories, {RUN_JSON} files or globs of them "
    "(e.g. moe-vlm report multirun/DATE/TIME)"
)


# ---------------------------------------------------------------- reading


def find_run_files(paths: list[str]) -> list[Path]:
    """run.json files under each PATH (a run dir, a sweep dir, a run.json, or a glob of those)."""
    found: dict[Path, None] = {}
    for given in paths:
        if glob.has_magic(given):
            matches = sorted(glob.glob(given))
            if not matches:
                raise BadInput(f"PATH {given!r}: the pattern matches nothing; {PATH_HINT}")
        elif not os.path.exists(given):
            raise BadInput(f"PATH {given}: no such file or directory; {PATH_HINT}")
        else:
            matches = [given]
        for match in matches:
            path = Path(match)
            if path.is_file() and path.name == RUN_JSON:
                found[path.resolve()] = None
            elif path.is_dir():
                for run_file in sorted(path.rglob(RUN_JSON)):
                    found[run_file.resolve()] = None
    return list(found)


def row_of(run_file: Path, run: RunRecord) -> dict[str, Any]:
    """One table row: the knobs, the status, and the summary numbers a report shows."""
    row: dict[str, Any] = {"run_dir": str(run_file.parent)}
    row |= run.knobs()
    row["status"] = run.status
    row["point_id"] = run.point_id
    gbs, seq = row.get("gbs"), row.get("seq_length")
    row["gbs_tokens"] = gbs * seq if isinstance(gbs, int) and isinstance(seq, int) else None
    row["gpu"] = run.setting("cluster", "gpu")
    row["forced_balance"] = bool(run.setting("router", "force_load_balancing"))
    row["gpu_memory_gib"] = run.setting("cluster", "gpu_memory_gib")
    row["reason"] = run.reason()
    view = stragglers.of_run(run_file, run)
    row["stragglers"] = view.text() if view else None
    row["straggler_ranks"] = view.ranks if view else None
    row["straggler_hosts"] = view.hosts if view else None
    row["straggler_nodes"] = view.slow_nodes if view else None

    summary = run.summary or {}
    step_time = summary.get("step_time_s") or {}
    tokens = summary.get("tokens_per_step") or {}
    flops = summary.get("flops_per_step") or {}
    components = summary.get("components") or {}
    peak = summary.get("peak") or {}
    row |= {
        "effective_tokens_per_s_per_gpu": summary.get("effective_tokens_per_s_per_gpu"),
        "nominal_tokens_per_s_per_gpu": summary.get("nominal_tokens_per_s_per_gpu"),
        "tflops_per_gpu": summary.get("tflops_per_gpu"),
        "bridge_tflops_per_gpu": summary.get("bridge_tflops_per_gpu"),
        "hardware_tflops_per_gpu": summary.get("hardware_tflops_per_gpu"),
        "mfu": summary.get("mfu"),
        "mfu_note": summary.get("mfu_note"),
        "peak_name": peak.get("name"),
        "mfu_precision": summary.get("mfu_precision"),
        "mfu_precision_note": summary.get("mfu_precision_note"),
        "precision_peak_name": (summary.get("precision_peak") or {}).get("name"),
        "step_time_mean_s": step_time.get("mean"),
        "step_time_p10_s": step_time.get("p10"),
        "step_time_p50_s": step_time.get("p50"),
        "step_time_p90_s": step_time.get("p90"),
        "steady_steps": _steady(summary.get("steady_steps")),
        "steady_window": (summary.get("steady_window") or {}).get("text"),
        "time_basis": (summary.get("time_basis") or {}).get("name"),  # None: written before it
        "peak_memory_gib": summary.get("peak_memory_gib"),
        "memory_kind": summary.get("memory_kind"),
        "real_tokens_per_step": tokens.get("real"),
        "image_tokens_per_step": tokens.get("image"),
        "padded_tokens_per_step": tokens.get("padded"),
        "model_flops_per_step": flops.get("model"),
        "bridge_flops_per_step": flops.get("bridge"),
        "share_vision_encoder": components.get("vision_encoder"),
        "share_projector": components.get("projector"),
        "share_decoder": components.get("decoder"),
        "errors": "; ".join(summary.get("errors") or []) or None,
    }
    return row


def _steady(steps: Any) -> str | None:
    return f"{steps[0]}-{steps[1]}" if isinstance(steps, list) and len(steps) == 2 else None


def load_table(paths: list[str]) -> pd.DataFrame:
    """One row per usable run.json under `paths`; each record RunRecord.read cannot use is left
    out with one line on stderr naming the file and why (BadInput when none is left)."""
    run_files = find_run_files(paths)
    if not run_files:
        raise BadInput(f"no {RUN_JSON} found under {' '.join(paths)}; {PATH_HINT}")
    rows = []
    for run_file in run_files:
        try:
            record = RunRecord.read(run_file)
        except RecordError as exc:
            print(exc.skipped("moe-vlm report"), file=sys.stderr)
            continue
        # A `running` record whose process is gone is a killed run (read only: status writes it).
        record = settle_running(run_file.parent, record, write=False)
        rows.append(row_of(run_file, record))
    if not rows:
        raise BadInput(
            f"none of the {len(run_files)} {RUN_JSON} file(s) under {' '.join(paths)} is a record a report "
            "can use (each is named above with why); pass runs that wrote their record"
        )
    table = pd.DataFrame(rows)
    common = os.path.commonpath([str(Path(r).parent) for r in table["run_dir"]]) if len(table) > 1 else None
    table["run"] = [os.path.relpath(r, common) if common else Path(r).name for r in table["run_dir"]]
    return table


def varying_knobs(table: pd.DataFrame) -> list[str]:
    return [k for k in KNOBS if table[k].astype(str).nunique() > 1]


def is_mock(table: pd.DataFrame) -> pd.Series:
    """Mock data of either kind (image-free, or Bridge's noise-image perf workload): ranked apart."""
    return table["data"].astype(str).isin({kind.value for kind in MOCK_KINDS})


def is_forced_balance(table: pd.DataFrame) -> pd.Series:
    """Random router logits (router.force_load_balancing): experts balanced whatever the data."""
    return table["forced_balance"].fillna(False).astype(bool)


def ranked(table: pd.DataFrame, mock: bool, forced: bool = False) -> pd.DataFrame:
    """Completed runs of one class, best effective tokens/s/GPU first: mock data (whatever the
    routing), forced-balance routing on synthetic/real data, or neither (the ranked class)."""
    forced_class = is_forced_balance(table) & ~is_mock(table)
    done = table[(table["status"] == "completed") & (is_mock(table) == mock) & (forced_class == forced)]
    return done.sort_values("effective_tokens_per_s_per_gpu", ascending=False, na_position="last")


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


def _step_time(row: Row) -> str:
    p10, p50, p90 = (row.get(f"step_time_p{q}_s") for q in (10, 50, 90))
    if _missing(p50):
        return "-"
    return f"{p50:.3f}" + ("" if _missing(p10) or _missing(p90) else f" ({p10:.3f}-{p90:.3f})")


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
                str(rank),
                str(row["run"]),
                *(_cell(row[k]) for k in knobs),
                _number(row["effective_tokens_per_s_per_gpu"]),
                _number(row["nominal_tokens_per_s_per_gpu"]),
                _flops(row["tflops_per_gpu"]),
                _mfu(row),
                _mfu(row, "mfu_precision"),
                _step_time(row),
                str(row["steady_steps"] or "-"),
                _number(row["peak_memory_gib"], 2),
                _shares(row),
                str(row["data"]),
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


# ---------------------------------------------------------------- --compare


@dataclass
class Comparison:
    workload: dict[str, Any]  # what is equal across the group
    matched_on: dict[str, Any]  # the other knobs held equal
    runs: dict[str, pd.Series]  # knob value -> best completed run at that value
    flags: list[str]  # why some pair does different effective work (then no ratios)
    ratios: dict[str, float]  # knob value -> effective tokens/s/GPU relative to the first value


def _differs(a: Any, b: Any) -> bool:
    a = 0.0 if a is None or (isinstance(a, float) and math.isnan(a)) else float(a)
    b = 0.0 if b is None or (isinstance(b, float) and math.isnan(b)) else float(b)
    return abs(a - b) > WORK_MATCH_TOLERANCE * max(abs(a), abs(b), 1.0)


def compare(table: pd.DataFrame, knob: str) -> list[Comparison]:
    """Side-by-side runs that differ in `knob` at equal model, data, GBS in tokens and seq length.

    Within a workload the other varying knobs are matched too (except those the compared knob
    owns: comparing parallelism compares TP/PP/EP layouts); at each setting the best run is shown.
    Pairs whose effective tokens or image tokens per step differ are flagged and get no ratio.
    """
    done = table[table["status"] == "completed"]
    owned = set(OWNED_BY.get(knob, ()))
    matched = [k for k in varying_knobs(table) if k != knob and k not in owned and k not in WORKLOAD]
    matched = [k for k in matched if k not in NOT_IDENTITY]
    keys = [k for k in WORKLOAD if k != knob] + matched
    result = []
    for group_key, group in done.groupby(keys, dropna=False, sort=True):
        if group[knob].astype(str).nunique() < 2:
            continue
        values = dict(zip(keys, group_key if isinstance(group_key, tuple) else (group_key,), strict=True))
        best: dict[str, pd.Series] = {}
        for value, runs in group.groupby(group[knob].astype(str), sort=True):
            best[str(value)] = runs.sort_values(
                "effective_tokens_per_s_per_gpu", ascending=False, na_position="last"
            ).iloc[0]
        flags = []
        settings = list(best)
        reference = best[settings[0]]
        for setting in settings[1:]:
            other = best[setting]
            for column, what in (
                ("real_tokens_per_step", "effective tokens/step"),
                ("image_tokens_per_step", "image tokens/step"),
            ):
                if _differs(reference[column], other[column]):
                    flags.append(
                        f"{knob}={settings[0]} vs {knob}={setting} do different effective work: {what} "
                        f"{_number(reference[column], 0)} vs {_number(other[column], 0)}; not compared"
                    )
        ratios: dict[str, float] = {}
        if not flags:
            base = reference["effective_tokens_per_s_per_gpu"]
            ratios = {s: float(best[s]["effective_tokens_per_s_per_gpu"]) / float(base) for s in settings}
        result.append(
            Comparison(
                workload={k: values[k] for k in WORKLOAD if k in values},
                matched_on={k: values[k] for k in matched},
                runs=best,
                flags=flags,
                ratios=ratios,
            )
        )
    return result


def compare_markdown(comparisons: list[Comparison], knob: str) -> str:
    if not comparisons:
        return f"No completed runs differ only in {knob} at equal model, data, GBS tokens and seq length."
    blocks = []
    for comparison in comparisons:
        title = ", ".join(f"{k}={v}" for k, v in {**comparison.workload, **comparison.matched_on}.items())
        header = [
            knob,
            "run",
            "eff tok/s/GPU",
            "vs first",
            "TFLOP/s/GPU",
            "MFU",
            "step s p50",
            "peak mem GiB",
        ]
        body = []
        for setting, row in comparison.runs.items():
            ratio = comparison.ratios.get(setting)
            body.append(
                [
                    setting,
                    str(row["run"]),
                    _number(row["effective_tokens_per_s_per_gpu"]),
                    f"{ratio:.2f}x" if ratio is not None else "not compared",
                    _flops(row["tflops_per_gpu"]),
                    _mfu(row),
                    _number(row["step_time_p50_s"], 3),
                    _number(row["peak_memory_gib"], 2),
                ]
            )
        block = [f"#### {title}", "", markdown_table(header, body)]
        block += [f"\n**FLAG**: {flag}" for flag in comparison.flags]
        blocks.append("\n".join(block))
    return "\n\n".join(blocks)


# ---------------------------------------------------------------- baseline


def identity(row: pd.Series) -> str:
    return ",".join(f"{k}={row[k]}" for k in KNOBS if k not in NOT_IDENTITY)


def save_baseline(table: pd.DataFrame, path: Path) -> int:
    done = table[table["status"] == "completed"].dropna(subset=[BASELINE_METRIC])
    configs = [
        {
            "config": identity(row),
            "data": row["data"],
            BASELINE_METRIC: float(row[BASELINE_METRIC]),
            "run_dir": row["run_dir"],
        }
        for _, row in done.iterrows()
    ]
    write_atomic(path, json.dumps({"metric": BASELINE_METRIC, "configs": configs}, indent=2) + "\n")
    return len(configs)


def load_baseline(path: Path) -> dict[str, float]:
    if not path.is_file():
        raise BadInput(
            f"--baseline {path}: {'a directory' if path.is_dir() else 'no such file'}; pass a file "
            "written by --save-baseline FILE (e.g. moe-vlm report SWEEP --save-baseline baseline.json)"
        )
    try:
        payload = json.loads(path.read_text())
        return {c["config"]: float(c[BASELINE_METRIC]) for c in payload["configs"]}
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise BadInput(
            f"--baseline {path}: not a baseline file ({exc.__class__.__name__}: {exc}); "
            "write one with --save-baseline FILE"
        ) from exc


def regression_check(table: pd.DataFrame, baseline: dict[str, float], tolerance: float) -> pd.DataFrame:
    """One row per baseline config: ok, REGRESSED (slower than tolerance allows, or no longer completing)."""
    rows = []
    current = {identity(row): row for _, row in table.iterrows()}
    for config, before in sorted(baseline.items()):
        row = current.get(config)
        if row is None:
            rows.append(
                {"config": config, "baseline": before, "now": None, "change": None, "verdict": "not run"}
            )
            continue
        now = row[BASELINE_METRIC]
        if row["status"] != "completed" or now is None or (isinstance(now, float) and math.isnan(now)):
            rows.append(
                {
                    "config": config,
                    "baseline": before,
                    "now": None,
                    "change": None,
                    "verdict": f"REGRESSED ({row['status']})",
                }
            )
            continue
        change = float(now) / before - 1.0
        verdict = "REGRESSED" if change < -tolerance else "ok"
        rows.append(
            {"config": config, "baseline": before, "now": float(now), "change": change, "verdict": verdict}
        )
    return pd.DataFrame(rows, columns=["config", "baseline", "now", "change", "verdict"])


def regression_markdown(check: pd.DataFrame, path: Path, tolerance: float) -> str:
    header = ["config", "baseline eff tok/s/GPU", "now", "change", "verdict"]
    body = [
        [
            r["config"],
            _number(r["baseline"]),
            _number(r["now"]),
            f"{r['change']:+.1%}" if r["change"] is not None and not math.isnan(r["change"]) else "-",
            f"**{r['verdict']}**" if r["verdict"].startswith("REGRESSED") else r["verdict"],
        ]
        for _, r in check.iterrows()
    ]
    return f"Against {path}, tolerance {tolerance:.0%} drop in effective tokens/s/GPU.\n\n" + markdown_table(
        header, body
    )


# ---------------------------------------------------------------- output


def write_table(table: pd.DataFrame, out: Path) -> None:
    parquet = table.to_parquet(index=False)
    assert parquet is not None  # without a path pandas returns the bytes
    write_atomic(out / "results.csv", table.to_csv(index=False))
    write_atomic(out / "results.parquet", parquet)


def _png(plot: plots.Plot) -> bytes:
    """The plot's PNG, rendered to a scratch file (Plot.save takes a path) for record.write_atomic."""
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
        "# moe_vlm sweep report",
        "",
        f"{len(table)} runs: " + ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) + ".",
        "Ranked by effective (real, unpadded) tokens/s/GPU = real tokens / (step time x world size); "
        "nominal = GBS x seq_length. TFLOP/s/GPU and MFU use our model FLOPs (real tokens, frozen-aware).",
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
    lines += stragglers.section(completed, top) + module_table.section(completed, top)
    lines += halving_report.section(table["run_dir"])

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


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"moe-vlm report: error: {message} (see moe-vlm report --help)", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="moe-vlm report", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="run dirs, sweep dirs, run.json files or globs")
    p.add_argument("--out", help="where report.md, results.csv/.parquet and plots go (default: first PATH)")
    p.add_argument("--compare", metavar="KNOB", help=f"side-by-side by one knob: {', '.join(KNOBS)}")
    p.add_argument("--baseline", metavar="FILE", help="flag configs slower than this saved baseline")
    p.add_argument(
        "--tolerance",
        type=float,
        default=DEFAULT_TOLERANCE,
        help=f"allowed drop vs --baseline, as a fraction (default {DEFAULT_TOLERANCE})",
    )
    p.add_argument("--save-baseline", metavar="FILE", help="save this report's throughput as a baseline")
    p.add_argument(
        "--diff",
        action="store_true",
        help="the two PATHs are runs A and B: their time per component and every configuration difference "
        "(knobs, Bridge's effective config) side by side; why is A faster than B?",
    )
    p.add_argument(
        "--top",
        type=_row_count,
        default=DEFAULT_TOP,
        metavar="N",
        help=f"rows per ranked table (default {DEFAULT_TOP}: every row of a sweep up to that size, the "
        f"best {DEFAULT_TOP} beyond it); plots name at most {plots.PLOT_TOP} configs and summarise the rest",
    )
    return p


def _row_count(text: str) -> int:
    """--top's type: argparse prints the message on one line, naming the option."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a row count; use a whole number 1 or more, e.g. --top {DEFAULT_TOP}"
        )
    return value


def _diff(paths: list[str]) -> int:
    from moe_vlm import report_diff  # it imports this module

    try:
        if len(paths) != 2:
            raise BadInput(f"--diff takes two runs, RUN_A RUN_B; got {len(paths)} PATH(s)")
        text = report_diff.render(*paths)
    except BadInput as exc:
        print(f"moe-vlm report: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(text, end="")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.diff:
        return _diff(args.paths)
    try:
        if args.compare and args.compare not in KNOBS:
            raise BadInput(f"unknown knob {args.compare!r} for --compare; allowed: {', '.join(KNOBS)}")
        if not 0.0 <= args.tolerance < 1.0:
            raise BadInput(
                f"--tolerance {args.tolerance}: must be a fraction in [0, 1), e.g. --tolerance 0.05"
            )
        if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
            raise BadInput(
                f"--out {args.out}: not a directory; pass a directory (created if missing), e.g. --out reports/today"
            )
        if args.save_baseline and Path(args.save_baseline).is_dir():
            raise BadInput(
                f"--save-baseline {args.save_baseline}: a directory; pass a file path, e.g. --save-baseline baseline.json"
            )
        baseline = load_baseline(Path(args.baseline)) if args.baseline else None
        table = load_table(args.paths)
    except BadInput as exc:
        print(f"moe-vlm report: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT

    out = output_dir(args.paths, args.out)
    text, made = build_report(table, out, args.compare, args.top)
    status = EXIT_OK
    if baseline is not None:
        check = regression_check(table, baseline, args.tolerance)
        text += (
            "\n## Regression check\n\n"
            + regression_markdown(check, Path(args.baseline), args.tolerance)
            + "\n"
        )
        regressed = check[check["verdict"].str.startswith("REGRESSED")]
        if not regressed.empty:
            status = EXIT_REGRESSED
            text += f"\n**{len(regressed)} config(s) regressed** (exit status {EXIT_REGRESSED}).\n"

    write_table(table, out)
    for plot in made:
        write_atomic(out / f"{plot.name}.png", _png(plot))
    write_atomic(out / "report.md", text)
    if args.save_baseline:
        saved = save_baseline(table, Path(args.save_baseline))
        text += f"\nSaved a baseline of {saved} completed config(s) to {args.save_baseline}.\n"
    print(text, end="")
    return status
