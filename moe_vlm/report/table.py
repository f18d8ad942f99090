"""The report's reading: every run.json as a row (load_table), which rows rank together (ranked)."""

from __future__ import annotations

import glob
import os
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from moe_vlm.base.errors import BadInput
from moe_vlm.base.files import RUN_JSON, STEPS_JSONL
from moe_vlm.config.schema import MOCK_KINDS
from moe_vlm.perf import stragglers
from moe_vlm.perf.metrics import by_step, steady_window
from moe_vlm.predict import report_section as prediction_report
from moe_vlm.predict.model import measured_window
from moe_vlm.record.columns import KNOBS
from moe_vlm.record.records import RecordError, RunRecord, read_steps
from moe_vlm.report import basis as report_basis
from moe_vlm.report import card as report_card
from moe_vlm.runtime.failures import settle_running

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
        "padding_fraction": summary.get("padding_fraction"),  # None: written before it
        "model_flops_per_step": flops.get("model"),
        "bridge_flops_per_step": flops.get("bridge"),
        "share_vision_encoder": components.get("vision_encoder"),
        "share_projector": components.get("projector"),
        "share_decoder": components.get("decoder"),
        **report_basis.rows_of(summary.get("flops_basis")),
        **report_card.rows_of((run.spec or {}).get("card")),
        "errors": "; ".join(summary.get("errors") or []) or None,
    }
    row |= throughput_band(summary)
    row |= prediction_report.row_fields(run.sections)  # predicted vs measured (moe_vlm/predict)
    return row


def throughput_band(summary: dict[str, Any]) -> dict[str, float | None]:
    """Effective tokens/s/GPU at the p50, p90 and p10 seconds of the steps the rates are over
    (the time basis: step periods where recorded, else step times): the run's median rate and its
    noise band. The mean rate is over the same steps' mean seconds, so rate x mean / seconds."""
    effective = summary.get("effective_tokens_per_s_per_gpu")
    window = measured_window(summary)
    spread = window[0] if window is not None else {}
    mean = spread.get("mean")
    band: dict[str, float | None] = {}
    for column, quantile in (("eff_p50", "p50"), ("eff_low", "p90"), ("eff_high", "p10")):
        seconds = spread.get(quantile)
        band[column] = effective * mean / seconds if effective is not None and mean and seconds else None
    return band


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
    """Mock data of either kind (image-free, or Bridge's noise-image perf workload): ranked apart."""
    return table["data"].astype(str).isin({kind.value for kind in MOCK_KINDS})


def is_forced_balance(table: pd.DataFrame) -> pd.Series:
    """Random router logits (router.force_load_balancing): experts balanced whatever the data."""
    return table["forced_balance"].fillna(False).astype(bool)


def ranked(table: pd.DataFrame, mock: bool, forced: bool = False) -> pd.DataFrame:
    """Completed runs of one class: mock data (whatever the routing), forced-balance routing on
    synthetic/real data, or neither (the ranked class). Best median effective tokens/s/GPU first,
    with a `place`: runs whose p10-p90 band overlaps a better run's share its place (`2=`) and
    are listed by name, since which of them is faster is inside the step-time noise."""
    forced_class = is_forced_balance(table) & ~is_mock(table)
    done = table[(table["status"] == "completed") & (is_mock(table) == mock) & (forced_class == forced)]
    if done.empty:
        return done.assign(place=pd.Series(dtype=str))
    # A record without the band (written before it, or one step) ranks on its mean rate, band-less.
    middle = done["eff_p50"].fillna(done["effective_tokens_per_s_per_gpu"]) if "eff_p50" in done else None
    done = done.assign(_middle=middle if middle is not None else done["effective_tokens_per_s_per_gpu"])
    done = done.sort_values(["_middle", "run"], ascending=[False, True], na_position="last")
    groups = _tie_groups(done)
    done = done.assign(_group=groups).sort_values(["_group", "run"], kind="stable")
    sizes = done["_group"].map(done["_group"].value_counts())
    places = [
        "-" if pd.isna(m) else f"{g + 1}{'=' if n > 1 else ''}"
        for g, n, m in zip(done["_group"], sizes, done["_middle"], strict=True)
    ]
    return done.assign(place=places).drop(columns=["_middle", "_group"])


def _tie_groups(rows: pd.DataFrame) -> list[int]:
    """For rows best first: each row's group, numbered by the position of the group's first row
    (its leader). A row joins the open group while its best (p10) rate reaches the leader's worst
    (p90) rate: the two bands overlap."""

    def band(row: dict[str, Any], column: str) -> float:
        value = row.get(column)
        return float(row["_middle"]) if value is None or pd.isna(value) else float(value)

    groups: list[int] = []
    leader_low: float | None = None
    for position, row in enumerate(rows.to_dict("records")):
        if pd.isna(row["_middle"]):
            groups.append(position)
            leader_low = None
        elif leader_low is not None and band(row, "eff_high") >= leader_low:
            groups.append(groups[-1])
        else:
            groups.append(position)
            leader_low = band(row, "eff_low")
    return groups
