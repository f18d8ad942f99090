"""How long planning takes: whole `train.py ... dry_run=true` commands, timed as subprocesses.

    .venv/bin/python scripts/bench_plan.py            # 3 repeats of each case
    .venv/bin/python scripts/bench_plan.py --repeat 5 --gpu
    .venv/bin/python scripts/bench_plan.py --library   # the library checks' cost, side by side

Cases: one point (the baseline), a 48-point sweep (three recompute options: three sets of group
choices), a 1,000-point sweep of scalar axes, the same 1,000 points through the Slurm launcher
(every point's sbatch script rendered and written), and with --gpu 100 points on GB200 with the
30B model (the Megatron memory estimate behind the rules). Each command runs in a fresh
directory with no site file; each run is checked (exit status 0 and the number of points its
summary states), so a figure is never of a failed command. The machine may be shared: the load
average is printed before and after, and wall and CPU time (user + system of the command) are
both reported. Ratios are median wall time over the one-point median of the same run.

--library (issue 31) times instead a 1,000-point GB200 sweep (30B model: four axes, 1,000
distinct points) with the library's own checks on every point the rules let through, against the
same sweep with `hydra.sweeper.library_checks=false`, interleaved in the same run, with a plan
cache of its own ($MOE_VLM_CACHE_DIR in a temporary directory): first one sweep with the checks on
an empty cache (every distinct point checked once: the stack imported, the recipe built once and a
copy of it per point), reported on its own line, then the repeats, which read the checks from that cache. The
ratios are checks-on over checks-off, wall and CPU (target: at most 1.5x, cached and cold).
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TRAIN = REPO / "train.py"
ITERS = "train_iters=8,16,32,64,128,256,512,1024,2048,4096"
SCALARS_1000 = ["mbs=1,2,4,8,16", "nodes=1,2,4,8,16", "seq_length=1024,2048,4096,8192", ITERS]
GOAL_S = 3.0  # issue 15: a 1,000-point dry run under 3 s ...
GOAL_RATIO = 5.0  # ... and at most five times a one-point dry run


@dataclass(frozen=True)
class Case:
    name: str
    points: int
    args: tuple[str, ...]


CASES = [
    Case("1 point", 1, ("dry_run=true",)),
    Case(
        "48 points",
        48,
        ("-m", "mbs=1,2,4,8", "recompute=none,full,selective", "nodes=1,2,4,8", "dry_run=true"),
    ),
    Case("1,000 points", 1000, ("-m", *SCALARS_1000, "dry_run=true")),
    Case(
        "1,000 points, Slurm", 1000, ("-m", "hydra/launcher=slurm", "nproc=1", *SCALARS_1000, "dry_run=true")
    ),
]
GPU_1000 = (
    "-m", "cluster=gb200", "model=qwen3_vl_30b_a3b", "mbs=1,2,4,8", "nodes=2,4,8,16,32",
    "seq_length=2048,4096,8192,16384,32768", ITERS, "dry_run=true",
)  # fmt: skip
LIBRARY_OFF = Case(
    "1,000 GB200 points, library checks off", 1000, (*GPU_1000, "hydra.sweeper.library_checks=false")
)
LIBRARY_ON = Case("1,000 GB200 points, library checks on", 1000, GPU_1000)
LIBRARY_GOAL = 1.5  # issue 31: at most 1.5x the same sweep without the checks
GPU_CASE = Case(
    "100 points, GB200 30B",
    100,
    ("-m", "cluster=gb200", "model=qwen3_vl_30b_a3b", "mbs=1,2,4,8", "nodes=2,4,8,16,32",
     "seq_length=2048,4096,8192,16384,32768", "dry_run=true"),
)  # fmt: skip


@dataclass(frozen=True)
class Timing:
    wall_s: float
    cpu_s: float


def run_once(case: Case, workdir: Path, cache: Path | None = None) -> Timing:
    args = list(case.args)
    if case.points > 1:
        args.append(f"hydra.sweep.dir={workdir / 'sweep'}")
    env = {**os.environ, "MOE_VLM_SITE_FILE": "none"}
    if cache is not None:
        env["MOE_VLM_CACHE_DIR"] = str(cache)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, str(TRAIN), *args],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{case.name}: exit status {done.returncode}\n{done.stderr[-3000:]}")
    if case.points > 1:
        found = re.search(r"dry run: (\d+) point\(s\)", done.stdout)
        if not found or int(found.group(1)) != case.points:
            raise SystemExit(f"{case.name}: expected {case.points} points\n{done.stdout[-2000:]}")
    elif "== moe_vlm plan ==" not in done.stdout:
        raise SystemExit(f"{case.name}: no plan printed\n{done.stdout[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Timing(wall, cpu)


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f} (1/5/15 min) on {os.cpu_count()} CPU(s)"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs of each case (default 3)")
    parser.add_argument(
        "--gpu", action="store_true", help="also plan 100 GB200 points (the Megatron estimate)"
    )
    parser.add_argument(
        "--library", action="store_true", help="time the library checks on a 1,000-point GB200 sweep instead"
    )
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat {args.repeat}: must be at least 1")
    if args.library:
        return library(args.repeat)
    cases = [*CASES, *([GPU_CASE] if args.gpu else [])]
    print(f"load average before: {load()}")
    results: dict[str, list[Timing]] = {case.name: [] for case in cases}
    for _ in range(args.repeat):  # interleaved, so that a burst of load hits every case alike
        for case in cases:
            with tempfile.TemporaryDirectory(prefix="moe_vlm_bench_plan_") as tmp:
                results[case.name].append(run_once(case, Path(tmp)))
    print(f"load average after:  {load()}")
    base = statistics.median(t.wall_s for t in results[CASES[0].name])
    print()
    print(
        "| command | points | wall median s | wall min s | CPU median s | x one point | ms per point over one |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for case in cases:
        walls = [t.wall_s for t in results[case.name]]
        median = statistics.median(walls)
        cpu = statistics.median(t.cpu_s for t in results[case.name])
        extra = "" if case.points == 1 else f"{(median - base) / case.points * 1000:.2f}"
        print(
            f"| {case.name} | {case.points} | {median:.2f} | {min(walls):.2f} | {cpu:.2f} | "
            f"{median / base:.2f} | {extra} |"
        )
    thousand = statistics.median(t.wall_s for t in results[CASES[2].name])
    verdict = "met" if thousand < GOAL_S and thousand / base <= GOAL_RATIO else "NOT met"
    print(
        f"\ngoal (1,000 points under {GOAL_S:.0f} s wall and at most {GOAL_RATIO:.0f}x one point): {verdict} "
        f"({thousand:.2f} s, {thousand / base:.2f}x)"
    )
    return 0


def library(repeat: int) -> int:
    """The library checks' cost: LIBRARY_ON against LIBRARY_OFF, interleaved, one plan cache."""
    print(f"load average before: {load()}")
    with tempfile.TemporaryDirectory(prefix="moe_vlm_bench_plan_cache_") as cache_tmp:
        cache = Path(cache_tmp)
        with tempfile.TemporaryDirectory(prefix="moe_vlm_bench_plan_") as tmp:
            cold = run_once(LIBRARY_ON, Path(tmp), cache)
        entries = len(list((cache / "plan").glob("library-*.json")))
        results: dict[str, list[Timing]] = {LIBRARY_OFF.name: [], LIBRARY_ON.name: []}
        for _ in range(repeat):
            for case in (LIBRARY_OFF, LIBRARY_ON):
                with tempfile.TemporaryDirectory(prefix="moe_vlm_bench_plan_") as tmp:
                    results[case.name].append(run_once(case, Path(tmp), cache))
    print(f"load average after:  {load()}")
    base = statistics.median(t.wall_s for t in results[LIBRARY_OFF.name])
    base_cpu = statistics.median(t.cpu_s for t in results[LIBRARY_OFF.name])
    print()
    print(
        "| command | wall median s | wall min s | CPU median s | x checks off (wall) | x checks off (CPU) |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, timings in results.items():
        median = statistics.median(t.wall_s for t in timings)
        cpu = statistics.median(t.cpu_s for t in timings)
        shown = f"{name}, from the plan cache" if name == LIBRARY_ON.name else name
        print(
            f"| {shown} | {median:.2f} | {min(t.wall_s for t in timings):.2f} | {cpu:.2f} | {median / base:.2f} | "
            f"{cpu / base_cpu:.2f} |"
        )
    print(
        f"| {LIBRARY_ON.name}, empty cache (once; {entries} distinct points checked) | {cold.wall_s:.2f} | "
        f"{cold.wall_s:.2f} | {cold.cpu_s:.2f} | {cold.wall_s / base:.2f} | {cold.cpu_s / base_cpu:.2f} |"
    )
    ratio = statistics.median(t.wall_s for t in results[LIBRARY_ON.name]) / base
    # On a shared machine the wall ratio moves with the load; the CPU ratio is what the checks cost.
    for what, wall, cpu in (
        (
            "from the plan cache",
            ratio,
            statistics.median(t.cpu_s for t in results[LIBRARY_ON.name]) / base_cpu,
        ),
        ("empty cache", cold.wall_s / base, cold.cpu_s / base_cpu),
    ):
        verdict = "met" if wall <= LIBRARY_GOAL else "NOT met"
        print(
            f"goal (with the checks at most {LIBRARY_GOAL}x without), {what}: {verdict} ({wall:.2f}x wall, "
            f"{cpu:.2f}x CPU)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
