#!/usr/bin/env python
"""Time submitting 200 sweep points to Slurm: one job array against one sbatch call per point.

    eval "$(bash scripts/slurm_local.sh start)"
    .venv/bin/python scripts/bench_submit.py                 # 200 points, 3 rounds
    .venv/bin/python scripts/bench_submit.py --points 500 --rounds 1

Both ways go through the real launcher (hydra_plugins/moe_vlm_sweeper/launcher.py,
SubmititLauncher.submit_points) on a real Slurm: submitit pickles every point's job, sbatch
takes the scripts. The run is one tiny point (engine=torch, cluster=local) composed by Hydra
once and given N point directories, as a sweep over a knob that changes no resource would be.
Every job is submitted held (`--hold`: nothing runs), timed, then cancelled; the script checks
that Slurm holds none of them before it exits, and cancels them on any error. The rounds
alternate the two ways, so a change in machine load hits both; the medians and their ratio are
printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

RUN = ["model=tiny_moe_vlm", "data=mock", "nproc=1", "train_iters=2", "cluster=local", "engine=torch"]


def slurm_up() -> bool:
    try:
        done = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and "UP" in done.stdout


def make_launcher(sweep_dir: Path) -> Any:
    """The sweep's launcher as `python train.py -m hydra/launcher=slurm ...` builds it."""
    from hydra import initialize_config_dir
    from hydra._internal.callbacks import Callbacks
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.plugins import Plugins
    from hydra.types import HydraContext, RunMode

    import moe_vlm.config.schema  # noqa: F401  (registers the config schema)
    from moe_vlm.run.task import run
    from moe_vlm.runtime.points import register_resolvers

    register_resolvers()
    overrides = [
        *RUN,
        "hydra/launcher=slurm",
        f"hydra.sweep.dir={sweep_dir}",
        "hydra.launcher.canary=false",  # the points' submission alone is measured
        "+hydra.launcher.additional_parameters.hold=true",
    ]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        hydra = GlobalHydra.instance().hydra
        assert hydra is not None
        cfg = hydra.compose_config("train", overrides, run_mode=RunMode.MULTIRUN)
        context = HydraContext(config_loader=hydra.config_loader, callbacks=Callbacks(cfg))
        return Plugins.instance().instantiate_launcher(hydra_context=context, task_function=run, config=cfg)


def numbered_points(launcher: Any, sweep_dir: Path, count: int) -> list[tuple[int, Any]]:
    """One planned point, N directories: what a sweep over a knob that keeps the resources gives."""
    first = launcher.plan([*RUN, f"hydra.sweep.dir={sweep_dir}", "hydra.sweep.subdir=p0000"])
    out = []
    for number in range(count):
        name = f"p{number:04d}"
        overrides = [*RUN, f"seed={number}", f"hydra.sweep.dir={sweep_dir}", f"hydra.sweep.subdir={name}"]
        out.append((number, dataclasses.replace(first, overrides=overrides, point_dir=sweep_dir / name)))
    return out


def job_ids(points: list[tuple[int, Any]]) -> set[str]:
    from moe_vlm.runtime.points import read_point

    ids = {str((read_point(job.point_dir) or {}).get("job_id") or "") for _, job in points}
    return {job_id.split("_")[0] for job_id in ids if job_id}


def queued(ids: set[str]) -> set[str]:
    """Which of these jobs Slurm still holds (an array counts by its own id)."""
    # %F: an array's own job id (a plain job's id for a plain job).
    out = subprocess.run(["squeue", "-h", "-o", "%F"], capture_output=True, text=True, check=True).stdout
    return ids & set(out.split())


@contextmanager
def cancelled_after(ids: set[str]) -> Iterator[set[str]]:
    try:
        yield ids
    finally:
        if ids:
            subprocess.run(["scancel", *sorted(ids)], capture_output=True, check=False)
        deadline = time.monotonic() + 60
        while ids and queued(ids) and time.monotonic() < deadline:
            time.sleep(0.5)


def submit_round(launcher: Any, root: Path, count: int, array: bool, tag: str) -> tuple[float, int]:
    """Submit `count` held points one way; (seconds, sbatch calls). The jobs are cancelled after."""
    sweep_dir = root / tag
    points = numbered_points(launcher, sweep_dir, count)
    launcher.settings = dataclasses.replace(launcher.settings, array=array)
    ids: set[str] = set()
    with cancelled_after(ids):
        started = time.perf_counter()
        try:
            calls = launcher.submit_points(points, {})
        finally:
            ids |= job_ids(points)
        seconds = time.perf_counter() - started
        expected = 1 if array else count
        assert calls == expected and len(ids) == expected, (calls, len(ids), expected)
    left = queued(ids)
    if left:
        raise SystemExit(f"bench_submit: Slurm still holds job(s) {sorted(left)}; cancel them by hand")
    return seconds, calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--points", type=int, default=200, help="points per submission (default 200)")
    parser.add_argument("--rounds", type=int, default=3, help="timings of each way (default 3)")
    args = parser.parse_args(argv)
    if args.points < 2 or args.rounds < 1:
        print("bench_submit: error: --points must be >= 2 and --rounds >= 1. Fix: --points 200 --rounds 3.")
        return 2
    if not slurm_up():
        print(
            "bench_submit: error: Slurm does not answer `scontrol ping`. "
            'Fix: eval "$(bash scripts/slurm_local.sh start)" first.',
            file=sys.stderr,
        )
        return 2
    times: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="bench_submit_") as tmp:
        root = Path(tmp)
        launcher = make_launcher(root / "planning")
        for round_number in range(args.rounds):
            for array in (False, True):
                seconds, calls = submit_round(launcher, root, args.points, array, f"r{round_number}-{array}")
                times[array].append(seconds)
                way = "one job array" if array else "one sbatch per point"
                print(
                    f"round {round_number + 1}: {way:>20}: {args.points} points, {calls} sbatch call(s), {seconds:.2f} s"
                )
    per_point, in_array = statistics.median(times[False]), statistics.median(times[True])
    print(
        f"median over {args.rounds} round(s), {args.points} points: one sbatch per point {per_point:.2f} s, "
        f"one job array {in_array:.2f} s, ratio {per_point / in_array:.1f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
