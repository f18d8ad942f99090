"""The report's "Predicted vs measured" section: each completed run's recorded prediction (run.json
"prediction", written when it ran) against its measured mean step time; a run more than
FLAG_SIGMAS slower than predicted is flagged as a likely regression or fault."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from moe_vlm.predict.model import FLAG_SIGMAS

COLUMNS = ("predicted_step_s", "predicted_sigma", "prediction_error", "prediction_sigmas")


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
    }


def section(rows: list[dict[str, Any]], top: int) -> list[str]:
    """Markdown lines; [] when no completed run recorded a prediction."""
    known = [
        r for r in rows if r.get("predicted_step_s") is not None and r.get("prediction_error") is not None
    ]
    if not known:
        return []
    known.sort(key=lambda r: -(r.get("prediction_sigmas") or 0.0))
    flagged = [r for r in known if (r.get("prediction_sigmas") or 0.0) > FLAG_SIGMAS]
    errors = [abs(r["prediction_error"]) for r in known]
    lines = [
        "",
        "## Predicted vs measured (moe_vlm/predict: the prediction recorded when each run ran)",
        "",
        f"{len(known)} run(s): mean absolute error {sum(errors) / len(errors):.1%}; "
        f"{len(flagged)} more than {FLAG_SIGMAS:g} sigma slower than predicted"
        + (
            " (FLAGGED below: a likely regression or fault; rerun or compare with moe-vlm report --diff)"
            if flagged
            else ""
        )
        + ".",
        "",
        "| run | measured s | predicted s | 1 sigma | error | sigmas | flag |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in known[:top]:
        sigmas = r.get("prediction_sigmas") or 0.0
        measured = r["predicted_step_s"] * (1 + r["prediction_error"])
        sigma = r.get("predicted_sigma")
        bound = sigma is None  # a probe's lower bound: no band, so no sigmas and no flag
        lines.append(
            f"| {r.get('run')} | {measured:.3f} | {r['predicted_step_s']:.3f} "
            f"| {'lower bound' if bound else f'{sigma:.0%}'} | {r['prediction_error']:+.1%} "
            f"| {'-' if bound else f'{sigmas:+.1f}'} | {'FLAGGED' if sigmas > FLAG_SIGMAS else ''} |"
        )
    if len(known) > top:
        lines.append(f"+ {len(known) - top} more; every row is in results.csv.")
    return lines
