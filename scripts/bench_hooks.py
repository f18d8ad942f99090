#!/usr/bin/env python
"""What do the component-timing hooks cost? The same training with hooks on and off, one run.

Two engine Trainers are built from the same config and seed (same weights); one has the
vision/projector/decoder timing hooks, the other none. Both cycle through the same few batches,
built once up front, so the data pipeline adds no noise. They train in interleaved blocks (on,
off, off, on, ...) so machine noise and drift hit both alike, and the script prints the ratio
of step times, hooks on / hooks off: of the medians (the figure to quote) and of the minima
(least disturbed by other load on the machine).

    .venv/bin/python scripts/bench_hooks.py                        # tiny model, synthetic images, CPU
    .venv/bin/python scripts/bench_hooks.py --reps 8 --steps 4 -- seq_length=2048
    .venv/bin/python scripts/bench_hooks.py -- model=qwen3_vl_30b_a3b ...   # any config overrides

One rank (gloo on CPU, NCCL on a GPU). Prints one line per block and a final ratio line.
"""

from __future__ import annotations

import argparse
import itertools
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import moe_vlm.schema  # noqa: E402, F401  (registers the config schema)
from moe_vlm.data import build_batches  # noqa: E402
from moe_vlm.engines.torch_engine import Trainer, pick_device  # noqa: E402
from moe_vlm.launch.dist_env import DistEnv  # noqa: E402
from moe_vlm.rules import errors, validate  # noqa: E402
from moe_vlm.spec import RunSpec  # noqa: E402

# Small synthetic photos: every hook fires (vision, projector, decoder) at a CPU-friendly size.
DEFAULT_OVERRIDES = [
    "nproc=1",
    "seq_length=512",
    "gbs=1",
    "data=synthetic",
    "data.max_long_side_px=448",
    "data.max_pixels=200704",
]


def make_spec(overrides: list[str]) -> RunSpec:
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = compose(config_name="train", overrides=overrides)
    spec = RunSpec.from_config(cfg)
    bad = errors(validate(spec))
    if bad:
        raise SystemExit("bench_hooks: invalid config: " + "; ".join(f.line() for f in bad))
    return spec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=10, help="block pairs (on + off) after warm-up")
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps per block")
    parser.add_argument("--warmup", type=int, default=2, help="steps per trainer before timing")
    parser.add_argument("--batches", type=int, default=4, help="distinct batches both trainers cycle through")
    parser.add_argument("--threads", type=int, default=1, help="CPU intra-op threads (CPU only)")
    parser.add_argument("overrides", nargs="*", help="config overrides (after --), on top of the defaults")
    args = parser.parse_args(argv)
    spec = make_spec([*DEFAULT_OVERRIDES, *args.overrides])

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = DistEnv(
        rank=0,
        world_size=1,
        local_rank=0,
        local_world_size=1,
        master_addr="127.0.0.1",
        master_port=port,
        launcher="spawn",
    )
    device = pick_device(env)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(args.threads)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=env.init_method, rank=0, world_size=1)
    try:
        source = build_batches(spec, 0, 1)
        batches = [next(source) for _ in range(args.batches * spec.accumulation_steps)]
        trainers = {
            kind: Trainer(spec, device, 0, 1, batches=itertools.cycle(batches), timing=kind == "on")
            for kind in ("on", "off")
        }
        print(
            f"bench_hooks: {spec.model.name} on {device} ({torch.get_num_threads()} threads), "
            f"data={spec.data.kind.value}, seq {spec.seq_length}, "
            f"mbs {spec.mbs} x accumulation {spec.accumulation_steps}; "
            f"{args.reps} x (on + off) blocks of {args.steps} steps after {args.warmup} warm-up steps each",
            flush=True,
        )
        step_number = {"on": 0, "off": 0}

        def run(kind: str, steps: int) -> list[float]:
            times = []
            for _ in range(steps):
                step_number[kind] += 1
                times.append(trainers[kind].step(step_number[kind])["step_time_s"])
            return times

        for kind in ("on", "off"):
            run(kind, args.warmup)
        times: dict[str, list[float]] = {"on": [], "off": []}
        block_ratios = []
        for rep in range(args.reps):
            order = ("on", "off") if rep % 2 == 0 else ("off", "on")
            block = {kind: run(kind, args.steps) for kind in order}
            for kind in order:
                times[kind] += block[kind]
            ratio = statistics.median(block["on"]) / statistics.median(block["off"])
            block_ratios.append(ratio)
            print(
                f"  block {rep + 1}: median step on {statistics.median(block['on']):.4f} s, "
                f"off {statistics.median(block['off']):.4f} s, on/off {ratio:.4f}",
                flush=True,
            )
        on, off = statistics.median(times["on"]), statistics.median(times["off"])
        fastest_on, fastest_off = min(times["on"]), min(times["off"])
        print(
            f"hooks on / off: {on / off:.4f} (median step {on:.4f} s vs {off:.4f} s over "
            f"{len(times['on'])} steps each; fastest steps {fastest_on / fastest_off:.4f}; "
            f"median of block ratios {statistics.median(block_ratios):.4f})",
            flush=True,
        )
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    started = time.perf_counter()
    code = main()
    print(f"bench_hooks: {time.perf_counter() - started:.0f} s", flush=True)
    sys.exit(code)
