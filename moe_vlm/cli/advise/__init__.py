"""`moe-vlm advise`: the field guide (docs/GUIDE.md) as code.

    moe-vlm advise model=qwen3_vl_235b_a22b cluster=gb200 nodes=16 goal=bring-up
    moe-vlm advise model=qwen3_vl_30b_a3b cluster=b200 goal=peak-throughput
    moe-vlm advise sweep=multirun/<sweep dir>

The overrides are train.py's (composed with Hydra's compose API against conf/, moe_vlm.config.compose).
Before any run (start.py) the advisor recommends FSDP or 3D with the guide's reasons and a
starting configuration for the cluster (dispatcher, EP, recompute, CUDA-graph scope, vision
freeze) that passes moe_vlm.rules.validate and that moe_vlm.perf.memory predicts to fit, printed as a
runnable `python train.py ...` line. With sweep=PATH (sweep.py) it reads every run.json under PATH
and says what to try next; every suggestion is a runnable command line. Bad input: one line,
exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from moe_vlm.base import inputs
from moe_vlm.base.errors import EXIT_INVALID, BadInput
from moe_vlm.base.files import RUN_JSON
from moe_vlm.cli.advise.start import GOALS, _pipeline_split, before_any_run
from moe_vlm.cli.advise.sweep import after_sweep
from moe_vlm.config.compose import compose_spec

# compose_spec and _pipeline_split: where the tests have always imported them from.
__all__ = ["GOALS", "Request", "_pipeline_split", "compose_spec", "main", "parse"]


@dataclass
class Request:
    goal: str
    sweep: Path | None
    overrides: list[str]


def usage() -> str:
    """`moe-vlm advise --help`: the arguments and examples (the examples are this module's docstring's)."""
    examples = [
        line.strip() for line in (__doc__ or "").splitlines() if line.startswith("    moe-vlm advise")
    ]
    return "\n".join(
        [
            "usage: moe-vlm advise [KEY=VALUE ...] [goal=GOAL] | sweep=PATH [goal=GOAL]",
            "",
            "What to run first (train.py's overrides: a model, a cluster, nodes, ...), or what to try next",
            "after a sweep (sweep=PATH). Every suggestion is a runnable command line.",
            "",
            "arguments:",
            "  KEY=VALUE    train.py overrides, one configuration (no sweeps), e.g. model=qwen3_vl_30b_a3b",
            f"  goal=GOAL    {' | '.join(GOALS)} (default bring-up)",
            "  sweep=PATH   a sweep's output directory (the multirun/... holding the points' run.json)",
            "",
            "examples:",
            *(f"  {line}" for line in examples),
        ]
    )


def parse(argv: list[str]) -> Request:
    goal, sweep = "bring-up", None
    overrides: list[str] = []
    for arg in argv:
        if "=" not in arg or arg.startswith("-"):
            raise BadInput(
                f"{arg}: not a key=value override. Fix: e.g. moe-vlm advise model=qwen3_vl_30b_a3b "
                "cluster=gb200 goal=bring-up (or sweep=PATH)."
            )
        key, value = arg.split("=", 1)
        if key == "goal":
            if value not in GOALS:
                raise BadInput(
                    f"goal={value}: not one of {', '.join(GOALS)}. Fix: goal=bring-up or "
                    "goal=peak-throughput."
                )
            goal = value
        elif key == "sweep":
            if not value.strip():  # Path("") is the current directory
                raise BadInput("sweep=: no path given. Fix: sweep=PATH to a sweep's output directory.")
            try:  # checked as every directory argument is (base/inputs.py)
                sweep = inputs.ReadDir("sweep=multirun/DATE/TIME (the directory holding the points)")(value)
            except argparse.ArgumentTypeError as exc:
                raise BadInput(f"sweep={value[:80]}: {str(exc).split(': ', 1)[-1]}") from None
            if not any(sweep.rglob(RUN_JSON)):
                raise BadInput(
                    f"sweep={value}: no {RUN_JSON} under it. Fix: point sweep= at a sweep that has run."
                )
        else:
            if "," in value and not value.startswith(("[", "'", '"')):
                raise BadInput(
                    f"{arg}: advise takes one configuration, not a sweep. Fix: give a single value, e.g. "
                    f"{key}={value.split(',')[0]}."
                )
            overrides.append(arg)
    return Request(goal, sweep, overrides)


def main(argv: list[str]) -> int:
    if any(arg in ("-h", "--help") for arg in argv):
        print(usage())
        return 0
    try:
        request = parse(list(argv))
        if request.sweep is not None:
            if request.overrides:
                raise BadInput(
                    f"{request.overrides[0]}: with sweep=PATH the configurations come from the "
                    "sweep's run.json "
                    "files. Fix: drop the overrides, or drop sweep= to plan a first run."
                )
            lines = after_sweep(request.sweep, request.goal)
        else:
            lines = before_any_run(request.overrides, request.goal)
    except BadInput as exc:
        print(f"moe-vlm advise: error: {exc}", file=sys.stderr)
        return EXIT_INVALID
    print("\n".join(lines))
    return 0
