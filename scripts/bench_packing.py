#!/usr/bin/env python
"""What does packing buy? none / in_batch / buffer effective tokens/s at MBS 1 and 4, in one run.

For each data kind (real by default: photographs in the project's Energon layout, built here with
scripts/build_dataset.py --skimage unless --real-path names a dataset) and each MBS, one engine
Trainer per packing mode with the same seed: padded rows (none), the micro-batch in one row
(in_batch: the same samples as none) and rows packed from a buffer (buffer: GBS counts rows, so a
step holds more samples). Every point runs in rounds whose order rotates, so machine noise hits all
alike, cycling through batches built once up front (the data pipeline adds no noise). Effective
tokens are real (non-padding) tokens; the table gives each point's samples, positions and real
tokens per step, the fraction of positions holding real tokens, effective tokens/s and its ratio to
none at the same MBS (wall time, and process CPU time, which other load disturbs less), and for
each MBS buffer against in_batch round by round: a tie where the rounds disagree on which is faster.

    .venv/bin/python scripts/bench_packing.py                          # tiny model, CPU, real data
    .venv/bin/python scripts/bench_packing.py --kinds synthetic real --mbs 1 --reps 3
    .venv/bin/python scripts/bench_packing.py -- seq_length=1024       # any config overrides

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
from dataclasses import dataclass, field
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
MODES = ("none", "in_batch", "buffer")


def make_spec(overrides: list[str]) -> RunSpec:
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = compose(config_name="train", overrides=overrides)
    spec = RunSpec.from_config(cfg)
    bad = errors(validate(spec))
    if bad:
        raise SystemExit("bench_packing: invalid config: " + "; ".join(f.line() for f in bad))
    return spec


@dataclass
class Point:
    """One (packing mode, MBS) configuration: its trainer and what it computed."""

    mode: str
    mbs: int
    trainer: Trainer
    positions: int  # per step, padding included
    real: int  # real tokens per step
    samples: float  # per step
    steps_per_pass: int
    seconds: list[float] = field(default_factory=list)
    cpu_seconds: list[float] = field(default_factory=list)
    tokens: int = 0
    steps_run: int = 0
    round_rates: list[float] = field(default_factory=list)  # effective tokens/s of each timed round

    @property
    def name(self) -> str:
        return f"{self.mode} mbs {self.mbs}"

    def run(self, steps: int, counted: bool = True) -> list[float]:
        times = []
        for _ in range(steps):
            self.steps_run += 1
            cpu_started = time.process_time()
            record = self.trainer.step(self.steps_run)
            times.append(record.step_time_s)
            if counted:
                self.seconds.append(record.step_time_s)
                self.cpu_seconds.append(time.process_time() - cpu_started)
                self.tokens += record.real_tokens
        return times

    def rate(self, cpu: bool = False) -> float:
        return self.tokens / sum(self.cpu_seconds if cpu else self.seconds)

    def timed_round(self) -> float:
        """One pass over the point's batches; records the round's effective tokens/s, returns its
        median step time."""
        tokens, seconds = self.tokens, sum(self.seconds)
        median = statistics.median(self.run(self.steps_per_pass))
        self.round_rates.append((self.tokens - tokens) / (sum(self.seconds) - seconds))
        return median


def verdict(first: Point, second: Point) -> str:
    """first against second from their rounds. The rounds are paired (every point runs once per
    round, the order rotated), so the ratio of each round is one measurement of the difference: a
    difference whose sign the rounds disagree on is inside the machine's noise, a tie."""
    overall = first.rate() / second.rate()
    per_round = [a / b for a, b in zip(first.round_rates, second.round_rates, strict=True)]
    spread = f"{overall:.2f}x (rounds {min(per_round):.2f}x-{max(per_round):.2f}x)"
    if len(per_round) < 2:
        return f"{spread}: one round cannot tell a difference from noise (--reps 3)"
    if min(per_round) <= 1.0 <= max(per_round):
        return f"{spread}: a tie, the rounds disagree on which is faster"
    faster = first.name if overall > 1.0 else second.name
    return f"{spread}: {faster} faster in every round"


def bench_kind(
    kind_overrides: list[str], args: argparse.Namespace, device: torch.device
) -> dict[tuple[str, int], tuple[float, float]]:
    """Prints one kind's figures; returns each point's effective tokens/s / none's at its MBS (wall, CPU)."""
    points: list[Point] = []
    for mbs in args.mbs:
        for mode in args.modes:
            spec = make_spec([*kind_overrides, f"mbs={mbs}", f"gbs={mbs}", f"data.packing={mode}"])
            # Each point cycles through one pass over the same leading samples of the stream: at
            # least one whole buffer when packing by buffer (its first rows hold the longest
            # samples), and then as many for none and in_batch, so that all three train the same
            # samples (fewer for them favoured whichever set was cheaper per token).
            wanted = max(args.samples, spec.data.packing_buffer if "buffer" in args.modes else 0)
            source = build_batches(spec, 0, 1)
            batches: list[Batch] = []
            while sum(b.stats.samples for b in batches) < wanted or len(batches) % spec.accumulation_steps:
                batches.append(next(source))
            trainer = Trainer(spec, device, 0, 1, batches=itertools.cycle(batches), timing=False)
            steps = len(batches) / spec.accumulation_steps
            points.append(
                Point(
                    mode,
                    mbs,
                    trainer,
                    positions=round(sum(b.stats.padded_tokens for b in batches) / steps),
                    real=round(sum(b.stats.real_tokens for b in batches) / steps),
                    samples=sum(b.stats.samples for b in batches) / steps,
                    steps_per_pass=round(steps),
                )
            )
    by_name = {(p.mode, p.mbs): p for p in points}
    for mbs in args.mbs:  # none and in_batch train the same samples; buffer more per step
        if ("none", mbs) in by_name and ("in_batch", mbs) in by_name:
            assert by_name[("none", mbs)].real == by_name[("in_batch", mbs)].real, "same samples expected"
    spec = points[0].trainer.spec
    print(
        f"bench_packing: data={spec.data.kind.value}, {spec.model.name} on {device}, seq {spec.seq_length}, "
        f"buffer {spec.data.packing_buffer} samples; each point cycles one pass over the stream's first "
        f"{wanted}+ samples; {args.reps} round(s) of one pass per point (order rotated each round) "
        f"after {args.warmup} warm-up step(s) each",
        flush=True,
    )
    for point in points:
        point.run(args.warmup, counted=False)
    for rep in range(args.reps):
        shift = rep % len(points)
        order = points[shift:] + points[:shift]
        medians = {p.name: p.timed_round() for p in order}
        print(f"  round {rep + 1}: median step " + ", ".join(f"{n} {t:.2f} s" for n, t in medians.items()))
    ratios: dict[tuple[str, int], tuple[float, float]] = {}
    print(
        f"  {'mode':<9} {'mbs':>3} {'samples/step':>12} {'positions/step':>14} {'real tokens':>11} "
        f"{'real frac':>9} {'eff tok/s':>10} {'vs none':>8} {'(CPU time)':>10}"
    )
    for point in points:
        base = by_name.get(("none", point.mbs), point)
        ratios[(point.mode, point.mbs)] = (point.rate() / base.rate(), point.rate(True) / base.rate(True))
        wall, cpu = ratios[(point.mode, point.mbs)]
        print(
            f"  {point.mode:<9} {point.mbs:>3} {point.samples:>12.1f} {point.positions:>14,} {point.real:>11,} "
            f"{point.real / point.positions:>9.0%} {point.rate():>10,.1f} {wall:>7.2f}x {cpu:>9.2f}x",
            flush=True,
        )
    for mbs in args.mbs:
        if ("buffer", mbs) in by_name and ("in_batch", mbs) in by_name:
            buffer, in_batch = by_name[("buffer", mbs)], by_name[("in_batch", mbs)]
            print(f"  buffer vs in_batch at MBS {mbs}, effective tokens/s: {verdict(buffer, in_batch)}")
    return ratios


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
    parser.add_argument("--kinds", nargs="+", default=["real"], choices=["synthetic", "real", "mock"])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--mbs", nargs="+", type=int, default=[1, 4], help="micro-batch sizes, each a point")
    parser.add_argument("--reps", type=int, default=1, help="rounds (one pass each) over every point")
    parser.add_argument("--warmup", type=int, default=1, help="steps per mode before timing")
    parser.add_argument(
        "--samples",
        type=int,
        default=24,
        help="samples each point cycles through (buffer: at least its buffer)",
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
    ratios: dict[str, dict[tuple[str, int], tuple[float, float]]] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for kind in args.kinds:
                extra = [f"data.path={real_dataset(args.real_path, Path(tmp))}"] if kind == "real" else []
                ratios[kind] = bench_kind(
                    [*DEFAULT_OVERRIDES, f"data={kind}", *extra, *args.overrides], args, device
                )
    finally:
        dist.destroy_process_group()
    summary = "; ".join(
        f"data={kind} "
        + ", ".join(f"{mode} mbs {mbs} {wall:.2f}x" for (mode, mbs), (wall, _) in found.items())
        for kind, found in ratios.items()
    )
    print(
        f"bench_packing: effective tokens/s vs none at the same MBS (wall): {summary} "
        f"({time.perf_counter() - started:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
