"""Successive halving against the full grid, measured in one run: best point found, node-seconds.

    python scripts/bench_halving.py                       # the local Slurm if SLURM_CONF is set
    python scripts/bench_halving.py --launcher local --seq-length 128 --gbs 8 --train-iters 80 --json

One sweep directory, two commands: first `hydra.sweeper.search=halving` (every point a short
first rung, the top 1/eta and their ties to the full train_iters), then the same sweep as a grid,
which runs the full length of every point the search stopped (the search's full-length runs have
the grid's identity and are reused). Then every point has its full-length run: the grid's best
is known, and so are the grid's node-seconds (each point's full run: its task's wall time from
its process start, so start-up counts) and the search's (every run of every rung). Prints the
grid's best, the search's best and whether it is the same point or within its noise (their
p10-p90 throughput ranges overlap), and the node-seconds ratio, with the node-steps ratio and
the plan's bound on it (each rung promotes at most tie_factor x its top 1/eta: the bound holds
whatever the timing). The points: MBS x recompute of the tiny model at one sequence length and
GBS, so they do equal work per step and genuinely differ in speed (about 3.5x from the slowest
to the fastest on a CPU). A run's node-seconds count its start-up (Python, torch, the engine:
about 7 s on an idle 2-core machine), which a halving search pays once more per point than the
grid does: the default length (256-token sequences, GBS 16, 120 steps) makes a point's steps
several times its start-up, as on a cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from moe_vlm.launch.halving import (  # noqa: E402
    HalvingState,
    RankClass,
    compare_with_grid,
    node_steps,
)
from moe_vlm.report.halving import short_labels  # noqa: E402

GRID = [
    "model=tiny_moe_vlm",
    "data=mock",
    "nproc=1",
    "warmup_steps=1",
    "mbs=1,2,4,8",
    "recompute=none,selective,full",
]


def sweep(sweep_dir: Path, launcher: str, shape: list[str], *extra: str, timeout_s: float = 3600) -> float:
    """One sweep command to its end; its wall time."""
    command = [sys.executable, "train.py", "-m", f"hydra/launcher={launcher}", f"hydra.sweep.dir={sweep_dir}"]
    command += [*GRID, *shape, *extra]
    if launcher.startswith("slurm"):
        # No canary (tested elsewhere; it would cost both commands the same); with memory stated,
        # two one-CPU jobs share the two-CPU test node instead of each taking all of it.
        command += ["hydra.launcher.canary=false", "hydra.launcher.timeout_min=30", "hydra.launcher.mem_gb=2"]
    started = time.monotonic()
    done = subprocess.run(
        command,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    if done.returncode != 0:
        raise SystemExit(
            f"bench_halving: {' '.join(command)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        )
    return time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--launcher", default="slurm" if os.environ.get("SLURM_CONF") else "local")
    parser.add_argument("--train-iters", type=int, default=120, help="each point's full length (default 120)")
    parser.add_argument("--seq-length", type=int, default=256)
    parser.add_argument("--gbs", type=int, default=16)
    parser.add_argument("--eta", type=int, default=6)
    parser.add_argument("--rungs", type=int, default=2)
    parser.add_argument(
        "--first-steps", type=int, default=10, help="steady steps of the first rung (default 10)"
    )
    parser.add_argument(
        "--tie-factor", type=float, default=1.5, help="ties promoted up to this x the top 1/eta (default 1.5)"
    )
    parser.add_argument("--dir", help="sweep directory (default: a new temporary one)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args(argv)
    sweep_dir = Path(args.dir or tempfile.mkdtemp(prefix="bench_halving-")) / "sweep"
    search = [
        "hydra.sweeper.search=halving",
        f"hydra.sweeper.halving.eta={args.eta}",
        f"hydra.sweeper.halving.rungs={args.rungs}",
        f"hydra.sweeper.halving.first_steps={args.first_steps}",
        f"hydra.sweeper.halving.tie_factor={args.tie_factor}",
        "hydra.sweeper.halving.poll_s=2",
    ]
    shape = [f"seq_length={args.seq_length}", f"gbs={args.gbs}", f"train_iters={args.train_iters}"]
    # The local Slurm's jobs return at once: the grid waits for them like the search does.
    wait = ["hydra.launcher.submit_and_exit=false"] if args.launcher.startswith("slurm") else []
    halving_s = sweep(sweep_dir, args.launcher, shape, *search)
    grid_s = sweep(sweep_dir, args.launcher, shape, *wait)
    figures = compare_with_grid(sweep_dir, RankClass.mock)  # data=mock: the mock class, ranked alone
    state = HalvingState.read(sweep_dir)
    assert state is not None
    steps = state.node_steps()
    bound = node_steps(state.settings, state.plan_points())
    out = {**asdict(figures), "ratio": figures.ratio, "halving_wall_s": halving_s, "grid_rest_wall_s": grid_s}
    out |= {
        "sweep_dir": str(sweep_dir),
        "node_steps": steps,
        "grid_node_steps": bound.grid,
        "plan_node_steps_bound": bound.worst,
        "promoted": [len(r.promoted()) for r in state.rungs[:-1]],
        "overflows": state.overflows(),
    }
    if args.json:
        print(json.dumps(out, sort_keys=True))
        return 0
    print(
        f"bench_halving: 12 points (MBS x recompute, tiny model, mock data), seq_length={args.seq_length}, "
        f"gbs={args.gbs}, train_iters={args.train_iters}"
    )
    print(
        f"  eta={args.eta}, {args.rungs} rungs, first rung {args.first_steps} steady steps, tie_factor "
        f"{args.tie_factor:g}; {args.launcher}"
    )
    labels = short_labels(state.points)
    print(
        f"  grid best:    {labels.get(figures.grid_best, figures.grid_best)}: "
        f"{figures.grid_best_tokens:,.1f} effective tokens/s/GPU"
    )
    same = (
        "the same point"
        if figures.found == figures.grid_best
        else "within its noise"
        if figures.within_noise
        else "NOT within noise"
    )
    print(f"  halving best: {labels.get(figures.found, figures.found)}: {figures.found_tokens:,.1f} ({same})")
    print(f"  promoted after each rung but the last: {out['promoted']} of 12")
    for line in out["overflows"]:
        print(f"  ties over the cap: {line}")
    print(
        f"  node-seconds: halving {figures.halving_node_seconds:,.0f}, grid {figures.grid_node_seconds:,.0f}: "
        f"ratio {figures.ratio:.2f}"
    )
    print(
        f"  node-steps: halving {steps}, grid {bound.grid}: ratio {steps / bound.grid:.2f} "
        f"(the plan's bound {bound.worst}: {bound.ratio:.2f})"
    )
    print(f"  sweep dir: {sweep_dir} (moe-vlm report {sweep_dir} shows the ladder)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
