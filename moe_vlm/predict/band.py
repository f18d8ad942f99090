"""The one definition of a prediction's band: a split-conformal quantile of out-of-sample errors.

A band is predicted x (1 +/- w). Its width w is the ceil((n + 1) x COVERAGE)-th smallest of n
scores |measured / predicted - 1|, each measured on a prediction whose fit did not see the run it
predicted (Vovk et al. 2005; Lei et al., JASA 2018, split conformal): if the point to predict is
exchangeable with those n, the band holds it with probability >= COVERAGE. Fewer scores than that
rank needs (n < 4 at 80 %): no width is measured, the band is uncalibrated (UNCALIBRATED_BAND), and
it is said so. The scores are a family's published rows' errors for a GPU point (families.py,
published.py: nothing is fitted on them), the CPU benchmark's for a point predicted from probe
rates, a calibration's leave-one-run-out errors for a user's own fit (calibration.py);
scripts/bench_predict.py --families measures each row against the band the other rows give it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

COVERAGE = 0.8
# No out-of-sample spread measured: a wide band, said to be uncalibrated.
UNCALIBRATED_BAND = 0.5


def score(predicted_s: float, measured_s: float) -> float:
    """How wide a band around `predicted_s` must be to hold `measured_s`."""
    return abs(measured_s / predicted_s - 1.0)


def score_of_error(error: float) -> float:
    """The score of a relative error (predicted - measured) / measured, a calibration's residual."""
    return abs(1.0 / (1.0 + error) - 1.0)


def conformal_width(scores: Iterable[float], coverage: float = COVERAGE) -> float | None:
    """The band's relative half-width from out-of-sample scores; None when too few."""
    ordered = sorted(scores)
    rank = math.ceil((len(ordered) + 1) * coverage)
    if not ordered or rank > len(ordered):
        return None
    return ordered[rank - 1]


def describe(coverage: float, basis: str) -> str:
    """The plan's words for a band: what it holds and what it was measured on."""
    return f"{coverage:.0%} band, from {basis}"
