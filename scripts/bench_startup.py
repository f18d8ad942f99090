"""How long our commands take to start, against an empty Hydra app in a venv holding only hydra-core.

    .venv/bin/python scripts/bench_startup.py                   # 5 interleaved repeats of each case
    .venv/bin/python scripts/bench_startup.py --repeat 9 --venv /tmp/hydra_only
    .venv/bin/python scripts/bench_startup.py --only "CPU dry run"      # that row (and the baseline) only

The baseline is what Hydra alone costs: an empty `@hydra.main` app run by a venv that holds only
hydra-core at the version constraints.txt pins (built once with `python -m venv` and pip, cached
in ~/.cache/moe_vlm/bench_startup_venv or --venv). Every other case is a whole command in a fresh
directory with no site file, run in each of three environments, side by side:

- the project's venv (.venv: bootstrap.sh's set plus the Megatron stack of install_megatron.sh);
- `bootstrap`: what the README's first command (scripts/bootstrap.sh, `pip install -e '.[dev]'`)
  installs, no Megatron stack: a CPU user's environment, and a login node's;
- `runtime`: what `pip install moe_vlm` installs (pyproject's dependencies, no extras).

The two are real, separate venvs (`python -m venv`, no system site-packages), each holding exactly
the distributions of that dependency closure, at the versions this venv holds (constraints.txt's
pins), as hard links to this venv's installed files (built once, seconds, no download; cached
under ~/.cache/moe_vlm/bench_startup_envs). Our code comes from this checkout (PYTHONPATH), as
`python train.py` finds it. Cases, in each environment:

- the same empty app (what every Hydra app pays there: the plugin scan of every installed
  `hydra_plugins` package, ours and other libraries');
- `train.py --help`;
- a CPU dry run, `train.py dry_run=true`;
- a GPU-point dry run, `train.py cluster=gb200 model=qwen3_vl_30b_a3b dry_run=true`, from the plan
  cache that one first run in the project's venv filled (it imports Megatron Bridge; reported on
  its own line).

Repeats are interleaved (one of each case per round, after one unmeasured warm-up round), so a
burst of load hits every case alike. Bytecode is cached as for any user (PYTHONDONTWRITEBYTECODE
is dropped from the commands' environment: without it every run recompiles our modules). Ratios
are medians over the baseline's median, wall and CPU time (user + system) both. Targets (issue
33): --help <= 1.5x, CPU dry run <= 2x (judged in the bootstrap environment), cached GPU-point dry
run <= 3x (judged in both the bootstrap environment and the project's venv). It also prints our
plugin modules' share of Hydra's plugin scan (Hydra's own ScanStats; target <= 50 ms).
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
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
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent
TRAIN = REPO / "train.py"
DEFAULT_VENV = Path.home() / ".cache" / "moe_vlm" / "bench_startup_venv"
ENVS_DIR = Path.home() / ".cache" / "moe_vlm" / "bench_startup_envs"
PROJECT = "project venv"
# Each built environment: the extras of moe_vlm it installs, and what it stands for.
BUILT = {
    "bootstrap": (("dev",), "scripts/bootstrap.sh: pip install -e '.[dev]'"),
    "runtime": ((), "pip install moe_vlm: pyproject's dependencies, no extras"),
}
ENVS = (PROJECT, *BUILT)
# Each target and the environments it is judged in (issue 33's brief).
TARGETS: dict[str, tuple[float, tuple[str, ...]]] = {
    "train.py --help": (1.5, ("bootstrap",)),
    "CPU dry run": (2.0, ("bootstrap",)),
    "GPU-point dry run, cached": (3.0, ("bootstrap", PROJECT)),
}
SCAN_TARGET_MS = 50.0
GPU_POINT = ("cluster=gb200", "model=qwen3_vl_30b_a3b", "dry_run=true")
# Each command (None: the empty app's path) and what its output must hold.
COMMANDS: dict[str, tuple[list[str | None], str]] = {
    "empty Hydra app": ([None], "empty"),
    "train.py --help": ([str(TRAIN), "--help"], "== Config groups"),
    "CPU dry run": ([str(TRAIN), "dry_run=true"], "== moe_vlm plan"),
    "GPU-point dry run, cached": ([str(TRAIN), *GPU_POINT], "== moe_vlm plan"),
}
FIRST = "GPU-point dry run, first (empty plan cache; project venv)"
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


def closure(extras: tuple[str, ...]) -> dict[str, metadata.Distribution]:
    """moe_vlm[extras]'s installed dependency closure in this venv (markers evaluated as pip does),
    moe_vlm itself left out (it comes from the checkout)."""
    installed: dict[str, metadata.Distribution] = {
        canonicalize_name(d.metadata["Name"]): d for d in metadata.distributions()
    }
    found: dict[str, metadata.Distribution] = {}
    seen: set[tuple[str, tuple[str, ...]]] = set()
    todo: list[tuple[str, tuple[str, ...]]] = [("moe-vlm", extras)]
    while todo:
        name, wanted = todo.pop()
        if (name, wanted) in seen:
            continue
        seen.add((name, wanted))
        dist = installed.get(name)
        if dist is None:
            raise SystemExit(f"{name}: required by moe_vlm{list(extras)} but not installed in {sys.prefix}")
        if name != "moe-vlm":
            found[name] = dist
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in ("", *wanted)):
                todo.append((canonicalize_name(req.name), tuple(sorted(req.extras))))
    return found


def built_env(name: str, extras: tuple[str, ...]) -> Path:
    """A venv holding exactly moe_vlm[extras]'s closure, hard-linked from this venv; built once.

    Hard links: the same bytes pip installed here, in a separate environment, in seconds and
    without a download (a copy where the link fails). Only files each distribution's RECORD
    lists under site-packages go in (console scripts are not needed here).
    """
    dists = closure(extras)
    want = {key: dist.version for key, dist in sorted(dists.items())}
    path = ENVS_DIR / name
    python = path / "bin" / "python"
    stamp = path / "moe_vlm_bench_startup.json"
    if python.exists() and stamp.exists() and json.loads(stamp.read_text()) == want:
        return python
    shutil.rmtree(path, ignore_errors=True)
    print(f"building the {name} venv {path} ({len(want)} distributions, hard links, once)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    for dist in dists.values():
        for file in dist.files or []:
            if file.parts[0] == "..":
                continue
            source, target = Path(str(dist.locate_file(file))), site / file
            if not source.is_file() or target.exists():  # a RECORD may list a file twice
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(source, target)
            except OSError:
                shutil.copy2(source, target)
    stamp.write_text(json.dumps(want))
    return python


def run(command: list[str], cache: Path, expect: str, project: bool) -> Timing:
    """One command in a fresh directory; its output must hold `expect`."""
    with tempfile.TemporaryDirectory(prefix="moe_vlm_bench_startup_") as tmp:
        # Bytecode cached as a user's would be; our code from this checkout for project commands.
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
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


def scan_ms(python: str) -> dict[str, float]:
    """Hydra's plugin scan in an environment: ms per scanned module, ours and others'."""
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [python, "-c", SCAN_PROBE], cwd=REPO, env=env, capture_output=True, text=True, check=True
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
    parser.add_argument(
        "--only",
        action="append",
        choices=list(COMMANDS),
        help="time only this command (repeatable; the baseline always runs): a shorter run on a shared machine",
    )
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat {args.repeat}: must be at least 1; e.g. --repeat 5")
    version = hydra_pin()
    clean = str(clean_venv(args.venv.expanduser().absolute(), version))
    pythons = {PROJECT: sys.executable, **{n: str(built_env(n, extras)) for n, (extras, _) in BUILT.items()}}
    work = Path(tempfile.mkdtemp(prefix="moe_vlm_bench_startup_"))
    baseline = f"empty Hydra app, venv with only hydra-core {version} (baseline)"
    try:
        app = work / "empty_app.py"
        app.write_text(EMPTY_APP)
        cache = work / "cache"
        commands = {
            name: ([str(app) if arg is None else arg for arg in command], expect)
            for name, (command, expect) in COMMANDS.items()
            if not args.only or name in args.only
        }
        cases: dict[tuple[str, str], tuple[list[str], str, bool]] = {
            (baseline, ""): ([clean, str(app)], "empty", False)
        }
        for name, (command, expect) in commands.items():
            for env_name, python in pythons.items():
                cases[(name, env_name)] = ([python, *command], expect, True)
        print(f"load average before: {load()}", flush=True)
        # Fills the plan cache the cached GPU point reads; reported when that point is timed.
        first = (
            run([sys.executable, str(TRAIN), *GPU_POINT], cache, "== moe_vlm plan", True)
            if "GPU-point dry run, cached" in commands
            else None
        )
        for command, expect, project in cases.values():  # warm-up: bytecode, the OS's file cache
            run(command, cache, expect, project)
        results: dict[tuple[str, str], list[Timing]] = {}
        scans: dict[str, list[dict[str, float]]] = {}
        for _ in range(args.repeat):
            for key, (command, expect, project) in cases.items():
                results.setdefault(key, []).append(run(command, cache, expect, project))
            for env_name, python in pythons.items():
                scans.setdefault(env_name, []).append(scan_ms(python))
        print(f"load average after:  {load()}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(results, scans, first, baseline, args.repeat)
    return 0


def report(
    results: dict[tuple[str, str], list[Timing]],
    scans: dict[str, list[dict[str, float]]],
    first: Timing | None,
    baseline: str,
    repeat: int,
) -> None:
    base = results[(baseline, "")]
    base_wall = statistics.median(t.wall_s for t in base)
    base_cpu = statistics.median(t.cpu_s for t in base)
    print()
    print(f"Medians of {repeat} runs: wall s (x baseline wall, x baseline CPU). The baseline: {baseline}, ")
    print(
        f"{base_wall:.2f} s wall, {base_cpu:.2f} s CPU. Environments: {PROJECT} (.venv, with the Megatron stack); "
    )
    for name, (_, what) in BUILT.items():
        print(f"  {name}: {what}")
    print()
    print(f"| command | {' | '.join(ENVS)} | target (judged in) |")
    print(f"|---|{'---:|' * len(ENVS)}---|")
    verdicts = []
    for name in dict.fromkeys(key[0] for key in results if key[0] != baseline):
        cells = []
        for env_name in ENVS:
            timings = results[(name, env_name)]
            wall = statistics.median(t.wall_s for t in timings)
            cpu_s = statistics.median(t.cpu_s for t in timings)
            wall_x, cpu_x = wall / base_wall, cpu_s / base_cpu
            cells.append(f"{wall:.2f} ({wall_x:.2f}x, {cpu_x:.2f}x)")
            target = TARGETS.get(name)
            if target is not None and env_name in target[1]:
                met = "met" if wall_x <= target[0] else "NOT met"
                verdicts.append(
                    f"{name} in {env_name}: {met} ({wall_x:.2f}x wall, {cpu_x:.2f}x CPU; target {target[0]}x)"
                )
        target = TARGETS.get(name)
        shown = f"<= {target[0]}x ({', '.join(target[1])})" if target is not None else ""
        print(f"| {name} | {' | '.join(cells)} | {shown} |")
    dash = " | ".join("-" for _ in ENVS[1:])
    if first is not None:
        print(
            f"| {FIRST} | {first.wall_s:.2f} ({first.wall_s / base_wall:.1f}x, "
            f"{first.cpu_s / base_cpu:.1f}x) | {dash} | reported apart (1 run) |"
        )
    print()
    for env_name, env_scans in scans.items():
        ours = statistics.median(
            sum(v for k, v in scan.items() if k.startswith("hydra_plugins.moe_vlm_sweeper"))
            for scan in env_scans
        )
        names = sorted({k for scan in env_scans for k in scan if k.startswith("hydra_plugins.")})
        each = ", ".join(
            f"{n.removeprefix('hydra_plugins.')} {statistics.median(s.get(n, 0.0) for s in env_scans):.0f}"
            for n in names
        )
        print(
            f"Hydra's plugin scan in {env_name} (its ScanStats, ms, median of {len(env_scans)}): our modules "
            f"{ours:.1f} ({'met' if ours <= SCAN_TARGET_MS else 'NOT met'}, target <= {SCAN_TARGET_MS:.0f}); {each}"
        )
    for line in verdicts:
        print(f"target {line}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
