"""What the shape check adds to planning a sweep: the rules alone vs the rules then the shape check,
on the same points, in one run (issue 31: planning a 1,000-point GPU sweep stays within 1.5x).

    .venv/bin/python scripts/bench_shape_check.py            # 1,000 GB200 points, 3 repeats

The points are a 1,000-point scalar sweep on the Megatron engine (BF16, padded: what a sweep over
MBS, nodes, seq_length and iterations plans), composed once; each repeat times `validate` over all
of them, then `validate` + `shape_check`, interleaved (per-process cache cleared first, so the first point of
each shape pays its build). Prints the medians and the ratio.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import statistics
import time

from moe_vlm.config.compose import compose_point
from moe_vlm.config.spec import RunSpec
from moe_vlm.engines.megatron import shape_check as engine_side
from moe_vlm.rules import errors, validate
from moe_vlm.run.plan import shape_check

AXES = {
    "mbs": (1, 2, 4, 8, 16),
    "nodes": (1, 2, 4, 8, 16),
    "seq_length": (1024, 2048, 4096, 8192),
    "train_iters": (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096),
}
BASE = ["engine=megatron", "dry_run=true", "cluster=gb200", "model=qwen3_vl_30b_a3b"]


def specs(extra: list[str]) -> list[RunSpec]:
    train = compose_point([*BASE, *extra]).train
    out = []
    for values in itertools.product(*AXES.values()):
        point = copy.copy(train)  # only top-level scalars change
        for name, value in zip(AXES, values, strict=True):
            setattr(point, name, value)
        out.append(RunSpec.from_config(point))
    return out


def timed(points: list[RunSpec], with_shapes: bool) -> float:
    engine_side._CACHE.clear()
    started = time.perf_counter()
    for spec in points:
        found = validate(spec)
        if with_shapes and not errors(found):
            shape_check(spec)
    return time.perf_counter() - started


def shapes_alone(points: list[RunSpec]) -> float:
    """The shape check by itself on the same points (cache cleared): its own cost, beside the noise."""
    engine_side._CACHE.clear()
    started = time.perf_counter()
    for spec in points:
        shape_check(spec)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--precision", default="bf16", help="bf16 (padded BF16 builds nothing) or fp8cs (TE's checks run)"
    )
    args = parser.parse_args()
    points = specs([f"precision={args.precision}"])
    timed(points[:5], True)  # imports (TE for FP8) out of the measurement
    rules, both = [], []
    for _ in range(args.repeat):  # interleaved, so a change in the machine's load hits both alike
        rules.append(timed(points, False))
        both.append(timed(points, True))
    base, new = statistics.median(rules), statistics.median(both)
    print(f"{len(points)} points, precision={args.precision}, {args.repeat} repeats (median wall time)")
    print(f"rules alone            {base:7.3f} s  1.00x")
    print(
        f"rules + shape check    {new:7.3f} s  {new / base:.2f}x  ({engine_side.cached_keys()} shapes built)"
    )
    alone = statistics.median([shapes_alone(points) for _ in range(args.repeat)])
    print(f"shape check alone      {alone:7.3f} s  {alone / base:.3f}x of the rules' time")


if __name__ == "__main__":
    main()
