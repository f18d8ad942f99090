#!/usr/bin/env python
"""Time the whole `moe-vlm report` command over 1,000 runs against a 10-run report, same machine, same run.

    python scripts/bench_report.py                        # N = 10 and 1000, 3 timings each
    python scripts/bench_report.py --runs 10 1000 --repeat 5 --keep /tmp/bench_report
    python scripts/bench_report.py --copies-of tests/fixtures/cpu_sweep/4b3021dc6b3c834c

For each N it writes a sweep directory of N FIXTURE runs (below) into a temp dir, then times
the console script `moe-vlm report SWEEP` as a subprocess (interpreter start and imports count),
alternating the sizes so a change in machine load hits both, and prints the median of each and
the ratio against the smallest N. Exit status 1 when the ratio exceeds --max-ratio (issue 15:
a 1,000-run report costs at most three times a 10-run one).

FIXTURES, valid for the report, not measurements: each run.json carries
"fixture": "moe_vlm scripts/bench_report.py ..." and the sweep root a FIXTURE.txt. They are
written the way a real run writes them: Hydra composes each group combination (GB200, 2 nodes,
Qwen3-VL-30B-A3B; FSDP or 3D PP2; recompute none/selective/full; HybridEP or all-to-all; some
mock data; DeepEP, which D001 rejects on GB200), scalars (MBS, GBS, sequence length, seed) are
set on the composed config, RunSpec and the rule catalogue run on it (a rejected point gets the
rejected record run/task.py writes, with the findings), steps.jsonl lines go through
record.StepWriter, run.json through record.RunRecord (rejected, completed with metrics.summarize
of the lines, failed), an OOM (peak memory: moe_vlm.perf.memory.estimate, give or take a few percent,
above the GPU's) through runtime.failures.write_failure, and each run gets Hydra's .hydra/ files.

With --copies-of RUN_DIR the sweeps are instead N copies of one recorded run (its run.json,
steps.jsonl, point.json and .hydra/), e.g. the real CPU run in tests/fixtures/cpu_sweep: every
row the same configuration, every point of the scatter in one place (issue 18 measured 6x here).
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

from omegaconf import DictConfig, OmegaConf

from moe_vlm.base.files import STEPS_JSONL
from moe_vlm.config.spec import RunSpec
from moe_vlm.perf.memory import estimate
from moe_vlm.perf.metrics import summarize
from moe_vlm.record import records as record_module
from moe_vlm.record.records import RunRecord, StepWriter
from moe_vlm.rules import errors, validate
from moe_vlm.run.task import resolved_config
from moe_vlm.runtime.failures import classify, write_failure

REPO = Path(__file__).resolve().parent.parent
FIXTURE = "moe_vlm scripts/bench_report.py: synthetic record for the report benchmark, not a measurement"
BASE = ("model=qwen3_vl_30b_a3b", "cluster=gb200", "nodes=2", "train_iters=10")
# Group choices Hydra composes; everything else is a scalar set on the composed config.
COMBOS: tuple[tuple[str, ...], ...] = (
    *(
        (f"parallelism={par}", *extra, f"recompute={rc}", f"dispatcher={disp}", "data=synthetic")
        for (par, *extra), rc, disp in itertools.product(
            (("fsdp",), ("3d", "pp=2")), ("none", "selective", "full"), ("hybridep", "alltoall")
        )
    ),
    ("parallelism=fsdp", "recompute=none", "dispatcher=hybridep", "data=mock"),
    ("parallelism=fsdp", "recompute=full", "dispatcher=hybridep", "data=mock"),
    ("parallelism=fsdp", "recompute=none", "dispatcher=deepep", "data=synthetic"),  # rejected on GB200
)
SCALARS = {"mbs": (1, 2, 4), "gbs": (256, 512, 1024), "seq_length": (2048, 4096)}
# Step time: a simple cost model, enough to give the report varied, plausible numbers.
RECOMPUTE_COST = {"none": 1.0, "selective": 1.08, "full": 1.33}
OOM_STEP = 2  # a run that does not fit dies here, after writing the steps before it


def compose(overrides: tuple[str, ...]) -> DictConfig:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return hydra_compose(config_name="train", overrides=list(overrides))


def points(n: int) -> Iterator[tuple[tuple[str, ...], dict[str, int]]]:
    """n sweep points in a fixed shuffled order: every combination once, then again with a new seed."""
    grid = [
        (combo, dict(zip(SCALARS, values, strict=True)))
        for combo in COMBOS
        for values in itertools.product(*SCALARS.values())
    ]
    random.Random(0).shuffle(grid)
    for index in range(n):
        combo, scalars = grid[index % len(grid)]
        yield combo, {**scalars, "seed": 1234 + index // len(grid)}


def step_lines(spec: RunSpec, rng: random.Random, recompute: str) -> tuple[list[dict[str, Any]], float]:
    """steps.jsonl lines (one per step per DP rank, record/records.py's format) and the run's peak GiB."""
    dp = spec.layout.dp
    sequences = spec.gbs // dp
    merge = spec.model.vision_spatial_merge_size**2
    # The project's own estimate, off by a few percent as a measurement is: near the limit, an OOM.
    peak = estimate(spec).allocated_gib * rng.uniform(0.9, 1.05)
    mock_data = spec.data.kind.value == "mock"
    speed = 9_000.0 * (1 + 0.12 * (spec.mbs.bit_length() - 1)) / RECOMPUTE_COST[recompute]
    lines = []
    for step in range(1, spec.train_iters + 1):
        step_time = (
            sequences * spec.seq_length * 0.7 / speed * (1.6 if step == 1 else rng.uniform(0.97, 1.05))
        )
        for rank in range(dp):
            images = 0 if mock_data else sequences * rng.randint(1, 2)
            patches = images * rng.randint(1024, 4096)
            image_tokens = patches // merge
            real = int(sequences * spec.seq_length * rng.uniform(0.55, 0.8)) + image_tokens
            vision = 0.0 if mock_data else step_time * rng.uniform(0.2, 0.4)
            lines.append({
                "step": step, "rank": rank, "warmup": step <= spec.warmup_steps,
                "time_unix_s": 1_760_000_000.0 + step * step_time, "step_time_s": step_time,
                "loss": 8.0 - 0.1 * step, "grad_norm": 1.0, "lr": 3e-4, "micro_batches": sequences // spec.mbs,
                "tokens": {"padded": sequences * spec.seq_length, "real": real, "text": real - image_tokens,
                           "image": image_tokens, "loss": real - image_tokens},
                "sequences": sequences, "images": images, "vision_patches": patches,
                "sum_seq_len_squared": real * spec.seq_length, "sum_patches_squared": patches * 4096,
                "peak_memory_gib": peak - 0.1 * rank, "memory_kind": "cuda_max_allocated",
                "components_s": {"vision_encoder": vision, "projector": 0.01 * step_time,
                                 "decoder": 0.85 * step_time - vision},
            })  # fmt: skip
    return lines, peak


def write_run(run_dir: Path, cfg: DictConfig, overrides: list[str], rng: random.Random) -> str:
    spec = RunSpec.from_config(cfg)
    config = resolved_config(cfg)
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    (run_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    findings = validate(spec)
    if errors(findings):
        record = RunRecord.rejected(spec, config, findings)
        record.sections["fixture"] = FIXTURE
        record.write(run_dir)
        return "rejected"
    recompute = str(cfg.recompute.name)
    lines, peak = step_lines(spec, rng, recompute)
    fits = peak <= float(spec.cluster.gpu_memory_gib)
    with StepWriter(run_dir / STEPS_JSONL) as writer:
        for line in lines if fits else [line for line in lines if line["step"] < OOM_STEP]:
            writer.write(line)
    if not fits:
        tail = [f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB (step {OOM_STEP})"]
        base = RunRecord.failed(spec, config, fixture=FIXTURE).to_json()
        write_failure(run_dir, classify("\n".join(tail)), tail, base)
        return "failed"
    RunRecord.completed(spec, config, summarize(lines, spec), fixture=FIXTURE).write(run_dir)
    return "completed"


def make_sweep(root: Path, n: int) -> dict[str, int]:
    """n run directories 0..n-1 under root, as a Hydra multirun lays them out; counts by status."""
    root.mkdir(parents=True)
    (root / "FIXTURE.txt").write_text(FIXTURE + "\n")
    composed: dict[tuple[str, ...], DictConfig] = {}
    rng = random.Random(n)
    counts: dict[str, int] = {}
    env = record_module.environment()
    # One process writes every record: git and the host are the same for all, so ask once.
    with mock.patch.object(record_module, "environment", lambda: env):
        for index, (combo, scalars) in enumerate(points(n)):
            if combo not in composed:
                composed[combo] = compose((*BASE, *combo))
            cfg = composed[combo].copy()
            for key, value in scalars.items():
                cfg[key] = value
            overrides = [*BASE, *combo, *(f"{k}={v}" for k, v in scalars.items())]
            status = write_run(root / str(index), cfg, overrides, rng)
            counts[status] = counts.get(status, 0) + 1
    return counts


def copy_sweep(root: Path, n: int, run_dir: Path) -> dict[str, int]:
    """n copies of one recorded run directory under root; counts by status."""
    root.mkdir(parents=True)
    for index in range(n):
        shutil.copytree(run_dir, root / str(index))
    status = str(json.loads((run_dir / "run.json").read_text()).get("status"))
    return {status: n}


def report_command() -> list[str]:
    script = Path(sys.executable).with_name("moe-vlm")
    return [str(script)] if script.exists() else [sys.executable, "-m", "moe_vlm.cli.main"]


def time_report(sweep: Path) -> float:
    start = time.perf_counter()
    done = subprocess.run([*report_command(), "report", str(sweep)], capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"bench_report: moe-vlm report {sweep} exited {done.returncode}:\n{done.stderr}")
    return elapsed


@dataclass
class Size:
    runs: int
    statuses: dict[str, int]
    seconds: list[float]

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)


@contextmanager
def workdir(keep: str | None) -> Iterator[Path]:
    if keep:
        path = Path(keep)
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="bench_report_") as tmp:
        yield Path(tmp)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, nargs="+", default=[10, 1000], help="sweep sizes (default 10 1000)")
    p.add_argument("--repeat", type=int, default=3, help="timings per size; the median counts (default 3)")
    p.add_argument("--max-ratio", type=float, default=3.0, help="allowed largest/smallest (default 3)")
    p.add_argument("--keep", metavar="DIR", help="write the sweeps here (replaced) and keep them")
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    p.add_argument(
        "--copies-of",
        metavar="RUN_DIR",
        type=Path,
        help="sweeps of N copies of this recorded run instead of the GB200 fixtures",
    )
    args = p.parse_args(argv)
    if min(args.runs) < 1 or args.repeat < 1:
        p.error("--runs and --repeat must be 1 or more")
    if args.copies_of is not None and not (args.copies_of / "run.json").is_file():
        p.error(f"--copies-of {args.copies_of}: no run.json in it; pass a run directory")

    sizes = sorted(set(args.runs))
    with workdir(args.keep) as root:
        results = []
        for n in sizes:
            start = time.perf_counter()
            if args.copies_of is None:
                statuses = make_sweep(root / f"runs_{n}", n)
            else:
                statuses = copy_sweep(root / f"runs_{n}", n, args.copies_of)
            took = time.perf_counter() - start
            what = f"copies of {args.copies_of}" if args.copies_of else "fixture runs"
            print(f"wrote {n} {what} in {took:.1f} s: {statuses}", flush=True)
            results.append(Size(n, statuses, []))
        time_report(root / f"runs_{sizes[0]}")  # warm the page cache and .pyc files, not counted
        for _ in range(args.repeat):
            for size in results:  # alternate sizes: a load change on a shared machine hits both
                size.seconds.append(time_report(root / f"runs_{size.runs}"))

    base = results[0]
    print(f"\nmoe-vlm report SWEEP, whole command, median of {args.repeat}:")
    for size in results:
        runs = ", ".join(f"{s:.2f}" for s in size.seconds)
        ratio = size.median_s / base.median_s
        print(
            f"  {size.runs:>5} runs: {size.median_s:6.2f} s  ({runs})  {ratio:.2f}x the {base.runs}-run report"
        )
    worst = max(size.median_s for size in results) / base.median_s
    verdict = "ok" if worst <= args.max_ratio else "TOO SLOW"
    print(f"largest / {base.runs}-run: {worst:.2f}x (allowed {args.max_ratio:g}x): {verdict}")
    if args.json:
        payload = {
            "max_ratio": args.max_ratio,
            "ratio": worst,
            "sizes": [{"runs": s.runs, "statuses": s.statuses, "seconds": s.seconds} for s in results],
        }
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n")
    return 0 if worst <= args.max_ratio else 1


if __name__ == "__main__":
    sys.exit(main())
