"""The report's comparisons: --compare (one knob at equal work), and a config's identity for baselines (report/gate.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from moe_vlm.record.columns import KNOBS
from moe_vlm.report.markdown import _flops, _mfu, _number, markdown_table
from moe_vlm.report.table import varying_knobs

BASELINE_METRIC = "effective_tokens_per_s_per_gpu"
WORK_MATCH_TOLERANCE = 0.01  # effective tokens or image tokens per step differing more: different work

# KNOBS (moe_vlm.record.columns): the knob columns, each read from the RunSpec, else the Hydra config.
# Knobs that do not change what a step costs: left out of a config's identity for the baseline.
NOT_IDENTITY = ("train_iters",)
# Knobs that belong to another knob's choice: comparing parallelism families compares their layouts.
OWNED_BY = {"parallelism": ("tp", "pp", "vp", "cp", "ep", "etp", "dispatcher")}
# Equal work requires these equal (besides the knob being compared): the issue's "equal model,
# data, GBS in tokens and sequence length".
WORKLOAD = ("model", "data", "gbs_tokens", "seq_length")


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
