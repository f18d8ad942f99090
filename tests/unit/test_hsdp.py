"""HSDP's outer data-parallel size and the launcher's --segment (moe_vlm/config/sharding.py)."""

from __future__ import annotations

import pytest

from moe_vlm.base.errors import BadInput
from moe_vlm.config.sharding import block_gpus, dp_outer, segment_nodes
from moe_vlm.knobs.bridge_fields import bridge_overrides
from moe_vlm.launch import slurm
from moe_vlm.rules import validate
from tests.conftest import make_spec

# Qwen3-VL-235B with EP 8 on GB200 (4 GPUs/node, 18 nodes per NVL72 domain).
GB200_235B = ["cluster=gb200", "model=qwen3_vl_235b_a22b", "dispatcher=hybridep", "ep=8"]


def field(spec: object, name: str) -> object:
    return next(o.value for o in bridge_overrides(spec) if o.field == name)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("nodes", "segment", "outer"),
    [
        (16, 16, 1),  # 64 GPUs: one domain, plain FSDP
        (36, 18, 2),  # 144 GPUs: two full NVL72 segments of 72 GPUs
        (54, 18, 3),
        (32, 16, 2),  # 128 GPUs: the largest divisor of 32 nodes inside 18 is 16 (launch/slurm.segment_nodes)
    ],
)
def test_dp_outer_zero_is_one_replica_per_segment(nodes: int, segment: int, outer: int) -> None:
    spec = make_spec(*GB200_235B, f"nodes={nodes}", "parallelism.dp_outer=0")
    assert segment_nodes(spec) == segment
    assert dp_outer(spec) == outer
    assert field(spec, "ddp.num_distributed_optimizer_instances") == outer
    if outer > 1:
        assert block_gpus(spec) == segment * 4  # each sharding group is one segment of GPUs
        assert not {f.code for f in validate(spec)} & {"O005", "O007"}


def test_zero_falls_back_to_one_where_replicas_cannot_divide_expert_dp() -> None:
    # 144 GPUs with EP 16: expert DP 9 cannot be split into 2 replicas (parallel_state.py:1447-1450).
    spec = make_spec(*GB200_235B, "nodes=36", "ep=16", "parallelism.dp_outer=0")
    assert dp_outer(spec) == 1
    # ... and Megatron FSDP over two NVL72 segments without HSDP is what O007 warns about.
    assert "O007" in {f.code for f in validate(spec)}


def test_an_explicit_segment_must_match_the_sharding_group() -> None:
    spec = make_spec(*GB200_235B, "nodes=36", "parallelism.dp_outer=2")
    settings = slurm.SlurmSettings(expects_cluster="gb200", segment="auto")
    assert slurm.checked(settings, spec).segment == "auto"  # auto: 18-node segments = the 72-GPU groups
    assert slurm.checked(slurm.SlurmSettings(segment="18"), spec).segment == "18"
    with pytest.raises(
        BadInput, match=r"hydra.launcher.segment=9 with parallelism.dp_outer: .*spans 72 GPUs"
    ):
        slurm.checked(slurm.SlurmSettings(segment="9"), spec)
    # Without HSDP there is no sharding group to match.
    plain = make_spec(*GB200_235B, "nodes=36")
    assert slurm.checked(slurm.SlurmSettings(segment="9"), plain).segment == "9"
