"""Validation of the step-time prediction (docs/step-time-prediction.md), two parts.

CPU (default): the torch engine on this machine. Runs (or, with --sweep DIR, reads) a 12-point
sweep of the tiny model (gbs x recompute x vision_freeze), calibrates on half of the points
(a checkerboard of the grid: each half holds every level of every factor), predicts the other half from the plan alone (the expected
workload of the data distribution, as a dry run would) and prints the mean absolute error and
Spearman's rank correlation (targets: <= 15 %, >= 0.9). Then every point predicted by the
calibration probe alone (moe_vlm/predict/probe.py, what the Slurm canary stores before any point
has run): how far below the measured step its lower bound sits, and how well it ranks.

    python scripts/bench_predict.py                       # runs the sweep: minutes on 2 cores
    python scripts/bench_predict.py --sweep multirun/X    # reads a sweep already run

Anchors (--anchors): the published measured rows of ../shared/reference/sister-skills.md (the VLM
card's rows and the Qwen hardware rows of 2.5), each as this tool's point; its "measured" step time
is the row's published TFLOP/s/GPU turned back into seconds with Bridge-comparable FLOPs (the
figure Megatron logs). Leave-one-out: each row predicted by the group scales (compute, data
movement) fitted on the others; prints each error and the mean (target <= 20 %). In sample: the
rows are the ones the defaults were once fitted on.

Families (--families): out of sample. Every published row of moe_vlm/predict/published_rows.json,
each whole family (model family, GPU generation, data kind, precision) left out of the fit in turn
and predicted by the rest (moe_vlm/predict/published.py): the table of every row (predicted,
published, error, inside the band) and each family's summary, in markdown
(docs/step-time-prediction.md holds this output), then the defaults' fit on all covered rows and
the plan's band. Each row's band is measured by nested leave-out (moe_vlm/predict/band.py: the
80 % conformal quantile of the errors the same procedure makes on the rows outside its family).
Targets: mean absolute error <= 15 %, no row beyond 30 %, bands holding >= 80 % of rows.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from scipy.stats import spearmanr

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from moe_vlm.config.compose import compose_config  # noqa: E402
from moe_vlm.config.spec import RunSpec  # noqa: E402
from moe_vlm.perf.flops import step_flops  # noqa: E402
from moe_vlm.predict.band import COVERAGE  # noqa: E402
from moe_vlm.predict.calibration import Sample, calibrate, predicted_s  # noqa: E402
from moe_vlm.predict.model import predict  # noqa: E402
from moe_vlm.predict.probe import probe  # noqa: E402
from moe_vlm.predict.published import (  # noqa: E402
    GROUPINGS,
    RowResult,
    coverage,
    default_band,
    default_fit,
    out_of_sample,
    published_rows,
    summaries,
    table,
)
from moe_vlm.predict.runs import RecordedRun, find_runs, recorded  # noqa: E402
from moe_vlm.predict.terms import Term, loads  # noqa: E402
from moe_vlm.predict.workload import expected_workload  # noqa: E402

SWEEP = ["gbs=2,4,8", "recompute=none,full", "vision_freeze=none,vision", "train_iters=12"]


FACTORS = ("gbs", "recompute", "vision_freeze")


def _level(value: str) -> tuple[int, str]:
    return (int(value), "") if value.isdigit() else (0, value)


def run_sweep(out: Path) -> None:
    cmd = [sys.executable, str(REPO / "train.py"), "-m", *SWEEP, f"hydra.sweep.dir={out}"]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    print("running:", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)


def cpu(sweep: Path) -> int:
    runs = [r for r in (recorded(p) for p in find_runs([sweep])) if isinstance(r, RecordedRun)]
    if len(runs) < 12:
        print(f"{sweep}: {len(runs)} completed run(s); the benchmark needs 12", file=sys.stderr)
        return 2
    # A checkerboard split of the 3-factor grid (the half-fraction design): each half has every
    # level of every factor and every pair of two factors' levels.
    levels = {k: sorted({str(r.record.knob(k)) for r in runs}, key=_level) for k in FACTORS}
    parity = {r.run_dir: sum(levels[k].index(str(r.record.knob(k))) for k in FACTORS) % 2 for r in runs}
    train = [r for r in runs if parity[r.run_dir] == 0]
    test = [r for r in runs if parity[r.run_dir] == 1]
    found = calibrate("local", train[0].stack, [r.sample() for r in train], f"half of {sweep}")
    print(f"calibrated on {len(train)} run(s): leave-one-out spread {found.sigma:.1%}")
    print(f"{'run':<18} {'overrides':<44} {'measured s':>10} {'predicted s':>11} {'error':>7}")
    measured, predicted, errors = [], [], []
    for r in test:
        guess = predict(r.spec, found).step_time_s or float("nan")
        error = guess / r.measured_s - 1
        label = " ".join(f"{k}={r.record.knob(k)}" for k in FACTORS)
        print(f"{r.run_dir.name:<18} {label:<44} {r.measured_s:>10.3f} {guess:>11.3f} {error:>+7.1%}")
        measured.append(r.measured_s)
        predicted.append(guess)
        errors.append(abs(error))
    # The same half predicted on the workload each run recorded: what the data's draw adds.
    recorded_errors = [
        abs(predicted_s({Term(k): v for k, v in found.scales.items()}, r.sample().base) / r.measured_s - 1)
        for r in test
    ]
    rho = spearmanr(measured, predicted).statistic
    print(
        f"mean absolute error {sum(errors) / len(errors):.1%} (target <= 15%); "
        f"on the recorded workloads {sum(recorded_errors) / len(recorded_errors):.1%}"
    )
    print(f"Spearman rank correlation {rho:.3f} (target >= 0.9)")
    probe_only(runs)
    return 0


def probe_only(runs: list[RecordedRun]) -> None:
    """Every point predicted by the calibration probe alone (what the canary stores before any
    point has run): a lower bound, so the ratio measured / predicted and the ranking are what count."""
    result = probe(runs[0].spec)
    found = result.calibration()
    print(f"\nthe probe alone ({found.source}):")
    ratios, predicted = [], []
    for r in runs:
        guess = predict(r.spec, found).step_time_s or float("nan")
        ratios.append(r.measured_s / guess)
        predicted.append(guess)
    ratios.sort()
    print(
        f"measured / probe's bound: median {ratios[len(ratios) // 2]:.1f}x "
        f"(range {ratios[0]:.1f}x-{ratios[-1]:.1f}x); every point above its bound: {ratios[0] >= 1}"
    )
    rho = spearmanr([r.measured_s for r in runs], predicted).statistic
    print(f"Spearman rank correlation over all {len(runs)} points {rho:.3f}")


@dataclass(frozen=True)
class Anchor:
    name: str
    overrides: tuple[str, ...]
    tflops: float | None  # published TFLOP/s/GPU; None: the card row's (conf/card/)
    source: str


BASE = ("seq_length=4096", "cuda_graph=none", "router=forced_balance")
ANCHORS = (
    # The skill card's rows: their knobs and published figure from conf/card/ (card=<row>), on
    # synthetic images rather than the option's Bridge mock.
    Anchor("card qwen3_vl_fsdp_gb200", ("card=qwen3_vl_fsdp_gb200", "data=synthetic"), None, "conf/card/"),
    Anchor("card qwen3_vl_fsdp_b200", ("card=qwen3_vl_fsdp_b200", "data=synthetic"), None, "conf/card/"),
    Anchor(
        "qwen3 235B B200x128 DeepEP",
        (
            "model=qwen3_vl_235b_a22b",
            "cluster=b200",
            "nodes=16",
            "parallelism=3d",
            "tp=2",
            "ep=16",
            "pp=4",
            "dispatcher=deepep",
            "mbs=2",
            "gbs=2048",
            "data=mock",
        ),
        590,
        "sister-skills.md 2.5 (moe-hardware-configs/card.yaml; VP12 left out: 94 layers)",
    ),
    Anchor(
        "qwen3 235B GB200x128 HybridEP",
        (
            "model=qwen3_vl_235b_a22b",
            "cluster=gb200",
            "nodes=32",
            "parallelism=3d",
            "ep=32",
            "pp=4",
            "dispatcher=hybridep",
            "mbs=1",
            "gbs=1024",
            "data=mock",
        ),
        700,
        "sister-skills.md 2.5 (VP12 left out)",
    ),
    Anchor(
        "qwen3 30B H100x32 DeepEP",
        (
            "model=qwen3_vl_30b_a3b",
            "cluster=h100",
            "nodes=4",
            "parallelism=3d",
            "ep=8",
            "dispatcher=deepep",
            "recompute=full",
            "mbs=4",
            "gbs=256",
            "data=mock",
        ),
        210,
        "sister-skills.md 2.5",
    ),
    Anchor(
        "qwen3 30B H100x16 HybridEP +EP overlap",
        (
            "model=qwen3_vl_30b_a3b",
            "cluster=h100",
            "nodes=2",
            "parallelism=3d",
            "ep=16",
            "dispatcher=hybridep",
            "dispatcher.overlap_moe_expert_parallel_comm=true",
            "mbs=1",
            "gbs=1024",
            "data=mock",
        ),
        287.305,
        "sister-skills.md 2.5 (EP overlap A/B, overlap on)",
    ),
    Anchor(
        "qwen3 30B H100x16 HybridEP no overlap",
        (
            "model=qwen3_vl_30b_a3b",
            "cluster=h100",
            "nodes=2",
            "parallelism=3d",
            "ep=16",
            "dispatcher=hybridep",
            "mbs=1",
            "gbs=1024",
            "data=mock",
        ),
        244.039,
        "sister-skills.md 2.5 (EP overlap A/B, overlap off)",
    ),
    # PP1 VPP4 as written is not a layout: the option runs it as PP1 (conf/card/).
    Anchor("card qwen3_next_35b_gb200", ("card=qwen3_next_35b_gb200", "data=synthetic"), None, "conf/card/"),
)


def anchors() -> int:
    samples, specs = [], {}
    for anchor in ANCHORS:
        spec = RunSpec.from_config(compose_config([*BASE, *anchor.overrides]))
        work = expected_workload(spec).workload
        world = spec.layout.world_size
        tflops = anchor.tflops if anchor.tflops is not None else spec.card.published_tflops_per_gpu
        assert tflops is not None, f"{anchor.name}: no published figure"
        measured = step_flops(spec, work).bridge / (tflops * 1e12 * world)
        samples.append(Sample(anchor.name, {load.term: load.base_s for load in loads(spec, work)}, measured))
        specs[anchor.name] = spec
    found = calibrate("gpu", "published", samples, "published rows", per_term=False)
    print(f"{'row':<42} {'world':>5} {'measured s':>10} {'LOO predicted s':>15} {'error':>7}")
    for sample in samples:
        error = found.residuals[sample.name]
        print(
            f"{sample.name:<42} {specs[sample.name].layout.world_size:>5} {sample.measured_s:>10.2f} "
            f"{sample.measured_s * (1 + error):>15.2f} {error:>+7.1%}"
        )
    mean = sum(abs(e) for e in found.residuals.values()) / len(found.residuals)
    print(f"leave-one-out mean absolute error {mean:.1%} (target <= 20%), rms {found.sigma:.1%}")
    print(
        "group scales on all rows: "
        + ", ".join(
            f"{g}={found.scales[t.value]:.4g}"
            for g, t in (
                ("compute", Term.vision),
                ("movement", Term.ep_alltoall),
                ("overhead", Term.overhead),
            )
        )
    )
    return 0


def _measured(results: list[RowResult]) -> str:
    held = [r for r in results if r.row.covered and r.measured_band]
    return f"{sum(r.inside for r in held) / len(held):.0%} of {len(held)}" if held else "none"


def families() -> int:
    rows = published_rows()
    figures = []
    for grouping in GROUPINGS:
        results = out_of_sample(grouping, rows)
        print("\n".join(table(grouping, results)))
        print()
        figures.append((grouping, results))
    fit = default_fit(rows)
    width, errors = default_band(rows)
    print(
        f"Defaults, fitted on all {fit.runs} covered rows: compute scale {fit.scales[Term.dense.value]:.4g} "
        f"(a step at {1 / fit.scales[Term.dense.value]:.1%} of the peaks); the plan's {COVERAGE:.0%} band "
        f"+/-{width:.1%}, from {errors} out-of-sample errors (every covered row, its family left out, per grouping)."
    )
    print()
    print("| left out by | family | rows | mean abs error | worst | band coverage |")
    print("|---|---|---|---|---|---|")
    for grouping, results in figures:
        for s in summaries(grouping, results):
            print(
                f"| {grouping} | {s.family} | {s.rows} | {s.mean_abs_error:.1%} | {s.worst_error:+.1%} "
                f"| {s.coverage:.0%} |"
            )
    print()
    print(
        f"Band coverage per leave-out (target >= {COVERAGE:.0%}): "
        + ", ".join(f"{g} {coverage(results):.0%}" for g, results in figures)
        + "; on the rows whose band was measured (the rest: the uncalibrated band, no family left to hold out): "
        + ", ".join(f"{g} {_measured(results)}" for g, results in figures)
        + "."
    )
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--sweep", default=None, help="a sweep directory already run (else run one)")
    p.add_argument("--anchors", action="store_true", help="leave-one-out on the published rows")
    p.add_argument("--families", action="store_true", help="out of sample: each family left out in turn")
    args = p.parse_args()
    if args.families:
        return families()
    if args.anchors:
        return anchors()
    sweep = Path(args.sweep) if args.sweep else REPO / "multirun" / "bench_predict"
    if not args.sweep:
        run_sweep(sweep)
    return cpu(sweep)


if __name__ == "__main__":
    sys.exit(main())
