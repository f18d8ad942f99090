#!/usr/bin/env python
"""What does the Megatron engine's step recorder cost the host per step? Old schedule vs new, one run.

StepRecorder's callbacks run in Bridge's order (step start, step end, then Bridge's step and FLOP
updates) on gloo ranks under Megatron Core's parallel_state, with no training in between, so the
time is the recorder's own. Three schedules in interleaved blocks (machine noise hits all alike):

    none        the same loop without a recorder (the floor)
    every-step  the recorder gathering every step: the old recorder's schedule
    every-N     the recorder as shipped: gathering every GATHER_EVERY_STEPS steps and at the end
    end-only    gathering once, at the end: what the callbacks themselves cost per step

It prints the host microseconds per step each schedule adds over `none`, and every-N / every-step.

Host side only. On this CPU the clock is perf_counter (the run's CUDA events cost a record call
each) and the memory counters are constants: the device-side effects, the two
torch.cuda.synchronize per step the old recorder made and the run-ahead they removed, and what
cudaMemGetInfo and torch.cuda's counters cost, need a GPU to measure.

    .venv/bin/python scripts/bench_step_timer.py                  # 2 ranks, 5 x 3 blocks of 200 steps
    .venv/bin/python scripts/bench_step_timer.py --ranks 4 --steps 500 --reps 7
"""

from __future__ import annotations

import argparse
import multiprocessing
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.multiprocessing as mp

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from moe_vlm.config.compose import compose_spec  # noqa: E402
from moe_vlm.config.spec import RunSpec  # noqa: E402
from moe_vlm.engines.megatron.recording import GATHER_EVERY_STEPS, MemorySample, StepRecorder  # noqa: E402
from moe_vlm.engines.timing import Clock  # noqa: E402

OVERRIDES = ("engine=megatron", "dry_run=true", "cluster=b200", "model=qwen3_vl_30b_a3b", "warmup_steps=1")


class ConstantMemory:
    """torch.cuda's memory counters need a GPU; constants keep their (unmeasured) cost out."""

    def reset_peak(self) -> None:
        pass

    def sample(self) -> MemorySample:
        return MemorySample(50.0, 60.0, 64.0)


def loop(recorder: StepRecorder | None, steps: int) -> float:
    """Seconds for `steps` steps of Bridge's callback sequence (train.py:454-506, 564, 608)."""
    state = SimpleNamespace(train_state=SimpleNamespace(step=0, floating_point_operations_so_far=0.0))
    optimizer = SimpleNamespace(param_groups=[{"lr": 3e-4}])
    plain = SimpleNamespace(state=state, model=[], optimizer=optimizer)
    started = time.perf_counter()
    if recorder is not None:
        recorder.on_train_start(plain)
    for _ in range(steps):
        if recorder is not None:
            recorder.on_train_step_start(plain)
            recorder.on_train_step_end(
                SimpleNamespace(
                    state=state,
                    model=[],
                    optimizer=optimizer,
                    loss_dict={"lm loss": torch.tensor(2.0)},
                    grad_norm=1.5,
                    skipped_iter=False,
                )
            )
        state.train_state.step += 1
        state.train_state.floating_point_operations_so_far += 1e15
    if recorder is not None:
        recorder.on_train_end(plain)
    return time.perf_counter() - started


def rank_main(rank: int, world: int, port: int, spec: RunSpec, args: argparse.Namespace, out: Path) -> None:
    from megatron.core import parallel_state

    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    parallel_state.initialize_model_parallel()
    schedules = {"none": None, "every-step": 1, "every-N": GATHER_EVERY_STEPS, "end-only": args.steps + 1}
    per_step: dict[str, list[float]] = {name: [] for name in schedules}
    try:
        with tempfile.TemporaryDirectory() as scratch:
            for rep in range(args.reps + 1):  # block 0 warms up and is not counted
                order = list(schedules) if rep % 2 == 0 else list(reversed(schedules))
                for name in order:
                    every = schedules[name]
                    recorder = None
                    if every is not None:
                        run_dir = Path(scratch) / f"{name}-{rep}"
                        recorder = StepRecorder(
                            spec,
                            run_dir,
                            clock=Clock(),
                            memory=ConstantMemory(),
                            gather_every=every,
                        )
                    torch.distributed.barrier()
                    seconds = loop(recorder, args.steps)
                    if rep:
                        per_step[name].append(seconds / args.steps)
        if rank == 0:
            floor = statistics.median(per_step["none"])
            added = {name: statistics.median(v) - floor for name, v in per_step.items() if name != "none"}
            lines = [
                f"{world} gloo ranks, {args.reps} blocks x {args.steps} steps per schedule (median block)",
                f"  none        {floor * 1e6:9.1f} us/step (the loop itself)",
                f"  every-step  {added['every-step'] * 1e6:+9.1f} us/step over none (old schedule: gather each step)",
                f"  every-N     {added['every-N'] * 1e6:+9.1f} us/step over none (gather every {GATHER_EVERY_STEPS})",
                f"  end-only    {added['end-only'] * 1e6:+9.1f} us/step over none (one gather per block)",
                f"  every-N / every-step host overhead: {added['every-N'] / added['every-step']:.2f}",
                "  host side only: device-side effects (synchronise, run-ahead) need a GPU",
            ]
            out.write_text("\n".join(lines) + "\n")
    finally:
        parallel_state.destroy_model_parallel()
        torch.distributed.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    multiprocessing.get_context("forkserver").set_forkserver_preload(
        ["__main__", "megatron.core.parallel_state"]
    )
    spec = compose_spec(list(OVERRIDES))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "result.txt"
        # forkserver: a forked child of a threaded parent can deadlock; the server imports this
        # script (and Megatron Core) once and forks each rank from there.
        mp.start_processes(
            rank_main, args=(args.ranks, port, spec, args, out), nprocs=args.ranks, start_method="forkserver"
        )
        print(out.read_text(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
