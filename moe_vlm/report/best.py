"""`moe-vlm report SWEEP --best`: best.yaml, the sweep's winner as a file you can rerun.

The winner is the first place of the ranked class (synthetic or real data with real routing),
as the report ranks it (report/table.py `ranked`: the median effective tokens/s/GPU, ties inside
the noise share the place). Mock-data and forced-balance runs never win against real ones: only
a sweep without any ranked run gets its winner from the forced-balance class, then the mock one,
and best.yaml says so. best.yaml holds:

- `overrides`: the point's own overrides (its point.json, as the sweeper composed it; a run
  without one, those that rebuild it from its config) and the launcher's, and `rerun`: the one
  command that runs that point again (a one-point sweep through the same launcher);
- `figures`: the median effective tokens/s/GPU and its p10-p90 band, the step time, the steady
  window, peak memory, TFLOP/s/GPU and MFU, the data kind and the routing, and the runs it is tied
  with (`tied_with`: a place shared inside the noise);
- `software`: Python, torch, transformers, Megatron Core and Bridge, the git commit, and the
  container image the run's job used.

tests/integration/test_decision.py reruns the command in dry-run mode and finds the resolved
configuration equal to the winner's, field for field.
"""

from __future__ import annotations

import math
import shlex
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from moe_vlm.base.files import RunPaths, write_atomic
from moe_vlm.base.safety import scrub
from moe_vlm.record.records import RecordError, RunRecord
from moe_vlm.report.gate import software_of
from moe_vlm.report.table import ranked
from moe_vlm.runtime import points

BEST_YAML = "best.yaml"
# Which class a winner comes from, in order: a lower class wins only where no higher one ran.
CLASSES = (
    ("ranked", False, False, "synthetic or real data with real routing"),
    (
        "forced_balance",
        False,
        True,
        "forced-balance routing: no real-routing run completed; not a real winner",
    ),
    ("mock", True, False, "mock data: no synthetic or real run completed; not a performance proxy"),
)


def _number(value: Any) -> float | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return float(value)


def winner(table: pd.DataFrame) -> tuple[pd.Series, list[str], str, str] | None:
    """(the winning row, the runs tied with it, its class, what the class means), or None."""
    for name, mock, forced, meaning in CLASSES:
        rows = ranked(table, mock=mock, forced=forced)
        if rows.empty:
            continue
        first = rows.iloc[0]
        tied = [str(r["run"]) for _, r in rows.iloc[1:].iterrows() if r["place"] == first["place"]]
        return first, tied, name, meaning
    return None


def rerun_command(overrides: list[str], launcher: list[str]) -> str:
    return " ".join(["python train.py -m", *(shlex.quote(o) for o in [*overrides, *launcher])])


def content(table: pd.DataFrame) -> dict[str, Any] | None:
    found = winner(table)
    if found is None:
        return None
    row, tied, name, meaning = found
    run_dir = Path(str(row["run_dir"]))
    run = RunRecord.read(RunPaths(run_dir).run_json)
    point = points.read_point(run_dir) or {}
    overrides = [str(o) for o in point.get("overrides") or run.overrides()]
    launcher = [str(o) for o in point.get("launcher_overrides") or []]
    low, high = _number(row.get("eff_low")), _number(row.get("eff_high"))
    return scrub(
        {
            "winner": {
                "point_id": run.point_id,
                "run_dir": str(run_dir),
                "class": name,
                "class_means": meaning,
                "place": str(row["place"]),
                "tied_with": tied,
            },
            "overrides": overrides,
            "launcher_overrides": launcher,
            "rerun": rerun_command(overrides, launcher),
            "figures": {
                "effective_tokens_per_s_per_gpu": {
                    "p50": _number(row.get("eff_p50")) or _number(row["effective_tokens_per_s_per_gpu"]),
                    "band_p90_p10": [low, high] if low is not None and high is not None else None,
                    "mean": _number(row["effective_tokens_per_s_per_gpu"]),
                },
                "step_time_s": {q: _number(row.get(f"step_time_{q}_s")) for q in ("p10", "p50", "p90")},
                "steady_steps": row.get("steady_steps"),
                "peak_memory_gib": _number(row.get("peak_memory_gib")),
                "tflops_per_gpu": _number(row.get("tflops_per_gpu")),
                "mfu": _number(row.get("mfu")),
                "data": str(row["data"]),
                "routing": "forced_balance" if bool(row.get("forced_balance")) else "real",
            },
            "software": software_of(run),
        }
    )


def write(table: pd.DataFrame, out: Path) -> str:
    """Write best.yaml in `out`; the report's lines about it."""
    try:
        best = content(table)
    except RecordError as exc:
        return f"## Best\n\nNo {BEST_YAML}: the winner's record cannot be read ({exc})."
    if best is None:
        return f"## Best\n\nNo {BEST_YAML}: no run completed."
    write_atomic(out / BEST_YAML, yaml.safe_dump(best, sort_keys=False, width=1000))
    who = best["winner"]
    tied = f", tied with {', '.join(who['tied_with'])} inside the noise" if who["tied_with"] else ""
    return (
        f"## Best\n\n{out / BEST_YAML}: {who['point_id']} ({who['class']}: {who['class_means']}{tied}), "
        f"{best['figures']['effective_tokens_per_s_per_gpu']['p50']:,.1f} effective tokens/s/GPU.\n\n"
        f"Rerun it: `{best['rerun']}`"
    )
