"""The published measurements the step model is validated on: whole-step rows and A/B pairs.

Rows (published_rows.json): a figure someone measured and published (TFLOP/s/GPU, tokens/s/GPU or
seconds per step), its source, and the overrides that compose it as this tool's point. Its
measured step time:

tflops_per_gpu        Bridge's own FLOP count of the step (``step_flops(...).bridge``, the figure
                      Megatron logs) over the published rate x GPUs
tokens_per_s_per_gpu  Bridge's nominal tokens, GBS x seq_length, over the published rate x GPUs
step_time_s           as published

Pairs (published_pairs.json): one knob, or one stated recipe stack, changed on the same model and
GPUs; the measured ratio of step times or of throughputs.

The step model fits nothing on either (hardware.py: rates with sources; step.py: the step), so
every error here is out of sample. ``family_bands`` turns the rows' errors into the bands a point
of each family gets (families.py); ``row_results`` judges each row against the band its families
get from the OTHER rows (leave-one-row-out), so the coverage it reports is measured, not assumed.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

from moe_vlm.config.compose import compose_config
from moe_vlm.config.spec import RunSpec
from moe_vlm.perf.flops import step_flops
from moe_vlm.predict.band import COVERAGE, conformal_width, score
from moe_vlm.predict.families import GROUPINGS, HYBRID_FAMILIES, FamilyBand, families_of
from moe_vlm.predict.hardware import gpu_hardware
from moe_vlm.predict.step_time import loads
from moe_vlm.predict.workload import expected_workload

ROWS_FILE = Path(__file__).with_name("published_rows.json")
PAIRS_FILE = Path(__file__).with_name("published_pairs.json")
# What every row runs unless it says otherwise: Bridge's perf recipes' sequence length, forced
# routing (every sister-skill benchmark row forces it: sister-skills.md 2.5), no CUDA graphs.
BASE = ("seq_length=4096", "cuda_graph=none", "router=forced_balance")
FIGURES = ("tflops_per_gpu", "tokens_per_s_per_gpu", "step_time_s")


@functools.cache
def _spec(overrides: tuple[str, ...]) -> RunSpec:
    return RunSpec.from_config(compose_config(list(overrides)))


def predicted_s(spec: RunSpec) -> float:
    """The step model's seconds for the point at its published rates, nothing fitted."""
    hw = gpu_hardware(spec.cluster)
    if hw is None:
        raise ValueError(f"cluster={spec.cluster.name}: no published rates")
    return sum(load.base_s for load in loads(spec, expected_workload(spec).workload, hw))


def bridge_flops(spec: RunSpec) -> float:
    return step_flops(spec, expected_workload(spec).workload).bridge


@dataclass(frozen=True)
class PublishedRow:
    name: str
    source: str
    gpus: int
    layout: str
    figure: str  # one of FIGURES
    value: float
    overrides: tuple[str, ...]
    excluded: str = ""  # why the row is shown but neither bands nor scores the model ("": it does)

    def spec(self) -> RunSpec:
        return _spec((*BASE, *self.overrides))

    @property
    def families(self) -> dict[str, str]:
        return families_of(self.spec())

    def measured_s(self) -> float:
        """The row's step time in seconds (module docstring)."""
        spec = self.spec()
        if self.figure == "step_time_s":
            return self.value
        if self.figure == "tokens_per_s_per_gpu":
            return spec.gbs * spec.seq_length / (self.value * self.gpus)
        return bridge_flops(spec) / (self.value * 1e12 * self.gpus)


def published_rows(path: Path = ROWS_FILE) -> tuple[PublishedRow, ...]:
    raw = json.loads(path.read_text())
    rows = tuple(
        PublishedRow(
            name=str(r["name"]),
            source=str(r["source"]),
            gpus=int(r["gpus"]),
            layout=str(r["layout"]),
            figure=str(r["figure"]),
            value=float(r["value"]),
            overrides=tuple(str(o) for o in r["overrides"]),
            excluded=str(r.get("excluded", "")),
        )
        for r in raw["rows"]
    )
    for row in rows:
        if row.figure not in FIGURES:
            raise ValueError(f"{path}: row {row.name!r}: figure in {FIGURES}")
    return rows


@dataclass(frozen=True)
class RowResult:
    row: PublishedRow
    measured_s: float
    predicted_s: float
    band: float  # the band its families get from the other rows (leave-one-row-out)
    band_basis: str

    @property
    def error(self) -> float:
        """(predicted - measured) / measured: negative = predicted too fast."""
        return self.predicted_s / self.measured_s - 1.0

    @property
    def score(self) -> float:
        return score(self.predicted_s, self.measured_s)

    @property
    def inside(self) -> bool:
        return self.score <= self.band


def family_bands(scored: dict[str, tuple[dict[str, str], float]]) -> dict[tuple[str, str], FamilyBand]:
    """Per (grouping, family): the 80 % conformal width of its rows' scores, or with too few rows
    their worst. `scored`: row name -> (its families, its score). A Gated DeltaNet hybrid's rows
    band only their own model family: no published rate stands for its kernels (step.py), so its
    error says nothing about the GPUs, data or dispatchers it shares with the others."""
    out: dict[tuple[str, str], FamilyBand] = {}
    for grouping in GROUPINGS:
        for family in sorted({f[grouping] for f, _ in scored.values()}):
            scores = [
                s
                for f, s in scored.values()
                if f[grouping] == family and (grouping == "model" or f["model"] not in HYBRID_FAMILIES)
            ]
            if not scores:
                continue
            width = conformal_width(scores)
            out[(grouping, family)] = FamilyBand(
                round(width if width is not None else max(scores), 4), len(scores), width is not None
            )
    return out


def band_from(
    bands: dict[tuple[str, str], FamilyBand], families: dict[str, str], widest: float
) -> tuple[float, str]:
    known = {g: bands[(g, f)] for g, f in families.items() if (g, f) in bands}
    missing = [g for g in GROUPINGS if g not in known]
    if missing:
        return widest, f"uncalibrated ({', '.join(missing)})"
    grouping, found = max(known.items(), key=lambda item: item[1].width)
    return (
        found.width,
        f"{grouping} {families[grouping]}: {'80% of' if found.conformal else 'worst of'} {found.rows}",
    )


def _scored(rows: tuple[PublishedRow, ...]) -> dict[str, tuple[dict[str, str], float]]:
    """Row name -> (its families, its score), over the rows that score the model."""
    return {
        r.name: (r.families, score(predicted_s(r.spec()), r.measured_s())) for r in rows if not r.excluded
    }


def row_results(rows: tuple[PublishedRow, ...] | None = None) -> list[RowResult]:
    """Every row predicted (nothing fitted), and the band the other rows give its families."""
    rows = rows if rows is not None else published_rows()
    scored = _scored(rows)
    out = []
    for row in rows:
        others = {name: entry for name, entry in scored.items() if name != row.name}
        widest = max(s for f, s in others.values() if f["model"] not in HYBRID_FAMILIES)
        band, basis = band_from(family_bands(others), row.families, widest)
        out.append(RowResult(row, row.measured_s(), predicted_s(row.spec()), band, basis))
    return out


def all_family_bands(
    rows: tuple[PublishedRow, ...] | None = None,
) -> tuple[dict[tuple[str, str], FamilyBand], float]:
    """families.FAMILY_BANDS and WIDEST_BAND, from every row."""
    rows = rows if rows is not None else published_rows()
    scored = _scored(rows)
    covered = [s for f, s in scored.values() if f["model"] not in HYBRID_FAMILIES]
    return family_bands(scored), round(max(covered), 4)


@dataclass(frozen=True)
class PublishedPair:
    name: str
    source: str
    base: tuple[str, ...]
    change: tuple[str, ...]
    figure: str  # step_time | throughput
    measured: float  # B / A
    noise: float
    excluded: str = ""  # why the pair is shown but not judged

    def specs(self) -> tuple[RunSpec, RunSpec]:
        return _spec((*BASE, *self.base)), _spec((*BASE, *self.base, *self.change))

    def predicted(self) -> float:
        a, b = self.specs()
        ratio = predicted_s(b) / predicted_s(a)
        if self.figure == "step_time":
            return ratio
        return bridge_flops(b) / bridge_flops(a) / ratio

    @property
    def effect_exceeds_noise(self) -> bool:
        return abs(self.measured - 1.0) > self.noise

    def judged(self) -> tuple[bool | None, float]:
        """(direction right, or None for a tie inside the noise; size error in points). A
        predicted effect inside the noise where the measured one is beyond it is no direction at
        all: not right."""
        guess = self.predicted()
        if not self.effect_exceeds_noise:
            return None, (guess - self.measured) * 100
        direction = abs(guess - 1.0) > self.noise and (guess > 1.0) == (self.measured > 1.0)
        return direction, (guess - self.measured) * 100


def ratio_band(pairs: tuple[PublishedPair, ...]) -> float:
    """The relative error of a predicted A/B ratio that 80 % of the judged pairs stay within (their
    empirical quantile: too few pairs for a conformal one, whose rank would be the worst of 8)."""
    scores = sorted(abs(p.predicted() / p.measured - 1) for p in pairs if not p.excluded)
    return round(scores[math.ceil(COVERAGE * len(scores)) - 1], 4)


def published_pairs(path: Path = PAIRS_FILE) -> tuple[PublishedPair, ...]:
    raw = json.loads(path.read_text())
    return tuple(
        PublishedPair(
            name=str(p["name"]),
            source=str(p["source"]),
            base=tuple(p["base"]),
            change=tuple(p["change"]),
            figure=str(p["figure"]),
            measured=float(p["measured"]),
            noise=float(p["noise"]),
            excluded=str(p.get("excluded", "")),
        )
        for p in raw["pairs"]
    )


def rows_table(results: list[RowResult]) -> list[str]:
    units = {"tflops_per_gpu": "TFLOP/s/GPU", "tokens_per_s_per_gpu": "tokens/s/GPU", "step_time_s": "s/step"}
    lines = [
        f"| row | GPUs | published | measured s | predicted s | error | {COVERAGE:.0%} band (from the other rows) | inside | source |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        inside = "excluded" if r.row.excluded else ("yes" if r.inside else "NO")
        lines.append(
            f"| {r.row.name} | {r.row.gpus} | {r.row.value:g} {units[r.row.figure]} | {r.measured_s:.2f} "
            f"| {r.predicted_s:.2f} | {r.error:+.1%} | +/-{r.band:.0%} ({r.band_basis}) | {inside} "
            f"| {r.row.source} |"
        )
    lines.append("")
    for label, judged in (
        ("every scoring row", scored_results(results)),
        ("without the hybrid", covered_results(results)),
    ):
        errors = [abs(r.error) for r in judged]
        lines.append(
            f"{label}: {len(judged)} rows, nothing fitted: mean absolute error {sum(errors) / len(errors):.1%}, "
            f"worst {max(errors):.1%}, {sum(r.inside for r in judged)} of {len(judged)} inside their band "
            f"({sum(r.inside for r in judged) / len(judged):.0%})."
        )
    for r in results:
        if r.row.excluded:
            lines.append(f"Excluded: {r.row.name} ({r.error:+.0%}): {r.row.excluded}.")
    return lines


def scored_results(results: list[RowResult]) -> list[RowResult]:
    return [r for r in results if not r.row.excluded]


def covered_results(results: list[RowResult]) -> list[RowResult]:
    """The rows of architectures the rates cover (no Gated DeltaNet hybrid): the targets' basis."""
    return [r for r in scored_results(results) if r.row.families["model"] not in HYBRID_FAMILIES]


def pairs_table(pairs: tuple[PublishedPair, ...]) -> list[str]:
    lines = [
        "| pair | figure (B / A) | measured | predicted | direction | size error | noise | source |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in pairs:
        direction, points = p.judged()
        verdict = "tie (inside the noise)" if direction is None else ("right" if direction else "WRONG")
        if direction is False and abs(p.predicted() - 1.0) <= p.noise:
            verdict = "WRONG: predicted no effect"
        verdict = f"excluded: {p.excluded}" if p.excluded else verdict
        lines.append(
            f"| {p.name} | {p.figure} | {p.measured:.3f} | {p.predicted():.3f} | {verdict} | {points:+.1f} pts "
            f"| +/-{p.noise:.0%} | {p.source} |"
        )
    judged = [p.judged() for p in pairs if not p.excluded]
    right = sum(1 for d, _ in judged if d)
    wrong = sum(1 for d, _ in judged if d is False)
    within = sum(1 for _, pts in judged if abs(pts) <= 10)
    lines.append("")
    lines.append(
        f"{len(judged)} pairs judged ({len(pairs) - len(judged)} excluded): direction right {right}, wrong {wrong}, "
        f"ties {len(judged) - right - wrong}; size within 10 points: {within} of {len(judged)}."
    )
    return lines
