"""The predicted step time of a point, with its band, tokens/s/GPU and MFU (named peak).

``predict(spec)`` adds the terms of moe_vlm/predict/terms.py, each times its calibrated scale:
the user's own calibration for (cluster, stack) when the calibration file has one (``moe-vlm
calibrate``), else the defaults fitted on published measured rows (GPU clusters; DEFAULT_SOURCE),
else none (cluster=local before any calibration: no number, and why).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moe_vlm.config.arch import Mixer, Mlp, layer_kinds
from moe_vlm.config.schema import Precision
from moe_vlm.config.spec import RunSpec
from moe_vlm.perf.flops import Workload, step_flops
from moe_vlm.perf.peaks import peak_of
from moe_vlm.predict.band import COVERAGE, UNCALIBRATED_BAND
from moe_vlm.predict.calibration import Calibration, find, stack_of
from moe_vlm.predict.terms import COMM, COMPUTE, ROUTING_NOT_MODELLED, Term, ep_term, loads, routing_load
from moe_vlm.predict.workload import expected_workload

# Defaults for GPU clusters: published.default_fit() on the 11 published measured rows the model
# covers (moe_vlm/predict/published_rows.json; `python scripts/bench_predict.py --families`): one
# scale for all compute (1 / the share of the peaks a whole step reaches) and none for the
# collectives or a per-step constant, which those rows do not separate from compute.
# tests/unit/test_predict_out_of_sample.py refits and compares.
DEFAULT_COMPUTE_SCALE = 3.706  # 1 / 27.0% of the peaks
DEFAULT_COMM_SCALE = 0.0
DEFAULT_SOURCE = "defaults fitted on 11 published rows (moe_vlm/predict/published_rows.json)"
# The defaults' band (band.py): the 80 % conformal quantile of the 44 errors the 11 rows make when
# their own family is left out of the fit, one per grouping (published.default_band). Its coverage
# measured by nested leave-out is in docs/step-time-prediction.md.
DEFAULT_BAND = 0.1784
DEFAULT_BAND_BASIS = "44 out-of-sample errors on 11 published rows, each with its family left out of the fit"
# Where no published row stands for the point, the band is what leaving a whole family out of the
# fit cost on the rows that have one (scripts/bench_predict.py --families; the test recomputes):
# a Gated DeltaNet hybrid (Qwen3.5: its one row, never fitted on, is -58 % to -63 %, so truth is up
# to 2.7x the prediction), a GPU generation left out (Blackwell from Hopper: worst -25.7 %), a
# precision left out (MXFP8 from BF16: worst -24.0 %).
HYBRID_BAND = 1.71  # rounded up: the largest need is 170.1 %
UNPUBLISHED_GPU_BAND = 0.35
UNPUBLISHED_PRECISION_BAND = 0.32
PUBLISHED_CLUSTERS = ("h100", "b200", "gb200")  # the GPUs of the published rows
PUBLISHED_PRECISIONS = (Precision.bf16, Precision.fp8mx)


def uncalibrated(spec: RunSpec) -> tuple[str, float] | None:
    """(what, band) when no published row stands for this point's architecture, GPU or precision:
    the widest applies."""
    found = []
    if any(kind.mixer is Mixer.linear_attention for kind in layer_kinds(spec.model)):
        found.append(("uncalibrated for this architecture (Gated DeltaNet hybrid)", HYBRID_BAND))
    if spec.cluster.name not in PUBLISHED_CLUSTERS:
        found.append(
            (f"uncalibrated for this GPU ({spec.cluster.name}: no published row)", UNPUBLISHED_GPU_BAND)
        )
    if spec.precision.format not in PUBLISHED_PRECISIONS:
        found.append(
            (f"uncalibrated for this precision ({spec.precision.format.value})", UNPUBLISHED_PRECISION_BAND)
        )
    return max(found, key=lambda f: f[1]) if found else None


def default_scales() -> dict[Term, float]:
    scales = {t: DEFAULT_COMPUTE_SCALE for t in COMPUTE}
    scales |= {t: DEFAULT_COMM_SCALE for t in COMM}
    scales[Term.optimizer] = DEFAULT_COMM_SCALE  # the data-movement group's scale
    scales[Term.overhead] = 0.0
    return scales


@dataclass(frozen=True)
class TermTime:
    term: str
    seconds: float
    why: str


@dataclass(frozen=True)
class Prediction:
    """What the plan, run.json and the report say about a point's speed before it runs."""

    step_time_s: float | None  # None: no calibration applies (`note` says why)
    # The relative half-width of the step time's band (band.py: what it holds, measured out of
    # sample; `band_basis` says on what). run.json keeps the key "sigma" for its readers.
    sigma: float
    source: str  # which calibration, in words
    workload: str  # where the expected tokens and patches come from
    effective_tokens_per_s_per_gpu: float | None
    mfu: float | None
    peak_name: str | None  # the MFU denominator, named (the dense BF16 peak, as the run's summary)
    terms: tuple[TermTime, ...]
    note: str | None = None
    unit: str = "GPU"  # "rank" for CPU ranks
    lower_bound: bool = False  # from a probe's calibration: at least this long; no band, no flag
    band_basis: str = ""  # the band in words: its coverage and what it was measured on

    def band(self, value: float | None, rate: bool = False) -> tuple[float, float] | None:
        """(low, high) of the band; a rate moves opposite to the step time. None for a lower bound."""
        if value is None or self.lower_bound:
            return None
        if rate:
            return value / (1 + self.sigma), value / max(1 - self.sigma, 1e-9)
        return value * max(1 - self.sigma, 0.0), value * (1 + self.sigma)

    def to_json(self) -> dict[str, Any]:
        band = self.band(self.step_time_s)
        return {
            "step_time_s": self.step_time_s,
            "step_time_band_s": None if band is None else list(band),  # JSON's shape, read back equal
            "sigma": None if self.lower_bound else self.sigma,
            "band_coverage": None if self.lower_bound else COVERAGE,
            "band_basis": None if self.lower_bound else self.band_basis,
            "lower_bound": self.lower_bound,
            "source": self.source,
            "workload": self.workload,
            "effective_tokens_per_s_per_gpu": self.effective_tokens_per_s_per_gpu,
            "mfu": self.mfu,
            "peak": self.peak_name,
            "terms": {t.term: t.seconds for t in self.terms},
            "note": self.note,
        }

    def range_text(self, value: float, fmt: str, unit: str, rate: bool = False) -> str:
        if self.lower_bound:
            return (
                "(at most: a probe's bound)"
                if rate
                else "(at least: a probe's lower bound, no band; it ranks points)"
            )
        low, high = self.band(value, rate) or (0.0, 0.0)
        head = f"{COVERAGE:.0%} band +/-{self.sigma:.0%}: " if not rate else ""
        if self.sigma >= 1:  # an uncalibrated band: no lower end worth printing
            return f"(+/-{self.sigma:.0%}: uncalibrated, see below)"
        return f"({head}{low:{fmt}}-{high:{fmt}}{unit})"

    def lines(self) -> list[str]:
        head = "-- predicted speed (moe_vlm/predict; docs/step-time-prediction.md) --"
        if self.step_time_s is None:
            return [head, f"not predicted: {self.note}"]
        out = [
            head,
            f"step time      {self.step_time_s:.4g} s  {self.range_text(self.step_time_s, '.4g', ' s')}",
        ]
        tokens = self.effective_tokens_per_s_per_gpu
        if tokens is not None:
            label = f"tokens/s/{self.unit}"
            out.append(
                f"{label:<14} {tokens:,.0f} effective {self.range_text(tokens, ',.0f', '', rate=True)}"
            )
        if self.mfu is not None:
            out.append(
                f"MFU            {self.mfu:.1%} {self.range_text(self.mfu, '.1%', '', rate=True)} vs {self.peak_name}"
            )
        else:
            out.append("MFU            none: the cluster declares no peak")
        out.append(f"calibration    {self.source}")
        if not self.lower_bound and self.band_basis:
            out.append(f"band           {self.band_basis}")
        out.append(f"workload       {self.workload}")
        shown = sorted((t for t in self.terms if t.seconds > 0), key=lambda t: -t.seconds)
        out += [f"  {t.term:<12} {t.seconds:10.4g} s  {t.why}" for t in shown]
        if self.note:
            out.append(self.note)
        return out


def _routing(
    spec: RunSpec, parts: tuple[TermTime, ...], step: float, band: float
) -> tuple[str | None, float]:
    """The routing line the plan prints next to the number, and the band: an assumed load widens
    it by what the routed terms would lose at balanced load (the bound's other end)."""
    if not any(kind.mlp is Mlp.moe for kind in layer_kinds(spec.model)):
        return None, band
    found = routing_load(spec)
    if found is None:
        return ROUTING_NOT_MODELLED, band
    if not found.assumed or step <= 0:
        return None, band
    routed = sum(t.seconds for t in parts if t.term in (Term.experts.value, ep_term(spec).value))
    widened = band + routed * (1 - 1 / found.factor) / step
    return f"{found.why}: band widened to +/-{widened:.0%} (balanced load at the other end)", widened


def has_defaults(spec: RunSpec) -> bool:
    """Whether the published-row defaults apply: a cluster with a datasheet peak."""
    return spec.cluster.peak_bf16_flops > 0 and DEFAULT_COMPUTE_SCALE > 0


def calibration_for(spec: RunSpec, path: Path | None = None) -> Calibration | None:
    """The user's calibration for this cluster and installed stack, else the GPU defaults, else None."""
    found = find(spec.cluster.name, stack_of(spec.engine), path)
    if found is not None:
        return found
    if has_defaults(spec):
        return Calibration(
            cluster=spec.cluster.name,
            stack="any",
            scales={t.value: v for t, v in default_scales().items()},
            sigma=None,
            runs=0,
            source=DEFAULT_SOURCE,
            width=DEFAULT_BAND,
            width_basis=DEFAULT_BAND_BASIS,
        )
    return None


def predict(
    spec: RunSpec,
    calibration: Calibration | None = None,
    workload: Workload | None = None,
    lookup: bool = True,
) -> Prediction:
    """The point's predicted step time; `calibration` None and `lookup`: calibration_for(spec)."""
    expected = expected_workload(spec)
    work = workload or expected.workload
    described = expected.source if workload is None else "the recorded steps' mean workload"
    if calibration is None and lookup:
        calibration = calibration_for(spec)
    peak = peak_of(spec)
    if calibration is None:
        return Prediction(
            None,
            UNCALIBRATED_BAND,
            "none",
            described,
            None,
            None,
            peak["name"],
            (),
            note=f"no calibration for cluster={spec.cluster.name} ({stack_of(spec.engine)}) and no datasheet "
            "peak to start from: run a sweep, then `moe-vlm calibrate <sweep dir>`",
        )
    parts = tuple(
        TermTime(load.term.value, calibration.scale(load.term) * load.base_s, load.why)
        for load in loads(spec, work)
    )
    step = sum(t.seconds for t in parts)
    world = max(spec.layout.world_size, 1)
    tokens = work.real_tokens / (step * world) if step > 0 else None
    mfu = None
    if peak["flops"] and step > 0:
        mfu = step_flops(spec, work).model / (step * world) / peak["flops"]
    source = (
        f"{calibration.source}; {calibration.runs} run(s), cluster={calibration.cluster}, {calibration.stack}"
        if calibration.runs
        else calibration.source
    )
    unit = "GPU" if spec.cluster.is_gpu_cluster else "rank"
    band, note, basis = calibration.band, None, calibration.band_text
    wide = uncalibrated(spec) if calibration.runs == 0 and not calibration.lower_bound else None
    if wide is not None:
        what, band = wide[0], max(wide[1], band)
        note = f"{what}: +/-{band:.0%}, from the published rows' out-of-sample error (docs/step-time-prediction.md)"
        source += f"; {what}: +/-{band:.0%}"
        basis = f"{what}: +/-{band:.0%}, the worst out-of-sample error of its kind, not a measured {COVERAGE:.0%} band"
    routing_note, routed_band = _routing(spec, parts, step, band)
    if routing_note:
        note = f"{note}\n{routing_note}" if note else routing_note
    if routed_band != band:
        band = routed_band
        basis += f"; widened to +/-{band:.0%} for the assumed routing load"
    return Prediction(
        step,
        band,
        source,
        described,
        tokens,
        mfu,
        peak["name"],
        parts,
        note=note,
        unit=unit,
        lower_bound=calibration.lower_bound,
        band_basis=basis,
    )


# A run slower than predicted by this many half-widths of its band (band.py; run.json's "sigmas",
# the key's old name) is flagged (regression or fault).
FLAG_SIGMAS = 2.0
# Fewer steady steps than this and the error is recorded, never judged: one step (a short run, a
# halving rung) can be a profiler, a GC pause or a compile, and its +28 % reads as "2.5 sigma"
# while the median of a longer window sits inside the band.
MIN_JUDGED_STEPS = 5


def deviation(predicted_s: float, sigma: float, measured_s: float) -> tuple[float, float]:
    """(relative error, in sigmas): (measured - predicted) / predicted; positive = slower."""
    error = measured_s / predicted_s - 1.0
    return error, error / sigma if sigma > 0 else 0.0


def measured_window(summary: Mapping[str, Any] | None) -> tuple[Mapping[str, Any], int | None] | None:
    """The steady window's seconds the rates divide by (step periods, else step times: p10, p50,
    p90, mean) and how many steps it holds (None in a record written before it counted them)."""
    for key in ("step_period_s", "step_time_s"):
        spread = (summary or {}).get(key)
        if isinstance(spread, Mapping) and any(_positive(spread.get(q)) for q in ("p50", "mean")):
            window = (summary or {}).get("steady_window")
            steps = window.get("steps") if isinstance(window, Mapping) else None
            return spread, steps if isinstance(steps, int) else None
    return None


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def record_section(spec: RunSpec, summary: Mapping[str, Any] | None) -> dict[str, Any]:
    """run.json's "prediction": what was predicted for this point when it ran, and how the
    measured window's median step (p50 of the rates' basis, with its p10-p90 spread) compares.
    A run is flagged only on a window of at least MIN_JUDGED_STEPS steps."""
    found = predict(spec)
    out: dict[str, Any] = {
        "predicted": found.to_json(),
        "measured_step_s": None,
        "error": None,
        "sigmas": None,
    }
    window = measured_window(summary)
    if window is None:
        return out
    spread, steps = window
    measured = float(spread["p50"] if _positive(spread.get("p50")) else spread["mean"])
    out |= {
        "measured_step_s": measured,
        "measured_p10_s": spread.get("p10"),
        "measured_p90_s": spread.get("p90"),
        "measured_steps": steps,
    }
    if not found.step_time_s:
        return out
    error, sigmas = deviation(found.step_time_s, found.sigma, measured)
    out["error"] = error
    if found.lower_bound:  # a probe's bound: a whole step is slower by design, never a fault
        return out
    out["sigmas"] = sigmas
    if steps is not None and steps < MIN_JUDGED_STEPS:
        out["flag"] = None
        out["note"] = f"{steps} steady step(s): too few to judge (at least {MIN_JUDGED_STEPS})"
        return out
    out["flag"] = (
        f"{sigmas:.1f} sigma slower than predicted: a likely regression or fault"
        if sigmas > FLAG_SIGMAS
        else None
    )
    return out
