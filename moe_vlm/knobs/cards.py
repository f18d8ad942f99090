"""Published card rows as `card=<row>` options (conf/card/; the `sweep=card_*` presets choose one).

A card row is a configuration someone ran and published a figure for (the skill card's
moe-vlm-training/card.yaml, shared/reference/sister-skills.md section 1). Its option sets the knobs
the row ran with; where the row as written breaks a rule the engine enforces, the nearest valid
setting, with the reason. This module says how a run differs from its row (the plan's `card`
block, each difference with its reason or "given on the command line"), what the card leaves
unsaid and this tool chose, and the published figure the report puts beside the measured one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from moe_vlm.config.spec import RunSpec
from moe_vlm.knobs.recipes import knob_changes, spec_value

# The reason a difference from the row has when its option does not declare one: the user's.
GIVEN = "given on the command line"


@dataclass(frozen=True)
class CardChange:
    knob: str
    as_written: Any
    run: Any
    reason: str

    def line(self) -> str:
        return f"  {self.knob:<30} card {self.as_written!s:<34} this run {self.run!s:<16} {self.reason}"


def card_row(spec: RunSpec) -> str | None:
    """The card row this run reproduces (card=<row>), or None."""
    return None if spec.card.row == "none" else spec.card.row


def card_changes(spec: RunSpec) -> list[CardChange]:
    """Every knob this run sets otherwise than its card row as written (empty without card=)."""
    if card_row(spec) is None:
        return []
    # A knob the card leaves unsaid is listed as assumed, not as a change from the row (the 3D
    # row's TP: its group option's default is no more the row's than the value chosen).
    return [
        CardChange(c.knob, c.wanted, c.run, spec.card.reasons.get(c.knob, GIVEN))
        for c in knob_changes(spec, spec.card.as_written)
        if c.knob not in spec.card.assumed
    ]


def row_as_run(spec: RunSpec) -> bool:
    """The run differs from its card row only where the option says why (nothing given by hand)."""
    return card_row(spec) is not None and all(c.reason != GIVEN for c in card_changes(spec))


def published_line(spec: RunSpec) -> str:
    card = spec.card
    tflops = (
        "none" if card.published_tflops_per_gpu is None else f"~{card.published_tflops_per_gpu:g} TFLOP/s/GPU"
    )
    mfu = "no MFU given" if card.published_mfu is None else f"~{card.published_mfu:.0%} MFU (peak not stated)"
    return f"published      {tflops}, {mfu}; validated_on {card.validated_on or 'not given'}"


def plan_lines(spec: RunSpec) -> list[str]:
    """The plan's card block: the row, its published figure and date, each knob the run changes
    from the row as written with its reason, and what the card leaves unsaid."""
    if card_row(spec) is None:
        return []
    found = card_changes(spec)
    lines = [f"card row       {spec.card.row} ({spec.card.source})", published_line(spec)]
    if found:
        lines.append(f"               this run changes {len(found)} knob(s) from the row as written:")
        lines += [c.line() for c in found]
    else:
        lines.append("               runs as written")
    if spec.card.assumed:
        lines.append("               not in the card, set here:")
        lines += [
            f"  {knob:<30} this run {spec_value(spec, knob)!s:<16} {why}"
            for knob, why in spec.card.assumed.items()
        ]
    lines.append(
        "               compare the measured tflops_per_gpu and bridge_tflops_per_gpu with the published "
        "figure (moe-vlm report puts it beside them)"
    )
    return lines
