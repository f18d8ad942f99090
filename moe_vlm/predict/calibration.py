"""Calibration of the step-time model on recorded runs, and the calibration file.

The step model (step.py) predicts from rates alone; a calibration can add two things, per
(cluster, stack version):

- ``rates``: a CPU machine's measured rates (the probe's MeasuredRates, by intra-op thread count),
  which cluster=local predicts from. Nothing fitted.
- ``scales``: three fitted numbers at most, one per group of terms (compute, data movement, host
  time), by non-negative least squares on relative residuals (every run weighs the same whatever
  its step time), ridged toward 1 (the rates as published or measured). A scale missing is 1.

The uncertainty is the leave-one-out spread: each run predicted by a fit on the others. ``sigma``
records their root mean square; the band a prediction prints is band.py's conformal quantile of
the same errors (too few of them: the band of the point's family, said so).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
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
from moe_vlm.predict.hardware import MeasuredRates
from moe_vlm.predict.terms import COMM, COMPUTE, HOST, Term

if TYPE_CHECKING:
    import numpy as np

# 2: scales are relative to the rates (1 = as published or measured); version-1 files held scales
# on nominal rates of the constant model and are ignored (calibrate again).
FILE_VERSION = 2
RIDGE = 0.05
MIN_RUNS_FOR_SPREAD = 3

GROUPS: dict[str, tuple[Term, ...]] = {
    "compute": COMPUTE,
    "movement": (*COMM, Term.optimizer),
    "host": HOST,
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
    scales: dict[str, float]  # Term value -> scale on its seconds at the rates (missing: 1)
    sigma: float | None  # relative 1-sigma spread of the step time (leave-one-out); None: none known
    runs: int
    source: str  # in words: what it was fitted on
    residuals: dict[str, float] = field(default_factory=dict)  # run dir -> leave-one-out relative error
    # The band's relative half-width where it was measured elsewhere (a family's out-of-sample
    # errors) and in words what on; None: from `residuals`.
    width: float | None = None
    width_basis: str = ""
    # A CPU machine's measured rates by intra-op thread count (MeasuredRates.to_json()).
    rates: dict[str, dict[str, float]] = field(default_factory=dict)

    def scale(self, term: Term) -> float:
        return float(self.scales.get(term.value, 1.0))

    def measured_rates(self, threads: int) -> MeasuredRates | None:
        """The rates measured at `threads` intra-op threads, else at the nearest count measured."""
        if not self.rates:
            return None
        key = min(self.rates, key=lambda t: (abs(int(t) - threads), int(t)))
        return MeasuredRates.from_json(self.rates[key])

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
            width=None if raw.get("width") is None else float(raw["width"]),
            width_basis=str(raw.get("width_basis", "")),
            rates={
                str(k): {str(n): float(x) for n, x in dict(v).items()}
                for k, v in dict(raw.get("rates") or {}).items()
            },
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
    """Each group's scale, ridged toward the prior's mean over the group (default 1)."""
    names = [g for g in GROUPS if any(s.base.get(t, 0.0) > 0 for s in samples for t in GROUPS[g])]
    rows = [[sum(s.base.get(t, 0.0) for t in GROUPS[g]) / s.measured_s for g in names] for s in samples]
    targets = [1.0] * len(samples)
    for j, group in enumerate(names):
        given = [prior[t] for t in GROUPS[group] if prior and prior.get(t, 0.0) > 0]
        value = sum(given) / len(given) if given else 1.0
        row = [0.0] * len(names)
        row[j] = math.sqrt(RIDGE) / value
        rows.append(row)
        targets.append(math.sqrt(RIDGE))
    solution = _solve(rows, targets)
    return dict(zip(names, (float(v) for v in solution), strict=True))


def fit_scales(samples: Sequence[Sample], prior: Mapping[Term, float] | None = None) -> dict[Term, float]:
    """One scale per group of terms (GROUPS) that the samples exercise; `prior`: what a ridge
    pulls each toward (default 1: the rates)."""
    group = _fit_groups(samples, prior)
    return {t: group[g] for g, terms in GROUPS.items() for t in terms if g in group}


def predicted_s(scales: Mapping[Term, float], base: Mapping[Term, float]) -> float:
    return sum(scales.get(t, 0.0) * seconds for t, seconds in base.items())


def leave_one_out(samples: Sequence[Sample], prior: Mapping[Term, float] | None = None) -> dict[str, float]:
    """Each run's relative error when the others calibrate: (predicted - measured) / measured."""
    errors: dict[str, float] = {}
    for i, sample in enumerate(samples):
        scales = fit_scales([s for j, s in enumerate(samples) if j != i], prior)
        errors[sample.name] = predicted_s(scales, sample.base) / sample.measured_s - 1.0
    return errors


def calibrate(
    cluster: str,
    stack: str,
    samples: Sequence[Sample],
    source: str,
    prior: Mapping[Term, float] | None = None,
    rates: dict[str, dict[str, float]] | None = None,
) -> Calibration:
    scales = fit_scales(samples, prior)
    residuals = leave_one_out(samples, prior) if len(samples) >= MIN_RUNS_FOR_SPREAD else {}
    sigma = math.sqrt(sum(e * e for e in residuals.values()) / len(residuals)) if residuals else None
    return Calibration(
        cluster=cluster,
        stack=stack,
        scales={t.value: v for t, v in scales.items()},
        sigma=sigma,
        runs=len(samples),
        source=source,
        residuals=residuals,
        rates=dict(rates or {}),
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
    if raw.get("version") != FILE_VERSION:
        return ()  # the constant model's scales mean nothing to the step model: calibrate again
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


def with_rates(existing: Calibration | None, probed: Calibration) -> Calibration:
    """`existing` (a fit on runs, or an earlier probe) with the probe's rates added by thread count:
    a fit's scales and band stay, a probe at another thread count stays beside this one."""
    if existing is None:
        return probed
    return replace(existing, rates={**existing.rates, **probed.rates})
