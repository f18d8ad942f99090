"""The time the training loop waited for data, per step on both engines, and its run summary."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist

from moe_vlm.data import Batch, build_batches
from moe_vlm.engines.megatron.recording import CountingIterator, StepStats
from moe_vlm.engines.torch_engine import Trainer
from moe_vlm.perf.metrics import summarize
from tests.conftest import make_spec

PAUSE_S = 0.25
TINY = ("nproc=1", "seq_length=64", "gbs=2", "mbs=1", "data=mock")


@pytest.fixture(scope="module")
def one_rank_group() -> Iterator[None]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def slow(batches: Iterator[Any], pause_s: float) -> Iterator[Any]:
    """A loader that takes pause_s to hand over each batch."""
    for batch in batches:
        time.sleep(pause_s)
        yield batch


def test_torch_engine_records_the_wait_for_each_batch(one_rank_group: None) -> None:
    spec = make_spec(*TINY)
    ready: list[Batch] = [next(build_batches(spec, 0, 1)) for _ in range(4)]
    waiting = Trainer(spec, torch.device("cpu"), 0, 1, batches=slow(iter(ready[:2]), PAUSE_S)).step(1)
    fed = Trainer(spec, torch.device("cpu"), 0, 1, batches=iter(ready[2:])).step(1)
    assert spec.accumulation_steps == 2
    assert 2 * PAUSE_S <= (waiting.data_wait_s or 0.0) < waiting.step_time_s
    assert (fed.data_wait_s or 0.0) < 0.05 < PAUSE_S  # batches already built: no wait to speak of


def test_megatron_counting_iterator_times_next() -> None:
    stats = StepStats()
    batch = {"input_ids": torch.ones(1, 8, dtype=torch.long), "skipped_samples": torch.tensor(2)}
    counted = list(CountingIterator(slow(iter([batch, batch]), PAUSE_S), stats, 0, 9))
    assert counted == [batch, batch] and stats.micro_batches == 2
    assert 2 * PAUSE_S <= stats.data_wait_s < 2 * PAUSE_S + 0.5
    assert stats.skipped_samples == 4


def _line(step: int, rank: int, step_time_s: float, data_wait_s: float | None) -> dict[str, Any]:
    line: dict[str, Any] = {"step": step, "rank": rank, "step_time_s": step_time_s, "tokens": {"real": 10}}
    if data_wait_s is not None:
        line["data_wait_s"] = data_wait_s
    return line


def test_summary_states_the_share_of_step_time_spent_waiting() -> None:
    spec = make_spec("train_iters=4", "warmup_steps=1")
    # Step 1 is warm-up (its long wait is left out); steps 2-4 on two ranks.
    steps = [_line(1, r, 5.0, 4.0) for r in (0, 1)]
    steps += [_line(s, 0, 2.0, 0.5) for s in (2, 3, 4)] + [_line(s, 1, 2.0, 0.1) for s in (2, 3, 4)]
    wait = summarize(steps, spec)["data_wait"]
    assert wait["rank_steps"] == 6 and wait["max_s"] == 0.5
    assert wait["mean_s"] == pytest.approx((3 * 0.5 + 3 * 0.1) / 6)
    assert wait["fraction_of_step_time"] == pytest.approx((3 * 0.5 + 3 * 0.1) / (6 * 2.0))
    assert summarize([_line(s, 0, 2.0, None) for s in (1, 2, 3)], spec)["data_wait"] is None
