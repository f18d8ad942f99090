#!/usr/bin/env python
"""What does in-batch packing buy? Packed vs padded effective tokens/s, measured in the same run.

For each data kind (synthetic, and real: photographs in the project's Energon layout, built here
with scripts/build_dataset.py --skimage unless --real-path names a dataset), two engine Trainers
with the same seed train on the SAME samples: one on padded rows (data.packing=none), one on each
micro-batch packed into one row (data.packing=in_batch). They run in interleaved blocks (padded,
packed, packed, padded, ...) so machine noise hits both alike, cycling through batches built once
up front (the data pipeline adds no noise). Effective tokens are the real (non-padding) tokens,
the same in both; the script prints each mode's effective tokens/s and the ratio packed / padded
(on wall time, and on process CPU time, which other load on a shared machine disturbs less), and
the positions each mode computed per step.

    .venv/bin/python scripts/bench_packing.py                         # tiny model, CPU, both kinds
    .venv/bin/python scripts/bench_packing.py --kinds synthetic --reps 2
    .venv/bin/python scripts/bench_packing.py -- seq_length=4096 mbs=4  # any config overrides

One rank (gloo on CPU, NCCL on a GPU).
"""

from __future__ import annotations

import argparse
import itertools
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

import moe_vlm.config.schema  # noqa: F401  (registers the config schema)
from moe_vlm.config.spec import RunSpec
from moe_vlm.data import Batch, build_batches
from moe_vlm.engines.torch_engine import Trainer, pick_device
from moe_vlm.rules import errors, validate
from moe_vlm.runtime.dist_env import DistEnv

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OVERRIDES = ["nproc=1"]
MODES = ("none", "in_batch")


def make_spec(overrides: list[str]) -> RunSpec:
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = compose(config_name="train", overrides=overrides)
    spec = RunSpec.from_config(cfg)
    bad = errors(validate(spec))
    if bad:
        raise SystemExit("bench_packing: invalid config: " + "; ".join(f.line() for f in bad))
    return spec


def bench_kind(
    kind_overrides: list[str], args: argparse.Namespace, device: torch.device
) -> tuple[float, float]:
    """Prints one kind's figures; returns effective tokens/s packed / padded on wall and CPU time."""
    specs = {mode: make_spec([*kind_overrides, f"data.packing={mode}"]) for mode in MODES}
    trainers: dict[str, Trainer] = {}
    per_step: dict[str, tuple[int, int]] = {}
    for mode, spec in specs.items():
        source = build_batches(spec, 0, 1)
        batches: list[Batch] = [next(source) for _ in range(args.batches * spec.accumulation_steps)]
        trainers[mode] = Trainer(spec, device, 0, 1, batches=itertools.cycle(batches), timing=False)
        steps = len(batches) / spec.accumulation_steps
        per_step[mode] = (
            round(sum(b.stats.padded_tokens for b in batches) / steps),
            round(sum(b.stats.real_tokens for b in batches) / steps),
        )
    assert per_step["none"][1] == per_step["in_batch"][1], "both modes must train on the same samples"
    spec = specs["none"]
    print(
        f"bench_packing: data={spec.data.kind.value}, {spec.model.name} on {device}, seq {spec.seq_length}, "
        f"mbs {spec.mbs} x accumulation {spec.accumulation_steps}; per step: padded computes "
        f"{per_step['none'][0]:,} positions, packed {per_step['in_batch'][0]:,}, for {per_step['none'][1]:,} "
        f"real tokens; {args.reps} x (padded + packed) blocks of {args.steps} steps after {args.warmup} "
        "warm-up steps each",
        flush=True,
    )
    step_number = {mode: 0 for mode in MODES}
    seconds: dict[str, list[float]] = {mode: [] for mode in MODES}
    cpu_seconds: dict[str, list[float]] = {mode: [] for mode in MODES}
    tokens: dict[str, int] = {mode: 0 for mode in MODES}

    def run(mode: str, steps: int, counted: bool = True) -> list[float]:
        times = []
        for _ in range(steps):
            step_number[mode] += 1
            cpu_started = time.process_time()
            record = trainers[mode].step(step_number[mode])
            times.append(record.step_time_s)
            if counted:
                seconds[mode].append(record.step_time_s)
                cpu_seconds[mode].append(time.process_time() - cpu_started)
                tokens[mode] += record.real_tokens
        return times

    for mode in MODES:
        run(mode, args.warmup, counted=False)
    for rep in range(args.reps):
        order = MODES if rep % 2 == 0 else MODES[::-1]
        block = {mode: statistics.median(run(mode, args.steps)) for mode in order}
        print(
            f"  block {rep + 1}: median step padded {block['none']:.3f} s, packed {block['in_batch']:.3f} s",
            flush=True,
        )
    rate = {mode: tokens[mode] / sum(seconds[mode]) for mode in MODES}
    cpu_rate = {mode: tokens[mode] / sum(cpu_seconds[mode]) for mode in MODES}
    ratio = rate["in_batch"] / rate["none"]
    cpu_ratio = cpu_rate["in_batch"] / cpu_rate["none"]
    print(
        f"  effective tokens/s: padded {rate['none']:,.0f}, packed {rate['in_batch']:,.0f}; "
        f"packed / padded = {ratio:.2f} wall, {cpu_ratio:.2f} process CPU time "
        f"(less disturbed by other load); positions computed packed / padded "
        f"{per_step['in_batch'][0] / per_step['none'][0]:.2f}",
        flush=True,
    )
    return ratio, cpu_ratio


def real_dataset(path: str | None, workdir: Path) -> str:
    if path:
        return path
    out = workdir / "skimage_photos"
    subprocess.run(
        [sys.executable, str(REPO / "scripts" / "build_dataset.py"), "--skimage", str(out)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return str(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--kinds", nargs="+", default=["synthetic", "real"], choices=["synthetic", "real", "mock"]
    )
    parser.add_argument("--reps", type=int, default=3, help="block pairs (padded + packed) after warm-up")
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps per block")
    parser.add_argument("--warmup", type=int, default=1, help="steps per mode before timing")
    parser.add_argument(
        "--batches", type=int, default=3, help="distinct steps' batches each mode cycles through"
    )
    parser.add_argument("--threads", type=int, default=1, help="CPU intra-op threads (CPU only)")
    parser.add_argument("--real-path", help="data=real: this dataset instead of the scikit-image photographs")
    parser.add_argument("overrides", nargs="*", help="config overrides (after --), on top of the defaults")
    args = parser.parse_args(argv)

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = DistEnv(
        rank=0, world_size=1, local_rank=0, local_world_size=1, master_addr="127.0.0.1", master_port=port,
        launcher="spawn",
    )  # fmt: skip
    device = pick_device(env)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(args.threads)
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo", init_method=env.init_method, rank=0, world_size=1
    )
    started = time.perf_counter()
    ratios: dict[str, tuple[float, float]] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for kind in args.kinds:
                extra = [f"data.path={real_dataset(args.real_path, Path(tmp))}"] if kind == "real" else []
                ratios[kind] = bench_kind(
                    [*DEFAULT_OVERRIDES, f"data={kind}", *extra, *args.overrides], args, device
                )
    finally:
        dist.destroy_process_group()
    summary = ", ".join(
        f"data={kind} {wall:.2f}x (CPU time {cpu:.2f}x)" for kind, (wall, cpu) in ratios.items()
    )
    print(
        f"bench_packing: effective tokens/s packed / padded: {summary} ({time.perf_counter() - started:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
