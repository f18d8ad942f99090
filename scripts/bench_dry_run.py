"""How long one `dry_run=true` takes, against an empty Hydra app timed in the same run.

    .venv/bin/python scripts/bench_dry_run.py              # 5 repeats of each case
    .venv/bin/python scripts/bench_dry_run.py --repeat 9 --cold 2

Cases, each a whole command in a fresh directory with no site file:

- the baseline: an empty Hydra app (`@hydra.main(version_base=None)` printing one line), the
  same interpreter and Hydra plugins (their scan is part of every Hydra app's start);
- the default CPU point: `train.py dry_run=true`;
- a GPU-cluster point, `train.py cluster=gb200 model=qwen3_vl_30b_a3b nodes=2 dry_run=true`,
  once with an empty plan cache (the first plan of a configuration: it imports the Megatron stack
  and builds Bridge's ConfigContainer on every perf recipe of the family) and then with the
  cache that run filled (every later plan of it); the plan must say where each section came from.

Repeats are interleaved so that a burst of load hits every case alike; the load average is
printed before and after. Ratios are medians over the empty app's median, wall and CPU time
(user + system of the command) both: the goal (issue 18) is the plan within 1.5x the empty app
once its Bridge-built sections are cached.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TRAIN = REPO / "train.py"
GOAL_RATIO = 1.5
EMPTY_APP = """import hydra


@hydra.main(version_base=None)
def main(cfg) -> None:
    print("empty")


if __name__ == "__main__":
    main()
"""
GPU_POINT = ("cluster=gb200", "model=qwen3_vl_30b_a3b", "nodes=2", "dry_run=true")
FROM_CACHE = "(from the plan cache:"
BUILT_NOW = "(built now with"


@dataclass(frozen=True)
class Timing:
    wall_s: float
    cpu_s: float


def run(command: list[str], cache: Path, expect: tuple[str, ...] = (), count: int = 0) -> Timing:
    """One command in a fresh directory; its output must hold each of `expect` `count` times
    (at least once when count is 0)."""
    with tempfile.TemporaryDirectory(prefix="moe_vlm_bench_dry_run_") as tmp:
        env = {
            **os.environ,
            "MOE_VLM_SITE_FILE": "none",
            "MOE_VLM_CACHE_DIR": str(cache),
            "PYTHONPATH": str(REPO),
        }
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        done = subprocess.run(command, cwd=tmp, env=env, capture_output=True, text=True, timeout=900)
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)}: exit status {done.returncode}\n{done.stderr[-3000:]}")
    for text in expect:
        found = done.stdout.count(text)
        if found == 0 or (count and found != count):
            raise SystemExit(
                f"{' '.join(command)}: expected {count or 'some'} x {text!r}, found {found}\n{done.stdout[-3000:]}"
            )
    return Timing(wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f} (1/5/15 min) on {os.cpu_count()} CPU(s)"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs of each warm case (default 5)")
    parser.add_argument("--cold", type=int, default=1, help="runs with an empty plan cache (default 1)")
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.cold < 1:
        parser.error("--repeat and --cold must be at least 1")
    python = sys.executable
    work = Path(tempfile.mkdtemp(prefix="moe_vlm_bench_dry_run_"))
    try:
        app = work / "empty_app.py"
        app.write_text(EMPTY_APP)
        cache = work / "cache"
        empty = [python, str(app)]
        cpu = [python, str(TRAIN), "dry_run=true"]
        gpu = [python, str(TRAIN), *GPU_POINT]
        print(f"load average before: {load()}")
        results: dict[str, list[Timing]] = {}
        for _ in range(args.cold):  # the first plan of the configuration: nothing cached
            shutil.rmtree(cache, ignore_errors=True)
            results.setdefault("GPU point, first plan (empty cache)", []).append(
                run(gpu, cache, (BUILT_NOW,), count=2)
            )
        for _ in range(args.repeat):
            results.setdefault("empty Hydra app", []).append(run(empty, cache, ("empty",)))
            results.setdefault("CPU point (default)", []).append(run(cpu, cache, ("== moe_vlm plan ==",)))
            results.setdefault("GPU point, cached", []).append(run(gpu, cache, (FROM_CACHE,), count=2))
        print(f"load average after:  {load()}")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    base = results["empty Hydra app"]
    base_wall = statistics.median(t.wall_s for t in base)
    base_cpu = statistics.median(t.cpu_s for t in base)
    print()
    print("| command | runs | wall median s | CPU median s | x empty app (wall) | x empty app (CPU) |")
    print("|---|---:|---:|---:|---:|---:|")
    ratios: dict[str, tuple[float, float]] = {}
    for name, timings in results.items():
        wall = statistics.median(t.wall_s for t in timings)
        cpu_s = statistics.median(t.cpu_s for t in timings)
        ratios[name] = (wall / base_wall, cpu_s / base_cpu)
        print(
            f"| {name} | {len(timings)} | {wall:.2f} | {cpu_s:.2f} | {ratios[name][0]:.2f} | {ratios[name][1]:.2f} |"
        )
    print()
    for name in ("CPU point (default)", "GPU point, cached"):
        wall_ratio, cpu_ratio = ratios[name]
        verdict = "met" if max(wall_ratio, cpu_ratio) <= GOAL_RATIO else "NOT met"
        print(
            f"goal ({name} within {GOAL_RATIO}x an empty Hydra app): {verdict} "
            f"({wall_ratio:.2f}x wall, {cpu_ratio:.2f}x CPU)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
