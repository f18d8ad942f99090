"""How long our commands take to start, against an empty Hydra app in a venv holding only hydra-core.

    .venv/bin/python scripts/bench_startup.py                   # 5 interleaved repeats of each case
    .venv/bin/python scripts/bench_startup.py --repeat 9 --venv /tmp/hydra_only

The baseline is what Hydra alone costs: an empty `@hydra.main` app run by a venv that holds only
hydra-core at the version constraints.txt pins (built once with `python -m venv` and pip, cached
in ~/.cache/moe_vlm/bench_startup_venv or --venv). Every other case runs with the project's
interpreter, each a whole command in a fresh directory with no site file:

- the same empty app in the project's venv (what every Hydra app pays here: the plugin scan of
  every installed `hydra_plugins` package, ours and other libraries');
- `train.py --help`;
- a CPU dry run, `train.py dry_run=true`;
- a GPU-point dry run, `train.py cluster=gb200 model=qwen3_vl_30b_a3b dry_run=true`, first with
  an empty plan cache (it imports Megatron Bridge; reported on its own line), then from the cache
  that run filled.

Repeats are interleaved (one of each case per round), so a burst of load hits every case alike.
Ratios are medians over the baseline's median, wall and CPU time (user + system) both. Targets
(issue 33): --help <= 1.5x, CPU dry run <= 2x, cached GPU-point dry run <= 3x. It also prints our
plugin modules' share of Hydra's plugin scan (Hydra's own ScanStats; target <= 50 ms).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench_dry_run import EMPTY_APP  # the same empty Hydra app (scripts/ is on the path when run)

REPO = Path(__file__).resolve().parent.parent
TRAIN = REPO / "train.py"
DEFAULT_VENV = Path.home() / ".cache" / "moe_vlm" / "bench_startup_venv"
TARGETS = {"train.py --help": 1.5, "CPU dry run": 2.0, "GPU-point dry run, cached": 3.0}
SCAN_TARGET_MS = 50.0
GPU_POINT = ("cluster=gb200", "model=qwen3_vl_30b_a3b", "dry_run=true")
# Our modules' share of Hydra's plugin scan, from the scan's own per-module timings.
SCAN_PROBE = """import json
from hydra.core.plugins import Plugins
stats = Plugins.instance().get_stats()
print(json.dumps(stats.modules_import_time))
"""


@dataclass(frozen=True)
class Timing:
    wall_s: float
    cpu_s: float


def hydra_pin() -> str:
    """hydra-core's version in constraints.txt (what the project's venv runs)."""
    found = re.search(r"^hydra-core==(\S+)$", (REPO / "constraints.txt").read_text(), re.MULTILINE)
    if found is None:
        raise SystemExit(
            "constraints.txt: no hydra-core==VERSION line; the baseline needs the pinned version"
        )
    return found.group(1)


def clean_venv(path: Path, version: str) -> Path:
    """A venv with only hydra-core==version (and what pip installs with it); built once."""
    python = path / "bin" / "python"
    stamp = path / "moe_vlm_bench_startup.json"
    if python.exists() and stamp.exists() and json.loads(stamp.read_text()).get("hydra-core") == version:
        return python
    shutil.rmtree(path, ignore_errors=True)
    print(f"building the baseline venv {path} (hydra-core=={version}, once)", flush=True)
    # The project's interpreter as the base: the same Python, none of its packages.
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            f"hydra-core=={version}",
        ],
        check=True,
    )
    stamp.write_text(json.dumps({"hydra-core": version}))
    return python


def run(command: list[str], cache: Path, expect: str, project: bool) -> Timing:
    """One command in a fresh directory; its output must hold `expect`."""
    with tempfile.TemporaryDirectory(prefix="moe_vlm_bench_startup_") as tmp:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update({"MOE_VLM_SITE_FILE": "none", "MOE_VLM_CACHE_DIR": str(cache)})
        if project:  # our plugins and code from this checkout, as `python train.py` finds them
            env["PYTHONPATH"] = str(REPO)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        done = subprocess.run(command, cwd=tmp, env=env, capture_output=True, text=True, timeout=900)
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0 or expect not in done.stdout:
        raise SystemExit(
            f"{' '.join(command)}: exit status {done.returncode}, {expect!r} "
            f"{'found' if expect in done.stdout else 'not found'}\n{done.stderr[-3000:]}"
        )
    return Timing(wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))


def scan_ms() -> dict[str, float]:
    """Hydra's plugin scan in the project's venv: ms per scanned module of ours, and all together."""
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", SCAN_PROBE], cwd=REPO, env=env, capture_output=True, text=True, check=True
    )
    times: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return {name: seconds * 1000 for name, seconds in times.items()}


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f} (1/5/15 min) on {os.cpu_count()} CPU(s)"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="interleaved runs of each case (default 5)")
    parser.add_argument(
        "--venv", type=Path, default=DEFAULT_VENV, help=f"the baseline venv (default {DEFAULT_VENV})"
    )
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat {args.repeat}: must be at least 1; e.g. --repeat 5")
    version = hydra_pin()
    clean = clean_venv(args.venv.expanduser().absolute(), version)
    python = sys.executable
    work = Path(tempfile.mkdtemp(prefix="moe_vlm_bench_startup_"))
    try:
        app = work / "empty_app.py"
        app.write_text(EMPTY_APP)
        cache = work / "cache"
        cases: dict[str, tuple[list[str], str, bool]] = {
            f"empty Hydra app, venv with only hydra-core {version} (baseline)": (
                [str(clean), str(app)],
                "empty",
                False,
            ),
            "empty Hydra app, project venv": ([python, str(app)], "empty", True),
            "train.py --help": ([python, str(TRAIN), "--help"], "== Config groups", True),
            "CPU dry run": ([python, str(TRAIN), "dry_run=true"], "== moe_vlm plan ==", True),
            "GPU-point dry run, cached": ([python, str(TRAIN), *GPU_POINT], "== moe_vlm plan ==", True),
        }
        print(f"load average before: {load()}", flush=True)
        first_command = cases["GPU-point dry run, cached"][0]
        results: dict[str, list[Timing]] = {"GPU-point dry run, first (empty plan cache)": []}
        results["GPU-point dry run, first (empty plan cache)"].append(
            run(first_command, cache, "== moe_vlm plan ==", True)
        )
        scans: list[dict[str, float]] = []
        for _ in range(args.repeat):
            for name, (command, expect, project) in cases.items():
                results.setdefault(name, []).append(run(command, cache, expect, project))
            scans.append(scan_ms())
        print(f"load average after:  {load()}")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    baseline = next(name for name in results if name.endswith("(baseline)"))
    base_wall = statistics.median(t.wall_s for t in results[baseline])
    base_cpu = statistics.median(t.cpu_s for t in results[baseline])
    print()
    print("| command | runs | wall median s | CPU median s | x baseline (wall) | x baseline (CPU) | target |")
    print("|---|---:|---:|---:|---:|---:|---|")
    verdicts = []
    order = [name for name in results if name != "GPU-point dry run, first (empty plan cache)"]
    for name in [*order, "GPU-point dry run, first (empty plan cache)"]:
        timings = results[name]
        wall = statistics.median(t.wall_s for t in timings)
        cpu_s = statistics.median(t.cpu_s for t in timings)
        wall_x, cpu_x = wall / base_wall, cpu_s / base_cpu
        target = TARGETS.get(name)
        if target is not None:
            met = "met" if wall_x <= target else "NOT met"
            verdicts.append(f"{name}: {met} ({wall_x:.2f}x wall, {cpu_x:.2f}x CPU; target {target}x)")
        shown = f"<= {target}x" if target is not None else ("reported apart" if "first" in name else "")
        print(
            f"| {name} | {len(timings)} | {wall:.2f} | {cpu_s:.2f} | {wall_x:.2f} | {cpu_x:.2f} | {shown} |"
        )
    print()
    ours = [
        sum(v for k, v in scan.items() if k.startswith("hydra_plugins.moe_vlm_sweeper")) for scan in scans
    ]
    others = [
        sum(v for k, v in scan.items() if k.startswith("hydra_plugins.") and "moe_vlm_sweeper" not in k)
        for scan in scans
    ]
    ours_ms = statistics.median(ours)
    print(
        f"Hydra's plugin scan (its ScanStats, median of {len(scans)}): our modules {ours_ms:.1f} ms "
        f"({'met' if ours_ms <= SCAN_TARGET_MS else 'NOT met'}, target <= {SCAN_TARGET_MS:.0f} ms); "
        f"other libraries' hydra_plugins {statistics.median(others):.1f} ms"
    )
    for name in sorted({k for scan in scans for k in scan if k.startswith("hydra_plugins.")}):
        print(f"  {name}: {statistics.median(scan.get(name, 0.0) for scan in scans):.1f} ms")
    for line in verdicts:
        print(f"target {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
