"""StepRecorder, the Megatron engine's steps.jsonl writer, driven the way Bridge drives it.

Real parts: Bridge's CallbackManager, CallbackContext and TrainState; the callback order and the
two updates Bridge makes after on_train_step_end (train.py:454-506, 564, 608); gloo process
groups under Megatron Core's parallel_state (4 forked ranks for PP=2 x DP=2); torch.distributed's
gather_object (counted by a spy that calls the real one); the project's perf_counter Clock, which
stands in only for CUDA events. One stand-in: FakeCudaMemory, for torch.cuda's allocator counters
and cudaMemGetInfo, which need a GPU. Running at all on this GPU-less machine also shows that
the recorder makes no other torch.cuda call (torch.cuda.synchronize raises here).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from moe_vlm.engines.megatron.recording import GIB, MemorySample, StepRecorder
from moe_vlm.metrics import summarize
from moe_vlm.record import STEPS_JSONL, read_steps
from moe_vlm.spec import RunSpec
from moe_vlm.timing import Clock
from tests.conftest import make_spec
from tests.megatron.conftest import needs_stack

MEG = ("engine=megatron", "dry_run=true", "cluster=b200", "model=qwen3_vl_30b_a3b", "warmup_steps=1")
BASE_GIB = 40.0  # what stays allocated between steps (weights, optimizer state)
OUTSIDE_GIB = 3.5  # NCCL / DeepEP / TE userbuffers + CUDA context: cudaMalloc'd, not the allocator's


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


def bridge_loop(
    recorder: StepRecorder,
    steps: int,
    *,
    flops_of: Callable[[int], float] = lambda step: 1e15,
    loss_of: Callable[[int], float] | None = lambda step: 2.0,
    during_step: Callable[[int], None] = lambda step: None,
    at_step_start: Callable[[int], None] = lambda step: None,
) -> None:
    """Bridge's train() as the recorder sees it: its callback manager and contexts, in its order."""
    from megatron.bridge.training.callbacks import CallbackContext, CallbackManager
    from megatron.bridge.training.state import TrainState

    state = SimpleNamespace(train_state=TrainState())  # the part of GlobalState the recorder reads
    optimizer = SimpleNamespace(param_groups=[{"lr": 3e-4}])
    manager = CallbackManager()
    manager.add([recorder])
    manager.fire("on_train_start", CallbackContext(state=state, model=[], optimizer=optimizer))
    for index in range(steps):
        step = index + 1
        manager.fire("on_train_step_start", CallbackContext(state=state, model=[], optimizer=optimizer))
        at_step_start(step)
        during_step(step)
        # Bridge's loss_dict: the reduced loss on the last pipeline stage, {} elsewhere (train.py:980-1007).
        loss = {} if loss_of is None else {"lm loss": torch.tensor(loss_of(step))}
        manager.fire(
            "on_train_step_end",
            CallbackContext(state=state, model=[], optimizer=optimizer, loss_dict=loss, grad_norm=1.5,
                            skipped_iter=False),
        )  # fmt: skip
        state.train_state.step += 1  # train.py:564
        state.train_state.floating_point_operations_so_far += flops_of(step)  # train.py:608
    manager.fire("on_train_end", CallbackContext(state=state, model=[], optimizer=optimizer))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


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


@pytest.fixture
def one_rank() -> Iterator[None]:
    join_megatron(0, 1, free_port(), pp=1)
    try:
        yield
    finally:
        leave_megatron()


@pytest.fixture
def gathers(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many records each gather_object call carried from rank 0 (the real call still runs)."""
    calls: list[int] = []
    real = torch.distributed.gather_object

    def spy(obj: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(len(obj))
        return real(obj, *args, **kwargs)

    monkeypatch.setattr(torch.distributed, "gather_object", spy)
    return calls


def recorder_for(spec: RunSpec, run_dir: Path, memory: FakeCudaMemory, gather_every: int) -> StepRecorder:
    return StepRecorder(spec, run_dir, clock=Clock(), memory=memory, gather_every=gather_every)


@needs_stack
def test_peak_memory_is_the_step_s_own_and_buffers_show_beside_it(one_rank: None, tmp_path: Path) -> None:
    memory = FakeCudaMemory()
    transient = {1: 30.0, 2: 5.0, 3: 12.0}  # a big first step, then smaller ones
    spec = make_spec(*MEG)
    bridge_loop(
        recorder_for(spec, tmp_path, memory, 10), 3, during_step=lambda s: memory.transient(transient[s])
    )
    lines = read_steps(tmp_path / STEPS_JSONL)
    assert memory.resets == 3  # once per step start
    # Never reset, max_memory_allocated would say 70 on every step after the first.
    assert [line["peak_memory_gib"] for line in lines] == [70.0, 45.0, 52.0]
    assert {line["memory_kind"] for line in lines} == {"cuda_max_allocated"}
    assert [line["reserved_gib"] for line in lines] == [70.0, 70.0, 70.0]  # the allocator keeps its cache
    assert [line["device_used_gib"] for line in lines] == [70.0 + OUTSIDE_GIB] * 3

    summary = summarize(lines, spec)
    assert summary["peak_memory_gib"] == 70.0 and summary["memory_kind"] == "cuda_max_allocated"
    assert summary["device_memory"] == {
        "device_used_gib": 70.0 + OUTSIDE_GIB,
        "device_used_kind": "cuda_device_used",
        "reserved_gib": 70.0,
        "reserved_kind": "cuda_memory_reserved",
        "outside_allocator_gib": pytest.approx(OUTSIDE_GIB),
    }


@needs_stack
def test_lines_travel_every_n_steps_and_at_the_end_none_lost_in_order(
    one_rank: None, gathers: list[int], tmp_path: Path
) -> None:
    written_at_start: dict[int, int] = {}

    def lines_so_far(step: int) -> None:
        written_at_start[step] = len(read_steps(tmp_path / STEPS_JSONL))

    bridge_loop(recorder_for(make_spec(*MEG), tmp_path, FakeCudaMemory(), 3), 8, at_step_start=lines_so_far)
    # Steps 1-3 travel when step 4 starts (step 3's FLOPs are known by then), 4-6 at step 7,
    # 7-8 at on_train_end: three gathers for eight steps, where the old recorder made eight.
    assert gathers == [3, 3, 2]
    assert written_at_start == {1: 0, 2: 0, 3: 0, 4: 3, 5: 3, 6: 3, 7: 6, 8: 6}
    lines = read_steps(tmp_path / STEPS_JSONL)
    assert [line["step"] for line in lines] == list(range(1, 9))
    assert all(line["loss"] == 2.0 and line["grad_norm"] == 1.5 and line["lr"] == 3e-4 for line in lines)
    assert [line["warmup"] for line in lines] == [True] + [False] * 7


@needs_stack
def test_step_time_comes_from_the_marks_and_flops_stay_with_their_step(
    one_rank: None, tmp_path: Path
) -> None:
    sleeps = {1: 0.0, 2: 0.2, 3: 0.0, 4: 0.0, 5: 0.0}
    bridge_loop(
        recorder_for(make_spec(*MEG), tmp_path, FakeCudaMemory(), 2),
        5,
        flops_of=lambda step: step * 1e15,  # a different count for every step
        during_step=lambda step: time.sleep(sleeps[step]),
    )
    lines = read_steps(tmp_path / STEPS_JSONL)
    # Batched gathers (at steps 3 and 5, and the end) still give each step the FLOPs Bridge
    # added after it, not its neighbour's.
    assert [line["bridge_step_flops"] for line in lines] == [step * 1e15 for step in range(1, 6)]
    assert lines[1]["step_time_s"] >= 0.2 > max(lines[i]["step_time_s"] for i in (0, 2, 3, 4))
    for line in lines:  # one rank: the slowest rank's time is its own
        assert line["bridge_tflops_per_gpu"] == pytest.approx(
            line["bridge_step_flops"] / line["step_time_s"] / 1e12
        )


# --- PP=2 x DP=2: the loss lives on the last stage, the line on the first ----------------------

PP, WORLD, STEPS, EVERY = 2, 4, 5, 2


def pipeline_rank(rank: int, port: int, spec: RunSpec, run_dir: Path) -> None:
    from megatron.core import parallel_state

    join_megatron(rank, WORLD, port, pp=PP)
    try:
        dp = parallel_state.get_data_parallel_rank()
        last = parallel_state.is_pipeline_last_stage(ignore_virtual=True)
        memory = FakeCudaMemory(extra_gib=rank)  # each GPU its own figure: a line shows its DP rank's worst
        bridge_loop(
            recorder_for(spec, run_dir, memory, EVERY),
            STEPS,
            loss_of=(lambda step: 10.0 * dp + step) if last else None,
        )
        (run_dir / f"rank{rank}.txt").write_text(f"{dp} {int(last)}")
    finally:
        leave_megatron()


@pytest.mark.slow
@needs_stack
def test_with_pipeline_parallelism_the_loss_reaches_the_line(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    assert not torch.distributed.is_initialized()  # forked ranks must not inherit a process group
    spec = make_spec(*MEG)
    # fork: the ranks inherit the imported Megatron instead of importing it four times over.
    mp.start_processes(pipeline_rank, args=(free_port(), spec, tmp_path), nprocs=WORLD, start_method="fork")
    placement = {
        rank: tuple(map(int, (tmp_path / f"rank{rank}.txt").read_text().split())) for rank in range(WORLD)
    }
    # Megatron's own layout: ranks 0-1 are the first stage, 2-3 the last, DP rank = rank % 2.
    assert placement == {0: (0, 0), 1: (1, 0), 2: (0, 1), 3: (1, 1)}
    lines = read_steps(tmp_path / STEPS_JSONL)
    assert [(line["step"], line["rank"]) for line in lines] == [
        (s, d) for s in range(1, STEPS + 1) for d in (0, 1)
    ]
    # Each first-stage line carries its DP rank's last-stage loss (before: None on every line).
    assert [line["loss"] for line in lines] == [10.0 * d + s for s in range(1, STEPS + 1) for d in (0, 1)]
    # Memory: max over the DP rank's peers (DP 0: ranks 0 and 2, DP 1: ranks 1 and 3).
    assert {line["rank"]: line["peak_memory_gib"] for line in lines} == {0: BASE_GIB + 2, 1: BASE_GIB + 3}
