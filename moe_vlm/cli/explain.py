"""`moe-vlm explain A B [SHARED...]`: why the step model ranks one point above another.

A and B are each one argument of overrides (quote several: "dispatcher=hybridep mbs=2"); SHARED
overrides apply to both. Prints both predictions and every term that differs, largest first, with
its seconds on each side and its share of the difference, the knobs that differ, and whether the
ratio is beyond what 80 % of published A/B ratios are predicted within (inside it: a tie).
"""

from __future__ import annotations

import shlex
import sys

from moe_vlm.base import inputs
from moe_vlm.base.errors import EXIT_INVALID, BadInput
from moe_vlm.base.inputs import refuse
from moe_vlm.config.compose import compose_config
from moe_vlm.config.preflight import COMPOSE_ERRORS
from moe_vlm.config.preflight import explain as explain_error
from moe_vlm.config.spec import RunSpec
from moe_vlm.predict.families import pair_band
from moe_vlm.predict.model import Prediction, predict
from moe_vlm.predict.terms import Term

PROG = "moe-vlm explain"


def parser() -> inputs.Parser:
    p = inputs.Parser(
        prog=PROG,
        description=__doc__.splitlines()[0] if __doc__ else None,
        epilog='example: moe-vlm explain "dispatcher=hybridep" "dispatcher=alltoall" cluster=gb200 '
        "model=qwen3_vl_30b_a3b nodes=2",
    )
    p.add_argument(
        "a", type=inputs.Text('"dispatcher=hybridep mbs=2"'), help="point A's overrides, one argument"
    )
    p.add_argument(
        "b", type=inputs.Text('"dispatcher=alltoall mbs=2"'), help="point B's overrides, one argument"
    )
    p.add_argument(
        "shared",
        nargs="*",
        type=inputs.Text("cluster=gb200"),
        help="overrides both points share (train.py's)",
    )
    return p


def _spec(overrides: list[str]) -> RunSpec:
    try:
        return RunSpec.from_config(compose_config(overrides))
    except COMPOSE_ERRORS as exc:
        raise BadInput(explain_error(exc, overrides)) from None


def differing_knobs(a: RunSpec, b: RunSpec) -> list[str]:
    """The resolved knobs that differ between the two points (dotted names)."""
    flat_a, flat_b = _flat(a.to_dict()), _flat(b.to_dict())
    return [
        f"{key}: {flat_a.get(key)} -> {flat_b.get(key)}"
        for key in sorted(flat_a.keys() | flat_b.keys())
        if flat_a.get(key) != flat_b.get(key)
    ]


def _flat(tree: object, prefix: str = "") -> dict[str, object]:
    if isinstance(tree, dict):
        out: dict[str, object] = {}
        for key, value in tree.items():
            out |= _flat(value, f"{prefix}{key}.")
        return out
    return {prefix[:-1]: tree}


def comparison(spec: RunSpec, a: Prediction, b: Prediction, top: int = 12) -> list[str]:
    """The terms that differ, largest first, and a verdict: a tie when the ratio is inside what
    predicted A/B ratios are off by (families.pair_band), not the points' own bands: two points one
    step apart share most of their error."""
    if a.step_time_s is None or b.step_time_s is None:
        return [f"not predicted: {(a if a.step_time_s is None else b).note}"]
    seconds_a = {t.term: t.seconds for t in a.terms}
    seconds_b = {t.term: t.seconds for t in b.terms}
    why = {t.term: t.why for t in (*a.terms, *b.terms)}
    diff = b.step_time_s - a.step_time_s
    rows = sorted(
        (
            (term, seconds_a.get(term, 0.0), seconds_b.get(term, 0.0))
            for term in seconds_a.keys() | seconds_b.keys()
        ),
        key=lambda row: -abs(row[2] - row[1]),
    )
    faster = "B" if diff < 0 else "A"
    ratio = max(a.step_time_s, b.step_time_s) / min(a.step_time_s, b.step_time_s)
    noise = pair_band(spec)
    lines = [
        f"step time   A {a.step_time_s:.4g} s   B {b.step_time_s:.4g} s   ({faster} is {ratio:.2f}x faster)",
        (
            f"verdict     a tie: {ratio:.2f}x is inside the +/-{noise:.0%} that 80% of published A/B ratios are "
            f"predicted within (each point alone: +/-{a.sigma:.0%}, +/-{b.sigma:.0%})"
            if ratio - 1 <= noise
            else f"verdict     {faster} first: {ratio:.2f}x is beyond the +/-{noise:.0%} that 80% of published A/B "
            "ratios are predicted within"
        ),
        "",
        f"{'term':<12} {'A s':>10} {'B s':>10} {'B - A':>10} {'share':>7}  why (B)",
    ]
    shown = [(term, sa, sb) for term, sa, sb in rows[:top] if abs(sb - sa) > 1e-12]
    for term, sa, sb in shown:
        share = (sb - sa) / diff if diff else 0.0
        lines.append(f"{term:<12} {sa:10.4g} {sb:10.4g} {sb - sa:+10.4g} {share:7.0%}  {why.get(term, '')}")
    lines.append(f"{'total':<12} {a.step_time_s:10.4g} {b.step_time_s:10.4g} {diff:+10.4g}")
    names = {term for term, _, _ in shown}
    lines += ["", *(f"{t.value}: {t.meaning}" for t in Term if t.value in names)]
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        shared = list(args.shared)
        a_over = [*shared, *shlex.split(args.a)]
        b_over = [*shared, *shlex.split(args.b)]
        a, b = _spec(a_over), _spec(b_over)
    except BadInput as exc:
        return refuse(PROG, exc)
    except ValueError as exc:  # shlex: an unclosed quote
        print(f"{PROG}: error: A or B: {exc}; quote each point's overrides as one argument", file=sys.stderr)
        return EXIT_INVALID
    found_a, found_b = predict(a), predict(b)
    print(f"A: {' '.join(a_over) or '(defaults)'}")
    print(f"B: {' '.join(b_over) or '(defaults)'}")
    knobs = differing_knobs(a, b)
    print("knobs that differ: " + ("; ".join(knobs) if knobs else "none"))
    print(f"rates: {found_a.source}")
    print()
    print("\n".join(comparison(a, found_a, found_b)))
    return 0
