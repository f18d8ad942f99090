"""The published measured rows (published_rows.json) and the predictor's out-of-sample validation.

Each row is a figure someone measured and published (TFLOP/s/GPU, tokens/s/GPU or seconds per
step), its source, and the overrides that compose it as this tool's point. Its measured step time:

tflops_per_gpu        Bridge's own FLOP count of the step (``step_flops(...).bridge``, the figure
                      Megatron logs) over the published rate x GPUs
tokens_per_s_per_gpu  Bridge's nominal tokens, GBS x seq_length (megatron-bridge.md: tokens/s is
                      nominal), over the published rate x GPUs
step_time_s           as published

``out_of_sample(grouping)`` leaves out one family at a time (every row sharing a model family, a
GPU generation, a data kind or a precision), fits the group scales (compute, data movement,
per-step constant: calibration.fit_scales) on the other rows, and predicts the family's rows.
Each row's band is band.py's: the conformal quantile of the scores the same family-left-out
procedure gives on the rows outside the row's family only (nested leave-out: neither the fit nor
the band's width saw the row or its family), so the table's coverage is measured, not assumed.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from moe_vlm.config.arch import Mixer, layer_kinds
from moe_vlm.config.compose import compose_config
from moe_vlm.config.spec import RunSpec
from moe_vlm.perf.flops import step_flops
from moe_vlm.predict.band import COVERAGE, UNCALIBRATED_BAND, conformal_width, score
from moe_vlm.predict.calibration import Calibration, Sample, calibrate, fit_scales, predicted_s
from moe_vlm.predict.terms import Term, loads
from moe_vlm.predict.workload import expected_workload

ROWS_FILE = Path(__file__).with_name("published_rows.json")
# What every row runs unless it says otherwise: Bridge's perf recipes' sequence length, forced
# routing (every sister-skill benchmark row forces it: sister-skills.md 2.5) and no CUDA graphs
# (the model has no graph term).
BASE = ("seq_length=4096", "cuda_graph=none", "router=forced_balance")
GROUPINGS = ("model", "gpu", "data", "precision")
FIGURES = ("tflops_per_gpu", "tokens_per_s_per_gpu", "step_time_s")


@dataclass(frozen=True)
class PublishedRow:
    name: str
    source: str  # file and line (or the URL the reference gives)
    model: str
    gpu: str
    gpus: int
    layout: str
    precision: str
    data: str
    figure: str  # one of FIGURES
    value: float
    overrides: tuple[str, ...]
    families: dict[str, str]  # grouping -> family

    def spec(self) -> RunSpec:
        return _spec((*BASE, *self.overrides))

    @property
    def covered(self) -> bool:
        """Whether the defaults are fitted on it: not a hybrid (Gated DeltaNet) model, whose
        layers no other row measures (is_hybrid)."""
        return not is_hybrid(self.spec())

    def measured_s(self) -> float:
        """The row's step time in seconds (module docstring)."""
        spec = self.spec()
        if self.figure == "step_time_s":
            return self.value
        if self.figure == "tokens_per_s_per_gpu":
            return spec.gbs * spec.seq_length / (self.value * self.gpus)
        work = expected_workload(spec).workload
        return step_flops(spec, work).bridge / (self.value * 1e12 * self.gpus)

    def sample(self) -> Sample:
        spec = self.spec()
        work = expected_workload(spec).workload
        # Compute only: on these rows the collectives and the per-step constant are not separable
        # from compute (a free scale for each overfits a family of 3 rows), so the defaults are one
        # scale, 1 / the share of the peaks a step reaches.
        base = {load.term: load.base_s for load in loads(spec, work) if load.term.is_compute}
        return Sample(self.name, base, self.measured_s())


def is_hybrid(spec: RunSpec) -> bool:
    """A model with Gated DeltaNet (linear attention) layers: the Qwen3.5 family."""
    return any(kind.mixer is Mixer.linear_attention for kind in layer_kinds(spec.model))


@functools.cache
def _spec(overrides: tuple[str, ...]) -> RunSpec:
    return RunSpec.from_config(compose_config(list(overrides)))


def published_rows(path: Path = ROWS_FILE) -> tuple[PublishedRow, ...]:
    raw = json.loads(path.read_text())
    rows = tuple(
        PublishedRow(
            name=str(r["name"]),
            source=str(r["source"]),
            model=str(r["model"]),
            gpu=str(r["gpu"]),
            gpus=int(r["gpus"]),
            layout=str(r["layout"]),
            precision=str(r["precision"]),
            data=str(r["data"]),
            figure=str(r["figure"]),
            value=float(r["value"]),
            overrides=tuple(str(o) for o in r["overrides"]),
            families={str(k): str(v) for k, v in dict(r["families"]).items()},
        )
        for r in raw["rows"]
    )
    for row in rows:
        if row.figure not in FIGURES or set(row.families) != set(GROUPINGS):
            raise ValueError(f"{path}: row {row.name!r}: figure in {FIGURES}, families {GROUPINGS}")
    return rows


@dataclass(frozen=True)
class RowResult:
    row: PublishedRow
    family: str
    measured_s: float
    predicted_s: float
    band: float  # relative half-width of the row's band (band.py), from rows outside its family
    scores: int  # how many out-of-sample errors measured it; 0: no held-out evidence, uncalibrated

    @property
    def error(self) -> float:
        """(predicted - measured) / measured: negative = predicted too fast."""
        return self.predicted_s / self.measured_s - 1.0

    @property
    def measured_band(self) -> bool:
        """Whether the width was measured (enough out-of-sample errors), not the uncalibrated one."""
        return self.scores > 0

    @property
    def inside(self) -> bool:
        """Whether the measured step lies in the predicted band, predicted x (1 +/- band)."""
        return score(self.predicted_s, self.measured_s) <= self.band


@dataclass(frozen=True)
class FamilySummary:
    grouping: str
    family: str
    rows: int
    mean_abs_error: float
    worst_error: float  # signed, the largest in size
    coverage: float  # share of rows inside their band
    measured_rows: int = 0  # rows whose band width was measured (not the uncalibrated one)
    measured_coverage: float | None = None  # share of those inside their band

    @property
    def band_needed(self) -> float:
        """The relative band that holds every row of this family predicted out of sample: the
        largest |measured / predicted - 1| (the plan's '+/-X %' where the family is uncalibrated)."""
        return abs(1.0 / (1.0 + self.worst_error) - 1.0)


def _family_fits(
    grouping: str, rows: tuple[PublishedRow, ...], samples: dict[str, Sample]
) -> Iterator[tuple[str, list[PublishedRow], dict[Term, float]]]:
    """(family, its rows, the group scales fitted on the covered rows outside it), per family."""
    for family in sorted({row.families[grouping] for row in rows}):
        inside = [row for row in rows if row.families[grouping] == family]
        # A hybrid row is never fitted on (the defaults are not): it is only predicted.
        train = [samples[row.name] for row in rows if row.families[grouping] != family and row.covered]
        if train:
            yield family, inside, fit_scales(train, per_term=False)


def out_of_sample_scores(
    rows: tuple[PublishedRow, ...], samples: dict[str, Sample] | None = None
) -> list[float]:
    """Every covered row's band score (band.score) under every grouping, each predicted by the fit
    on the covered rows outside its family: the evidence a band's width is measured on."""
    samples = samples if samples is not None else {row.name: row.sample() for row in rows}
    return [
        score(predicted_s(scales, samples[row.name].base), samples[row.name].measured_s)
        for grouping in GROUPINGS
        for _, inside, scales in _family_fits(grouping, rows, samples)
        for row in inside
        if row.covered
    ]


def out_of_sample(grouping: str, rows: tuple[PublishedRow, ...] | None = None) -> list[RowResult]:
    """Every row predicted by the group scales fitted on the rows outside its family, its band
    measured on those rows alone (nested: out_of_sample_scores of the rows outside the family)."""
    rows = rows if rows is not None else published_rows()
    samples = {row.name: row.sample() for row in rows}
    out: list[RowResult] = []
    for family, inside, scales in _family_fits(grouping, rows, samples):
        others = tuple(row for row in rows if row.families[grouping] != family)
        scores = out_of_sample_scores(others, samples)
        width = conformal_width(scores)
        for row in inside:
            sample = samples[row.name]
            out.append(
                RowResult(
                    row,
                    family,
                    sample.measured_s,
                    predicted_s(scales, sample.base),
                    UNCALIBRATED_BAND if width is None else width,
                    0 if width is None else len(scores),
                )
            )
    return out


def default_band(rows: tuple[PublishedRow, ...] | None = None) -> tuple[float, int]:
    """The GPU defaults' band (predict/model.py DEFAULT_BAND) and how many out-of-sample errors
    measured it: band.py's quantile of every covered row's errors with its family left out."""
    rows = rows if rows is not None else published_rows()
    scores = out_of_sample_scores(rows)
    width = conformal_width(scores)
    if width is None:
        raise ValueError(f"{len(scores)} out-of-sample errors: too few for a {COVERAGE:.0%} band")
    return width, len(scores)


def default_fit(rows: tuple[PublishedRow, ...] | None = None) -> Calibration:
    """The GPU defaults (predict/model.py): the group scales on every covered row, with their
    leave-one-out spread."""
    rows = rows if rows is not None else published_rows()
    samples = [row.sample() for row in rows if row.covered]
    return calibrate("gpu", "published", samples, "published rows", per_term=False)


def summaries(grouping: str, results: list[RowResult], covered: bool = True) -> list[FamilySummary]:
    """Per family; `covered`: over the rows the defaults cover (hybrid rows apart: their band is
    the plan's uncalibrated one, set from their own error, so counting them would be circular)."""
    out = []
    for family in sorted({r.family for r in results}):
        mine = [r for r in results if r.family == family and r.row.covered == covered]
        if not mine:
            continue
        worst = max(mine, key=lambda r: abs(r.error))
        measured = [r for r in mine if r.measured_band]
        out.append(
            FamilySummary(
                grouping,
                family,
                len(mine),
                sum(abs(r.error) for r in mine) / len(mine),
                worst.error,
                sum(r.inside for r in mine) / len(mine),
                len(measured),
                sum(r.inside for r in measured) / len(measured) if measured else None,
            )
        )
    return out


def coverage(results: list[RowResult]) -> float:
    """The share of covered rows inside their band: the figure the >= 80 % target is on."""
    covered = [r for r in results if r.row.covered]
    return sum(r.inside for r in covered) / len(covered)


def _band_cell(r: RowResult) -> str:
    if not r.row.covered:
        return "uncalibrated"
    if not r.measured_band:
        return f"{r.band:.0%} uncalibrated (no family left to hold out)"
    return f"{r.band:.0%} (from {r.scores} errors)"


def table(grouping: str, results: list[RowResult]) -> list[str]:
    """Markdown: every row (predicted, published, error, inside the band) and each family's summary."""
    lines = [
        f"Left out by {grouping}: each family predicted by the fit on the other families' rows; its "
        f"{COVERAGE:.0%} band measured on those rows alone (nested leave-out).",
        "",
        f"| family | row | GPUs | published | measured s | predicted s | error | band ({COVERAGE:.0%}) "
        "| inside | source |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    units = {"tflops_per_gpu": "TFLOP/s/GPU", "tokens_per_s_per_gpu": "tokens/s/GPU", "step_time_s": "s/step"}
    for r in results:
        inside = ("yes" if r.inside else "NO") if r.row.covered else "-"
        lines.append(
            f"| {r.family} | {r.row.name} | {r.row.gpus} | {r.row.value:g} {units[r.row.figure]} "
            f"| {r.measured_s:.2f} | {r.predicted_s:.2f} | {r.error:+.1%} | {_band_cell(r)} | {inside} | {r.row.source} |"
        )
    lines += [
        "",
        "| family | rows | mean abs error | worst | band coverage | rows with a measured band: coverage |",
        "|---|---|---|---|---|---|",
    ]
    for s in summaries(grouping, results):
        held = "-" if s.measured_coverage is None else f"{s.measured_coverage:.0%}"
        lines.append(
            f"| {s.family} | {s.rows} | {s.mean_abs_error:.1%} | {s.worst_error:+.1%} | {s.coverage:.0%} "
            f"| {s.measured_rows}: {held} |"
        )
    covered = [r for r in results if r.row.covered]
    errors = [abs(r.error) for r in covered]
    measured = [r for r in covered if r.measured_band]
    on_measured = (
        f"{sum(r.inside for r in measured) / len(measured):.0%} of the {len(measured)} whose band was measured"
        if measured
        else "no row's band measured"
    )
    lines.append(
        f"\nThe {len(covered)} covered rows out of sample by {grouping}: mean abs error "
        f"{sum(errors) / len(errors):.1%}, worst {max(errors):.1%}, band coverage "
        f"{coverage(results):.0%} ({on_measured}; {len(covered) - len(measured)} judged against the "
        f"uncalibrated {UNCALIBRATED_BAND:.0%})."
    )
    for r in results:
        if not r.row.covered:
            lines.append(
                f"Uncalibrated architecture (Gated DeltaNet hybrid, never fitted on): {r.row.name} "
                f"{r.error:+.1%}: a band of +/-{summaries(grouping, [r], covered=False)[0].band_needed:.0%} holds it "
                "(the plan prints the widest over the groupings)."
            )
    return lines
