"""Calibration of the step-time model: one scale per term, fitted on recorded runs.

Per (cluster, stack version): runs of one cluster preset and one engine stack share their
efficiencies; another cluster or another library version is another calibration. The fit is a
non-negative least squares on relative residuals (every run weighs the same whatever its step
time), in two stages so that a handful of runs cannot overfit a dozen scales:

1. one scale for all compute, one for all data movement (collectives + optimizer), and the
   per-step constant; with a prior (the defaults), a ridge pulls each toward it;
2. one scale per term, ridged toward its stage-1 group scale (λ = RIDGE): a term the runs do not
   separate keeps its group's scale.

The uncertainty is the leave-one-out spread: each run predicted by a fit on the others. ``sigma``
records their root mean square; the band a prediction prints is band.py's conformal quantile of
the same errors (too few of them: UNCALIBRATED_BAND, said so).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moe_vlm.base.distributions import installed_versions
from moe_vlm.base.errors import BadInput
from moe_vlm.base.files import write_json_atomic
from moe_vlm.base.inputs import (
    CALIBRATION_ENV,
    calibration_file,
    check_calibration_file,
    json_has,
    output_file,
)
from moe_vlm.config.schema import Engine
from moe_vlm.predict.band import COVERAGE, UNCALIBRATED_BAND, conformal_width, describe, score_of_error
from moe_vlm.predict.terms import COMM, COMPUTE, Term

if TYPE_CHECKING:
    import numpy as np

FILE_VERSION = 1
RIDGE = 0.05
MIN_RUNS_FOR_SPREAD = 3

GROUPS: dict[str, tuple[Term, ...]] = {
    "compute": COMPUTE,
    "movement": (*COMM, Term.optimizer),
    "overhead": (Term.overhead,),
}


def calibration_path() -> Path:
    """$MOE_VLM_CALIBRATION, else the user's cache (base/inputs.py owns the variable)."""
    return calibration_file()


def stack_of(engine: Engine | str, versions: Mapping[str, Any] | None = None) -> str:
    """The stack a calibration holds for: the engine's library and its version (from a run's
    record env, else installed here)."""
    package = "megatron-core" if str(engine) == Engine.megatron.value else "torch"
    version = (versions or {}).get(package.replace("-", "_"))
    if version is None and versions is None:
        version = installed_versions().get(package) or None
    return f"{package} {version or 'unknown'}"


@dataclass(frozen=True)
class Calibration:
    cluster: str
    stack: str
    scales: dict[str, float]  # Term value -> scale on its base seconds
    sigma: float | None  # relative 1-sigma spread of the step time (leave-one-out); None: none known
    runs: int
    source: str  # in words: what it was fitted on
    residuals: dict[str, float] = field(default_factory=dict)  # run dir -> leave-one-out relative error
    # A probe's (moe_vlm/predict/probe.py): the probed kernels and collectives alone, so a whole
    # step takes longer by what it spends between them. It ranks points; it neither bands nor flags.
    lower_bound: bool = False
    # The band's relative half-width where it was measured elsewhere (the GPU defaults: the
    # published rows' family-left-out errors) and in words what on; None: from `residuals`.
    width: float | None = None
    width_basis: str = ""

    def scale(self, term: Term) -> float:
        if term.value not in self.scales and term is Term.gdn:
            # A calibration stored before Gated DeltaNet had its own term timed it with attention.
            return float(self.scales.get(Term.attention.value, 0.0))
        return float(self.scales.get(term.value, 0.0))

    @property
    def band(self) -> float:
        """The relative half-width of its COVERAGE band (band.py): measured out of sample, else
        UNCALIBRATED_BAND."""
        if self.width is not None:
            return self.width
        measured = conformal_width(score_of_error(e) for e in self.residuals.values())
        return measured if measured is not None else UNCALIBRATED_BAND

    @property
    def band_text(self) -> str:
        """What the band holds and what it was measured on, in the plan's words."""
        if self.width is not None:
            return describe(COVERAGE, self.width_basis)
        if conformal_width(score_of_error(e) for e in self.residuals.values()) is not None:
            return describe(COVERAGE, f"{len(self.residuals)} runs' leave-one-out errors")
        return (
            f"uncalibrated band +/-{UNCALIBRATED_BAND:.0%}: {len(self.residuals)} out-of-sample error(s), "
            f"too few for a {COVERAGE:.0%} band"
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Calibration:
        return cls(
            cluster=str(raw["cluster"]),
            stack=str(raw["stack"]),
            scales={str(k): float(v) for k, v in dict(raw["scales"]).items()},
            sigma=None if raw.get("sigma") is None else float(raw["sigma"]),
            runs=int(raw.get("runs", 0)),
            source=str(raw.get("source", "")),
            residuals={str(k): float(v) for k, v in dict(raw.get("residuals") or {}).items()},
            lower_bound=bool(raw.get("lower_bound", False)),
            width=None if raw.get("width") is None else float(raw["width"]),
            width_basis=str(raw.get("width_basis", "")),
        )


@dataclass(frozen=True)
class Sample:
    """One recorded run: its terms at base rates and the step time it measured."""

    name: str
    base: dict[Term, float]
    measured_s: float


def _solve(rows: list[list[float]], targets: list[float]) -> np.ndarray:
    # Here, not at the top: only a fit solves; every plan reads a calibration, and numpy's import
    # (0.1-0.2 s) was a tenth of a CPU dry run's start-up (issue 33).
    import numpy as np
    from scipy.optimize import nnls  # heavy, and absent from a bare GPU image: only a fit needs it

    solution, _ = nnls(np.array(rows, dtype=float), np.array(targets, dtype=float))
    return solution


def _fit_groups(samples: Sequence[Sample], prior: Mapping[Term, float] | None) -> dict[str, float]:
    names = list(GROUPS)
    rows = [[sum(s.base.get(t, 0.0) for t in GROUPS[g]) / s.measured_s for g in names] for s in samples]
    targets = [1.0] * len(samples)
    if prior:
        for j, group in enumerate(names):
            mean_prior = [prior[t] for t in GROUPS[group] if t in prior and prior[t] > 0]
            if mean_prior:
                value = sum(mean_prior) / len(mean_prior)
                row = [0.0] * len(names)
                row[j] = math.sqrt(RIDGE) / value
                rows.append(row)
                targets.append(math.sqrt(RIDGE))
    solution = _solve(rows, targets)
    return dict(zip(names, (float(v) for v in solution), strict=True))


def fit_scales(
    samples: Sequence[Sample], prior: Mapping[Term, float] | None = None, per_term: bool = True
) -> dict[Term, float]:
    """Scales per term (see the module docstring); `prior`: the defaults a ridge pulls toward;
    per_term False: stage 1 only (one scale per group)."""
    group = _fit_groups(samples, prior)
    start = {t: group[g] for g, terms in GROUPS.items() for t in terms}
    if not per_term:
        return start
    terms = [t for t in Term if any(s.base.get(t, 0.0) > 0 for s in samples)]
    rows = [[s.base.get(t, 0.0) / s.measured_s for t in terms] for s in samples]
    targets = [1.0] * len(samples)
    for j, term in enumerate(terms):
        if start[term] > 0:
            row = [0.0] * len(terms)
            row[j] = math.sqrt(RIDGE) / start[term]
            rows.append(row)
            targets.append(math.sqrt(RIDGE))
    solution = _solve(rows, targets)
    return {**start, **dict(zip(terms, (float(v) for v in solution), strict=True))}


def predicted_s(scales: Mapping[Term, float], base: Mapping[Term, float]) -> float:
    return sum(scales.get(t, 0.0) * seconds for t, seconds in base.items())


def leave_one_out(
    samples: Sequence[Sample], prior: Mapping[Term, float] | None = None, per_term: bool = True
) -> dict[str, float]:
    """Each run's relative error when the others calibrate: (predicted - measured) / measured."""
    errors: dict[str, float] = {}
    for i, sample in enumerate(samples):
        scales = fit_scales([s for j, s in enumerate(samples) if j != i], prior, per_term)
        errors[sample.name] = predicted_s(scales, sample.base) / sample.measured_s - 1.0
    return errors


def calibrate(
    cluster: str,
    stack: str,
    samples: Sequence[Sample],
    source: str,
    prior: Mapping[Term, float] | None = None,
    per_term: bool = True,
) -> Calibration:
    scales = fit_scales(samples, prior, per_term)
    residuals = leave_one_out(samples, prior, per_term) if len(samples) >= MIN_RUNS_FOR_SPREAD else {}
    sigma = math.sqrt(sum(e * e for e in residuals.values()) / len(residuals)) if residuals else None
    return Calibration(
        cluster=cluster,
        stack=stack,
        scales={t.value: v for t, v in scales.items()},
        sigma=sigma,
        runs=len(samples),
        source=source,
        residuals=residuals,
    )


# --- the calibration file ----------------------------------------------------------------------


def read_calibrations(path: Path | None = None) -> list[Calibration]:
    """Every calibration in the file ([] when there is none yet; BadInput when it is corrupt: read
    as empty, the plan would call every point uncalibrated and `calibrate` would overwrite it).
    Read once per file version: a big dry run predicts every point from the same file."""
    file = path or calibration_path()
    try:
        stamp = file.stat()
    except OSError:
        return []
    return list(_read(str(file), stamp.st_mtime_ns, stamp.st_size))


@functools.lru_cache(maxsize=8)
def _read(file: str, _mtime_ns: int, _size: int) -> tuple[Calibration, ...]:
    check_calibration_file(Path(file))
    raw = json.loads(Path(file).read_text())
    try:
        return tuple(Calibration.from_json(entry) for entry in raw["calibrations"])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise BadInput(
            f"calibration file {file} (${CALIBRATION_ENV} or the default): an entry is not a calibration "
            f"({type(exc).__name__}: {exc}). Fix: move it away and run moe-vlm calibrate again"
        ) from None


def find(cluster: str, stack: str, path: Path | None = None) -> Calibration | None:
    return next((c for c in read_calibrations(path) if c.cluster == cluster and c.stack == stack), None)


def store(found: Sequence[Calibration], path: Path | None = None) -> Path:
    """Add or replace these calibrations (by cluster and stack) in the file, atomically."""
    file = output_file("calibration file", path or calibration_path(), json_has("calibrations"))
    keys = {(c.cluster, c.stack) for c in found}
    kept = [c for c in read_calibrations(file) if (c.cluster, c.stack) not in keys]
    file.parent.mkdir(parents=True, exist_ok=True)
    payload = {"version": FILE_VERSION, "calibrations": [c.to_json() for c in [*kept, *found]]}
    write_json_atomic(file, payload)
    return file
