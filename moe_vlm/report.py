"""The report's table: every run.json as a row (load_table), the ranked and labelled tables, --compare,
baselines and the regression check, and report.md with its plots (build_report). The command line,
`moe-vlm report` and `--diff`, is report_cli.py.
"""

from __future__ import annotations

import glob
import json
import math
import os
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from moe_vlm import halving_report, module_table, plots, stragglers
from moe_vlm.errors import EXIT_FAILED, EXIT_INVALID, BadInput
from moe_vlm.metrics import TimeBasis, by_step, steady_window
from moe_vlm.record import KNOBS, RUN_JSON, STEPS_JSONL, RecordError, RunRecord, read_steps, write_atomic
from moe_vlm.runtime.failures import settle_running

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
    view = stragglers_of_run(run_file, run)
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


def stragglers_of_run(run_file: Path, record: RunRecord) -> stragglers.Stragglers | None:
    """Slow ranks and nodes of a completed run.json: from summary.per_rank, or (a record written
    before it existed) from the run's steps.jsonl. None for a run that did not complete."""
    if record.status != "completed":
        return None
    per_rank = (record.summary or {}).get("per_rank")
    if per_rank is None:
        grouped = by_step(read_steps(run_file.parent / STEPS_JSONL))
        warmup = int((record.spec or {}).get("warmup_steps") or 0)
        per_rank = stragglers.rank_medians([grouped[step] for step in steady_window(grouped, warmup).steps])
    return stragglers.find(per_rank)


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
    return table["data"].astype(str) == "mock"


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
    mock_title = "## MOCK data (image-free): NOT a VLM performance proxy, not ranked with synthetic/real"
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
