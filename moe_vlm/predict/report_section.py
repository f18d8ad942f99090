"""The report's "Predicted vs measured" section: each completed run's recorded prediction (run.json
"prediction", written when it ran) against the median step of its measured window, with the
window's p10-p90; a run the record flagged (more than FLAG_SIGMAS slower than predicted over at
least MIN_JUDGED_STEPS steps) is shown as a likely regression or fault."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from moe_vlm.predict.band import COVERAGE
from moe_vlm.predict.model import FLAG_SIGMAS, MIN_JUDGED_STEPS

COLUMNS = (
    "predicted_step_s",
    "predicted_sigma",
    "prediction_error",
    "prediction_sigmas",
    "prediction_flagged",
    "measured_p10_s",
    "measured_p90_s",
)


def row_fields(sections: Mapping[str, Any]) -> dict[str, Any]:
    """A report row's prediction columns from a run's sections (None where it recorded none)."""
    section = sections.get("prediction")
    section = section if isinstance(section, Mapping) else {}
    predicted = section.get("predicted")
    predicted = predicted if isinstance(predicted, Mapping) else {}

    def number(value: Any) -> float | None:
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

    return {
        "predicted_step_s": number(predicted.get("step_time_s")),
        "predicted_sigma": number(predicted.get("sigma")),
        "prediction_error": number(section.get("error")),
        "prediction_sigmas": number(section.get("sigmas")),
        # a record written before the judgement moved to the p50 carries no flag key: its sigmas
        "prediction_flagged": bool(section.get("flag"))
        if "flag" in section
        else (number(section.get("sigmas")) or 0.0) > FLAG_SIGMAS,
        "measured_p10_s": number(section.get("measured_p10_s")),
        "measured_p90_s": number(section.get("measured_p90_s")),
    }


def section(rows: list[dict[str, Any]], top: int) -> list[str]:
    """Markdown lines; [] when no completed run recorded a prediction."""
    known = [
        r for r in rows if r.get("predicted_step_s") is not None and r.get("prediction_error") is not None
    ]
    if not known:
        return []
    known.sort(key=lambda r: -(r.get("prediction_sigmas") or 0.0))
    flagged = [r for r in known if r.get("prediction_flagged")]
    errors = [abs(r["prediction_error"]) for r in known]
    lines = [
        "",
        "## Predicted vs measured (moe_vlm/predict: the prediction recorded when each run ran)",
        "",
        f"{len(known)} run(s): mean absolute error {sum(errors) / len(errors):.1%}; "
        f"{len(flagged)} more than {FLAG_SIGMAS:g} sigma slower than predicted at the window's median step "
        f"(judged over at least {MIN_JUDGED_STEPS} steady steps)"
        + (
            " (FLAGGED below: a likely regression or fault; rerun or compare with moe-vlm report --diff)"
            if flagged
            else ""
        )
        + ".",
        "",
        # "sigmas": the error in half-widths of the recorded band (band.py), the key's old name.
        f"| run | measured s p50 (p10-p90) | predicted s | {COVERAGE:.0%} band | error | sigmas | flag |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in known[:top]:
        sigmas = r.get("prediction_sigmas") or 0.0
        measured = r["predicted_step_s"] * (1 + r["prediction_error"])
        p10, p90 = r.get("measured_p10_s"), r.get("measured_p90_s")
        spread = f" ({p10:.3f}-{p90:.3f})" if p10 is not None and p90 is not None else ""
        sigma = r.get("predicted_sigma")
        bound = sigma is None  # a record from before issue 48: a probe's lower bound, no band, no flag
        lines.append(
            f"| {r.get('run')} | {measured:.3f}{spread} | {r['predicted_step_s']:.3f} "
            f"| {'lower bound' if bound else f'+/-{sigma:.0%}'} | {r['prediction_error']:+.1%} "
            f"| {'-' if bound else f'{sigmas:+.1f}'} | {'FLAGGED' if r.get('prediction_flagged') else ''} |"
        )
    if len(known) > top:
        lines.append(f"+ {len(known) - top} more; every row is in results.csv.")
    return lines
