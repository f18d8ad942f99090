"""`moe-vlm calibrate SWEEP_OR_RUN_DIR...`: fit the step-time model on recorded runs.

One calibration per (cluster, stack version) found among the completed runs, stored (added or
replaced) in the calibration file the plan reads ($MOE_VLM_CALIBRATION, else
~/.cache/moe_vlm/step_time_calibration.json), written atomically.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

from moe_vlm.base import inputs
from moe_vlm.base.errors import EXIT_INVALID, BadInput
from moe_vlm.base.inputs import json_has, output_file, refuse
from moe_vlm.config.compose import compose_config
from moe_vlm.config.preflight import COMPOSE_ERRORS, explain
from moe_vlm.config.spec import RunSpec
from moe_vlm.predict.calibration import calibrate, calibration_path, read_calibrations, store
from moe_vlm.predict.model import has_defaults
from moe_vlm.predict.probe import probe as run_probe
from moe_vlm.predict.runs import RecordedRun, find_runs, recorded
from moe_vlm.predict.terms import NOMINAL_CPU_FLOPS, NOMINAL_CPU_LINK, NOMINAL_CPU_MEMORY, Term
from moe_vlm.rules import validate

PROG = "moe-vlm calibrate"
# What a printed scale is, in the words a reader needs to use it.
SCALES_MEAN = (
    "scale = measured seconds / the term's base seconds (its work at the cluster's datasheet rates; "
    f"cluster=local: a nominal {NOMINAL_CPU_FLOPS / 1e9:g} GFLOP/s, {NOMINAL_CPU_LINK / 1e9:g} GB/s links, "
    f"{NOMINAL_CPU_MEMORY / 1e9:g} GB/s memory): 1 = as fast as those rates, 2 = twice as slow; "
    "a term not listed has no scale (its work is absent here)"
)


def parser() -> argparse.ArgumentParser:
    p = inputs.Parser(prog=PROG, description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument(
        "paths",
        nargs="+",
        # Directories or, with --probe, overrides: which one is known after parsing (checked in main).
        type=inputs.Text("multirun/DATE/TIME (or with --probe: model=qwen3_vl_30b_a3b)"),
        help="sweep or run directories (every run.json under them); with --probe: the point's overrides",
    )
    p.add_argument(
        "--probe",
        action="store_true",
        help="time the point's GEMMs, a copy and its collectives here (seconds) for a first calibration",
    )
    p.add_argument(
        "--store",
        action="store_true",
        help="with --probe on a GPU cluster: store the probe's calibration over the published-row defaults",
    )
    p.add_argument(
        "--out",
        default=None,
        type=inputs.WriteFile("--out calibration.json"),
        help=f"calibration file (default: {calibration_path()})",
    )
    p.add_argument("--dry-run", action="store_true", help="print the fit, write nothing")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        # Before any fit: a calibration file this tool did not write, or a corrupt one, is refused
        # rather than overwritten (base/inputs.output_file).
        out = output_file("calibration file", args.out or calibration_path(), json_has("calibrations"))
        read_calibrations(out)
        if args.probe:
            return probe(args.paths, out, args.dry_run, args.store)
        paths = [_run_dir(text) for text in args.paths]
    except BadInput as exc:
        return refuse(PROG, exc)
    groups: dict[tuple[str, str], list[RecordedRun]] = defaultdict(list)
    for run_dir in find_runs(paths):
        found = recorded(run_dir)
        if isinstance(found, str):
            print(f"{PROG}: skipped {found}", file=sys.stderr)
            continue
        groups[(found.cluster, found.stack)].append(found)
    if not groups:
        print(
            f"{PROG}: error: no completed run with a steady window under {', '.join(map(str, paths))}; "
            "run a sweep first (python train.py -m ...)",
            file=sys.stderr,
        )
        return EXIT_INVALID
    made = []
    for (cluster, stack), runs in sorted(groups.items()):
        source = f"fitted on the runs under {', '.join(map(str, paths))}"
        fitted = calibrate(cluster, stack, [r.sample() for r in runs], source)
        made.append(fitted)
        spread = (
            f"{fitted.sigma:.1%} (leave-one-out)" if fitted.sigma is not None else "none (fewer than 3 runs)"
        )
        print(f"cluster={cluster} {stack}: {len(runs)} run(s), spread {spread}")
        print(f"  {SCALES_MEAN}")
        for term, scale in sorted(fitted.scales.items()):
            if scale > 0:
                print(f"  {term:<12} scale {scale:<8.4g} {Term(term).meaning}")
    if args.dry_run:
        return 0
    print(f"wrote {store(made, out)}")
    return 0


def _run_dir(text: str) -> Path:
    """A PATH without --probe: a sweep or run directory, checked as `moe-vlm status` checks its own."""
    try:
        return inputs.ReadDir("multirun/DATE/TIME")(text)
    except argparse.ArgumentTypeError as exc:
        raise BadInput(f"PATH {exc}") from None


def probe(overrides: list[str], out: Path, dry_run: bool, store_anyway: bool) -> int:
    """--probe: compose the point (one-line error, exit 2, on bad overrides), time it here, store."""
    try:
        spec = RunSpec.from_config(compose_config(overrides))
    except COMPOSE_ERRORS as exc:
        print(f"{PROG}: error: {explain(exc, overrides)}", file=sys.stderr)
        return EXIT_INVALID
    bad = [f for f in validate(spec) if f.is_error]
    if bad:
        print(f"{PROG}: error: the point is invalid: {bad[0].brief()}", file=sys.stderr)
        return EXIT_INVALID
    result = run_probe(spec)
    found = result.calibration()
    print(f"cluster={found.cluster} {found.stack}:")
    for line in result.lines():
        print(f"  {line}")
    if dry_run:
        return 0
    if has_defaults(spec) and not store_anyway:
        print(
            f"not stored: cluster={spec.cluster.name} predicts from the defaults fitted on published whole "
            "steps, which a probe of GEMMs and collectives alone does not beat (docs/step-time-prediction.md); "
            "--store stores it anyway"
        )
        return 0
    print(f"wrote {store([found], out)}")
    return 0
