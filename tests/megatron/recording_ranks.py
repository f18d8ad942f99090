"""Bridge's training loop as StepRecorder sees it, for tests/megatron/test_recording.py and its
ranks. Kept free of pytest and of `megatron.bridge` (15 s of CPU to import) so that a forkserver
loads it and Megatron Core once and forks each gloo rank from there (the stack is imported
lazily, so a machine without it still collects the tests and skips them)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from moe_vlm.config.spec import RunSpec
from moe_vlm.engines.megatron.recording import GIB, MemorySample, StepRecorder
from moe_vlm.engines.timing import Clock

BASE_GIB = 40.0  # what stays allocated between steps (weights, optimizer state)
OUTSIDE_GIB = 3.5  # NCCL / DeepEP / TE userbuffers + CUDA context: cudaMalloc'd, not the allocator's
PP, WORLD, STEPS, EVERY = 2, 4, 5, 2  # the pipeline test's layout and schedule


class FakeCudaMemory:
    """Stands in for torch.cuda's caching-allocator counters (reset_peak_memory_stats,
    max_memory_allocated, memory_reserved) and cudaMemGetInfo. Same rules as torch: a reset
    sets the peak to what is allocated now; reserved never shrinks (no empty_cache)."""

    def __init__(self, extra_gib: float = 0.0) -> None:
        self.allocated = (BASE_GIB + extra_gib) * GIB
        self.peak = self.reserved = self.allocated
        self.resets = 0

    def transient(self, gib: float) -> None:
        """A step's activations: allocated, then freed before the step ends."""
        self.peak = max(self.peak, self.allocated + gib * GIB)
        self.reserved = max(self.reserved, self.allocated + gib * GIB)

    def reset_peak(self) -> None:
        self.resets += 1
        self.peak = self.allocated

    def sample(self) -> MemorySample:
        return MemorySample(self.peak / GIB, self.reserved / GIB, self.reserved / GIB + OUTSIDE_GIB)


def recorder_for(spec: RunSpec, run_dir: Path, memory: FakeCudaMemory, gather_every: int) -> StepRecorder:
    """The engine's recorder, timed by the host clock where a GPU run records CUDA events."""
    return StepRecorder(spec, run_dir, clock=Clock(), memory=memory, gather_every=gather_every)


def bridge_loop(
    recorder: StepRecorder,
    steps: int,
    *,
    fire: Callable[[str, Any], None] | None = None,
    context: Callable[..., Any] = SimpleNamespace,
    train_state: Any = None,
    flops_of: Callable[[int], float] = lambda step: 1e15,
    loss_of: Callable[[int], float] | None = lambda step: 2.0,
    during_step: Callable[[int], None] = lambda step: None,
    at_step_start: Callable[[int], None] = lambda step: None,
    between_steps: Callable[[int], None] = lambda step: None,
) -> None:
    """Bridge's train() around the recorder: its events in its order, the two updates it makes
    after on_train_step_end (train.py:454-506, 564, 608), and what runs before the next step. The tests pass Bridge's own
    CallbackManager.fire, CallbackContext and TrainState; the forked ranks, which skip importing
    Bridge, plain objects with the same attributes."""
    fire = fire or (lambda event, ctx: getattr(recorder, event)(ctx))
    train_state = train_state or SimpleNamespace(step=0, floating_point_operations_so_far=0)
    state = SimpleNamespace(train_state=train_state)  # the part of GlobalState the recorder reads
    optimizer = SimpleNamespace(param_groups=[{"lr": 3e-4}])
    fire("on_train_start", context(state=state, model=[], optimizer=optimizer))
    for index in range(steps):
        step = index + 1
        fire("on_train_step_start", context(state=state, model=[], optimizer=optimizer))
        at_step_start(step)
        during_step(step)
        # Bridge's loss_dict: the reduced loss on the last pipeline stage, {} elsewhere (train.py:980-1018).
        loss = {} if loss_of is None else {"lm loss": torch.tensor(loss_of(step))}
        fire(
            "on_train_step_end",
            context(
                state=state, model=[], optimizer=optimizer, loss_dict=loss, grad_norm=1.5, skipped_iter=False
            ),
        )
        train_state.step += 1  # train.py:564
        train_state.floating_point_operations_so_far += flops_of(step)  # train.py:608
        between_steps(step)  # training_log (train.py:633), manual GC (:725-729), checkpoints
    fire("on_train_end", context(state=state, model=[], optimizer=optimizer))


def join_megatron(rank: int, world: int, port: int, pp: int) -> None:
    from megatron.core import parallel_state

    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    parallel_state.initialize_model_parallel(pipeline_model_parallel_size=pp)


def leave_megatron() -> None:
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    torch.distributed.destroy_process_group()


def pipeline_rank(rank: int, port: int, spec: RunSpec, run_dir: Path) -> None:
    """One of WORLD ranks at PP=2 x DP=2: the last stage has the loss, each GPU its own memory."""
    from megatron.core import parallel_state

    join_megatron(rank, WORLD, port, pp=PP)
    try:
        dp = parallel_state.get_data_parallel_rank()
        last = parallel_state.is_pipeline_last_stage(ignore_virtual=True)
        bridge_loop(
            recorder_for(spec, run_dir, FakeCudaMemory(extra_gib=rank), EVERY),
            STEPS,
            loss_of=(lambda step: 10.0 * dp + step) if last else None,
        )
        (run_dir / f"rank{rank}.txt").write_text(f"{dp} {int(last)}")
    finally:
        leave_megatron()
