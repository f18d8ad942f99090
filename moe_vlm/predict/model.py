"""The predicted step time of a point, with its band, tokens/s/GPU and MFU (named peak).

``predict(spec)`` runs the step model (step.py) on the point's hardware: a GPU preset's published
rates (hardware.py), or on cluster=local the rates the probe measured on this machine (stored in
the calibration file). A calibration fitted on the user's own runs (``moe-vlm calibrate``) scales
groups of terms; without one, nothing is fitted. The band is the point's family's out-of-sample
error (families.py), or the calibration's held-out errors once it has enough of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moe_vlm.config.arch import Mlp, layer_kinds
from moe_vlm.config.spec import RunSpec
from moe_vlm.perf.flops import Workload, step_flops
from moe_vlm.perf.peaks import peak_of
from moe_vlm.predict.band import COVERAGE, UNCALIBRATED_BAND, conformal_width, score_of_error
from moe_vlm.predict.calibration import GROUPS, Calibration, find, stack_of
from moe_vlm.predict.families import band_for
from moe_vlm.predict.hardware import Hardware, gpu_hardware, rank_threads
from moe_vlm.predict.step_time import loads, not_modelled
from moe_vlm.predict.terms import ROUTING_NOT_MODELLED, Term, ep_term, routing_load
from moe_vlm.predict.workload import expected_workload

RATES_SOURCE = "published rates (moe_vlm/predict/hardware.py); nothing fitted"


@dataclass(frozen=True)
class TermTime:
    term: str
    seconds: float
    why: str


@dataclass(frozen=True)
class Prediction:
    """What the plan, run.json and the report say about a point's speed before it runs."""

    step_time_s: float | None  # None: no rates for this cluster (`note` says why)
    # The relative half-width of the step time's band (band.py: what it holds, measured out of
    # sample; `band_basis` says on what). run.json keeps the key "sigma" for its readers.
    sigma: float
    source: str  # which rates and calibration, in words
    workload: str  # where the expected tokens and patches come from
    effective_tokens_per_s_per_gpu: float | None
    mfu: float | None
    peak_name: str | None  # the MFU denominator, named (the dense BF16 peak, as the run's summary)
    terms: tuple[TermTime, ...]
    note: str | None = None
    unit: str = "GPU"  # "rank" for CPU ranks
    band_basis: str = ""  # the band in words: its coverage and what it was measured on
    not_modelled: tuple[str, ...] = ()

    def band(self, value: float | None, rate: bool = False) -> tuple[float, float] | None:
        """(low, high) of the band; a rate moves opposite to the step time."""
        if value is None:
            return None
        if rate:
            return value / (1 + self.sigma), value / max(1 - self.sigma, 1e-9)
        return value * max(1 - self.sigma, 0.0), value * (1 + self.sigma)

    def to_json(self) -> dict[str, Any]:
        band = self.band(self.step_time_s)
        return {
            "step_time_s": self.step_time_s,
            "step_time_band_s": None if band is None else list(band),  # JSON's shape, read back equal
            "sigma": self.sigma,
            "band_coverage": COVERAGE,
            "band_basis": self.band_basis,
            "source": self.source,
            "workload": self.workload,
            "effective_tokens_per_s_per_gpu": self.effective_tokens_per_s_per_gpu,
            "mfu": self.mfu,
            "peak": self.peak_name,
            "terms": {t.term: t.seconds for t in self.terms},
            "note": self.note,
            "not_modelled": list(self.not_modelled),
        }

    def range_text(self, value: float, fmt: str, unit: str, rate: bool = False) -> str:
        low, high = self.band(value, rate) or (0.0, 0.0)
        head = f"{COVERAGE:.0%} band +/-{self.sigma:.0%}: " if not rate else ""
        if self.sigma >= 1:  # an uncalibrated band: no lower end worth printing
            return f"(+/-{self.sigma:.0%}: uncalibrated, see below)"
        return f"({head}{low:{fmt}}-{high:{fmt}}{unit})"

    def lines(self, full: bool = False) -> list[str]:
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
        out.append(f"rates          {self.source}")
        if self.band_basis:
            out.append(f"band           {self.band_basis}")
        out.append(f"workload       {self.workload}")
        shown = sorted((t for t in self.terms if t.seconds > 0), key=lambda t: -t.seconds)
        out += [f"  {t.term:<12} {t.seconds:10.4g} s  {t.why}" for t in shown]
        if self.note:
            out.append(self.note)
        if self.not_modelled:
            if full:
                out += ["not modelled:", *(f"  {item}" for item in self.not_modelled)]
            else:
                out.append(f"not modelled   {len(self.not_modelled)} knob(s) (dry_run=full lists them)")
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
    """Whether published rates predict this cluster (a GPU preset of hardware.GPU_RATES)."""
    return gpu_hardware(spec.cluster) is not None


def calibration_for(spec: RunSpec, path: Path | None = None) -> Calibration | None:
    """The user's calibration for this cluster and installed stack, if any."""
    return find(spec.cluster.name, stack_of(spec.engine), path)


def hardware_for(spec: RunSpec, calibration: Calibration | None) -> tuple[Hardware | None, str]:
    """The rates this point is predicted at, and where they come from, in words."""
    measured = calibration.measured_rates(rank_threads(spec)) if calibration is not None else None
    published = gpu_hardware(spec.cluster)
    if measured is not None and published is not None:
        return measured.over(
            published
        ), "published links with a node's measured GEMM, attention and memory rates"
    if measured is not None:
        threads = rank_threads(spec)
        hw = measured.hardware(spec.cluster.name)
        note = (
            ""
            if measured.threads == threads
            else f" (measured at {measured.threads} thread(s), the rank runs {threads})"
        )
        return hw, f"measured on this machine by the probe{note}"
    if published is not None:
        return published, RATES_SOURCE
    return None, (
        f"no rates for cluster={spec.cluster.name} ({stack_of(spec.engine)}): measure this machine's with "
        "`moe-vlm calibrate --probe` (the Slurm canary does it for a sweep)"
    )


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
    hw, rates = hardware_for(spec, calibration)
    if hw is None:
        return Prediction(
            None, UNCALIBRATED_BAND, "none", described, None, None, peak["name"], (), note=rates
        )
    scale = calibration.scale if calibration is not None else (lambda _term: 1.0)
    parts = tuple(
        TermTime(load.term.value, scale(load.term) * load.base_s, load.why)
        for load in loads(spec, work, hw, expected.spread)
    )
    step = sum(t.seconds for t in parts)
    world = max(spec.layout.world_size, 1)
    tokens = work.real_tokens / (step * world) if step > 0 else None
    mfu = None
    if peak["flops"] and step > 0:
        mfu = step_flops(spec, work).model / (step * world) / peak["flops"]
    source = rates
    family = band_for(spec)
    band, basis, note = family.width, family.basis, None
    if calibration is not None and calibration.scales:
        fitted = ", ".join(f"{g} x{v:.3g}" for g, v in _group_scales(calibration).items())
        source += f"; scaled by a calibration on {calibration.runs} run(s) ({fitted}): {calibration.source}"
        held_out = conformal_width(score_of_error(e) for e in calibration.residuals.values())
        if held_out is not None:
            band, basis = (
                held_out,
                f"{COVERAGE:.0%} band of the calibration's {len(calibration.residuals)} held-out errors",
            )
    if family.uncalibrated:
        note = f"uncalibrated for {family.uncalibrated}: +/-{band:.0%} (docs/step-time-prediction.md)"
    routing_note, routed_band = _routing(spec, parts, step, band)
    if routing_note:
        note = f"{note}\n{routing_note}" if note else routing_note
    if routed_band != band:
        band = routed_band
        basis += f"; widened to +/-{band:.0%} for the assumed routing load"
    unit = "GPU" if spec.cluster.is_gpu_cluster else "rank"
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
        band_basis=basis,
        not_modelled=not_modelled(spec, hw),
    )


def _group_scales(calibration: Calibration) -> dict[str, float]:
    return {
        g: calibration.scale(terms[0]) for g, terms in GROUPS.items() if terms[0].value in calibration.scales
    }


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
