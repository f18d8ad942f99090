"""Fsdp rules (F...)."""

from __future__ import annotations

from collections.abc import Iterator

from moe_vlm.config.schema import (
    CudaGraphImpl,
    Engine,
    ParallelismFamily,
    ShardingStrategy,
)
from moe_vlm.config.spec import RunSpec
from moe_vlm.rules.catalogue import (
    Level,
    Violation,
    _uses_graphs,
    rule,
)


@rule("F001", Level.error, "Megatron FSDP v2 is data-parallel only")
def _fsdp_v2(spec: RunSpec) -> Iterator[Violation]:
    par, lay = spec.parallelism, spec.layout
    if spec.family != ParallelismFamily.fsdp or par.fsdp_version != 2:
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
    if spec.family != ParallelismFamily["3d"]:
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
    if spec.family == ParallelismFamily.fsdp and spec.layout.pp > 1:
        yield Violation(
            ("pp",),
            "Megatron FSDP with PP > 1 is 'intended to work, not fully validated' upstream.",
            "use pp=1 with FSDP, or parallelism=3d for pipeline layouts.",
        )


@rule("F004", Level.warning, "FSDP family is TP=CP=1")
def _fsdp_tp_cp(spec: RunSpec) -> Iterator[Violation]:
    if spec.family == ParallelismFamily.fsdp and (spec.layout.tp > 1 or spec.layout.cp > 1):
        yield Violation(
            ("tp", "cp"),
            "parallelism=fsdp is the TP=CP=PP=1 bring-up family; TP/CP > 1 leaves it.",
            "keep tp=1 cp=1 with FSDP, or move to parallelism=3d.",
        )


@rule("F005", Level.error, "Megatron FSDP hooks the layers TE CUDA graphs capture (TE graph.py)")
def _fsdp_te_graphs(spec: RunSpec) -> Iterator[Violation]:
    # Megatron FSDP registers forward (pre-)hooks on every TransformerLayer it shards
    # (megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py:1017-1028, 1062-1075,
    # 1090-1097); Bridge takes forward pre-hooks off before capture only without Megatron FSDP
    # (megatron/bridge/training/train.py:255-259, 436-441, 1111-1131), and Transformer Engine
    # refuses a hooked module (transformer_engine/pytorch/graph.py:386-400): capture fails at
    # step cuda_graph.warmup_steps. With no_shard no hook lands on a layer.
    if (
        spec.engine == Engine.megatron
        and spec.family == ParallelismFamily.fsdp
        and spec.parallelism.sharding_strategy is not ShardingStrategy.no_shard
        and spec.cuda_graph.impl is CudaGraphImpl.transformer_engine
    ):
        yield Violation(
            ("parallelism", "cuda_graph"),
            "Megatron FSDP keeps forward hooks on every TransformerLayer, and Transformer Engine refuses to "
            f"capture a hooked module: cuda_graph={spec.cuda_graph.name} would crash at step "
            f"{spec.cuda_graph.warmup_steps + 1}.",
            "use parallelism=3d for TE CUDA graphs, or cuda_graph=none with parallelism=fsdp.",
        )
