"""data.num_workers: null resolves per engine (torch: 0 in its loop; Megatron: from the CPUs per rank),
an explicit value wins, and the resolved count is what the plan shows and the Bridge row sets."""

from __future__ import annotations

import os

import pytest

from moe_vlm.data.workers import MAX_AUTO_WORKERS, PREFETCH_PER_WORKER, data_workers
from moe_vlm.knobs.bridge_fields import bridge_overrides
from moe_vlm.rules import errors, validate
from moe_vlm.run.plan import layout_lines
from tests.conftest import make_spec

# 2 GB200 nodes: 4 GPUs (ranks) per node.
MEG = ("engine=megatron", "dry_run=true", "model=qwen3_vl_30b_a3b", "cluster=gb200", "nodes=2")


def test_torch_engine_builds_batches_in_its_loop_by_default() -> None:
    spec = make_spec("engine=torch")
    assert spec.data.num_workers is None
    assert data_workers(spec, {"SLURM_CPUS_PER_TASK": "36"}).count == 0
    assert "E010" not in {f.code for f in errors(validate(spec))}


@pytest.mark.parametrize(("cpus", "workers"), [("36", MAX_AUTO_WORKERS), ("4", 3), ("1", 1)])
def test_megatron_workers_come_from_slurm_cpus_per_task(cpus: str, workers: int) -> None:
    # One core stays with the training thread; past MAX_AUTO_WORKERS more workers only cost memory.
    resolved = data_workers(make_spec(*MEG), {"SLURM_CPUS_PER_TASK": cpus})
    assert resolved.count == workers and f"SLURM_CPUS_PER_TASK={cpus}" in resolved.source
    assert resolved.prefetched == workers * PREFETCH_PER_WORKER


def test_megatron_workers_outside_slurm_share_this_machine_s_cpus() -> None:
    spec = make_spec(*MEG)
    cpus = len(os.sched_getaffinity(0))
    expected = min(max(max(cpus // spec.layout.ranks_per_node, 1) - 1, 1), MAX_AUTO_WORKERS)
    resolved = data_workers(spec, {})
    assert resolved.count == expected
    assert f"{cpus} CPUs here / {spec.layout.ranks_per_node} ranks per node" in resolved.source


def test_an_explicit_count_wins() -> None:
    assert data_workers(make_spec(*MEG, "data.num_workers=3"), {"SLURM_CPUS_PER_TASK": "36"}).count == 3
    assert data_workers(make_spec(*MEG, "data.num_workers=0"), {"SLURM_CPUS_PER_TASK": "36"}).count == 0


def test_the_plan_and_the_bridge_row_carry_the_resolved_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "36")
    spec = make_spec(*MEG)
    row = next(o for o in bridge_overrides(spec) if o.field == "dataset.num_workers")
    assert row.value == MAX_AUTO_WORKERS
    plan = "\n".join(layout_lines(spec))
    assert (
        f"data workers   {MAX_AUTO_WORKERS} per rank, {MAX_AUTO_WORKERS * PREFETCH_PER_WORKER} micro-batches "
        "prefetched (auto: SLURM_CPUS_PER_TASK=36" in plan
    )
    torch_plan = "\n".join(layout_lines(make_spec("engine=torch", "dry_run=true")))
    assert "data workers   0: batches built on the training thread, inside the step" in torch_plan
