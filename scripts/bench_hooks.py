#!/usr/bin/env python
"""What do the component-timing hooks cost? The same training with hooks on and off, one run.

One engine Trainer trains in interleaved blocks of steps (on, off, off, on, ...) with the
vision/projector/decoder timing hooks attached, then removed, so machine noise and drift hit
both alike and the hooks are the only difference. It cycles through a few batches built once
up front, so the data pipeline adds no noise. The script prints the ratio of median step
times, hooks on / hooks off, in wall time and (on CPU) in process CPU time, which other load
on the machine disturbs less. It also adds up the host time spent inside the hooks themselves
and prints it as a share of the step: the direct cost, free of A/B noise.

    .venv/bin/python scripts/bench_hooks.py                        # tiny model, synthetic images, CPU
    .venv/bin/python scripts/bench_hooks.py --reps 8 --steps 4 -- seq_length=2048
    .venv/bin/python scripts/bench_hooks.py -- model=qwen3_vl_30b_a3b ...   # any config overrides
    .venv/bin/python scripts/bench_hooks.py --router               # the router-load counter instead

--router A/B-tests the router-load counter (engines/router_hooks.py: a bincount of the top-k
indices per MoE layer, issue 32) the same way, the timing hooks off in both arms.

One rank (gloo on CPU, NCCL on a GPU). Prints one line per block, then the ratios and the share.
"""

from __future__ import annotations

import argparse
import itertools
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from torch import nn

import moe_vlm.config.schema  # noqa: F401  (registers the config schema)
from moe_vlm.config.spec import RunSpec
from moe_vlm.data import build_batches
from moe_vlm.engines.router_hooks import RouterCounter
from moe_vlm.engines.timing import Clock, ComponentTimer, ComponentTimes, clock_for
from moe_vlm.engines.torch_engine import Trainer, pick_device
from moe_vlm.rules import errors, validate
from moe_vlm.runtime.dist_env import DistEnv

REPO = Path(__file__).resolve().parent.parent

# Small synthetic photos: every hook fires (vision, projector, decoder) at a CPU-friendly size.
DEFAULT_OVERRIDES = [
    "nproc=1",
    "seq_length=512",
    "gbs=1",
    "data=synthetic",
    "data.max_long_side_px=448",
    "data.max_pixels=200704",
]


class MeteredTimer(ComponentTimer):
    """The engine's timer, also adding up the host time spent inside its own hooks and calls."""

    def __init__(self, model: nn.Module, clock: Clock) -> None:
        self.spent_s = 0.0
        super().__init__(model, clock)

    def _metered(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent_s += time.perf_counter() - started

        return call

    def _attach(self, model: Any) -> None:
        # Every module hook the timer registers goes through these two methods: wrap the hooks.
        register_pre, register_post = nn.Module.register_forward_pre_hook, nn.Module.register_forward_hook

        def pre(module: nn.Module, hook: Callable[..., Any], **kwargs: Any) -> Any:
            return register_pre(module, self._metered(hook), **kwargs)

        def post(module: nn.Module, hook: Callable[..., Any], **kwargs: Any) -> Any:
            return register_post(module, self._metered(hook), **kwargs)

        setattr(nn.Module, "register_forward_pre_hook", pre)  # noqa: B010
        setattr(nn.Module, "register_forward_hook", post)  # noqa: B010
        try:
            super()._attach(model)
        finally:
            setattr(nn.Module, "register_forward_pre_hook", register_pre)  # noqa: B010
            setattr(nn.Module, "register_forward_hook", register_post)  # noqa: B010

    def _mark(self, component: str) -> None:  # what the autograd-node hooks call
        self._metered(super()._mark)(component)

    def begin_backward(self) -> None:
        self._metered(super().begin_backward)()

    def end_backward(self) -> None:
        self._metered(super().end_backward)()

    def collect(self) -> ComponentTimes:
        return self._metered(super().collect)()


class MeteredRouterCounter(RouterCounter):
    """The engine's router counter, also adding up the host time spent inside its hooks."""

    def __init__(self, layers: nn.ModuleList, device: torch.device) -> None:
        self.spent_s = 0.0
        super().__init__(layers, device)

    def _hook(self, row: int) -> Callable[..., None]:
        count = super()._hook(row)

        def metered(*args: Any) -> None:
            started = time.perf_counter()
            try:
                count(*args)
            finally:
                self.spent_s += time.perf_counter() - started

        return metered


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
    parser.add_argument("--warmup", type=int, default=2, help="steps with and without hooks before timing")
    parser.add_argument("--batches", type=int, default=4, help="distinct batches the training cycles through")
    parser.add_argument("--threads", type=int, default=1, help="CPU intra-op threads (CPU only)")
    parser.add_argument("--router", action="store_true", help="A/B the router-load counter, not the timer")
    parser.add_argument("overrides", nargs="*", help="config overrides (after --), on top of the defaults")
    args = parser.parse_args(argv)
    # --router: every step counts (no engine warm-up), as a measured step does.
    spec = make_spec([*DEFAULT_OVERRIDES, *(["warmup_steps=0"] if args.router else []), *args.overrides])

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
        # One trainer, hooks attached for "on" blocks and removed for "off" blocks: same weights,
        # same optimizer state, same memory, so the hooks are the only difference.
        trainer = Trainer(spec, device, 0, 1, batches=itertools.cycle(batches), timing=False)
        no_hooks = trainer.timer
        trainer.router.remove()
        layers = trainer.model.model.language_model.layers
        no_counter = RouterCounter(nn.ModuleList(), device)  # nothing attached
        what = "router counter" if args.router else "hooks"
        print(
            f"bench_hooks: {spec.model.name} on {device} ({torch.get_num_threads()} threads), "
            f"data={spec.data.kind.value}, seq {spec.seq_length}, "
            f"mbs {spec.mbs} x accumulation {spec.accumulation_steps}; "
            f"{args.reps} x (on + off) blocks of {args.steps} steps after {args.warmup} warm-up steps each",
            flush=True,
        )
        step_number = 0
        inside_hooks_s = 0.0

        def run(kind: str, steps: int, counted: bool = True) -> tuple[list[float], list[float]]:
            """Wall seconds (the engine's synchronised step_time_s) and CPU seconds per step."""
            nonlocal step_number, inside_hooks_s
            metered: MeteredTimer | MeteredRouterCounter | None = None
            if args.router:
                metered = MeteredRouterCounter(layers, device) if kind == "on" else None
                trainer.router = metered or no_counter
            else:
                metered = MeteredTimer(trainer.model, clock_for(device)) if kind == "on" else None
                trainer.timer = metered or no_hooks
            wall, cpu = [], []
            for _ in range(steps):
                step_number += 1
                cpu_started = time.process_time()
                wall.append(trainer.step(step_number).step_time_s)
                cpu.append(time.process_time() - cpu_started)
            if metered is not None:
                inside_hooks_s += metered.spent_s if counted else 0.0
                metered.remove()
            return wall, cpu

        for kind in ("on", "off"):
            run(kind, args.warmup, counted=False)
        wall: dict[str, list[float]] = {"on": [], "off": []}
        cpu: dict[str, list[float]] = {"on": [], "off": []}
        for rep in range(args.reps):
            order = ("on", "off") if rep % 2 == 0 else ("off", "on")
            block = {kind: run(kind, args.steps) for kind in order}
            for kind in order:
                wall[kind] += block[kind][0]
                cpu[kind] += block[kind][1]
            on, off = statistics.median(block["on"][0]), statistics.median(block["off"][0])
            print(
                f"  block {rep + 1}: median step on {on:.4f} s, off {off:.4f} s, on/off {on / off:.4f}",
                flush=True,
            )

        def ratio(times: dict[str, list[float]]) -> str:
            on, off = statistics.median(times["on"]), statistics.median(times["off"])
            return f"{on / off:.4f} (median {on:.4f} s vs {off:.4f} s)"

        steps = len(wall["on"])
        print(f"{what} on / off, wall time per step: {ratio(wall)} over {steps} steps each", flush=True)
        if device.type == "cpu":
            # Process CPU time is what the hooks themselves add on a CPU rank, and unlike wall
            # time it does not grow while other processes hold the cores.
            print(f"{what} on / off, CPU time per step:  {ratio(cpu)} over {steps} steps each", flush=True)
        per_step = inside_hooks_s / steps
        share = per_step / statistics.median(wall["on"])
        print(
            f"time inside the {what}: {per_step * 1e3:.3f} ms per step = {share:.3%} of the median step",
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
