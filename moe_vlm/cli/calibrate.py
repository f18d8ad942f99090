"""`moe-vlm calibrate SWEEP_OR_RUN_DIR...`: scale the step model to recorded runs; `--probe`:
measure this machine's rates.

One calibration per (cluster, stack version) found among the completed runs, stored (added or
replaced) in the calibration file the plan reads ($MOE_VLM_CALIBRATION, else
~/.cache/moe_vlm/step_time_calibration.json), written atomically. A fit scales at most three groups
of terms (compute, data movement, host time) and keeps the rates it scales; on a cluster with no
published rates (cluster=local) the probe measures them first.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

from moe_vlm.base import inputs
from moe_vlm.base.errors import EXIT_INVALID, BadInput
from moe_vlm.base.inputs import json_has, output_file, refuse
from moe_vlm.config.compose import compose_config
from moe_vlm.config.preflight import COMPOSE_ERRORS, explain
from moe_vlm.config.spec import RunSpec

if TYPE_CHECKING:
    from moe_vlm.predict.probe import ProbeResult
from moe_vlm.predict.calibration import (
    GROUPS,
    calibrate,
    calibration_path,
    find,
    read_calibrations,
    store,
    with_rates,
)
from moe_vlm.predict.model import hardware_for, has_defaults
from moe_vlm.predict.runs import RecordedRun, find_runs, recorded
from moe_vlm.rules import validate

PROG = "moe-vlm calibrate"
# What a printed scale is, in the words a reader needs to use it.
SCALES_MEAN = (
    "scale = measured seconds / the group's seconds at the rates (published, or measured by the probe): "
    "1 = as the rates say, 2 = twice as slow; a group the runs do not exercise is not fitted"
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
        help="with --probe on a GPU cluster: the node's GEMM, attention and memory rates replace the published ones",
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
        existing = find(cluster, stack, out)
        hw, _ = hardware_for(runs[0].spec, existing)
        if hw is None:
            print(f"{PROG}: cluster={cluster}: no rates yet; measuring this machine's (as --probe does)")
            existing = with_rates(existing, _measure(runs[0].spec).calibration())
            hw, _ = hardware_for(runs[0].spec, existing)
        assert hw is not None
        source = f"fitted on the runs under {', '.join(map(str, paths))}"
        fitted = calibrate(
            cluster, stack, [r.sample(hw) for r in runs], source, rates=existing.rates if existing else None
        )
        made.append(fitted)
        spread = (
            f"{fitted.sigma:.1%} (leave-one-out)" if fitted.sigma is not None else "none (fewer than 3 runs)"
        )
        print(f"cluster={cluster} {stack}: {len(runs)} run(s), spread {spread}")
        print(f"  {SCALES_MEAN}")
        for group, terms in GROUPS.items():
            if terms[0].value in fitted.scales:
                scale = fitted.scales[terms[0].value]
                finding = "  FINDING: fitted to 0 (the runs do not separate it)" if scale <= 1e-6 else ""
                print(f"  {group:<9} scale {scale:<8.4g} ({', '.join(t.value for t in terms)}){finding}")
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
    result = _measure(spec)
    found = result.calibration()
    print(f"cluster={found.cluster} {found.stack}:")
    for line in result.lines():
        print(f"  {line}")
    if dry_run:
        return 0
    if has_defaults(spec) and not store_anyway:
        print(
            f"not stored: cluster={spec.cluster.name} is predicted at its published rates "
            "(moe_vlm/predict/hardware.py); --store puts this node's GEMM, attention and memory rates in "
            "their place (its links stay the preset's)"
        )
        return 0
    print(f"wrote {store([with_rates(find(found.cluster, found.stack, out), found)], out)}")
    return 0


def _measure(spec: RunSpec) -> ProbeResult:
    # Here, not at the top: the probe imports torch, which `calibrate --help` need not.
    from moe_vlm.predict.probe import probe

    return probe(spec)
