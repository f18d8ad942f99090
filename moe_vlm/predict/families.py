"""Which validated family a point belongs to, and the band its family's out-of-sample errors give.

A point belongs to one family per grouping: its GPU generation, precision, model family, data kind
and dispatcher. The step model is fitted on nothing, so every published row's error is out of
sample; a family's band is the 80 % conformal quantile of its rows' scores (band.py) when it has
enough of them, else its worst score, said so. A point's band is the widest of its families'. A
point in a family no published row stands for (an FP8 current-scaling run, a GPU generation with
no row) is uncalibrated there: it gets the widest score of all rows, and the plan says which family
it lacked. FAMILY_BANDS is what ``published.family_bands()`` computes on published_rows.json
(``python scripts/bench_predict.py --families`` prints it; tests/unit/test_predict_out_of_sample.py
recomputes it and fails when the rows or the model move it).
"""

from __future__ import annotations

from dataclasses import dataclass

from moe_vlm.config.schema import DataKind, Engine
from moe_vlm.config.spec import RunSpec
from moe_vlm.predict.band import COVERAGE
from moe_vlm.predict.terms import Term, ep_term

GROUPINGS = ("gpu", "precision", "model", "data", "dispatcher")
GENERATIONS = {"h100": "Hopper", "h200": "Hopper", "b200": "Blackwell", "gb200": "Blackwell"}
GENERATIONS |= {"b300": "Blackwell Ultra", "gb300": "Blackwell Ultra"}
MODEL_FAMILIES = {
    "qwen3_vl_235b_a22b": "Qwen3 235B",
    "qwen3_vl_30b_a3b": "Qwen3 30B",
    "qwen35_vl_35b_a3b": "Qwen3.5 35B",
}
# Model families with Gated DeltaNet layers: banded by their own rows only (published.family_bands).
HYBRID_FAMILIES = ("Qwen3.5 35B",)
DATA_FAMILIES = {DataKind.mock: "text mock", DataKind.bridge_mock: "Bridge VLM mock"}
DISPATCHERS = {
    Term.ep_alltoall: "alltoall",
    Term.ep_allgather: "allgather",
    Term.ep_deepep: "DeepEP",
    Term.ep_hybridep: "HybridEP",
}


def families_of(spec: RunSpec) -> dict[str, str]:
    """The point's family in each grouping."""
    return {
        "gpu": GENERATIONS.get(spec.cluster.name, spec.cluster.name),
        "precision": spec.precision.format.value.upper(),
        "model": MODEL_FAMILIES.get(spec.model.name, spec.model.name),
        "data": DATA_FAMILIES.get(spec.data.kind, "images"),
        "dispatcher": DISPATCHERS[ep_term(spec)] if spec.layout.ep > 1 else "no EP",
    }


@dataclass(frozen=True)
class FamilyBand:
    width: float  # relative half-width
    rows: int  # published rows in the family
    conformal: bool  # an 80 % quantile (enough rows), else the family's worst score


# published.family_bands() on published_rows.json with the step model of this commit.
FAMILY_BANDS: dict[tuple[str, str], FamilyBand] = {
    ("data", "Bridge VLM mock"): FamilyBand(0.3393, 1, False),
    ("data", "text mock"): FamilyBand(0.2177, 8, True),
    ("dispatcher", "DeepEP"): FamilyBand(0.0851, 2, False),
    ("dispatcher", "HybridEP"): FamilyBand(0.3393, 6, True),
    ("dispatcher", "alltoall"): FamilyBand(0.0964, 1, False),
    ("gpu", "Blackwell"): FamilyBand(0.3393, 5, True),
    ("gpu", "Hopper"): FamilyBand(0.2177, 4, True),
    ("model", "Qwen3 235B"): FamilyBand(0.3393, 3, False),
    ("model", "Qwen3 30B"): FamilyBand(0.2177, 6, True),
    ("model", "Qwen3.5 35B"): FamilyBand(1.1747, 1, False),
    ("precision", "BF16"): FamilyBand(0.3393, 7, True),
    ("precision", "FP8MX"): FamilyBand(0.1586, 2, False),
}
# The widest score of any published row: the band of a family no row stands for.
WIDEST_BAND = 0.3393
# The relative error of a predicted A/B ratio 80 % of the published pairs stay within
# (published.ratio_band): two points one step apart share most of their error, so `moe-vlm
# explain` calls a difference a tie inside this, not inside the two points' own bands.
PAIR_BAND = 0.1843
# The same over scripts/bench_predict.py's CPU knob moves (cluster=local, probe rates).
CPU_PAIR_BAND = 0.08
# cluster=local predicted from the probe's measured rates: the 80 % quantile of the errors of
# scripts/bench_predict.py's CPU sweep (docs/step-time-prediction.md, "CPU").
CPU_PROBE_BAND = 0.3645


def pair_band(spec: RunSpec) -> float:
    """How far a predicted ratio between this point and a neighbour can be off (80 % of pairs)."""
    return PAIR_BAND if spec.cluster.is_gpu_cluster else CPU_PAIR_BAND


@dataclass(frozen=True)
class Band:
    width: float
    basis: str  # in the plan's words
    uncalibrated: str | None  # which family no row stands for, or None


def band_for(spec: RunSpec) -> Band:
    """The point's band from its families' out-of-sample errors (module docstring)."""
    if not spec.cluster.is_gpu_cluster:
        return Band(
            CPU_PROBE_BAND,
            f"{COVERAGE:.0%} band of the CPU benchmark's out-of-sample errors (probe rates, nothing fitted)",
            None,
        )
    if spec.engine is Engine.torch:
        return Band(
            WIDEST_BAND,
            f"uncalibrated: no published row runs the torch engine on GPUs; the widest out-of-sample error "
            f"of any row, +/-{WIDEST_BAND:.0%}",
            "the torch engine on GPUs",
        )
    mine = families_of(spec)
    known = {g: FAMILY_BANDS[(g, f)] for g, f in mine.items() if (g, f) in FAMILY_BANDS}
    missing = [f"{g} {mine[g]}" for g in GROUPINGS if g not in known]
    if missing:
        return Band(
            WIDEST_BAND,
            f"uncalibrated: no published row for {', '.join(missing)}; the widest out-of-sample error of "
            f"any row, +/-{WIDEST_BAND:.0%}",
            ", ".join(missing),
        )
    grouping, found = max(known.items(), key=lambda item: item[1].width)
    how = f"{COVERAGE:.0%} of" if found.conformal else "the worst of"
    return Band(
        found.width,
        f"{how} {found.rows} published row(s) of its {grouping} family ({mine[grouping]}), each out of "
        "sample (nothing fitted); the widest of its families",
        None,
    )
