"""Fsdp rules (F...)."""

from __future__ import annotations

from collections.abc import Iterator

from moe_vlm.rules.catalogue import (
    Level,
    Violation,
    _uses_graphs,
    rule,
)
from moe_vlm.schema import (
    ShardingStrategy,
)
from moe_vlm.spec import RunSpec


@rule("F001", Level.error, "Megatron FSDP v2 is data-parallel only")
def _fsdp_v2(spec: RunSpec) -> Iterator[Violation]:
    par, lay = spec.parallelism, spec.layout
    if spec.family != "fsdp" or par.fsdp_version != 2:
        return
    blockers = [
        name for name, size in (("tp", lay.tp), ("pp", lay.pp), ("cp", lay.cp), ("ep", lay.ep)) if size > 1
    ]
    if spec.model.num_experts > 0:
        blockers.append("MoE model")
    if _uses_graphs(spec):
        blockers.append("cuda_graph")
    if blockers:
        yield Violation(
            ("parallelism.fsdp_version",),
            f"Megatron FSDP v2 rejects {', '.join(blockers)} (it is DP-only).",
            "set parallelism.fsdp_version=1.",
        )


@rule("F002", Level.error, "FSDP-only knobs need parallelism=fsdp")
def _fsdp_knobs_on_3d(spec: RunSpec) -> Iterator[Violation]:
    par = spec.parallelism
    if spec.family != "3d":
        return
    ignored = []
    if par.sharding_strategy is not ShardingStrategy.no_shard:
        ignored.append(f"parallelism.sharding_strategy={par.sharding_strategy.value}")
    if par.fsdp_double_buffer:
        ignored.append("parallelism.fsdp_double_buffer=true")
    if par.nccl_ub:
        ignored.append("parallelism.nccl_ub=true")
    if par.fsdp_version != 1:
        ignored.append(f"parallelism.fsdp_version={par.fsdp_version}")
    if ignored:
        yield Violation(
            tuple(item.split("=")[0] for item in ignored),
            f"{', '.join(ignored)} only apply to Megatron FSDP; 3D parallel uses the distributed optimizer.",
            "use parallelism=fsdp, or drop these overrides.",
        )


@rule("F003", Level.warning, "FSDP with PP > 1 is not validated upstream")
def _fsdp_pp(spec: RunSpec) -> Iterator[Violation]:
    if spec.family == "fsdp" and spec.layout.pp > 1:
        yield Violation(
            ("pp",),
            "Megatron FSDP with PP > 1 is 'intended to work, not fully validated' upstream.",
            "use pp=1 with FSDP, or parallelism=3d for pipeline layouts.",
        )


@rule("F004", Level.warning, "FSDP family is TP=CP=1")
def _fsdp_tp_cp(spec: RunSpec) -> Iterator[Violation]:
    if spec.family == "fsdp" and (spec.layout.tp > 1 or spec.layout.cp > 1):
        yield Violation(
            ("tp", "cp"),
            "parallelism=fsdp is the TP=CP=PP=1 bring-up family; TP/CP > 1 leaves it.",
            "keep tp=1 cp=1 with FSDP, or move to parallelism=3d.",
        )
