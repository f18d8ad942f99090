"""The baseline gate's false alarms on identical points: how often `moe-vlm report --baseline`
fails a run that differs from its baseline only by when it ran.

Runs N points that differ only in their seed (one config; the tiny model on this machine's CPU,
Hydra's basic launcher, one after another), or reads an existing sweep (`--sweep DIR`), then
gates every run against a baseline saved from each other run alone (N x (N-1) pairs) and
against one saved from all the others (N leave-one-out baselines), at the gate's defaults
(`--tolerance 0.05`, `--memory-tolerance 0.10`) over the baseline's window. Every failure is a
false alarm: the points are identical.

    python scripts/bench_gate.py                 # 6 points of 16 steps (3 of warm-up): a few minutes
    python scripts/bench_gate.py --points 8 --steps 20 --tolerance 0.05
    python scripts/bench_gate.py --sweep multirun/identical
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from moe_vlm.report import gate  # noqa: E402
from moe_vlm.report.table import load_table  # noqa: E402

RUN = ["model=tiny_moe_vlm", "data=synthetic", "nproc=1", "warmup_steps=3", "seq_length=128", "gbs=4"]
RUN += ["data.min_images=1", "data.max_images=1", "data.max_long_side_px=336"]


def run_points(sweep_dir: Path, points: int, steps: int) -> None:
    seeds = ",".join(str(seed) for seed in range(1, points + 1))
    command = [sys.executable, "train.py", "-m", f"hydra.sweep.dir={sweep_dir}", *RUN, f"train_iters={steps}"]
    subprocess.run([*command, f"seed={seeds}"], cwd=REPO, check=True, capture_output=True, text=True)


def false_alarms(
    sweep_dir: Path, tolerance: float, memory_tolerance: float
) -> tuple[int, int, int, int, list[str]]:
    table = load_table([str(sweep_dir)])
    done = table[table["status"] == "completed"].reset_index(drop=True)
    pairs = pair_alarms = loo = loo_alarms = 0
    lines: list[str] = []
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "baseline.json"
        for i in range(len(done)):
            others = done.drop(index=i)
            for j in others.index:
                gate.save(done.loc[[j]], path, None)
                judged = gate.judge(done.loc[[i]], gate.load(path), tolerance, memory_tolerance, None)
                pairs += 1
                pair_alarms += any(x.verdict == "FAIL" for x in judged)
                lines += [
                    f"pair {done.loc[j, 'run']} -> {line}" for line in gate.lines(judged) if "FAIL" in line
                ]
            gate.save(others, path, None)
            judged = gate.judge(done.loc[[i]], gate.load(path), tolerance, memory_tolerance, None)
            loo += 1
            loo_alarms += any(x.verdict == "FAIL" for x in judged)
            lines += [f"all others -> {line}" for line in gate.lines(judged) if "FAIL" in line]
    return pairs, pair_alarms, loo, loo_alarms, lines


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--points", type=int, default=6)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--sweep", type=Path, help="gate the runs of this sweep instead of running new ones")
    parser.add_argument("--tolerance", type=float, default=0.05)
    parser.add_argument("--memory-tolerance", type=float, default=gate.DEFAULT_MEMORY_TOLERANCE)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        sweep_dir = args.sweep or Path(scratch) / "identical"
        if args.sweep is None:
            run_points(sweep_dir, args.points, args.steps)
        pairs, pair_alarms, loo, loo_alarms, lines = false_alarms(
            sweep_dir, args.tolerance, args.memory_tolerance
        )
    print(
        f"identical points gated at tolerance {args.tolerance:g}, memory tolerance {args.memory_tolerance:g}:"
    )
    print(f"  against one other run:    {pair_alarms} false alarm(s) in {pairs} gate(s)")
    print(f"  against all the others:   {loo_alarms} false alarm(s) in {loo} gate(s)")
    for line in lines:
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
