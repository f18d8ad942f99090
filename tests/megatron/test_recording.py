"""StepRecorder, the Megatron engine's steps.jsonl writer, driven the way Bridge drives it.

Real parts: Bridge's CallbackManager, CallbackContext and TrainState; the callback order and the
two updates Bridge makes after on_train_step_end (tests/megatron/recording_ranks.bridge_loop);
gloo process groups under Megatron Core's parallel_state (4 ranks for PP=2 x DP=2);
torch.distributed's gather_object (counted by a spy that calls the real one); the project's
perf_counter Clock, which stands in only for CUDA events. One stand-in: FakeCudaMemory, for
torch.cuda's allocator counters and cudaMemGetInfo, which need a GPU. Running at all on this
GPU-less machine also shows the recorder makes no other torch.cuda call (synchronize raises here).
"""

from __future__ import annotations

import json
import multiprocessing
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from moe_vlm.base.files import STEPS_JSONL
from moe_vlm.engines.megatron.recording import StepRecorder
from moe_vlm.perf.metrics import summarize
from moe_vlm.record.records import StepRecord, read_steps
from moe_vlm.runtime.dist_env import free_port
from tests.conftest import make_spec
from tests.megatron.conftest import needs_stack
from tests.megatron.recording_ranks import (
    BASE_GIB,
    OUTSIDE_GIB,
    STEPS,
    WORLD,
    FakeCudaMemory,
    join_megatron,
    leave_megatron,
    pipeline_rank,
    recorder_for,
)
from tests.megatron.recording_ranks import bridge_loop as plain_loop

MEG = ("engine=megatron", "dry_run=true", "cluster=b200", "model=qwen3_vl_30b_a3b", "warmup_steps=1")


def bridge_loop(recorder: Any, steps: int, **kwargs: Any) -> None:
    """The loop with Bridge's own callback manager, context and train state."""
    from megatron.bridge.training.callbacks import CallbackContext, CallbackManager
    from megatron.bridge.training.state import TrainState

    manager = CallbackManager()
    manager.add([recorder])
    plain_loop(
        recorder, steps, fire=manager.fire, context=CallbackContext, train_state=TrainState(), **kwargs
    )


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
    assert [line.peak_memory_gib for line in lines] == [70.0, 45.0, 52.0]
    assert {line.memory_kind for line in lines} == {"cuda_max_allocated"}
    assert [line.reserved_gib for line in lines] == [70.0, 70.0, 70.0]  # the allocator keeps its cache
    assert [line.device_used_gib for line in lines] == [70.0 + OUTSIDE_GIB] * 3

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
def test_every_line_is_a_step_record_of_this_version(one_rank: None, tmp_path: Path) -> None:
    bridge_loop(recorder_for(make_spec(*MEG), tmp_path, FakeCudaMemory(), 2), 3)
    written = [json.loads(text) for text in (tmp_path / STEPS_JSONL).read_text().splitlines()]
    assert len(written) == 3
    for line in written:
        # Every field of the line contract, each of its type, nothing else (record.StepRecord,
        # which the torch engine's lines meet too: tests/unit/test_torch_engine.py).
        record = StepRecord.from_json(line, strict=True)
        assert record.to_json() == line
        assert None not in (record.host, record.reserved_gib, record.bridge_step_flops)
        assert record.skipped_samples == 0 and record.optimizer_s is None  # the torch engine's only


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
    assert [line.step for line in lines] == list(range(1, 9))
    assert all(line.loss == 2.0 and line.grad_norm == 1.5 and line.lr == 3e-4 for line in lines)
    assert [line.warmup for line in lines] == [True] + [False] * 7


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
    assert [line.bridge_step_flops for line in lines] == [step * 1e15 for step in range(1, 6)]
    assert lines[1].step_time_s >= 0.2 > max(lines[i].step_time_s for i in (0, 2, 3, 4))
    for line in lines:  # one rank: the slowest rank's time is its own
        assert line.bridge_step_flops is not None
        assert line.bridge_tflops_per_gpu == pytest.approx(line.bridge_step_flops / line.step_time_s / 1e12)


@pytest.mark.slow
@needs_stack
def test_with_pipeline_parallelism_the_loss_reaches_the_line(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    # A forkserver, not fork: forking pytest's threaded process can deadlock a rank. It imports
    # Megatron Core once and forks each rank from there.
    multiprocessing.get_context("forkserver").set_forkserver_preload(
        ["megatron.core.parallel_state", "tests.megatron.recording_ranks"]
    )
    spec = make_spec(*MEG)
    mp.start_processes(
        pipeline_rank, args=(free_port(), spec, tmp_path), nprocs=WORLD, start_method="forkserver"
    )
    placement = {
        rank: tuple(map(int, (tmp_path / f"rank{rank}.txt").read_text().split())) for rank in range(WORLD)
    }
    # Megatron's own layout: ranks 0-1 are the first stage, 2-3 the last, DP rank = rank % 2.
    assert placement == {0: (0, 0), 1: (1, 0), 2: (0, 1), 3: (1, 1)}
    lines = read_steps(tmp_path / STEPS_JSONL)
    assert [(line.step, line.rank) for line in lines] == [(s, d) for s in range(1, STEPS + 1) for d in (0, 1)]
    # Each first-stage line carries its DP rank's last-stage loss (before: None on every line).
    assert [line.loss for line in lines] == [10.0 * d + s for s in range(1, STEPS + 1) for d in (0, 1)]
    # Memory: max over the DP rank's peers (DP 0: ranks 0 and 2, DP 1: ranks 1 and 3).
    assert {line.rank: line.peak_memory_gib for line in lines} == {0: BASE_GIB + 2, 1: BASE_GIB + 3}


@needs_stack
def test_virtual_pipeline_chunks_count_each_micro_batch_once(tmp_path: Path) -> None:
    """vp=2: Bridge hands both model chunks a view of one cache over the step's iterator
    (training/train.py:896-901, data/iterator_utils.py:23-90), and each chunk's forward step reads
    every micro-batch from its own view. Counted per view, 4 micro-batches were 8, 48 real tokens 96."""
    from megatron.bridge.data.iterator_utils import make_data_iterator_list

    from moe_vlm.engines.megatron.recording import StepStats, counted

    spec = make_spec(*MEG, "model=qwen35_vl_35b_a3b", "parallelism=3d", "pp=2", "vp=2")
    recorder = StepRecorder(spec, tmp_path)
    pad, image = spec.model.pad_token_id, spec.model.image_token_id
    row = torch.full((1, 16), pad)
    row[0, :12] = 7  # 12 real tokens of 16
    row[0, 3:5] = image
    source = [{"input_ids": row.clone(), "loss_mask": torch.ones(1, 16)} for _ in range(4)]
    for chunks in (2, 1):  # vp=2, and vp=1 (make_data_iterator_list hands the iterator back)
        recorder.stats = StepStats()
        views = make_data_iterator_list(model=[object()] * chunks, data_iterator=iter(source))
        views = views if isinstance(views, list) else [views]
        # The interleaved schedule: every chunk's forward step reads every micro-batch, each
        # through a fresh counting wrapper as counting_forward_step makes one per call.
        seen = [next(counted(views[c], recorder)) for m in range(4) for c in range(chunks)]
        assert [id(b) for b in seen] == [id(source[m]) for m in range(4) for _ in range(chunks)]
        stats = recorder.stats
        assert (stats.micro_batches, stats.sequences, stats.real_tokens) == (4, 4, 48), chunks
        assert (stats.image_tokens, stats.padded_tokens, stats.loss_tokens) == (8, 64, 64), chunks


@needs_stack
def test_what_runs_between_steps_is_in_the_step_period_not_the_step_time(
    one_rank: None, tmp_path: Path
) -> None:
    """Bridge's manual GC and training_log run after on_train_step_end (train.py:633, 725-729):
    outside the step window, inside the period from this step's start to the next one's."""
    pauses = {2: 0.3}  # a collection after step 2
    bridge_loop(
        recorder_for(make_spec(*MEG), tmp_path, FakeCudaMemory(), 2),
        4,
        between_steps=lambda step: time.sleep(pauses.get(step, 0.0)),
    )
    lines = read_steps(tmp_path / STEPS_JSONL)
    assert all(line.step_time_s < 0.3 for line in lines)
    periods = [line.step_period_s for line in lines]
    assert periods[3] is None  # the last step: no next start
    assert periods[1] is not None and periods[1] >= 0.3 + lines[1].step_time_s
    assert all(p is not None and p < 0.3 for p in (periods[0], periods[2]))
    summary = summarize(lines, make_spec(*MEG, "train_iters=4"))
    # Steady steps 2-4 (warm-up 1): steps 2 and 3 have periods, and the rates divide by them.
    assert summary["time_basis"]["name"] == "step_period" and summary["time_basis"]["steps"] == 2
    assert summary["between_steps_s"]["max"] >= 0.3


@needs_stack
@pytest.mark.parametrize(("ranks", "stops"), [("[]", [4]), ("[0]", [4]), ("[1]", [])])
def test_the_memory_history_stops_after_the_snapshot_on_profiled_ranks(
    one_rank: None, tmp_path: Path, ranks: str, stops: list[int]
) -> None:
    """profiling=memory: Bridge records every allocation with its Python stack on the profiled
    ranks from before the model is built and never stops (train_utils.py:206-217), slowing every
    step. The recorder stops it when the step after the snapshot (step 3, dumped in training_log)
    starts; steps 1-3 are out of the steady window. The stop itself is torch.cuda's allocator (a GPU
    call), so a spy stands in for it and says when it ran."""
    spec = make_spec(*MEG, "profiling=memory", "profiling.steps=[3]", f"profiling.ranks={ranks}")
    recorder = recorder_for(spec, tmp_path, FakeCudaMemory(), 10)
    current: list[int] = [0]
    stopped: list[int] = []
    recorder.history_off = lambda: stopped.append(current[0] + 1)  # during the next step's start
    bridge_loop(recorder, 5, at_step_start=lambda step: current.__setitem__(0, step))
    assert stopped == stops
    lines = read_steps(tmp_path / STEPS_JSONL)
    assert [line.exclude for line in lines] == ["profiler"] * 3 + [None] * 2
    window = summarize(lines, make_spec(*MEG, "train_iters=5", "profiling=memory", "profiling.steps=[3]"))
    assert window["steady_window"]["text"] == "steps 4-5 (2 steps); excluded warm-up: 1; profiler: 2-3"
