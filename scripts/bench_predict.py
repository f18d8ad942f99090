"""How well the step model predicts, measured; nothing in it is fitted to what it predicts.

CPU (default): the torch engine on this machine. First the probe measures this machine's rates
(moe_vlm/predict/probe.py) into a calibration file of the benchmark's own; then

knobs   each knob the CPU engine honours moved alone from one base point (MBS 1/2/4, recompute
        none/selective/full, vision freeze, image-free mock vs synthetic images, sequence length,
        1 vs 2 ranks, in-batch and buffer packing): every point trained for a few steps, and the
        step time ratio of each variant to its base measured and predicted. The predictions use
        each run's recorded workload (the real micro-batches' lengths and patches) and the probe's
        rates, never the measured step times. Targets: |predicted / measured ratio - 1| <= 15 %
        on average over the knobs, <= 25 % for the worst.
sweep   the 12-point sweep gbs=2,4,8 x recompute=none,full x vision_freeze=none,vision: Kendall's
        tau between the predicted and the measured order (target >= 0.8), a pair whose measured
        difference is inside the noise (the two runs' standard errors combined) counted as a tie.

    python scripts/bench_predict.py                  # probe + 23 short trainings: ~20 min on 2 cores
    python scripts/bench_predict.py --dir DIR        # reuse the runs (and the probe) under DIR

GPU (--families): the published rows and A/B pairs (moe_vlm/predict/published.py), every one out
of sample, with the family bands the plan prints (families.FAMILY_BANDS). --speed: the cost of one
prediction against composing the point, over 10,000 points.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from moe_vlm.config.compose import compose_config  # noqa: E402
from moe_vlm.config.spec import RunSpec  # noqa: E402
from moe_vlm.predict.band import COVERAGE, conformal_width, score  # noqa: E402
from moe_vlm.predict.model import calibration_for, predict  # noqa: E402
from moe_vlm.predict.runs import RecordedRun, recorded  # noqa: E402

TRAIN_ITERS = 10
BASE = ("gbs=8", "mbs=1", f"train_iters={TRAIN_ITERS}", "warmup_steps=2")


@dataclass(frozen=True)
class Knob:
    name: str
    base: tuple[str, ...]  # overrides of the point the variants are compared with
    variants: tuple[tuple[str, ...], ...]


KNOBS = (
    Knob("mbs", (), (("mbs=2",), ("mbs=4",))),
    Knob("recompute", (), (("recompute=selective",), ("recompute=full",))),
    Knob("vision freeze", (), (("vision_freeze=vision",),)),
    Knob("data: mock vs synthetic", (), (("data=mock",),)),
    Knob("sequence length", (), (("seq_length=3072",),)),
    Knob("ranks: 2 -> 1", (), (("nproc=1",),)),
    Knob("packing in a micro-batch (mbs 2)", ("mbs=2",), (("mbs=2", "data.packing=in_batch"),)),
    Knob("packing across samples", (), (("data.packing=buffer",),)),
)
SWEEP = [
    (f"gbs={g}", f"recompute={r}", f"vision_freeze={v}", f"train_iters={TRAIN_ITERS}", "warmup_steps=2")
    for g, r, v in itertools.product((2, 4, 8), ("none", "full"), ("none", "vision"))
]


def _name(overrides: tuple[str, ...]) -> str:
    return "_".join(o.replace("=", "-").replace(".", "-").replace(",", "-") for o in overrides) or "base"


def train(root: Path, overrides: tuple[str, ...]) -> Path:
    """Train the point once (skipped when its run directory already holds a completed run)."""
    run_dir = root / _name(overrides)
    if isinstance(recorded(run_dir), RecordedRun):
        return run_dir
    cmd = [sys.executable, str(REPO / "train.py"), *overrides, f"hydra.run.dir={run_dir}"]
    print("  train", " ".join(overrides) or "(base)", flush=True)
    subprocess.run(cmd, check=True, env=dict(os.environ, PYTHONPATH=str(REPO)), stdout=subprocess.DEVNULL)
    return run_dir


@dataclass(frozen=True)
class Point:
    overrides: tuple[str, ...]
    measured_s: float
    sem: float  # standard error of the measured mean
    predicted_s: float  # on the run's recorded workload
    expected_s: float  # on the data distribution's expected workload (what a plan prints)


def measure(root: Path, overrides: tuple[str, ...]) -> Point:
    run = recorded(train(root, overrides))
    if not isinstance(run, RecordedRun):
        raise SystemExit(f"{overrides}: {run}")
    spec = run.spec
    found = calibration_for(spec)
    window = (run.record.summary or {}).get("step_period_s") or (run.record.summary or {}).get("step_time_s")
    spread = (window.get("p90", 0) - window.get("p10", 0)) / 2.56 if isinstance(window, dict) else 0.0
    steps = ((run.record.summary or {}).get("steady_window") or {}).get("steps") or 1
    at_recorded = predict(spec, found, workload=run.workload).step_time_s
    at_expected = predict(spec, found).step_time_s
    if at_recorded is None or at_expected is None:
        raise SystemExit(f"{overrides}: not predicted (no probe rates?)")
    return Point(overrides, run.measured_s, spread / math.sqrt(steps), at_recorded, at_expected)


def knobs(root: Path) -> list[float]:
    print("\n| knob | variant | measured s (base -> variant) | measured ratio | predicted ratio | error |")
    print("|---|---|---|---|---|---|")
    errors = []
    for knob in KNOBS:
        base = measure(root, (*BASE, *knob.base))
        for variant in knob.variants:
            point = measure(root, (*BASE, *variant))
            measured = point.measured_s / base.measured_s
            predicted = point.predicted_s / base.predicted_s
            error = predicted / measured - 1
            errors.append(error)
            print(
                f"| {knob.name} | {' '.join(variant)} | {base.measured_s:.3f} -> {point.measured_s:.3f} "
                f"| {measured:.3f} | {predicted:.3f} | {error:+.1%} |",
                flush=True,
            )
    mean = sum(abs(e) for e in errors) / len(errors)
    worst = max(errors, key=abs)
    print(
        f"\n{len(errors)} knob moves: mean |error| {mean:.1%} (target <= 15%), worst {worst:+.1%} (target <= 25%)"
    )
    return errors


def kendall(points: list[Point]) -> tuple[float, float]:
    """(tau-b over every pair, tau with pairs inside the measured noise counted as ties)."""
    concordant = discordant = ties_m = ties_p = 0
    noisy_c = noisy_d = 0
    for a, b in itertools.combinations(points, 2):
        dm, dp = b.measured_s - a.measured_s, b.predicted_s - a.predicted_s
        product = dm * dp
        if dm == 0:
            ties_m += 1
        elif dp == 0:
            ties_p += 1
        elif product > 0:
            concordant += 1
        else:
            discordant += 1
        noise = 2 * math.hypot(a.sem, b.sem)
        if abs(dm) > noise and dp != 0:
            noisy_c += product > 0
            noisy_d += product < 0
    n0 = concordant + discordant
    tau_b = (concordant - discordant) / math.sqrt((n0 + ties_m) * (n0 + ties_p)) if n0 else 0.0
    judged = noisy_c + noisy_d
    return tau_b, (noisy_c - noisy_d) / judged if judged else 1.0


def sweep(root: Path) -> None:
    points = [measure(root / "sweep", tuple(o)) for o in SWEEP]
    print(
        "\n| point | measured s (+/- s.e.) | predicted s (recorded workload) | error | predicted s (expected workload) |"
    )
    print("|---|---|---|---|---|")
    for p in points:
        label = " ".join(o for o in p.overrides if not o.startswith(("train_iters", "warmup")))
        print(
            f"| {label} | {p.measured_s:.3f} +/- {p.sem:.3f} | {p.predicted_s:.3f} "
            f"| {p.predicted_s / p.measured_s - 1:+.1%} | {p.expected_s:.3f} |"
        )
    errors = [abs(p.predicted_s / p.measured_s - 1) for p in points]
    tau_b, tau_noise = kendall(points)
    print(
        f"\n12 points: mean |error| {sum(errors) / len(errors):.1%}; Kendall tau-b {tau_b:.3f}; with pairs inside "
        f"the measured noise as ties {tau_noise:.3f} (target >= 0.8)"
    )
    # What the plan prints for a CPU point: the expected workload's prediction, nothing fitted.
    width = conformal_width(score(p.expected_s, p.measured_s) for p in points)
    print(
        f"the plan's CPU band (families.CPU_PROBE_BAND): the {COVERAGE:.0%} conformal quantile of these scores, {width}"
    )


def probe_rates(root: Path) -> None:
    """This machine's rates at 1 and 2 threads per rank, in the benchmark's own calibration file."""
    os.environ["MOE_VLM_CALIBRATION"] = str(root / "calibration.json")
    if (root / "calibration.json").exists():
        print(f"probe rates: {root / 'calibration.json'} (reused)")
        return
    for ranks in ("nproc=2", "nproc=1"):
        subprocess.run(
            [sys.executable, "-m", "moe_vlm.cli", "calibrate", "--probe", ranks],
            check=True,
            env=dict(os.environ, PYTHONPATH=str(REPO)),
        )


def speed(count: int = 10_000) -> None:
    """The cost of predicting a composed point against composing it (the ratio a search pays)."""
    axes = {
        "mbs": ("1", "2", "4", "8"),
        "recompute": ("none", "selective", "full"),
        "dispatcher": ("alltoall", "hybridep", "deepep"),
        "ep": ("8", "16", "32"),
        "cuda_graph": ("none", "te_moe"),
    }
    combos = list(itertools.product(*axes.values()))
    base = ("cluster=gb200", "model=qwen3_vl_235b_a22b", "nodes=16", "parallelism=3d")
    started = time.perf_counter()
    specs = []
    for combo in combos:
        overrides = [*base, *(f"{k}={v}" for k, v in zip(axes, combo, strict=True))]
        specs.append(RunSpec.from_config(compose_config(overrides)))
    compose_s = (time.perf_counter() - started) / len(specs)
    started = time.perf_counter()
    done = 0
    while done < count:
        for spec in specs:
            predict(spec, lookup=False)
            done += 1
            if done >= count:
                break
    predict_s = (time.perf_counter() - started) / done
    print(
        f"{done} predictions over {len(specs)} composed points: {predict_s * 1e3:.3f} ms each (target <= 1 ms); "
        f"composing one point {compose_s * 1e3:.1f} ms: prediction / composition = {predict_s / compose_s:.3f}"
    )


def families() -> None:
    from moe_vlm.predict.published import (
        all_family_bands,
        pairs_table,
        published_pairs,
        row_results,
        rows_table,
    )

    print("\n".join(rows_table(row_results())))
    print()
    print("\n".join(pairs_table(published_pairs())))
    bands, widest = all_family_bands()
    print("\nfamilies.FAMILY_BANDS (every row, nothing fitted):")
    for (grouping, family), band in sorted(bands.items()):
        print(f"    ({grouping!r}, {family!r}): FamilyBand({band.width}, {band.rows}, {band.conformal}),")
    print(f"families.WIDEST_BAND = {widest}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument(
        "--dir", default=str(REPO / "multirun" / "bench_predict"), help="where the runs go (reused)"
    )
    p.add_argument("--families", action="store_true", help="the published rows and pairs (GPU)")
    p.add_argument("--speed", action="store_true", help="prediction cost per point vs composing it")
    p.add_argument("--knobs", action="store_true", help="CPU: the knob moves only")
    p.add_argument("--sweep", action="store_true", help="CPU: the 12-point sweep only")
    args = p.parse_args()
    if args.families:
        families()
        return 0
    if args.speed:
        speed()
        return 0
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    probe_rates(root)
    if not args.sweep:
        knobs(root)
    if not args.knobs:
        sweep(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
