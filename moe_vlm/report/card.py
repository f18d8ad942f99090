"""The report's view of published card rows (`card=<row>`, moe_vlm/knobs/cards.py): each run of one, its
row's published TFLOP/s/GPU beside the measured figures, both ours and Bridge's count (the card
does not say which count it used). Rows and headers only; report/build.py renders them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from moe_vlm.report.basis import num

TITLE = "## Card rows: the published figure beside the measured one"
NOTE = (
    "The card states neither its FLOP count nor its MFU peak: compare its figure with Bridge's count "
    "(padded positions, frozen modules x3) as well as ours (real tokens, frozen-aware); the plan lists "
    "how each run differs from its row as written (moe_vlm/knobs/cards.py)."
)
HEADER = [
    "run",
    "card row",
    "published TFLOP/s/GPU",
    "validated_on",
    "Bridge-count TFLOP/s/GPU",
    "Bridge / published",
    "ours TFLOP/s/GPU",
    "ours / published",
]


def rows_of(card: Mapping[str, Any] | None) -> dict[str, Any]:
    """The report table's columns from one run's recorded card (run.json spec.card)."""
    card = card or {}
    row = card.get("row")
    return {
        "card_row": None if row in (None, "none") else row,
        "published_tflops_per_gpu": card.get("published_tflops_per_gpu"),
        "published_mfu": card.get("published_mfu"),
        "card_validated_on": card.get("validated_on") or None,
    }


def _ratio(measured: Any, published: Any) -> str:
    if not isinstance(measured, int | float) or not isinstance(published, int | float) or not published:
        return "-"
    return f"{measured / published:.2f}x"


def table(rows: list[dict[str, Any]], top: int) -> list[list[str]]:
    """One line per completed run of a card row."""
    return [
        [
            str(r["run"]),
            str(r["card_row"]),
            num(r.get("published_tflops_per_gpu"), ",.4g"),
            str(r.get("card_validated_on") or "-"),
            num(r.get("bridge_tflops_per_gpu"), ",.4g"),
            _ratio(r.get("bridge_tflops_per_gpu"), r.get("published_tflops_per_gpu")),
            num(r.get("tflops_per_gpu"), ",.4g"),
            _ratio(r.get("tflops_per_gpu"), r.get("published_tflops_per_gpu")),
        ]
        for r in rows
        if r.get("card_row")
    ][:top]
