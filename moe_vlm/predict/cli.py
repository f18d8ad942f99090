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
from typing import NoReturn

from moe_vlm.errors import EXIT_INVALID
from moe_vlm.predict.calibration import calibrate, calibration_path, store
from moe_vlm.predict.runs import RecordedRun, find_runs, recorded

PROG = "moe-vlm calibrate"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"{PROG}: error: {message}", file=sys.stderr)
        sys.exit(EXIT_INVALID)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("paths", nargs="+", help="sweep or run directories (every run.json under them)")
    p.add_argument("--out", default=None, help=f"calibration file (default: {calibration_path()})")
    p.add_argument("--dry-run", action="store_true", help="print the fit, write nothing")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    paths = [Path(p).expanduser() for p in args.paths]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        print(
            f"{PROG}: error: no such path: {', '.join(missing)}; give sweep or run directories",
            file=sys.stderr,
        )
        return EXIT_INVALID
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
        source = f"fitted on {len(runs)} run(s) under {', '.join(map(str, paths))}"
        fitted = calibrate(cluster, stack, [r.sample() for r in runs], source)
        made.append(fitted)
        spread = (
            f"{fitted.sigma:.1%} (leave-one-out)" if fitted.sigma is not None else "none (fewer than 3 runs)"
        )
        print(f"cluster={cluster} {stack}: {len(runs)} run(s), spread {spread}")
        for term, scale in sorted(fitted.scales.items()):
            if scale > 0:
                print(f"  {term:<12} scale {scale:.4g}")
    if args.dry_run:
        return 0
    out = store(made, Path(args.out).expanduser() if args.out else None)
    print(f"wrote {out}")
    return 0
