"""The report's view of Bridge's logged TFLOP/s beside ours (run.json ``summary.flops_basis``,
moe_vlm/perf/flops_basis.py): a section of ``moe-vlm report`` and a table of ``report --diff``.
Rows and headers only; the callers render them (report.markdown.markdown_table)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from moe_vlm.perf.flops_basis import PETA

TITLE = "## Bridge's logged TFLOP/s beside ours"
NOTE = (
    "Bridge counts every padded position of GBS rows, the padded vocabulary and every module x3 "
    "(frozen ones too); ours counts real tokens, frozen-aware. `moe-vlm report --diff A B` splits "
    "the difference term by term (docs/reports.md)."
)
HEADER = ["run", "Bridge TFLOP/s/GPU", "ours", "ours / Bridge", "positions/sample", "real/sample", "real %"]


def num(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def rows_of(basis: Mapping[str, Any] | None) -> dict[str, Any]:
    """The report table's columns from one run's summary.flops_basis."""
    basis = basis or {}
    return {
        "bridge_useful_fraction": basis.get("useful_fraction"),
        "positions_per_sample": basis.get("positions_per_sample"),
        "real_tokens_per_sample": basis.get("real_tokens_per_sample"),
        "real_fraction": basis.get("real_fraction"),
    }


def table(rows: list[dict[str, Any]], top: int) -> list[list[str]]:
    """One line per completed run that recorded a basis: what Bridge would log, what is useful."""
    return [
        [
            str(r["run"]),
            num(r.get("bridge_tflops_per_gpu"), ",.4g"),
            num(r.get("tflops_per_gpu"), ",.4g"),
            num(r.get("bridge_useful_fraction"), ".1%"),
            num(r.get("positions_per_sample"), ",.0f"),
            num(r.get("real_tokens_per_sample"), ",.0f"),
            num(r.get("real_fraction"), ".1%"),
        ]
        for r in rows
        if r.get("bridge_useful_fraction") is not None
    ][:top]


def diff_rows(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[list[str]]:
    """Two runs' bases side by side (their run.json summaries), term by term."""
    basis_a, basis_b = a.get("flops_basis") or {}, b.get("flops_basis") or {}
    if not basis_a and not basis_b:
        return []
    terms = [t["name"] for t in (basis_a.get("terms") or basis_b.get("terms") or [])]

    def term(basis: Mapping[str, Any], name: str) -> float | None:
        found = [t["flops"] for t in basis.get("terms") or [] if t.get("name") == name]
        return found[0] if found else None

    def peta(value: Any) -> str:
        return "-" if value is None else f"{value / PETA:,.4g}"

    out = [
        ["positions/sample", num(basis_a.get("positions_per_sample"), ",.0f"), num(basis_b.get("positions_per_sample"), ",.0f")],
        ["real tokens/sample", num(basis_a.get("real_tokens_per_sample"), ",.0f"), num(basis_b.get("real_tokens_per_sample"), ",.0f")],
        ["real %", num(basis_a.get("real_fraction"), ".1%"), num(basis_b.get("real_fraction"), ".1%")],
        ["ViT patches/sample", num(basis_a.get("patches_per_sample"), ",.0f"), num(basis_b.get("patches_per_sample"), ",.0f")],
        ["Bridge's count (PFLOP/step)", peta(basis_a.get("bridge_flops")), peta(basis_b.get("bridge_flops"))],
        *([f"- {name} (PFLOP/step)", peta(term(basis_a, name)), peta(term(basis_b, name))] for name in terms),
        ["= ours (PFLOP/step)", peta(basis_a.get("model_flops")), peta(basis_b.get("model_flops"))],
        ["ours / Bridge", num(basis_a.get("useful_fraction"), ".1%"), num(basis_b.get("useful_fraction"), ".1%")],
        ["Bridge TFLOP/s/GPU", num(a.get("bridge_tflops_per_gpu"), ",.4g"), num(b.get("bridge_tflops_per_gpu"), ",.4g")],
        ["ours TFLOP/s/GPU", num(a.get("tflops_per_gpu"), ",.4g"), num(b.get("tflops_per_gpu"), ",.4g")],
    ]  # fmt: skip
    return out
